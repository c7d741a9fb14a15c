use super::*;
use crate::nn::{AdamW, Gpt, GptConfig, Optimizer, Parameters};
use crate::rng::Rng;
use crate::{Device, Element, Tape};

// The tests, run by `tests/unit.rs`.
unit_tests![
    a_clean_f32_run_is_within_tolerance_at_every_layer,
    a_clean_bf16_run_is_within_tolerance_at_every_layer,
    unwatched_steps_check_nothing_and_fractions_pick_calls,
    an_injected_fault_is_found_at_its_layer_and_call_and_replays,
    halt_stops_at_the_first_difference_past_tolerance,
    a_damaged_replay_file_is_an_error_naming_it,
    a_fault_in_attention_is_found_at_its_layer_and_its_file_replays_whole,
    the_attention_judge_sizes_results_by_their_terms,
];

const TINY: GptConfig = GptConfig {
    vocab: 11,
    context: 8,
    width: 16,
    heads: 2,
    layers: 2,
};

/// `steps` AdamW steps of a tiny transformer on random tokens, watched by
/// `shadow` on every step it picks.
fn train<T: Element>(shadow: &Shadow, steps: usize) -> Result<()> {
    let mut rng = Rng::new(7);
    let mut model = Gpt::<T>::new(TINY, &mut rng)?;
    let mut opt = AdamW::with_lr(1e-2)?;
    let (b, t) = (3, TINY.context);
    for step in 0..steps {
        let ids: Vec<usize> = (0..b * t).map(|_| rng.below(TINY.vocab)).collect();
        let tgt: Vec<usize> = ids.iter().map(|i| (i * 3 + 1) % TINY.vocab).collect();
        let tape = Tape::new();
        shadow.watch(&tape, step);
        let p = model.bind(&tape);
        let loss = model.loss(&p, &ids, &tgt, b, t)?;
        let g = p.grads(&loss.backward()?)?;
        opt.update(&mut model.params_mut(), &g)?;
    }
    Ok(())
}

/// The fused ops of [`TINY`], in call order within a step.
const SITES: [&str; 7] = [
    "blocks.0.ln1",
    "blocks.0.attn",
    "blocks.0.ln2",
    "blocks.1.ln1",
    "blocks.1.attn",
    "blocks.1.ln2",
    "ln_f",
];

/// Checks per call: y and three gradients for a norm (x, gamma, beta); y
/// and the packed dqkv for attention.
fn checks_per_call(site: &str) -> usize {
    if site.ends_with("attn") {
        2
    } else {
        4
    }
}

fn clean_run<T: Element>() {
    let shadow = Shadow::new(ShadowConfig::every(2));
    let seen = Rc::new(RefCell::new(0usize));
    let count = seen.clone();
    shadow.on_check(move |_| *count.borrow_mut() += 1);
    train::<T>(&shadow, 5).unwrap();
    let sites = shadow.sites();
    let names: Vec<&str> = sites.iter().map(|s| s.site.as_str()).collect();
    assert_eq!(names, SITES, "{}", T::NAME);
    for s in &sites {
        // Steps 0, 2 and 4.
        assert_eq!(s.calls, 3, "{s:?}");
        let op = if s.site.ends_with("attn") {
            "attention_qkv"
        } else {
            "layer_norm"
        };
        assert_eq!(s.op, op);
        assert_eq!(s.history.iter().map(|h| h.0).collect::<Vec<_>>(), [0, 2, 4]);
        assert_eq!(s.failures, 0, "{} {s:?}", T::NAME);
        let g = s.worst_grad.as_ref().unwrap();
        assert!(g.diff <= g.tol && g.tol > 0.0, "{g:?}");
        assert_eq!(g.dtype, T::NAME);
        assert!(s.worst_ratio() <= 1.0);
    }
    let per_step: usize = SITES.iter().map(|s| checks_per_call(s)).sum();
    assert_eq!(*seen.borrow(), 3 * per_step);
    assert!(shadow.all_passed());
}

fn a_clean_f32_run_is_within_tolerance_at_every_layer() {
    clean_run::<f32>();
}

fn a_clean_bf16_run_is_within_tolerance_at_every_layer() {
    clean_run::<half::bf16>();
}

fn unwatched_steps_check_nothing_and_fractions_pick_calls() {
    let shadow = Shadow::new(ShadowConfig::every(100));
    train::<f32>(&shadow, 1).unwrap();
    assert_eq!(shadow.sites().len(), SITES.len(), "step 0 is checked");
    let none = Shadow::new(ShadowConfig {
        fraction: 0.0,
        ..ShadowConfig::every(1)
    });
    train::<f32>(&none, 2).unwrap();
    assert!(none.sites().is_empty());
    let some = Shadow::new(ShadowConfig {
        fraction: 0.5,
        ..ShadowConfig::every(1)
    });
    train::<f32>(&some, 8).unwrap();
    let calls: usize = some.sites().iter().map(|s| s.calls).sum();
    assert!((12..44).contains(&calls), "{calls} of 56 calls checked");
    let ln_only = Shadow::new(ShadowConfig {
        ops: vec!["rms_norm".into()],
        ..ShadowConfig::every(1)
    });
    train::<f32>(&ln_only, 1).unwrap();
    assert!(ln_only.sites().is_empty(), "the model has no RMSNorm");
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fusegrad-shadow-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn an_injected_fault_is_found_at_its_layer_and_call_and_replays() {
    let dir = tmp("fault");
    // Row 5 of dx at the third LayerNorm call of step 1: blocks.1.ln1.
    let fault = Fault {
        op: "layer_norm".into(),
        step: 1,
        call: 2,
        result: "dx".into(),
        row: 5,
        delta: 0.25,
    };
    let shadow = Shadow::new(ShadowConfig {
        replay_dir: Some(dir.clone()),
        fault: Some(fault.clone()),
        ..ShadowConfig::every(1)
    });
    train::<f32>(&shadow, 3).unwrap();
    let sites = shadow.sites();
    let bad: Vec<&SiteReport> = sites.iter().filter(|s| s.failures > 0).collect();
    assert_eq!(bad.len(), 1, "{sites:?}");
    let s = bad[0];
    assert_eq!((s.site.as_str(), s.failures), ("blocks.1.ln1", 1));
    let g = s.worst_grad.as_ref().unwrap();
    assert_eq!((g.step, g.call, g.result.as_str()), (1, 2, "dx"));
    assert_eq!(g.row.unwrap().row, 5);
    // The perturbation itself is the difference, up to rounding.
    assert!(((g.fused - g.twin) - 0.25).abs() < 1e-3, "{g:?}");
    assert!(g.diff > 100.0 * g.tol, "{g:?}");
    // The file keeps the worst rows; the fault is at the file's row of 5.
    let file = s.replay.clone().expect("a replay file");
    assert!(file.starts_with(&dir));
    let clean = replay(&file, Device::Cpu, ShadowConfig::every(1)).unwrap();
    let rows: Vec<usize> = clean.meta["rows"]
        .split(',')
        .map(|r| r.parse().unwrap())
        .collect();
    let at = rows.iter().position(|&r| r == 5).expect("row 5 kept");
    assert!(clean.checks.iter().all(Check::passed), "{clean}");
    assert_eq!(clean.checks.len(), 4, "y, dx, dgamma, dbeta");
    let again = replay(
        &file,
        Device::Cpu,
        ShadowConfig {
            fault: Some(Fault {
                step: 0,
                call: 0,
                row: at,
                ..fault
            }),
            ..ShadowConfig::every(1)
        },
    )
    .unwrap();
    let dx = again.recorded_result().unwrap();
    assert!(!dx.passed(), "{again}");
    assert!(((dx.fused - dx.twin) - 0.25).abs() < 1e-3, "{again}");
    assert!(format!("{again}").contains("PAST"));
    let _ = std::fs::remove_dir_all(&dir);
}

fn halt_stops_at_the_first_difference_past_tolerance() {
    let shadow = Shadow::new(ShadowConfig {
        halt: true,
        fault: Some(Fault {
            op: "layer_norm".into(),
            step: 0,
            call: 1,
            result: "y".into(),
            row: 0,
            delta: 1.0,
        }),
        ..ShadowConfig::every(1)
    });
    match train::<f32>(&shadow, 1) {
        Err(Error::ShadowMismatch { site, result, .. }) => {
            assert_eq!((site.as_str(), result.as_str()), ("blocks.0.ln2", "y"))
        }
        other => panic!("{other:?}"),
    }
}

fn a_damaged_replay_file_is_an_error_naming_it() {
    let dir = tmp("damaged");
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("bad.safetensors");
    std::fs::write(&f, b"not a safetensors file").unwrap();
    let e = replay(&f, Device::Cpu, ShadowConfig::every(1)).unwrap_err();
    assert!(e.to_string().contains("bad.safetensors"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn a_fault_in_attention_is_found_at_its_layer_and_its_file_replays_whole() {
    let dir = tmp("attn-fault");
    // Row 3 (a position, all heads) of dqkv at the second attention call
    // of step 0: blocks.1.attn.
    let fault = Fault {
        op: "attention_qkv".into(),
        step: 0,
        call: 1,
        result: "dqkv".into(),
        row: 3,
        delta: 0.5,
    };
    let shadow = Shadow::new(ShadowConfig {
        replay_dir: Some(dir.clone()),
        fault: Some(fault.clone()),
        ..ShadowConfig::every(1)
    });
    train::<f32>(&shadow, 2).unwrap();
    let sites = shadow.sites();
    let bad: Vec<&SiteReport> = sites.iter().filter(|s| s.failures > 0).collect();
    assert_eq!(bad.len(), 1, "{sites:?}");
    let s = bad[0];
    assert_eq!(
        (s.op, s.site.as_str(), s.failures),
        ("attention_qkv", "blocks.1.attn", 1)
    );
    let g = s.worst_grad.as_ref().unwrap();
    assert_eq!((g.step, g.call, g.result.as_str()), (0, 1, "dqkv"));
    assert_eq!(g.row.unwrap().row, 3);
    assert!(((g.fused - g.twin) - 0.5).abs() < 1e-3, "{g:?}");
    assert!(g.diff > 100.0 * g.tol, "{g:?}");
    // Attention's rows depend on each other: the file keeps everything.
    let file = s.replay.clone().expect("a replay file");
    let clean = replay(&file, Device::Cpu, ShadowConfig::every(1)).unwrap();
    assert_eq!(clean.meta["rows"], "all");
    assert_eq!(clean.meta["heads"], "2");
    assert_eq!(clean.checks.len(), 2, "y, dqkv");
    assert!(clean.checks.iter().all(Check::passed), "{clean}");
    let again = replay(
        &file,
        Device::Cpu,
        ShadowConfig {
            fault: Some(Fault { call: 0, ..fault }),
            ..ShadowConfig::every(1)
        },
    )
    .unwrap();
    let d = again.recorded_result().unwrap();
    assert!(!d.passed(), "{again}");
    assert!(((d.fused - d.twin) - 0.5).abs() < 1e-3, "{again}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn the_attention_judge_sizes_results_by_their_terms() {
    use crate::ops::attention::twin::twin;
    use crate::ops::attention::Geometry;
    // One head, T = 2, d = 1, causal: p = [[1, 0], [a, 1 - a]].
    let g = Geometry {
        batch: 1,
        heads: 1,
        t: 2,
        d: 1,
        packed: false,
    };
    let judge = twin::<f64>(g, true, 1.0).judge;
    let (q, k, v) = (vec![1.0, 2.0], vec![0.5, -1.0], vec![3.0, -4.0]);
    // Row 1: s_10 = q_1 k_0 = 2 * 0.5, s_11 = q_1 k_1 = 2 * (-1).
    let (s10, s11) = (1.0, -2.0);
    let a = 1.0 / (1.0 + f64::exp(s11 - s10));
    let inputs = vec![q, k, v];
    let y = judge.scales(&inputs, None);
    assert_eq!(y.len(), 1);
    assert!(
        (y[0] - f64::max(3.0, a * 3.0 + (1.0 - a) * 4.0)).abs() < 1e-12,
        "{y:?}"
    );
    let cot = [1.0, -2.0];
    let s = judge.scales(&inputs, Some(&cot));
    assert_eq!(s.len(), 4, "y, dq, dk, dv");
    // dv: column sums of p |dO|: [1 + 2a, 2(1 - a)].
    assert!(
        (s[3] - f64::max(1.0 + 2.0 * a, 2.0 * (1.0 - a))).abs() < 1e-12,
        "{s:?}"
    );
    let cond = judge.row_condition(&inputs);
    assert_eq!(cond, vec![1.0, 2.0], "max |s| per query row, at least 1");
    assert!(judge.whole());
}
