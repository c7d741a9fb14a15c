//! Every op on the GPU against the CPU: forward values and the gradients of
//! every input under a random cotangent, for f32, f64, f16 and bf16; two
//! GPU runs give the same bits; mixed devices are errors. Without a CUDA
//! driver they run on the CPU emulation of `tests/cuda_emu` (the kernels'
//! own code, compiled for the host); where that cannot be built either,
//! each test prints why it skipped.

use crate::cuda_emu::gpu;

use fusegrad::mask::causal_mask;
use fusegrad::rng::Rng;
use fusegrad::{ops, Device, Element, Error, Result, Tape, Tensor, Var};

type OpFn<T> = fn(&[Var<T>]) -> Result<Var<T>>;

/// An op under test: its input shapes, whether inputs must be positive
/// (log, sqrt), and the op.
struct Case<T: Element> {
    name: &'static str,
    shapes: Vec<Vec<usize>>,
    positive: bool,
    f: OpFn<T>,
}

fn case<T: Element>(
    name: &'static str,
    shapes: &[&[usize]],
    positive: bool,
    f: OpFn<T>,
) -> Case<T> {
    Case {
        name,
        shapes: shapes.iter().map(|s| s.to_vec()).collect(),
        positive,
        f,
    }
}

fn cases<T: Element>() -> Vec<Case<T>> {
    vec![
        case("add broadcast", &[&[4, 3, 5], &[3, 1]], false, |v| {
            ops::add(&v[0], &v[1])
        }),
        case("sub", &[&[7, 9], &[7, 9]], false, |v| {
            ops::sub(&v[0], &v[1])
        }),
        case("mul broadcast", &[&[2, 3, 4], &[4]], false, |v| {
            ops::mul(&v[0], &v[1])
        }),
        case("mul same shape", &[&[33, 17], &[33, 17]], false, |v| {
            ops::mul(&v[0], &v[1])
        }),
        case("div", &[&[5, 6], &[5, 6]], true, |v| ops::div(&v[0], &v[1])),
        case("neg", &[&[10]], false, |v| ops::neg(&v[0])),
        case("scalar ops", &[&[3, 8]], false, |v| {
            ops::scalar_add(&ops::scalar_mul(&v[0], 1.5)?, -0.25)
        }),
        case("powi", &[&[40]], false, |v| ops::powi(&v[0], 3)),
        case("sqrt", &[&[40]], true, |v| ops::sqrt(&v[0])),
        case("rsqrt", &[&[40]], true, |v| ops::rsqrt(&v[0])),
        case("exp", &[&[40]], false, |v| ops::exp(&v[0])),
        case("log", &[&[40]], true, |v| ops::log(&v[0])),
        case("tanh", &[&[40]], false, |v| ops::tanh(&v[0])),
        case("sigmoid", &[&[40]], false, |v| ops::sigmoid(&v[0])),
        case("relu", &[&[70]], false, |v| ops::relu(&v[0])),
        case("gelu", &[&[40]], false, |v| ops::gelu(&v[0])),
        case("gelu_tanh", &[&[40]], false, |v| ops::gelu_tanh(&v[0])),
        case("sum", &[&[6, 7]], false, |v| ops::sum(&v[0])),
        case("mean", &[&[6, 7]], false, |v| ops::mean(&v[0])),
        case("sum_axes last", &[&[5, 300]], false, |v| {
            ops::sum_axes(&v[0], &[-1], false)
        }),
        case("sum_axes first", &[&[300, 5]], false, |v| {
            ops::sum_axes(&v[0], &[0], true)
        }),
        case("mean_axes middle", &[&[3, 4, 5]], false, |v| {
            ops::mean_axes(&v[0], &[1], false)
        }),
        case("softmax last", &[&[4, 50]], false, |v| {
            ops::softmax(&v[0], -1)
        }),
        case("log_softmax last", &[&[4, 2000]], false, |v| {
            ops::log_softmax(&v[0], -1)
        }),
        case("softmax axis 0", &[&[6, 5]], false, |v| {
            ops::softmax(&v[0], 0)
        }),
        case(
            "attention causal",
            &[&[2, 3, 37, 8], &[2, 3, 37, 8], &[2, 3, 37, 8]],
            false,
            |v| ops::attention(&v[0], &v[1], &v[2], true, 0.35),
        ),
        case(
            "attention full, two columns per lane",
            &[&[1, 2, 20, 40], &[1, 2, 20, 40], &[1, 2, 20, 40]],
            false,
            |v| ops::attention(&v[0], &v[1], &v[2], false, 0.15),
        ),
        case("attention_qkv causal", &[&[2, 33, 96]], false, |v| {
            ops::attention_qkv(&v[0], 2, true, 0.25)
        }),
        case("attention_qkv head_dim 64", &[&[1, 9, 192]], false, |v| {
            ops::attention_qkv(&v[0], 1, false, 0.125)
        }),
        case("mse", &[&[8, 3], &[8, 3]], false, |v| {
            ops::mse(&v[0], &v[1])
        }),
        case("cross_entropy", &[&[6, 11]], false, |v| {
            ops::cross_entropy(&v[0], &[0, 3, 10, 5, 5, 1])
        }),
        case("matmul", &[&[5, 7], &[7, 3]], false, |v| {
            ops::matmul(&v[0], &v[1])
        }),
        case(
            "batched matmul, shared weight",
            &[&[2, 4, 5, 6], &[6, 3]],
            false,
            |v| ops::matmul(&v[0], &v[1]),
        ),
        case(
            "batched matmul, partial broadcast",
            &[&[2, 1, 3, 4], &[1, 3, 4, 2]],
            false,
            |v| ops::matmul(&v[0], &v[1]),
        ),
        case("transpose", &[&[3, 4, 5]], false, |v| {
            ops::transpose(&v[0], 0, 2)
        }),
        case("permute", &[&[2, 3, 4, 5]], false, |v| {
            ops::permute(&v[0], &[2, 0, 3, 1])
        }),
        case("reshape", &[&[6, 4]], false, |v| {
            ops::reshape(&v[0], &[2, 12])
        }),
        case("broadcast_to", &[&[3, 1]], false, |v| {
            ops::broadcast_to(&v[0], &[2, 3, 4])
        }),
        case("narrow", &[&[4, 9, 3]], false, |v| {
            ops::narrow(&v[0], 1, 2, 5)
        }),
        case("concat", &[&[2, 3, 4], &[2, 5, 4]], false, |v| {
            ops::concat(&[&v[0], &v[1]], 1)
        }),
        case("embedding", &[&[10, 6]], false, |v| {
            ops::embedding(&v[0], &[3, 1, 3, 9, 0, 3], &[2, 3])
        }),
        case("masked_fill causal", &[&[2, 5, 5]], false, |v| {
            ops::masked_fill(&v[0], &causal_mask(5)?, -1e4)
        }),
        case("dropout", &[&[9, 13]], false, |v| {
            ops::dropout(&v[0], 0.3, &mut Rng::new(7), true)
        }),
        case("layer_norm", &[&[9, 70], &[70], &[70]], false, |v| {
            ops::layer_norm(&v[0], Some(&v[1]), Some(&v[2]), 1e-5)
        }),
        case(
            "layer_norm wide",
            &[&[3, 5000], &[5000], &[5000]],
            false,
            |v| ops::layer_norm(&v[0], Some(&v[1]), Some(&v[2]), 1e-5),
        ),
        case("layer_norm no affine", &[&[4, 33]], false, |v| {
            ops::layer_norm(&v[0], None, None, 1e-5)
        }),
        case(
            "layer_norm composed",
            &[&[9, 70], &[70], &[70]],
            false,
            |v| ops::layer_norm_composed(&v[0], Some(&v[1]), Some(&v[2]), 1e-5),
        ),
        case("rms_norm", &[&[9, 70], &[70]], false, |v| {
            ops::rms_norm(&v[0], Some(&v[1]), 1e-6)
        }),
        case("rms_norm composed", &[&[9, 70], &[70]], false, |v| {
            ops::rms_norm_composed(&v[0], Some(&v[1]), 1e-6)
        }),
    ]
}

/// Relative tolerance per element type (values and gradients are O(1)).
fn tol<T: Element>() -> f64 {
    match T::NAME {
        "f64" => 1e-9,
        "f32" => 2e-4,
        "f16" => 2e-2,
        _ => 6e-2,
    }
}

fn random<T: Element>(rng: &mut Rng, shape: &[usize], positive: bool) -> Tensor<T> {
    let n: usize = shape.iter().product();
    let v = (0..n)
        .map(|_| {
            let x = rng.normal();
            T::from_f64(if positive { x.abs() + 0.5 } else { x })
        })
        .collect();
    Tensor::from_vec(shape.to_vec(), v).unwrap()
}

/// The output and the gradients of every input, all on the host.
fn run<T: Element>(c: &Case<T>, dev: Device, seed: u64) -> Result<Vec<Vec<f64>>> {
    let mut rng = Rng::new(seed);
    let inputs: Vec<Tensor<T>> = c
        .shapes
        .iter()
        .map(|s| random(&mut rng, s, c.positive))
        .collect();
    let tape = Tape::new();
    let mut vars = Vec::new();
    for t in &inputs {
        vars.push(tape.var_on(t.clone(), dev)?);
    }
    let y = (c.f)(&vars)?;
    assert_eq!(
        y.value().device(),
        dev,
        "{}: output on the wrong device",
        c.name
    );
    let cot = random::<T>(&mut rng, y.shape(), false).to_device(dev)?;
    let grads = y.backward_with(&cot)?;
    let mut out = vec![y.value().to_f64_vec()?];
    for v in &vars {
        let g = grads.wrt(v)?;
        assert_eq!(g.device(), dev, "{}: gradient on the wrong device", c.name);
        out.push(g.to_f64_vec()?);
    }
    Ok(out)
}

fn close(name: &str, what: &str, a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "{name} {what}: lengths");
    let scale = a.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let ok = (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol * scale;
        assert!(
            ok,
            "{name} {what}[{i}]: cpu {x} vs cuda {y} (tol {tol} x {scale})"
        );
    }
}

fn every_op<T: Element>() {
    let Some(dev) = gpu() else { return };
    for (k, c) in cases::<T>().iter().enumerate() {
        let seed = 1000 + k as u64;
        let cpu = run(c, Device::Cpu, seed).unwrap_or_else(|e| panic!("{} cpu: {e}", c.name));
        let gpu = run(c, dev, seed).unwrap_or_else(|e| panic!("{} cuda {}: {e}", c.name, T::NAME));
        let label = format!("{} ({})", c.name, T::NAME);
        for (i, (a, b)) in cpu.iter().zip(&gpu).enumerate() {
            let what = if i == 0 {
                "forward".to_string()
            } else {
                format!("grad {}", i - 1)
            };
            close(&label, &what, a, b, tol::<T>());
        }
        // Deterministic: a second run gives the same bits.
        let again = run(c, dev, seed).unwrap();
        for (a, b) in gpu.iter().zip(&again) {
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{label}: two GPU runs differ");
        }
    }
}

#[test]
fn every_op_matches_the_cpu_f32() {
    every_op::<f32>();
}

#[test]
fn every_op_matches_the_cpu_f64() {
    every_op::<f64>();
}

#[test]
fn every_op_matches_the_cpu_f16() {
    every_op::<half::f16>();
}

#[test]
fn every_op_matches_the_cpu_bf16() {
    every_op::<half::bf16>();
}

#[test]
fn mixed_devices_are_errors_naming_both() {
    let Some(dev) = gpu() else { return };
    let tape = Tape::<f32>::new();
    let a = tape.var(Tensor::from_vec(vec![2], vec![1.0, 2.0]).unwrap());
    let b = tape.var(a.value().to_device(dev).unwrap());
    match ops::add(&a, &b) {
        Err(Error::DeviceMismatch { op, lhs, rhs }) => {
            assert!(!op.is_empty());
            assert_eq!((lhs.as_str(), rhs.as_str()), ("cpu", "cuda:0"));
        }
        other => panic!(
            "expected DeviceMismatch, got {:?}",
            other.map(|v| v.shape().to_vec())
        ),
    }
    // Round trip: host -> GPU -> host keeps every bit.
    let back = b.value().to_device(Device::Cpu).unwrap();
    assert_eq!(back.as_slice().unwrap(), a.value().as_slice().unwrap());
    assert!(
        b.value().as_slice().is_err(),
        "as_slice of GPU data must be an error"
    );
}

#[test]
fn fused_and_composed_layer_norm_agree_on_the_gpu() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng::new(5);
    let (n, d) = (64, 768);
    let x = random::<f32>(&mut rng, &[n, d], false)
        .to_device(dev)
        .unwrap();
    let gm = random::<f32>(&mut rng, &[d], false).to_device(dev).unwrap();
    let bt = random::<f32>(&mut rng, &[d], false).to_device(dev).unwrap();
    let cot = random::<f32>(&mut rng, &[n, d], false)
        .to_device(dev)
        .unwrap();
    let mut outs = Vec::new();
    for composed in [false, true] {
        let tape = Tape::new();
        let (xv, gv, bv) = (
            tape.var(x.clone()),
            tape.var(gm.clone()),
            tape.var(bt.clone()),
        );
        let y = if composed {
            ops::layer_norm_composed(&xv, Some(&gv), Some(&bv), 1e-5)
        } else {
            ops::layer_norm(&xv, Some(&gv), Some(&bv), 1e-5)
        }
        .unwrap();
        let g = y.backward_with(&cot).unwrap();
        outs.push([
            y.value().to_f64_vec().unwrap(),
            g.wrt(&xv).unwrap().to_f64_vec().unwrap(),
            g.wrt(&gv).unwrap().to_f64_vec().unwrap(),
            g.wrt(&bv).unwrap().to_f64_vec().unwrap(),
        ]);
    }
    for (i, what) in ["y", "dx", "dgamma", "dbeta"].iter().enumerate() {
        close("fused vs composed", what, &outs[0][i], &outs[1][i], 1e-4);
    }
}

/// The fused attention on the GPU against its composed twin on the GPU,
/// in f64, both layouts, with a random cotangent; a head_dim past the
/// kernel's 64 is an error naming it.
#[test]
fn fused_and_composed_attention_agree_on_the_gpu_in_f64() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng::new(6);
    for (packed, causal) in [(false, true), (true, true), (true, false)] {
        let shape: &[usize] = if packed {
            &[2, 41, 3 * 3 * 8]
        } else {
            &[2, 3, 41, 8]
        };
        let n = if packed { 1 } else { 3 };
        let xs: Vec<Tensor<f64>> = (0..n)
            .map(|_| {
                random::<f64>(&mut rng, shape, false)
                    .to_device(dev)
                    .unwrap()
            })
            .collect();
        let mut outs = Vec::new();
        for composed in [false, true] {
            let tape = Tape::new();
            let vs: Vec<Var<f64>> = xs.iter().map(|x| tape.var(x.clone())).collect();
            let y = match (packed, composed) {
                (true, false) => ops::attention_qkv(&vs[0], 3, causal, 0.3),
                (true, true) => ops::attention_qkv_composed(&vs[0], 3, causal, 0.3),
                (false, false) => ops::attention(&vs[0], &vs[1], &vs[2], causal, 0.3),
                (false, true) => ops::attention_composed(&vs[0], &vs[1], &vs[2], causal, 0.3),
            }
            .unwrap();
            assert_eq!(y.value().device(), dev);
            let cot = random::<f64>(&mut Rng::new(9), y.shape(), false)
                .to_device(dev)
                .unwrap();
            let g = y.backward_with(&cot).unwrap();
            let mut o = vec![y.value().to_f64_vec().unwrap()];
            for v in &vs {
                o.push(g.wrt(v).unwrap().to_f64_vec().unwrap());
            }
            outs.push(o);
        }
        for (i, (a, b)) in outs[0].iter().zip(&outs[1]).enumerate() {
            close(
                "attention fused vs composed",
                &format!("output {i}"),
                a,
                b,
                1e-12,
            );
        }
    }
    let tape = Tape::<f32>::new();
    let x = tape.var(
        Tensor::zeros(&[1, 4, 3 * 65])
            .unwrap()
            .to_device(dev)
            .unwrap(),
    );
    match ops::attention_qkv(&x, 1, true, 1.0) {
        Err(Error::Cuda { op, msg, .. }) => {
            assert_eq!(op, "attention_qkv");
            assert!(msg.contains("head_dim 65"), "{msg}");
        }
        other => panic!(
            "expected Error::Cuda, got {:?}",
            other.map(|v| v.shape().to_vec())
        ),
    }
}

#[test]
fn adamw_training_steps_on_the_gpu_match_the_cpu() {
    use fusegrad::nn::{AdamW, Linear, Module, Optimizer, Parameters};
    let Some(dev) = gpu() else { return };
    let mut rng = Rng::new(11);
    let x = random::<f32>(&mut rng, &[16, 8], false);
    let target = random::<f32>(&mut rng, &[16, 4], false);
    let base = Linear::<f32>::new(8, 4, &mut Rng::new(3)).unwrap();
    let mut finals = Vec::new();
    for device in [Device::Cpu, dev] {
        let mut model = base.clone();
        model.to_device(device).unwrap();
        let mut opt = AdamW::<f32>::with_lr(1e-2).unwrap();
        let (xd, td) = (
            x.to_device(device).unwrap(),
            target.to_device(device).unwrap(),
        );
        let mut losses = Vec::new();
        for _ in 0..3 {
            let tape = Tape::new();
            let bound = model.bind(&tape);
            let y = model.forward(&bound, &tape.constant(xd.clone())).unwrap();
            let loss = ops::mse(&y, &tape.constant(td.clone())).unwrap();
            losses.push(loss.value().to_f64_vec().unwrap()[0]);
            let grads = loss.backward().unwrap();
            opt.step(&mut model, &bound, &grads).unwrap();
        }
        for p in model.params() {
            assert_eq!(p.device(), device, "parameter left its device");
        }
        let params: Vec<f64> = model
            .params()
            .iter()
            .flat_map(|p| p.to_f64_vec().unwrap())
            .collect();
        finals.push((losses, params));
    }
    close("adamw", "losses", &finals[0].0, &finals[1].0, 1e-4);
    close("adamw", "params", &finals[0].1, &finals[1].1, 1e-4);
}

/// Infinities, NaN, signed zeros, large and subnormal inputs through the
/// unary ops: the GPU gives the CPU's NaNs and infinities, and its finite
/// values within tolerance.
#[test]
fn special_values_match_the_cpu() {
    let Some(dev) = gpu() else { return };
    let xs = vec![
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        0.0,
        -0.0,
        40.0,
        -40.0,
        1e-40,
        -3.5,
    ];
    type Unary = fn(&Var<f32>) -> Result<Var<f32>>;
    let unary: [(&str, Unary); 10] = [
        ("neg", ops::neg),
        ("exp", ops::exp),
        ("log", ops::log),
        ("sqrt", ops::sqrt),
        ("rsqrt", ops::rsqrt),
        ("tanh", ops::tanh),
        ("sigmoid", ops::sigmoid),
        ("relu", ops::relu),
        ("gelu", ops::gelu),
        ("gelu_tanh", ops::gelu_tanh),
    ];
    for (name, f) in unary {
        let mut outs = Vec::new();
        for d in [Device::Cpu, dev] {
            let tape = Tape::new();
            let x = tape
                .var_on(Tensor::from_vec(vec![xs.len()], xs.clone()).unwrap(), d)
                .unwrap();
            let y = f(&x).unwrap();
            let cot = Tensor::from_vec(vec![xs.len()], vec![0.75f32; xs.len()]).unwrap();
            let g = y.backward_with(&cot.to_device(d).unwrap()).unwrap();
            outs.push([
                y.value().to_f64_vec().unwrap(),
                g.wrt(&x).unwrap().to_f64_vec().unwrap(),
            ]);
        }
        for (k, what) in ["forward", "grad"].iter().enumerate() {
            for (i, (a, b)) in outs[0][k].iter().zip(&outs[1][k]).enumerate() {
                let ok = if a.is_nan() || a.is_infinite() || *a == 0.0 {
                    a.is_nan() && b.is_nan() || a == b
                } else {
                    // A gradient made from the saved output (tanh, sigmoid)
                    // cancels as the output saturates: a 1-ulp difference
                    // in y moves `g (1 - y^2)` by about `2 g 2^-24`,
                    // absolute (g = 0.75), whatever its size.
                    let cancel = if k == 1 { 1e-6 } else { 0.0 };
                    (a - b).abs() <= 1e-5 * a.abs().max(1e-30) + cancel
                };
                assert!(ok, "{name} {what} at x = {}: cpu {a} vs cuda {b}", xs[i]);
            }
        }
    }
}

#[test]
fn a_checkpoint_of_a_gpu_run_loads_onto_each_device_and_resumes_exactly() {
    use fusegrad::nn::{
        load_checkpoint, AdamW, Checkpoints, Linear, Module, Optimizer, Parameters, TrainState,
    };
    let Some(dev) = gpu() else { return };
    let mut rng = Rng::new(12);
    let x = random::<f32>(&mut rng, &[16, 8], false)
        .to_device(dev)
        .unwrap();
    let target = random::<f32>(&mut rng, &[16, 4], false)
        .to_device(dev)
        .unwrap();
    let step = |model: &mut Linear<f32>, opt: &mut AdamW<f32>| {
        let tape = Tape::new();
        let bound = model.bind(&tape);
        let y = model.forward(&bound, &tape.constant(x.clone())).unwrap();
        let loss = ops::mse(&y, &tape.constant(target.clone())).unwrap();
        let grads = loss.backward().unwrap();
        opt.step(model, &bound, &grads).unwrap();
    };
    let fresh = || {
        let mut m = Linear::<f32>::new(8, 4, &mut Rng::new(4)).unwrap();
        m.to_device(dev).unwrap();
        (m, AdamW::<f32>::with_lr(1e-2).unwrap())
    };
    let (mut a, mut oa) = fresh();
    step(&mut a, &mut oa);
    step(&mut a, &mut oa);
    let dir = std::env::temp_dir().join(format!("fusegrad-{}-gpu-ckpt", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let state = TrainState {
        step: 2,
        ..TrainState::new()
    };
    Checkpoints::new(&dir).save(&a, &oa, &state).unwrap();
    let flat = |m: &Linear<f32>| -> Vec<u32> {
        m.params()
            .iter()
            .flat_map(|p| p.to_vec().unwrap())
            .map(f32::to_bits)
            .collect()
    };
    // Onto the GPU: parameters and moments on the device, and the next step
    // is the step the saved run takes.
    let (mut b, mut ob) = fresh();
    load_checkpoint(&dir, &mut b, &mut ob, &Default::default()).unwrap();
    let moments = ob.state_dict().unwrap();
    assert!(moments
        .buffers
        .iter()
        .flatten()
        .all(|(_, t)| t.device() == dev));
    assert!(b.params().iter().all(|p| p.device() == dev));
    step(&mut a, &mut oa);
    step(&mut b, &mut ob);
    assert_eq!(flat(&b), flat(&a), "a resumed GPU step differs");
    // Onto the CPU: the same values.
    let mut c = Linear::<f32>::new(8, 4, &mut Rng::new(5)).unwrap();
    let mut oc = AdamW::<f32>::with_lr(1e-2).unwrap();
    let back = load_checkpoint(&dir, &mut c, &mut oc, &Default::default()).unwrap();
    assert_eq!(back.step, 2);
    assert!(c.params().iter().all(|p| p.device() == Device::Cpu));
    let cpu_moments = oc.state_dict().unwrap();
    for (g, h) in moments
        .buffers
        .iter()
        .flatten()
        .zip(cpu_moments.buffers.iter().flatten())
    {
        assert_eq!(g.1.to_vec().unwrap(), h.1.to_vec().unwrap(), "{}", g.0);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
