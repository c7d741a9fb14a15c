//! The fused LayerNorm/RMSNorm kernels on the device: fused CUDA against
//! composed CUDA against fused CPU for every dtype; the edge cases the CPU
//! handles (D = 1, constant rows, offsets of 1e8, rows of 1e30 and 1e-30,
//! odd and very large D, N = 0, no affine, NaN); f64 finite differences on
//! the device; and the same bits from two runs. Without a CUDA driver these
//! run on the CPU emulation (`tests/cuda_emu`).

use crate::cuda_emu::gpu;

use fusegrad::rng::Rng;
use fusegrad::{ops, Device, Element, Result, Tape, Tensor, Var};

#[derive(Clone, Copy, PartialEq, Debug)]
enum Norm {
    Layer,
    LayerComposed,
    Rms,
    RmsComposed,
}

/// y and the gradients of x, gamma and beta (those that exist) under the
/// cotangent `cot`, all on the host.
fn run<T: Element>(
    norm: Norm,
    dev: Device,
    x: &Tensor<T>,
    affine: bool,
    cot: &Tensor<T>,
) -> Result<Vec<Vec<f64>>> {
    let d = *x.shape().last().unwrap();
    let tape = Tape::new();
    let xv = tape.var_on(x.clone(), dev)?;
    let mut rng = Rng::new(91);
    let param = |rng: &mut Rng| -> Result<Var<T>> {
        let v = (0..d)
            .map(|_| T::from_f64(1.0 + 0.5 * rng.normal()))
            .collect();
        tape.var_on(Tensor::from_vec(vec![d], v)?, dev)
    };
    let (g, b) = if affine {
        (Some(param(&mut rng)?), Some(param(&mut rng)?))
    } else {
        (None, None)
    };
    let y = match norm {
        Norm::Layer => ops::layer_norm(&xv, g.as_ref(), b.as_ref(), 1e-5)?,
        Norm::LayerComposed => ops::layer_norm_composed(&xv, g.as_ref(), b.as_ref(), 1e-5)?,
        Norm::Rms => ops::rms_norm(&xv, g.as_ref(), 1e-6)?,
        Norm::RmsComposed => ops::rms_norm_composed(&xv, g.as_ref(), 1e-6)?,
    };
    let grads = y.backward_with(&cot.to_device(dev)?)?;
    let mut out = vec![y.value().to_f64_vec()?, grads.wrt(&xv)?.to_f64_vec()?];
    if let Some(g) = &g {
        out.push(grads.wrt(g)?.to_f64_vec()?);
    }
    if let (Some(b), Norm::Layer | Norm::LayerComposed) = (&b, norm) {
        out.push(grads.wrt(b)?.to_f64_vec()?);
    }
    Ok(out)
}

fn tensor<T: Element>(shape: &[usize], f: impl FnMut(usize) -> f64) -> Tensor<T> {
    let n: usize = shape.iter().product();
    Tensor::from_vec(shape.to_vec(), (0..n).map(f).map(T::from_f64).collect()).unwrap()
}

fn normal<T: Element>(rng: &mut Rng, shape: &[usize]) -> Tensor<T> {
    tensor(shape, |_| rng.normal())
}

/// Elementwise agreement relative to the larger magnitude of `a`; NaN
/// only where the reference has NaN.
fn close(label: &str, a: &[Vec<f64>], b: &[Vec<f64>], tol: f64) {
    assert_eq!(a.len(), b.len(), "{label}: outputs");
    for (k, (a, b)) in a.iter().zip(b).enumerate() {
        assert_eq!(a.len(), b.len(), "{label} output {k}: lengths");
        let scale = a
            .iter()
            .filter(|v| v.is_finite())
            .fold(1.0f64, |m, v| m.max(v.abs()));
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let ok = if x.is_nan() {
                y.is_nan()
            } else {
                (x - y).abs() <= tol * scale
            };
            assert!(ok, "{label} output {k}[{i}]: reference {x} vs cuda {y}");
        }
    }
}

fn tol<T: Element>() -> f64 {
    match T::NAME {
        "f64" => 1e-10,
        "f32" => 1e-4,
        "f16" => 2e-2,
        _ => 6e-2,
    }
}

fn cross_check<T: Element>(dev: Device) {
    let mut rng = Rng::new(17);
    for (n, d) in [(7, 96), (5, 1000), (3, 2051)] {
        let x = normal::<T>(&mut rng, &[n, d]);
        let cot = normal::<T>(&mut rng, &[n, d]);
        for (fused, composed) in [
            (Norm::Layer, Norm::LayerComposed),
            (Norm::Rms, Norm::RmsComposed),
        ] {
            let label = format!("{fused:?} {n}x{d} {}", T::NAME);
            let cpu = run(fused, Device::Cpu, &x, true, &cot).unwrap();
            let gf = run(fused, dev, &x, true, &cot).unwrap();
            let gc = run(composed, dev, &x, true, &cot).unwrap();
            close(
                &format!("{label}: fused CUDA vs fused CPU"),
                &cpu,
                &gf,
                tol::<T>(),
            );
            close(
                &format!("{label}: composed CUDA vs fused CUDA"),
                &gf,
                &gc,
                tol::<T>(),
            );
            let again = run(fused, dev, &x, true, &cot).unwrap();
            for (a, b) in gf.iter().zip(&again) {
                let same = a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(
                    same,
                    "{label}: two runs differ (dx, dgamma and dbeta must not)"
                );
            }
        }
    }
}

#[test]
fn fused_cuda_composed_cuda_and_fused_cpu_agree_f32() {
    if let Some(dev) = gpu() {
        cross_check::<f32>(dev);
    }
}

#[test]
fn fused_cuda_composed_cuda_and_fused_cpu_agree_f64() {
    if let Some(dev) = gpu() {
        cross_check::<f64>(dev);
    }
}

#[test]
fn fused_cuda_composed_cuda_and_fused_cpu_agree_f16() {
    if let Some(dev) = gpu() {
        cross_check::<half::f16>(dev);
    }
}

#[test]
fn fused_cuda_composed_cuda_and_fused_cpu_agree_bf16() {
    if let Some(dev) = gpu() {
        cross_check::<half::bf16>(dev);
    }
}

/// Edge inputs: the fused kernels against the fused CPU, f32 and bf16.
fn edges<T: Element>(dev: Device) {
    let mut rng = Rng::new(23);
    let mut cases: Vec<(&str, Tensor<T>)> = vec![
        ("D = 1", normal(&mut rng, &[5, 1])),
        ("constant rows", tensor(&[3, 40], |i| (i / 40) as f64 * 2.5)),
        ("zero rows", tensor(&[2, 64], |_| 0.0)),
        ("N = 0", tensor(&[0, 16], |_| 0.0)),
        ("odd D", normal(&mut rng, &[4, 37])),
        ("very large D", normal(&mut rng, &[2, 65_537])),
    ];
    if T::NAME == "f32" {
        let noise: Vec<f64> = (0..4 * 300).map(|_| rng.normal()).collect();
        cases.push(("offset 1e8", tensor(&[4, 300], |i| 1e8 + 64.0 * noise[i])));
        cases.push((
            "rows of 1e30",
            tensor(&[3, 50], |i| 1e30 * (1.0 + noise[i])),
        ));
        cases.push(("rows of 1e-30", tensor(&[3, 50], |i| 1e-30 * noise[i])));
    }
    let mut with_nan = normal::<T>(&mut rng, &[3, 45]).into_vec().unwrap();
    with_nan[50] = T::from_f64(f64::NAN);
    cases.push((
        "NaN in row 1",
        Tensor::from_vec(vec![3, 45], with_nan).unwrap(),
    ));
    for (name, x) in &cases {
        let cot = normal::<T>(&mut rng, x.shape());
        for norm in [Norm::Layer, Norm::Rms] {
            for affine in [true, false] {
                let label = format!("{norm:?} {name} affine={affine} {}", T::NAME);
                let cpu = run(norm, Device::Cpu, x, affine, &cot).unwrap();
                let cuda =
                    run(norm, dev, x, affine, &cot).unwrap_or_else(|e| panic!("{label}: {e}"));
                close(&label, &cpu, &cuda, tol::<T>());
                if name.starts_with("rows of") {
                    let finite = cuda.iter().flatten().all(|v| v.is_finite());
                    assert!(finite, "{label}: a finite input gave a non-finite result");
                }
                if *name == "NaN in row 1" {
                    let d = 45;
                    let y = &cuda[0];
                    assert!(y[d..2 * d].iter().all(|v| v.is_nan()), "{label}: NaN row");
                    assert!(y[..d].iter().chain(&y[2 * d..]).all(|v| v.is_finite()));
                }
            }
        }
    }
}

#[test]
fn edge_cases_match_the_cpu_f32() {
    if let Some(dev) = gpu() {
        edges::<f32>(dev);
    }
}

#[test]
fn edge_cases_match_the_cpu_bf16() {
    if let Some(dev) = gpu() {
        edges::<half::bf16>(dev);
    }
}

/// d/dp of sum(cot * norm(x)) by central differences, computed on the
/// device in f64, against the fused backward on the device.
#[test]
fn finite_differences_on_the_device_f64() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng::new(29);
    let (n, d) = (3, 19);
    let x = normal::<f64>(&mut rng, &[n, d]);
    let cot = normal::<f64>(&mut rng, &[n, d]);
    let c = cot.to_f64_vec().unwrap();
    for norm in [Norm::Layer, Norm::Rms] {
        let analytic = run(norm, dev, &x, false, &cot).unwrap();
        let loss = |xs: &[f64]| -> f64 {
            let xt = Tensor::from_vec(vec![n, d], xs.to_vec()).unwrap();
            let y = run(norm, dev, &xt, false, &cot).unwrap().remove(0);
            y.iter().zip(&c).map(|(a, b)| a * b).sum()
        };
        let x0 = x.to_f64_vec().unwrap();
        let h = 1e-6;
        for i in [0, 7, d + 3, 2 * d + 18] {
            let (mut up, mut dn) = (x0.clone(), x0.clone());
            up[i] += h;
            dn[i] -= h;
            let fd = (loss(&up) - loss(&dn)) / (2.0 * h);
            let an = analytic[1][i];
            assert!(
                (fd - an).abs() <= 1e-6 * an.abs().max(1.0),
                "{norm:?} dx[{i}]: finite difference {fd} vs backward {an}"
            );
        }
    }
}

/// The shadow check on the device: each fused norm against its composed
/// twin, both on the device, in f32 and bf16; then a fault injected into
/// one row of the device's dx is found at its call and row.
fn shadow_on<T: Element>(dev: Device) {
    use fusegrad::shadow::Fault;
    use fusegrad::{Shadow, ShadowConfig};
    let mut rng = Rng::new(17);
    let fault = Fault {
        op: "rms_norm".into(),
        step: 0,
        call: 1,
        result: "dx".into(),
        row: 3,
        // Past the dtype's bar: bf16's is about a tenth of the terms.
        delta: if T::NAME == "bf16" { 20.0 } else { 0.5 },
    };
    let shadow = Shadow::new(ShadowConfig {
        fault: Some(fault),
        ..ShadowConfig::every(1)
    });
    let tape = Tape::<T>::new();
    shadow.watch(&tape, 0);
    let x = tape.var_on(normal::<T>(&mut rng, &[6, 40]), dev).unwrap();
    let g = tape.var_on(normal::<T>(&mut rng, &[40]), dev).unwrap();
    let b = tape.var_on(normal::<T>(&mut rng, &[40]), dev).unwrap();
    tape.name_var(&g, "ln.weight");
    let y = ops::layer_norm(&x, Some(&g), Some(&b), 1e-5).unwrap();
    let z = ops::rms_norm(&y, None, 1e-6).unwrap(); // call 0 of rms_norm
    let w = ops::rms_norm(&z, None, 1e-6).unwrap(); // call 1: the fault
    let cot = normal::<T>(&mut rng, &[6, 40]).to_device(dev).unwrap();
    w.backward_with(&cot).unwrap();
    let sites = shadow.sites();
    let names: Vec<&str> = sites.iter().map(|s| s.site.as_str()).collect();
    assert_eq!(names, ["ln", "rms_norm#0", "rms_norm#1"], "{}", T::NAME);
    for s in &sites[..2] {
        assert_eq!((s.calls, s.failures), (1, 0), "{} {s:?}", T::NAME);
        assert!(s.worst_ratio() <= 1.0, "{s:?}");
    }
    let bad = sites[2].worst_grad.as_ref().unwrap();
    assert!(!bad.passed(), "{bad:?}");
    assert_eq!((bad.result.as_str(), bad.row.unwrap().row), ("dx", 3));
    assert!(sites[2].worst_output.as_ref().unwrap().passed());
}

#[test]
fn the_shadow_check_runs_on_the_device_f32_bf16() {
    if let Some(dev) = gpu() {
        shadow_on::<f32>(dev);
        shadow_on::<half::bf16>(dev);
    }
}

/// The shadow check of the fused attention on the device, plain and
/// packed: within tolerance, and a fault injected into one row of the
/// device's `dk` is found at its call and row.
fn shadow_attention_on<T: Element>(dev: Device) {
    use fusegrad::shadow::Fault;
    use fusegrad::{Shadow, ShadowConfig};
    let mut rng = Rng::new(23);
    let fault = Fault {
        op: "attention".into(),
        step: 0,
        call: 1,
        result: "dk".into(),
        row: 5,
        delta: if T::NAME == "bf16" { 50.0 } else { 0.5 },
    };
    let shadow = Shadow::new(ShadowConfig {
        fault: Some(fault),
        ..ShadowConfig::every(1)
    });
    let tape = Tape::<T>::new();
    shadow.watch(&tape, 0);
    let mut var = |shape: &[usize]| tape.var_on(normal::<T>(&mut rng, shape), dev).unwrap();
    let (q, k, v) = (var(&[2, 2, 5, 8]), var(&[2, 2, 5, 8]), var(&[2, 2, 5, 8]));
    let qkv = var(&[2, 5, 48]);
    let y = ops::attention(&q, &k, &v, true, 0.35).unwrap(); // call 0
    let y = ops::attention(&y, &k, &v, false, 0.35).unwrap(); // call 1: the fault
    let z = ops::attention_qkv(&qkv, 2, true, 0.35).unwrap();
    for out in [&y, &z] {
        let cot = normal::<T>(&mut rng, out.shape()).to_device(dev).unwrap();
        out.backward_with(&cot).unwrap();
    }
    let sites = shadow.sites();
    let names: Vec<&str> = sites.iter().map(|s| s.site.as_str()).collect();
    assert_eq!(
        names,
        ["attention#0", "attention#1", "attention_qkv#0"],
        "{}",
        T::NAME
    );
    for s in [&sites[0], &sites[2]] {
        assert_eq!((s.calls, s.failures), (1, 0), "{} {s:?}", T::NAME);
        assert!(s.worst_ratio() <= 1.0, "{s:?}");
    }
    let bad = sites[1].worst_grad.as_ref().unwrap();
    assert!(!bad.passed(), "{bad:?}");
    assert_eq!((bad.result.as_str(), bad.row.unwrap().row), ("dk", 5));
    assert!(sites[1].worst_output.as_ref().unwrap().passed());
}

#[test]
fn the_shadow_check_of_attention_runs_on_the_device_f32_bf16() {
    if let Some(dev) = gpu() {
        shadow_attention_on::<f32>(dev);
        shadow_attention_on::<half::bf16>(dev);
    }
}
