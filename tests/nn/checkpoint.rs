//! Training checkpoints: a run stopped and resumed from its checkpoint ends
//! bit for bit where an unbroken run does (f32, bf16, f64; AdamW with a
//! schedule, SGD with momentum); a damaged, mismatched or foreign
//! checkpoint is refused by name and changes nothing; saves never replace
//! a checkpoint, prune out of sight and leave no half-written folder.

use fusegrad::nn::{
    load_checkpoint, AdamW, Checkpoints, Gpt, GptConfig, Linear, Module, Optimizer, OptimizerState,
    Parameters, Sgd, SgdConfig, TrainState, WarmupCosine,
};
use fusegrad::rng::Rng;
use fusegrad::{ops, Accum, Element, Tape};
use half::bf16;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fusegrad-{}-ckpt-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn bits<E: Element>(ts: &[&fusegrad::Tensor<E>]) -> Vec<Vec<u64>> {
    ts.iter()
        .map(|p| {
            p.to_vec()
                .unwrap()
                .iter()
                .map(|v| v.to_acc().f64().to_bits())
                .collect()
        })
        .collect()
}

fn moments<T: Element>(s: &OptimizerState<T>) -> Vec<Vec<u64>> {
    let all: Vec<&fusegrad::Tensor<T::Acc>> = s.buffers.iter().flatten().map(|(_, t)| t).collect();
    bits(&all)
}

fn config() -> BTreeMap<String, String> {
    BTreeMap::from([("width".to_string(), "8".to_string())])
}

fn gpt<T: Element>(seed: u64) -> Gpt<T> {
    let cfg = GptConfig {
        vocab: 11,
        context: 6,
        width: 8,
        heads: 2,
        layers: 2,
    };
    Gpt::new(cfg, &mut Rng::new(seed)).unwrap()
}

/// `steps` steps of the transformer from `state`: random batches from the
/// state's generator, AdamW on a warmup-cosine schedule, clipping.
fn train<T: Element>(model: &mut Gpt<T>, opt: &mut AdamW<T>, state: &mut TrainState, steps: u64) {
    let schedule = WarmupCosine::new(3e-3, 3e-4, 2, 12).unwrap();
    let mut rng = state.rng("batches", Rng::new(99));
    for _ in 0..steps {
        let (b, t) = (3, 6);
        let x: Vec<usize> = (0..b * t).map(|_| rng.below(11)).collect();
        let y: Vec<usize> = (0..b * t).map(|_| rng.below(11)).collect();
        let tape = Tape::new();
        let p = model.bind(&tape);
        let loss = model.loss(&p, &x, &y, b, t).unwrap();
        let value = loss.value().to_vec().unwrap()[0].to_acc().f64();
        let g = p.grads(&loss.backward().unwrap()).unwrap();
        opt.set_lr(schedule.lr(state.step)).unwrap();
        opt.update_clipped(&mut model.params_mut(), g, 0.5).unwrap();
        state.step += 1;
        state.data_position += b as u64;
        state.losses.push(value);
        state.rngs.insert("batches".into(), rng.state());
    }
}

fn resume_is_exact<T: Element>() {
    let d = dir(&format!("resume-{}", T::NAME));
    let mut fresh = TrainState::new();
    fresh.config = config();
    // Unbroken: 8 steps.
    let (mut a, mut oa, mut sa) = (
        gpt::<T>(1),
        AdamW::<T>::with_lr(1e-3).unwrap(),
        fresh.clone(),
    );
    train(&mut a, &mut oa, &mut sa, 8);
    // Broken: 4 steps, saved, everything dropped; a new process's model
    // (another init) and optimizer load it and take 4 more.
    let (mut b, mut ob, mut sb) = (gpt::<T>(1), AdamW::<T>::with_lr(1e-3).unwrap(), fresh);
    train(&mut b, &mut ob, &mut sb, 4);
    let saved = Checkpoints::new(&d).save(&b, &ob, &sb).unwrap();
    assert!(saved.ends_with("step-00000004"), "{}", saved.display());
    drop((b, ob, sb));
    let (mut c, mut oc) = (gpt::<T>(7), AdamW::<T>::with_lr(1e-3).unwrap());
    let mut sc = load_checkpoint(&d, &mut c, &mut oc, &config()).unwrap();
    assert_eq!((sc.step, sc.data_position, sc.losses.len()), (4, 12, 4));
    train(&mut c, &mut oc, &mut sc, 4);
    assert_eq!(bits(&c.params()), bits(&a.params()), "{} weights", T::NAME);
    let (ma, mc) = (oa.state_dict().unwrap(), oc.state_dict().unwrap());
    assert_eq!(moments(&mc), moments(&ma), "{} moments", T::NAME);
    assert_eq!((mc.step, mc.hyper.clone()), (ma.step, ma.hyper.clone()));
    let loss_bits = |s: &TrainState| s.losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
    assert_eq!(loss_bits(&sc), loss_bits(&sa));
    assert_eq!(sc.rngs, sa.rngs);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_resumed_run_ends_bitwise_where_an_unbroken_one_does() {
    resume_is_exact::<f32>();
    resume_is_exact::<bf16>();
    resume_is_exact::<f64>();
}

#[test]
fn sgd_momentum_and_a_fresh_optimizer_round_trip() {
    let d = dir("sgd");
    let mut model = Linear::<f32>::new(3, 4, &mut Rng::new(2)).unwrap();
    let cfg = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        ..SgdConfig::default()
    };
    let mut opt = Sgd::<f32>::new(cfg).unwrap();
    let mut state = TrainState::new();
    // Step 0: nothing has a buffer yet.
    let ck = Checkpoints::new(&d);
    ck.save(&model, &opt, &state).unwrap();
    let x = fusegrad::Tensor::from_vec(vec![2, 3], vec![0.5, -1.0, 2.0, 1.5, 0.0, -0.5]).unwrap();
    let target =
        fusegrad::Tensor::from_vec(vec![2, 4], vec![1.0, -1.0, 0.5, 0.0, 0.0, 0.5, -1.0, 1.0])
            .unwrap();
    for _ in 0..3 {
        let tape = Tape::new();
        let p = model.bind(&tape);
        let y = model.forward(&p, &tape.constant(x.clone())).unwrap();
        let loss = ops::mse(&y, &tape.constant(target.clone())).unwrap();
        let g = p.grads(&loss.backward().unwrap()).unwrap();
        opt.update(&mut model.params_mut(), &g).unwrap();
        state.step += 1;
    }
    ck.save(&model, &opt, &state).unwrap();
    assert_eq!(
        ck.list().unwrap().iter().map(|s| s.0).collect::<Vec<_>>(),
        [0, 3]
    );
    let mut back = Linear::<f32>::new(3, 4, &mut Rng::new(5)).unwrap();
    let mut opt2 = Sgd::<f32>::new(cfg).unwrap();
    load_checkpoint(&d, &mut back, &mut opt2, &BTreeMap::new()).unwrap();
    assert_eq!(bits(&back.params()), bits(&model.params()));
    let (s1, s2) = (opt.state_dict().unwrap(), opt2.state_dict().unwrap());
    assert_eq!(moments(&s2), moments(&s1));
    assert_eq!(s2.buffers[0][0].0, "momentum_buffer");
    // The step-0 checkpoint has no buffers: loading it empties them.
    load_checkpoint(
        d.join("step-00000000"),
        &mut back,
        &mut opt2,
        &BTreeMap::new(),
    )
    .unwrap();
    assert!(opt2.state_dict().unwrap().buffers.is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

/// Loads `path` into a fresh model and optimizer and returns the error,
/// checking that neither changed.
fn refused<T: Element>(path: &Path, opt: AdamW<T>, cfg: &BTreeMap<String, String>) -> String {
    let mut model = gpt::<T>(3);
    let mut opt = opt;
    let before = (bits(&model.params()), opt.state_dict().unwrap().step);
    let e = load_checkpoint(path, &mut model, &mut opt, cfg)
        .unwrap_err()
        .to_string();
    assert_eq!(
        (bits(&model.params()), opt.state_dict().unwrap().step),
        before,
        "{e}"
    );
    e
}

#[test]
fn mismatched_or_damaged_checkpoints_are_refused_and_change_nothing() {
    let d = dir("refuse");
    let (mut m, mut o) = (gpt::<f32>(1), AdamW::<f32>::with_lr(1e-3).unwrap());
    let mut s = TrainState::new();
    s.config = config();
    train(&mut m, &mut o, &mut s, 2);
    let at = Checkpoints::new(&d).save(&m, &o, &s).unwrap();
    let adamw = || AdamW::<f32>::with_lr(1e-3).unwrap();
    // Other settings: the first difference is named.
    let other = BTreeMap::from([("width".to_string(), "16".to_string())]);
    let e = refused(&at, adamw(), &other);
    assert!(
        e.contains("made with width 8, this run has width 16"),
        "{e}"
    );
    // Another element type.
    let e = {
        let mut m16 = gpt::<bf16>(3);
        let mut o16 = AdamW::<bf16>::with_lr(1e-3).unwrap();
        load_checkpoint(&at, &mut m16, &mut o16, &config())
            .unwrap_err()
            .to_string()
    };
    assert!(e.contains("holds f32 weights, the model is bf16"), "{e}");
    // Another optimizer setting (the learning rate may differ).
    let mut cfg = *AdamW::<f32>::with_lr(1e-3).unwrap().config();
    cfg.beta2 = 0.99;
    let e = refused(&at, AdamW::<f32>::new(cfg).unwrap(), &config());
    assert!(e.contains("beta2 0.999, this one 0.99"), "{e}");
    // Another model: a parameter of another shape.
    let e = {
        let mut wide = Gpt::<f32>::new(
            GptConfig {
                vocab: 11,
                context: 6,
                width: 12,
                heads: 2,
                layers: 2,
            },
            &mut Rng::new(1),
        )
        .unwrap();
        load_checkpoint(&at, &mut wide, &mut adamw(), &config())
            .unwrap_err()
            .to_string()
    };
    assert!(
        e.contains("has shape") && e.contains("model.safetensors"),
        "{e}"
    );
    // One flipped byte in any file, a truncated file, a missing file.
    for file in ["model.safetensors", "optimizer.safetensors", "state.json"] {
        let p = at.join(file);
        let good = std::fs::read(&p).unwrap();
        let mut bad = good.clone();
        let k = bad.len() * 2 / 3;
        bad[k] ^= 0x10;
        std::fs::write(&p, &bad).unwrap();
        let e = refused(&at, adamw(), &config());
        assert!(e.contains(file) && e.contains("damaged"), "{e}");
        std::fs::write(&p, &good[..good.len() - 1]).unwrap();
        let e = refused(&at, adamw(), &config());
        assert!(e.contains(file) && e.contains("bytes"), "{e}");
        std::fs::remove_file(&p).unwrap();
        let e = refused(&at, adamw(), &config());
        assert!(e.contains(file) && e.contains("cannot read"), "{e}");
        std::fs::write(&p, &good).unwrap();
    }
    // Whole again, it loads.
    let (mut m2, mut o2) = (gpt::<f32>(3), adamw());
    load_checkpoint(&at, &mut m2, &mut o2, &config()).unwrap();
    assert_eq!(bits(&m2.params()), bits(&m.params()));
    let e = refused(&d.join("nothing-here"), adamw(), &config());
    assert!(e.contains("no such checkpoint folder"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn saves_never_replace_prune_out_of_sight_and_clean_what_a_kill_left() {
    let d = dir("keep");
    let (m, o) = (gpt::<f32>(1), AdamW::<f32>::with_lr(1e-3).unwrap());
    assert!(Checkpoints::new(&d).keep(0).is_err());
    let ck = Checkpoints::new(&d).keep(2).unwrap();
    assert_eq!(ck.latest().unwrap(), None);
    // What a save killed by a dead process leaves, and a stray folder.
    std::fs::create_dir_all(d.join(".step-00000009.partial-999999999-0")).unwrap();
    std::fs::create_dir_all(d.join("notes")).unwrap();
    let mut s = TrainState::new();
    s.losses = vec![f64::NAN, f64::INFINITY, -0.0, 1e-300];
    for step in [1, 2, 3] {
        s.step = step;
        ck.save(&m, &o, &s).unwrap();
    }
    let mut names: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["notes", "step-00000002", "step-00000003"]);
    let e = ck.save(&m, &o, &s).unwrap_err().to_string();
    assert!(
        e.contains("step-00000003") && e.contains("never overwritten"),
        "{e}"
    );
    // Losses that JSON has no number for come back as they were.
    let (mut m2, mut o2) = (gpt::<f32>(2), AdamW::<f32>::with_lr(1e-3).unwrap());
    let back = load_checkpoint(&d, &mut m2, &mut o2, &BTreeMap::new()).unwrap();
    assert_eq!(back.step, 3);
    let b: Vec<u64> = back.losses.iter().map(|l| l.to_bits()).collect();
    let want: Vec<u64> = s.losses.iter().map(|l| l.to_bits()).collect();
    assert_eq!(b[1..], want[1..]);
    assert!(back.losses[0].is_nan());
    std::fs::remove_dir_all(&d).unwrap();
}
