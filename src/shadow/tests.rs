use super::*;
use crate::nn::{AdamW, Gpt, GptConfig, Module, Optimizer};
use crate::rng::Rng;
use crate::{Device, Element, Tape};

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

/// The norms of [`TINY`], in call order within a step.
const SITES: [&str; 5] = [
    "blocks.0.ln1",
    "blocks.0.ln2",
    "blocks.1.ln1",
    "blocks.1.ln2",
    "ln_f",
];

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
        // Steps 0, 2 and 4; y, dx, dgamma and dbeta each time.
        assert_eq!(s.calls, 3, "{s:?}");
        assert_eq!(s.history.iter().map(|h| h.0).collect::<Vec<_>>(), [0, 2, 4]);
        assert_eq!(s.failures, 0, "{} {s:?}", T::NAME);
        let g = s.worst_grad.as_ref().unwrap();
        assert!(g.diff <= g.tol && g.tol > 0.0, "{g:?}");
        assert_eq!(g.dtype, T::NAME);
        assert!(s.worst_ratio() <= 1.0);
    }
    assert_eq!(*seen.borrow(), 3 * 4 * SITES.len());
    assert!(shadow.all_passed());
}

#[test]
fn a_clean_f32_run_is_within_tolerance_at_every_layer() {
    clean_run::<f32>();
}

#[test]
fn a_clean_bf16_run_is_within_tolerance_at_every_layer() {
    clean_run::<half::bf16>();
}

#[test]
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
    assert!((8..32).contains(&calls), "{calls} of 40 calls checked");
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

#[test]
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

#[test]
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

#[test]
fn a_damaged_replay_file_is_an_error_naming_it() {
    let dir = tmp("damaged");
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("bad.safetensors");
    std::fs::write(&f, b"not a safetensors file").unwrap();
    let e = replay(&f, Device::Cpu, ShadowConfig::every(1)).unwrap_err();
    assert!(e.to_string().contains("bad.safetensors"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
