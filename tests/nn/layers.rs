//! nn: layers, init and optimizers (the training runs are the command's
//! demos, tested in `tests/command/demos.rs`).

use fusegrad::gradcheck::{check, Options};
use fusegrad::nn::{
    Activation, Adam, AdamConfig, AdamW, Bound, Init, LayerNorm, Linear, Mlp, MlpConfig, Module,
    Norm, NormImpl, Optimizer, Parameters, RmsNorm, Sgd, SgdConfig,
};
use fusegrad::rng::Rng;
use fusegrad::tolerance::F64_VS_REFERENCE;
use fusegrad::{ops, Error, Tape, Tensor};

fn t64(shape: &[usize], v: &[f64]) -> Tensor<f64> {
    Tensor::from_vec(shape.to_vec(), v.to_vec()).unwrap()
}

fn rand64(rng: &mut Rng, shape: &[usize]) -> Tensor<f64> {
    let n = shape.iter().product();
    Tensor::from_vec(shape.to_vec(), rng.vec(n)).unwrap()
}

fn vals(t: &Tensor<f64>) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

// ---- Gradients through modules ----

/// Linear -> LayerNorm with random x, W, b, gamma, beta: every gradient
/// against finite differences (random cotangent), fused and composed.
#[test]
fn linear_layer_norm_stack_gradcheck() {
    let mut rng = Rng::new(11);
    for imp in [NormImpl::Fused, NormImpl::Composed] {
        let model = (
            Linear::<f64>::new(3, 4, &mut rng).unwrap(),
            LayerNorm::new(4).unwrap().with_impl(imp),
        );
        let inputs = vec![
            rand64(&mut rng, &[5, 3]),
            rand64(&mut rng, &[3, 4]),
            rand64(&mut rng, &[4]),
            rand64(&mut rng, &[4]),
            rand64(&mut rng, &[4]),
        ];
        let f = |v: &[fusegrad::Var<f64>]| model.forward(&Bound::from_vars(v[1..].to_vec()), &v[0]);
        let report = check(f, &inputs, &Options::default()).unwrap();
        assert_eq!(report.inputs.len(), 5);
        assert!(report.passed(), "{imp:?}\n{report}");
        assert!(report
            .inputs
            .iter()
            .all(|r| r.checked == r.shape.iter().product::<usize>()));
    }
}

/// A whole Mlp (LayerNorm or RMSNorm, GELU or tanh) against finite
/// differences with respect to its input and every parameter.
#[test]
fn mlp_gradcheck() {
    let mut rng = Rng::new(12);
    for (norm, act) in [
        (Norm::LayerNorm, Activation::Gelu),
        (Norm::RmsNorm, Activation::Tanh),
    ] {
        let config = MlpConfig {
            norm,
            activation: act,
            ..MlpConfig::default()
        };
        let mlp = Mlp::<f64>::new(&[3, 5, 4, 2], &config, &mut rng).unwrap();
        // Random values in place of gamma = 1 / beta = 0 so that every term
        // of the chain rule is exercised.
        let mut inputs = vec![rand64(&mut rng, &[4, 3])];
        inputs.extend(mlp.params().iter().map(|p| rand64(&mut rng, p.shape())));
        let f = |v: &[fusegrad::Var<f64>]| mlp.forward(&Bound::from_vars(v[1..].to_vec()), &v[0]);
        let report = check(f, &inputs, &Options::default()).unwrap();
        assert_eq!(report.inputs.len(), 1 + mlp.params().len());
        assert!(report.passed(), "{norm:?} {act:?}\n{report}");
    }
}

// ---- Layers ----

/// `x @ W + b` by hand, for a rank-1 and a rank-3 input.
#[test]
fn linear_forward_by_hand() {
    let w = t64(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
    let b = t64(&[2], &[0.5, -0.5]);
    let lin = Linear::from_tensors(w, Some(b)).unwrap();
    assert_eq!((lin.in_features(), lin.out_features()), (3, 2));
    let y = lin.predict(&t64(&[3], &[1., 0., -1.])).unwrap();
    assert_eq!(y.shape(), [2]);
    assert_eq!(vals(&y), [1. - 5. + 0.5, 2. - 6. - 0.5]);
    let x = t64(&[2, 1, 3], &[1., 0., -1., 0., 2., 1.]);
    let y = lin.predict(&x).unwrap();
    assert_eq!(y.shape(), [2, 1, 2]);
    assert_eq!(vals(&y), [-3.5, -4.5, 11.5, 13.5]);
}

/// LayerNorm's fused and composed forms give the same values, and with the
/// default gamma = 1, beta = 0 each row has mean 0 and variance ~1.
#[test]
fn layer_norm_module_values() {
    let mut rng = Rng::new(3);
    let x = rand64(&mut rng, &[6, 8]);
    let ln = LayerNorm::<f64>::new(8).unwrap();
    assert_eq!(ln.imp(), NormImpl::Fused);
    let yf = vals(&ln.predict(&x).unwrap());
    let yc = vals(
        &ln.clone()
            .with_impl(NormImpl::Composed)
            .predict(&x)
            .unwrap(),
    );
    assert!(F64_VS_REFERENCE.accepts_all(&yf, &yc));
    for row in yf.chunks(8) {
        let m = row.iter().sum::<f64>() / 8.0;
        let v = row.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / 8.0;
        assert!(
            m.abs() < 1e-12 && (v - 1.0).abs() < 1e-3,
            "mean {m} var {v}"
        );
    }
    let rms = RmsNorm::<f64>::new(8).unwrap();
    let rf = vals(&rms.predict(&x).unwrap());
    let rc = vals(&rms.with_impl(NormImpl::Composed).predict(&x).unwrap());
    assert!(F64_VS_REFERENCE.accepts_all(&rf, &rc));
    let ms = rf[..8].iter().map(|a| a * a).sum::<f64>() / 8.0;
    assert!((ms - 1.0).abs() < 1e-3, "{ms}");
}

/// Same seed, same parameters; another seed, others. Param lists agree in
/// order between `params` and `params_mut`.
#[test]
fn init_is_deterministic_and_param_orders_agree() {
    let sizes = [2, 8, 8, 3];
    let a = Mlp::<f32>::new(&sizes, &MlpConfig::default(), &mut Rng::new(5)).unwrap();
    let b = Mlp::<f32>::new(&sizes, &MlpConfig::default(), &mut Rng::new(5)).unwrap();
    let mut c = Mlp::<f32>::new(&sizes, &MlpConfig::default(), &mut Rng::new(6)).unwrap();
    let flat = |m: &Mlp<f32>| -> Vec<f64> {
        m.params()
            .iter()
            .flat_map(|p| p.to_f64_vec().unwrap())
            .collect()
    };
    assert_eq!(flat(&a), flat(&b));
    assert_ne!(flat(&a), flat(&c));
    // W, b, gamma, beta per block, then the head's W, b.
    let shapes: Vec<Vec<usize>> = a.params().iter().map(|p| p.shape().to_vec()).collect();
    let want: Vec<Vec<usize>> = vec![
        vec![2, 8],
        vec![8],
        vec![8],
        vec![8],
        vec![8, 8],
        vec![8],
        vec![8],
        vec![8],
        vec![8, 3],
        vec![3],
    ];
    assert_eq!(shapes, want);
    let shapes_mut: Vec<Vec<usize>> = c.params_mut().iter().map(|p| p.shape().to_vec()).collect();
    assert_eq!(shapes_mut, want);
    assert_eq!(a.num_params(), 16 + 8 + 16 + 64 + 8 + 16 + 24 + 3);
    assert_eq!(a.bind(&Tape::new()).len(), 10);
}

/// Kaiming and Xavier uniform stay inside their bounds and have the
/// variance they promise.
#[test]
fn init_bounds_and_variance() {
    let mut rng = Rng::new(9);
    let (fi, fo) = (200, 100);
    let cases = [
        (
            Init::kaiming_relu(),
            (6.0 / fi as f64).sqrt(),
            2.0 / fi as f64,
        ),
        (
            Init::xavier(),
            (6.0 / (fi + fo) as f64).sqrt(),
            2.0 / (fi + fo) as f64,
        ),
    ];
    for (init, bound, var) in cases {
        let w: Tensor<f64> = init.tensor(&[fi, fo], fi, fo, &mut rng).unwrap();
        let v = vals(&w);
        assert!(v.iter().all(|a| a.abs() <= bound), "{init:?}");
        let m = v.iter().sum::<f64>() / v.len() as f64;
        let s = v.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / v.len() as f64;
        // 20000 samples: the sample variance is within a few percent.
        assert!((s / var - 1.0).abs() < 0.05, "{init:?}: {s} vs {var}");
    }
    let bad = Init::Uniform { lo: 1.0, hi: 0.0 }.tensor::<f32>(&[2], 1, 1, &mut rng);
    assert!(matches!(bad, Err(Error::InvalidArgument { .. })));
    let bad = Init::KaimingUniform { gain: 1.0 }.tensor::<f32>(&[2], 0, 1, &mut rng);
    assert!(matches!(bad, Err(Error::InvalidArgument { .. })));
    let bad = Init::Normal {
        mean: 0.0,
        std: f64::NAN,
    }
    .tensor::<f32>(&[2], 1, 1, &mut rng);
    assert!(matches!(bad, Err(Error::InvalidArgument { .. })));
}

// ---- Optimizers by hand ----

/// Plain SGD, SGD with weight decay, and two SGD-momentum steps.
#[test]
fn sgd_steps_by_hand() {
    let g = t64(&[2], &[0.5, 1.0]);
    let mut p = t64(&[2], &[1.0, -2.0]);
    Sgd::with_lr(0.1)
        .unwrap()
        .update(&mut [&mut p], std::slice::from_ref(&g))
        .unwrap();
    assert_eq!(vals(&p), [0.95, -2.1]);

    let mut p = t64(&[2], &[1.0, -2.0]);
    let mut sgd = Sgd::new(SgdConfig {
        lr: 0.1,
        momentum: 0.0,
        weight_decay: 0.1,
    })
    .unwrap();
    sgd.update(&mut [&mut p], std::slice::from_ref(&g)).unwrap();
    // g' = g + 0.1 p = [0.6, 0.8].
    assert!(F64_VS_REFERENCE.accepts_all(&vals(&p), &[0.94, -2.08]));

    let mut p = t64(&[2], &[1.0, -2.0]);
    let mut sgd = Sgd::new(SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 0.0,
    })
    .unwrap();
    sgd.update(&mut [&mut p], &[g]).unwrap();
    assert!(F64_VS_REFERENCE.accepts_all(&vals(&p), &[0.95, -2.1]));
    // v = 0.9 [0.5, 1] + [-1, 0.25] = [-0.55, 1.15].
    sgd.update(&mut [&mut p], &[t64(&[2], &[-1.0, 0.25])])
        .unwrap();
    assert!(F64_VS_REFERENCE.accepts_all(&vals(&p), &[1.005, -2.215]));
}

/// Two Adam steps against the bias-corrected formulas written out.
#[test]
fn adam_steps_by_hand() {
    let mut adam = Adam::new(AdamConfig {
        lr: 0.1,
        ..AdamConfig::default()
    })
    .unwrap();
    let mut p = t64(&[2], &[0.5, -1.0]);
    adam.update(&mut [&mut p], &[t64(&[2], &[0.2, -0.4])])
        .unwrap();
    assert_eq!(adam.steps(), 1);
    // Step 1: m_hat = g, v_hat = g^2, so p -= 0.1 g / (|g| + 1e-8).
    let p1 = [
        0.5 - 0.1 * 0.2 / (0.2 + 1e-8),
        -1.0 + 0.1 * 0.4 / (0.4 + 1e-8),
    ];
    assert!(F64_VS_REFERENCE.accepts_all(&vals(&p), &p1));
    adam.update(&mut [&mut p], &[t64(&[2], &[-0.1, 0.3])])
        .unwrap();
    // Step 2: m = 0.9 * 0.1 g1 + 0.1 g2, v = 0.999 * 0.001 g1^2 + 0.001 g2^2.
    let m = [0.9 * 0.02 + 0.1 * -0.1, 0.9 * -0.04 + 0.1 * 0.3];
    let v = [
        0.999 * 0.001 * 0.04 + 0.001 * 0.01,
        0.999 * 0.001 * 0.16 + 0.001 * 0.09,
    ];
    let (c1, c2) = (1.0 - 0.81, 1.0 - 0.999f64 * 0.999);
    let p2: Vec<f64> = (0..2)
        .map(|i| p1[i] - 0.1 * (m[i] / c1) / ((v[i] / c2).sqrt() + 1e-8))
        .collect();
    assert!(
        F64_VS_REFERENCE.accepts_all(&vals(&p), &p2),
        "{:?} vs {p2:?}",
        vals(&p)
    );
    adam.reset();
    assert_eq!(adam.steps(), 0);
}

/// `step` on a model is `update` with the gradients of the bound params,
/// and one SGD step on a least-squares problem lowers the loss.
/// AdamW as PyTorch's: the decay scales the weights before the Adam
/// update and never enters the moments.
#[test]
fn adamw_steps_by_hand_and_differs_from_adam_l2() {
    let (lr, b1, b2, eps, wd) = (0.1, 0.9, 0.999, 1e-8, 0.05);
    let cfg = AdamConfig {
        lr,
        beta1: b1,
        beta2: b2,
        eps,
        weight_decay: wd,
    };
    let mut opt = AdamW::new(cfg).unwrap();
    let mut p = t64(&[2], &[1.0, -2.0]);
    let grads = [[0.2, -0.4], [-0.1, 0.3]];
    let (mut w, mut m, mut v) = ([1.0f64, -2.0], [0.0f64; 2], [0.0f64; 2]);
    for (t, g) in grads.iter().enumerate() {
        opt.update(&mut [&mut p], &[t64(&[2], g)]).unwrap();
        let t = t as i32 + 1;
        for i in 0..2 {
            w[i] -= lr * wd * w[i];
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            let (mh, vh) = (m[i] / (1.0 - b1.powi(t)), v[i] / (1.0 - b2.powi(t)));
            w[i] -= lr * mh / (vh.sqrt() + eps);
        }
        for (got, want) in vals(&p).iter().zip(&w) {
            assert!((got - want).abs() <= 1e-14, "step {t}: {got} vs {want}");
        }
    }
    assert_eq!(opt.steps(), 2);
    // Adam's L2 form at the same settings lands elsewhere.
    let mut adam = Adam::new(cfg).unwrap();
    let mut q = t64(&[2], &[1.0, -2.0]);
    for g in &grads {
        adam.update(&mut [&mut q], &[t64(&[2], g)]).unwrap();
    }
    assert!((vals(&q)[0] - w[0]).abs() > 1e-4);
    assert_eq!(
        AdamW::<f32>::with_lr(1e-3).unwrap().config().weight_decay,
        0.01
    );
}

#[test]
fn step_updates_the_model() {
    let mut rng = Rng::new(4);
    let mut model = Linear::<f64>::new(3, 2, &mut rng).unwrap();
    let mut twin = model.clone();
    let w0 = vals(model.weight());
    let x = rand64(&mut rng, &[6, 3]);
    let target = rand64(&mut rng, &[6, 2]);
    let loss_of = |m: &Linear<f64>| -> f64 {
        let tape = Tape::new();
        let y = tape.constant(m.predict(&x).unwrap());
        vals(
            ops::mse(&y, &tape.constant(target.clone()))
                .unwrap()
                .value(),
        )[0]
    };
    let before = loss_of(&model);
    let tape = Tape::new();
    let p = model.bind(&tape);
    let y = model.forward(&p, &tape.constant(x.clone())).unwrap();
    let loss = ops::mse(&y, &tape.constant(target.clone())).unwrap();
    let grads = loss.backward().unwrap();
    let g = p.grads(&grads).unwrap();
    let mut opt = Sgd::with_lr(0.1).unwrap();
    opt.step(&mut model, &p, &grads).unwrap();
    Sgd::with_lr(0.1)
        .unwrap()
        .update(&mut twin.params_mut(), &g)
        .unwrap();
    for (a, b) in model.params().iter().zip(twin.params()) {
        assert_eq!(vals(a), vals(b));
    }
    assert_ne!(vals(model.weight()), w0);
    let after = loss_of(&model);
    assert!(after < before, "{before} -> {after}");
}

// ---- Errors, never panics ----

#[test]
fn layer_shape_errors() {
    let mut rng = Rng::new(1);
    let lin = Linear::<f32>::new(3, 2, &mut rng).unwrap();
    let tape = Tape::new();
    let p = lin.bind(&tape);
    let x = tape.constant(Tensor::<f32>::zeros(&[4, 5]).unwrap());
    let e = lin.forward(&p, &x).unwrap_err();
    assert_eq!(
        e,
        Error::ShapeMismatch {
            op: "Linear",
            lhs: vec![4, 5],
            rhs: vec![3]
        }
    );
    let scalar_x = tape.constant(Tensor::<f32>::scalar(1.0));
    assert!(matches!(
        lin.forward(&p, &scalar_x),
        Err(Error::ShapeMismatch { .. })
    ));

    assert!(matches!(
        Linear::<f32>::new(0, 2, &mut rng),
        Err(Error::InvalidArgument { .. })
    ));
    let w = Tensor::<f32>::zeros(&[3, 2]).unwrap();
    let b = Tensor::<f32>::zeros(&[3]).unwrap();
    assert_eq!(
        Linear::from_tensors(w, Some(b)).unwrap_err(),
        Error::ShapeMismatch {
            op: "Linear::from_tensors",
            lhs: vec![3],
            rhs: vec![2]
        }
    );
    let w3 = Tensor::<f32>::zeros(&[3, 2, 1]).unwrap();
    assert!(matches!(
        Linear::from_tensors(w3, None),
        Err(Error::InvalidArgument { .. })
    ));

    let ln = LayerNorm::<f32>::new(4).unwrap();
    let x = tape.constant(Tensor::<f32>::zeros(&[2, 3]).unwrap());
    assert!(matches!(
        ln.forward(&ln.bind(&tape), &x),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        LayerNorm::<f32>::with_options(4, 0.0, true),
        Err(Error::BadEps { .. })
    ));
    assert!(matches!(
        RmsNorm::<f32>::with_options(4, f64::NAN, true),
        Err(Error::BadEps { .. })
    ));
    assert!(matches!(
        LayerNorm::<f32>::new(0),
        Err(Error::EmptyNormalized { .. })
    ));
    assert!(matches!(
        Mlp::<f32>::new(&[3], &MlpConfig::default(), &mut rng),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        Mlp::<f32>::new(&[3, 0, 2], &MlpConfig::default(), &mut rng),
        Err(Error::InvalidArgument { .. })
    ));
}

/// A Bound that does not fit the module, or a parameter reshaped behind the
/// module's back, is an error.
#[test]
fn bound_mismatch_errors() {
    let mut rng = Rng::new(2);
    let a = Linear::<f32>::new(3, 2, &mut rng).unwrap();
    let b = (
        Linear::<f32>::new(3, 2, &mut rng).unwrap(),
        LayerNorm::new(2).unwrap(),
    );
    let c = Linear::<f32>::with_init(3, 2, false, Init::xavier(), Init::Zeros, &mut rng).unwrap();
    let tape = Tape::new();
    let x = tape.constant(Tensor::<f32>::zeros(&[1, 3]).unwrap());
    // Too many entries.
    assert!(matches!(
        a.forward(&b.bind(&tape), &x),
        Err(Error::InvalidArgument { .. })
    ));
    // Too few.
    assert!(matches!(
        b.forward(&a.bind(&tape), &x),
        Err(Error::InvalidArgument { .. })
    ));
    // Right count, wrong shape: c's weight against a's [3, 2] weight is fine,
    // but a's bias is one too many for c.
    assert!(matches!(
        c.forward(&a.bind(&tape), &x),
        Err(Error::InvalidArgument { .. })
    ));
    let d = Linear::<f32>::new(2, 3, &mut rng).unwrap();
    let x2 = tape.constant(Tensor::<f32>::zeros(&[1, 2]).unwrap());
    assert!(matches!(
        d.forward(&a.bind(&tape), &x2),
        Err(Error::ShapeMismatch { .. })
    ));
    // A Bound on another tape.
    let other = Tape::new();
    assert!(matches!(
        a.forward(&a.bind(&other), &x),
        Err(Error::TapeMismatch { .. })
    ));
    // A parameter replaced by one of another shape.
    let mut e = a.clone();
    *e.params_mut()[0] = Tensor::<f32>::scalar(1.0);
    assert!(matches!(
        e.predict(&Tensor::<f32>::zeros(&[1, 3]).unwrap()),
        Err(Error::ShapeMismatch { .. })
    ));
}

/// Optimizer errors are checked before anything changes.
#[test]
fn optimizer_errors_leave_params_untouched() {
    let mut p = Tensor::<f32>::from_vec(vec![2, 3], vec![1.; 6]).unwrap();
    let mut q = Tensor::<f32>::from_vec(vec![2], vec![2.; 2]).unwrap();
    let good = Tensor::<f32>::zeros(&[2, 3]).unwrap();
    let bad = Tensor::<f32>::zeros(&[3, 2]).unwrap();
    let mut adam = Adam::<f32>::with_lr(0.1).unwrap();
    // The second gradient has the wrong shape: neither parameter moves.
    let e = adam.update(
        &mut [&mut q, &mut p],
        &[Tensor::full(&[2], 1.0).unwrap(), bad.clone()],
    );
    assert_eq!(
        e.unwrap_err(),
        Error::ShapeMismatch {
            op: "Adam::step",
            lhs: vec![2, 3],
            rhs: vec![3, 2]
        }
    );
    assert_eq!(q.to_f64_vec().unwrap(), [2.0, 2.0]);
    assert_eq!(adam.steps(), 0);
    let e = Sgd::<f32>::with_lr(0.1)
        .unwrap()
        .update(&mut [&mut p], &[good.clone(), good.clone()]);
    assert!(matches!(e, Err(Error::InvalidArgument { .. })));
    assert_eq!(p.to_f64_vec().unwrap(), [1.0; 6]);
    // State built for one parameter set, then used on another.
    let mut sgd = Sgd::<f32>::new(SgdConfig {
        momentum: 0.9,
        ..SgdConfig::default()
    })
    .unwrap();
    sgd.update(&mut [&mut p], std::slice::from_ref(&good))
        .unwrap();
    assert!(matches!(
        sgd.update(&mut [&mut q], &[Tensor::zeros(&[2]).unwrap()]),
        Err(Error::InvalidArgument { .. })
    ));
    sgd.reset();
    sgd.update(&mut [&mut q], &[Tensor::zeros(&[2]).unwrap()])
        .unwrap();
    adam.update(&mut [&mut p], &[good]).unwrap();
    assert!(matches!(
        adam.update(&mut [&mut q], &[Tensor::zeros(&[2]).unwrap()]),
        Err(Error::InvalidArgument { .. })
    ));
    // Bad hyperparameters.
    assert!(Sgd::<f32>::with_lr(f64::NAN).is_err());
    assert!(Sgd::<f32>::with_lr(-1.0).is_err());
    assert!(Adam::<f32>::new(AdamConfig {
        beta1: 1.0,
        ..AdamConfig::default()
    })
    .is_err());
    assert!(Adam::<f32>::new(AdamConfig {
        eps: 0.0,
        ..AdamConfig::default()
    })
    .is_err());
    assert!(Adam::<f32>::with_lr(0.1)
        .unwrap()
        .set_lr(f64::INFINITY)
        .is_err());
}

/// Stepping with frozen (constant) parameters is an error, not a silent
/// no-op.
#[test]
fn step_with_frozen_bound_is_an_error() {
    let mut rng = Rng::new(8);
    let mut lin = Linear::<f32>::new(2, 2, &mut rng).unwrap();
    let tape = Tape::new();
    let p = lin.bind_frozen(&tape);
    let x = tape.var(Tensor::<f32>::zeros(&[1, 2]).unwrap());
    let loss = ops::sum(&lin.forward(&p, &x).unwrap()).unwrap();
    let grads = loss.backward().unwrap();
    let e = Sgd::with_lr(0.1).unwrap().step(&mut lin, &p, &grads);
    assert!(matches!(e, Err(Error::NoGradient { .. })));
}

/// A tuple `(Linear, LayerNorm, GELU, Linear)` has the parameter order of
/// a one-hidden-layer Mlp, so it runs on the Mlp's bound parameters and
/// gives the same output.
#[test]
fn tuple_of_modules_matches_mlp() {
    let mut rng = Rng::new(21);
    let mlp = Mlp::<f64>::new(&[2, 8, 3], &MlpConfig::default(), &mut rng).unwrap();
    let seq = (
        Linear::<f64>::new(2, 8, &mut rng).unwrap(),
        LayerNorm::new(8).unwrap(),
        Activation::Gelu,
        Linear::new(8, 3, &mut rng).unwrap(),
    );
    assert_eq!(seq.num_params(), mlp.num_params());
    let tape = Tape::new();
    let p = mlp.bind(&tape);
    let x = tape.constant(rand64(&mut rng, &[5, 2]));
    let a = mlp.forward(&p, &x).unwrap();
    let b = seq.forward(&p, &x).unwrap();
    assert_eq!(b.shape(), [5, 3]);
    assert_eq!(vals(a.value()), vals(b.value()));
    // With its own parameters the tuple computes something else.
    assert_ne!(vals(a.value()), vals(&seq.predict(x.value()).unwrap()));
}

/// `step_clipped` is `clip_grad_norm` then `update`, and returns the norm
/// before clipping; a non-finite norm leaves the model as it was.
#[test]
fn step_clipped_clips_then_updates_and_skips_a_non_finite_norm() {
    use fusegrad::nn::clip_grad_norm;
    let mut rng = Rng::new(5);
    let model = Linear::<f64>::new(3, 2, &mut rng).unwrap();
    let x = rand64(&mut rng, &[4, 3]);
    let loss_of = |m: &Linear<f64>, tape: &Tape<f64>| {
        let p = m.bind(tape);
        let y = m.forward(&p, &tape.constant(x.clone())).unwrap();
        let l = ops::sum(&ops::mul(&y, &y).unwrap()).unwrap();
        (p, l)
    };
    // By hand: the gradients, clipped to 0.1, then AdamW.
    let mut by_hand = model.clone();
    let tape = Tape::new();
    let (p, l) = loss_of(&by_hand, &tape);
    let mut g = p.grads(&l.backward().unwrap()).unwrap();
    let norm = clip_grad_norm(&mut g, 0.1).unwrap();
    assert!(norm > 0.1, "the case must clip: norm {norm}");
    let mut opt = AdamW::with_lr(1e-2).unwrap();
    opt.update(&mut by_hand.params_mut(), &g).unwrap();
    // In one call.
    let mut stepped = model.clone();
    let tape = Tape::new();
    let (p, l) = loss_of(&stepped, &tape);
    let mut opt = AdamW::with_lr(1e-2).unwrap();
    let got = opt
        .step_clipped(&mut stepped, &p, &l.backward().unwrap(), 0.1)
        .unwrap();
    assert_eq!(got, norm);
    for (a, b) in by_hand.params().iter().zip(stepped.params()) {
        assert_eq!(vals(a), vals(b));
    }
    assert_ne!(vals(stepped.params()[0]), vals(model.params()[0]));
    // A NaN input gives a NaN norm: the step is skipped, nothing changes.
    let mut kept = model.clone();
    let tape = Tape::new();
    let p = kept.bind(&tape);
    let nan = Tensor::from_vec(vec![1, 3], vec![f64::NAN, 1.0, 2.0]).unwrap();
    let y = kept.forward(&p, &tape.constant(nan)).unwrap();
    let l = ops::sum(&y).unwrap();
    let mut opt = AdamW::with_lr(1e-2).unwrap();
    let n = opt
        .step_clipped(&mut kept, &p, &l.backward().unwrap(), 1.0)
        .unwrap();
    assert!(n.is_nan());
    for (a, b) in kept.params().iter().zip(model.params()) {
        assert_eq!(vals(a), vals(b));
    }
    // A bad max_norm is an error before anything changes.
    let e = opt
        .step_clipped(&mut kept, &p, &l.backward().unwrap(), -1.0)
        .unwrap_err();
    assert!(e.to_string().contains("max_norm"), "{e}");
}
