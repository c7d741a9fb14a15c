//! Fused RMSNorm: an independent chain-rule derivation, edge cases, input
//! validation, saved memory, thread-count determinism and 16-bit accuracy.
//! The randomized three-way check is in tests/rms_norm_props.rs.

use crate::common::{normal, tensor};
use fusegrad::gradcheck::rel_diff;
use fusegrad::rng::Rng;
use fusegrad::{ops, tolerance, Element, Error, Tape, Tensor};
use half::{bf16, f16};

/// `(y, dx, dgamma)` in f64.
type Grads = (Vec<f64>, Vec<f64>, Vec<f64>);

fn fused<T: Element>(
    shape: &[usize],
    norm: &[usize],
    x: &[f64],
    gamma: &[f64],
    dy: &[f64],
    eps: f64,
) -> Grads {
    let tape = Tape::<T>::new();
    let xv = tape.var(tensor::<T>(shape, x));
    let gv = tape.var(tensor::<T>(norm, gamma));
    let y = ops::rms_norm_nd(&xv, norm, Some(&gv), eps).unwrap();
    let g = y.backward_with(&tensor::<T>(shape, dy)).unwrap();
    let f = |t: Tensor<T>| t.to_f64_vec().unwrap();
    (
        f(y.value().clone()),
        f(g.wrt(&xv).unwrap()),
        f(g.wrt(&gv).unwrap()),
    )
}

/// Reference RMSNorm in f64, differentiated node by node through
/// `ms = sum(x^2)/d -> rstd = (ms + eps)^(-1/2) -> xhat = x rstd -> y`.
fn chain_rule(x: &[f64], gamma: &[f64], dy: &[f64], d: usize, eps: f64) -> Grads {
    let (mut y, mut dx, mut dgamma) = (vec![], vec![], vec![0.0; d]);
    for (xr, dyr) in x.chunks(d).zip(dy.chunks(d)) {
        let df = d as f64;
        let ms = xr.iter().map(|v| v * v).sum::<f64>() / df;
        let rstd = 1.0 / (ms + eps).sqrt();
        let xhat: Vec<f64> = xr.iter().map(|v| v * rstd).collect();
        y.extend((0..d).map(|j| xhat[j] * gamma[j]));
        let dxhat: Vec<f64> = (0..d).map(|j| dyr[j] * gamma[j]).collect();
        for j in 0..d {
            dgamma[j] += dyr[j] * xhat[j];
        }
        // xhat_j = x_j * rstd: a direct path to x and one through rstd.
        let mut dxr: Vec<f64> = (0..d).map(|j| dxhat[j] * rstd).collect();
        let drstd: f64 = (0..d).map(|j| dxhat[j] * xr[j]).sum();
        let dms = drstd * -0.5 * (ms + eps).powf(-1.5);
        for j in 0..d {
            dxr[j] += dms * 2.0 * xr[j] / df;
        }
        dx.extend(dxr);
    }
    (y, dx, dgamma)
}

#[test]
fn consolidated_backward_matches_step_by_step_chain_rule() {
    let mut rng = Rng::new(12);
    for &(n, d, eps) in &[
        (5usize, 7usize, 1e-5),
        (3, 64, 1e-6),
        (4, 1000, 1e-3),
        (6, 3, 1e-12),
        (7, 129, 1e-2),
    ] {
        let x = normal(&mut rng, n * d, 1.5, 0.3);
        let gamma = normal(&mut rng, d, 1.0, 0.0);
        let dy = rng.vec(n * d);
        let got = fused::<f64>(&[n, d], &[d], &x, &gamma, &dy, eps);
        let want = chain_rule(&x, &gamma, &dy, d, eps);
        for (what, a, b) in [
            ("y", &got.0, &want.0),
            ("dx", &got.1, &want.1),
            ("dgamma", &got.2, &want.2),
        ] {
            let r = rel_diff(a, b);
            assert!(r <= 1e-12, "n={n} d={d}: {what} rel diff {r:e}");
        }
    }
}

#[test]
fn d_equal_one() {
    // y = gamma * x / sqrt(x^2 + eps); dx = rstd * g * eps / (x^2 + eps).
    let x = [3.0, -2.0, 0.0, 0.5];
    let dy = [0.5, -0.25, 1.0, 2.0];
    let eps = 1e-2;
    let (y, dx, _) = fused::<f64>(&[4, 1], &[1], &x, &[1.5], &dy, eps);
    for i in 0..4 {
        let r = 1.0 / (x[i] * x[i] + eps).sqrt();
        assert!((y[i] - 1.5 * x[i] * r).abs() < 1e-15);
        let want = r * 1.5 * dy[i] * eps / (x[i] * x[i] + eps);
        assert!(
            (dx[i] - want).abs() <= 1e-12 * r * 1.5,
            "{} vs {want}",
            dx[i]
        );
    }
}

#[test]
fn zero_input_and_zero_gamma() {
    let mut rng = Rng::new(4);
    let (n, d) = (3, 16);
    let dy = rng.vec(n * d);
    let gamma = normal(&mut rng, d, 1.0, 0.0);
    // x = 0: y = 0, dx = g / sqrt(eps), dgamma = 0.
    let eps = 1e-4;
    let (y, dx, dg) = fused::<f64>(&[n, d], &[d], &vec![0.0; n * d], &gamma, &dy, eps);
    assert!(y.iter().all(|&v| v == 0.0));
    assert!(dg.iter().all(|&v| v == 0.0));
    let want: Vec<f64> = (0..n * d)
        .map(|i| dy[i] * gamma[i % d] / eps.sqrt())
        .collect();
    assert!(rel_diff(&dx, &want) < 1e-15);
    // gamma = 0: y = 0, dx = 0, dgamma finite.
    let x = normal(&mut rng, n * d, 2.0, 1.0);
    let (y, dx, dg) = fused::<f64>(&[n, d], &[d], &x, &vec![0.0; d], &dy, 1e-5);
    assert!(y.iter().chain(&dx).all(|&v| v == 0.0));
    assert!(dg.iter().all(|v| v.is_finite()) && dg.iter().any(|&v| v != 0.0));
}

#[test]
fn long_rows_agree_with_the_composed_twin() {
    let mut rng = Rng::new(8);
    let d = 16384;
    let x = normal(&mut rng, 2 * d, 1.0, 0.5);
    let gamma = normal(&mut rng, d, 0.5, 1.0);
    let dy = rng.vec(2 * d);
    let f = fused::<f32>(&[2, d], &[d], &x, &gamma, &dy, 1e-5);
    let tape = Tape::<f32>::new();
    let xv = tape.var(tensor::<f32>(&[2, d], &x));
    let gv = tape.var(tensor::<f32>(&[d], &gamma));
    let y = ops::rms_norm_composed(&xv, Some(&gv), 1e-5).unwrap();
    let g = y.backward_with(&tensor::<f32>(&[2, d], &dy)).unwrap();
    let c = (
        y.value().to_f64_vec().unwrap(),
        g.wrt(&xv).unwrap().to_f64_vec().unwrap(),
        g.wrt(&gv).unwrap().to_f64_vec().unwrap(),
    );
    for (a, b) in [(&f.0, &c.0), (&f.1, &c.1), (&f.2, &c.2)] {
        assert!(rel_diff(a, b) < 1e-5, "{}", rel_diff(a, b));
    }
}

#[test]
fn no_rows_gives_empty_output_and_zero_dgamma() {
    let (y, dx, dg) = fused::<f32>(&[0, 5], &[5], &[], &[1.0; 5], &[], 1e-5);
    assert!(y.is_empty() && dx.is_empty());
    assert_eq!(dg, vec![0.0; 5]);
}

#[test]
fn nan_stays_in_its_row() {
    let mut rng = Rng::new(5);
    let (n, d) = (4, 33);
    let mut x = normal(&mut rng, n * d, 1.0, 0.0);
    x[d + 3] = f64::NAN;
    let gamma = normal(&mut rng, d, 1.0, 0.0);
    let dy = rng.vec(n * d);
    let check = |(y, dx, dg): Grads| {
        for i in 0..n {
            for r in [&y[i * d..(i + 1) * d], &dx[i * d..(i + 1) * d]] {
                if i == 1 {
                    assert!(r.iter().all(|v| v.is_nan()), "row {i}");
                } else {
                    assert!(r.iter().all(|v| v.is_finite()), "row {i}");
                }
            }
        }
        assert!(dg.iter().all(|v| v.is_nan()));
    };
    check(fused::<f64>(&[n, d], &[d], &x, &gamma, &dy, 1e-5));
    check(fused::<f32>(&[n, d], &[d], &x, &gamma, &dy, 1e-5));
    check(fused::<f16>(&[n, d], &[d], &x, &gamma, &dy, 1e-5));
}

#[test]
fn bad_arguments_are_errors() {
    let tape = Tape::<f64>::new();
    let x = tape.var(Tensor::zeros(&[2, 3, 4]).unwrap());
    let g3 = tape.var(Tensor::zeros(&[3]).unwrap());
    let g34 = tape.var(Tensor::zeros(&[3, 4]).unwrap());
    let g4 = tape.var(Tensor::zeros(&[4]).unwrap());
    assert!(ops::rms_norm(&x, Some(&g4), 1e-5).is_ok());
    assert!(ops::rms_norm_nd(&x, &[3, 4], Some(&g34), 1e-5).is_ok());
    for (f, g) in [(true, &g3), (true, &g34), (false, &g4)] {
        let e = if f {
            ops::rms_norm(&x, Some(g), 1e-5)
        } else {
            ops::rms_norm_nd(&x, &[3, 4], Some(g), 1e-5)
        }
        .unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    }
    for eps in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let e = ops::rms_norm(&x, None, eps).unwrap_err();
        assert!(matches!(e, Error::BadEps { .. }), "{e}");
        let e = ops::rms_norm_composed(&x, None, eps).unwrap_err();
        assert!(matches!(e, Error::BadEps { .. }), "{e}");
    }
    for norm in [&[][..], &[0], &[3, 0]] {
        let e = ops::rms_norm_nd(&x, norm, None, 1e-5).unwrap_err();
        assert!(matches!(e, Error::EmptyNormalized { .. }), "{norm:?}: {e}");
    }
    for norm in [&[3usize][..], &[2, 4], &[9, 2, 3, 4]] {
        let e = ops::rms_norm_nd(&x, norm, None, 1e-5).unwrap_err();
        assert!(matches!(e, Error::NormalizedShape { .. }), "{norm:?}: {e}");
        let e = ops::rms_norm_composed_nd(&x, norm, None, 1e-5).unwrap_err();
        assert!(matches!(e, Error::NormalizedShape { .. }), "{norm:?}: {e}");
    }
    let s = tape.var(Tensor::scalar(1.0));
    assert!(matches!(
        ops::rms_norm(&s, None, 1e-5),
        Err(Error::EmptyNormalized { .. })
    ));
}

#[test]
fn fused_saves_one_statistic_per_row_composed_saves_the_tensor() {
    fn check<T: Element>(n: usize, d: usize) {
        let tape = Tape::<T>::new();
        let x = tape.var(Tensor::<T>::zeros(&[n, d]).unwrap());
        let g = tape.var(Tensor::<T>::zeros(&[d]).unwrap());
        ops::rms_norm(&x, Some(&g), 1e-5).unwrap();
        assert_eq!(
            tape.saved_bytes(),
            n * std::mem::size_of::<T::Acc>(),
            "{}",
            T::NAME
        );
        let tape = Tape::<T>::new();
        let x = tape.var(Tensor::<T>::zeros(&[n, d]).unwrap());
        let g = tape.var(Tensor::<T>::zeros(&[d]).unwrap());
        ops::rms_norm_composed(&x, Some(&g), 1e-5).unwrap();
        assert!(
            tape.saved_bytes() >= n * d * std::mem::size_of::<T>(),
            "{}",
            T::NAME
        );
    }
    check::<f32>(64, 256);
    check::<f64>(3, 7);
    check::<bf16>(10, 1024);
}

fn bits_in_pool(pool: &rayon::ThreadPool, n: usize, d: usize) -> Vec<Vec<u16>> {
    pool.install(|| {
        let mut rng = Rng::new(98);
        let x = normal(&mut rng, n * d, 3.0, 1.0);
        let gamma = normal(&mut rng, d, 1.0, 0.0);
        let dy = rng.vec(n * d);
        let tape = Tape::<bf16>::new();
        let xv = tape.var(tensor::<bf16>(&[n, d], &x));
        let gv = tape.var(tensor::<bf16>(&[d], &gamma));
        let y = ops::rms_norm(&xv, Some(&gv), 1e-5).unwrap();
        let g = y.backward_with(&tensor::<bf16>(&[n, d], &dy)).unwrap();
        let bits = |t: &Tensor<bf16>| t.as_slice().unwrap().iter().map(|v| v.to_bits()).collect();
        vec![
            bits(y.value()),
            bits(&g.wrt(&xv).unwrap()),
            bits(&g.wrt(&gv).unwrap()),
        ]
    })
}

#[test]
fn results_are_bitwise_identical_for_one_and_two_threads() {
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let two = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for (n, d) in [(300usize, 1000usize), (1100, 4096)] {
        let a = bits_in_pool(&one, n, d);
        let b = bits_in_pool(&two, n, d);
        assert!(a == b, "n={n} d={d}: 1 and 2 threads differ");
    }
}

#[test]
fn f16_and_bf16_follow_f64() {
    fn run<T: Element>(tol: f64) {
        let mut rng = Rng::new(22);
        for &(n, d) in &[(8usize, 64usize), (4, 768), (2, 2048), (3, 13)] {
            let round =
                |v: Vec<f64>| -> Vec<f64> { v.iter().map(|&a| T::from_f64(a).to_f64()).collect() };
            let x = round(normal(&mut rng, n * d, 1.0, 0.5));
            let gamma = round(normal(&mut rng, d, 0.5, 1.0));
            let dy = round(rng.vec(n * d));
            let lo = fused::<T>(&[n, d], &[d], &x, &gamma, &dy, 1e-5);
            let hi = fused::<f64>(&[n, d], &[d], &x, &gamma, &dy, 1e-5);
            for (a, b) in [(&lo.0, &hi.0), (&lo.1, &hi.1), (&lo.2, &hi.2)] {
                assert!(
                    rel_diff(a, b) <= tol,
                    "{} n={n} d={d}: {:e}",
                    T::NAME,
                    rel_diff(a, b)
                );
            }
        }
    }
    run::<f16>(tolerance::F16_VS_F64.rtol);
    run::<bf16>(tolerance::BF16_VS_F64.rtol);
    run::<f32>(tolerance::F32_VS_F64.rtol);
}

/// Every combination of gamma present / constant / var and x constant / var
/// matches the composed twin.
#[test]
fn optional_gamma_and_partial_gradients_match_composed() {
    let mut rng = Rng::new(32);
    let (n, d) = (4, 21);
    let x = normal(&mut rng, n * d, 2.0, 1.0);
    let gamma = normal(&mut rng, d, 1.0, 1.0);
    let dy = rng.vec(n * d);
    for (xvar, gm) in [(true, 0), (true, 1), (true, 2), (false, 2)] {
        let run = |fused: bool| -> Vec<Vec<f64>> {
            let tape = Tape::<f64>::new();
            let xt = tensor::<f64>(&[n, d], &x);
            let xv = if xvar {
                tape.var(xt)
            } else {
                tape.constant(xt)
            };
            let gt = tensor::<f64>(&[d], &gamma);
            let gv = match gm {
                2 => Some(tape.var(gt)),
                1 => Some(tape.constant(gt)),
                _ => None,
            };
            let y = if fused {
                ops::rms_norm(&xv, gv.as_ref(), 1e-5)
            } else {
                ops::rms_norm_composed(&xv, gv.as_ref(), 1e-5)
            }
            .unwrap();
            let g = y.backward_with(&tensor::<f64>(&[n, d], &dy)).unwrap();
            let mut out = vec![y.value().to_f64_vec().unwrap()];
            for v in [Some(&xv), gv.as_ref()].into_iter().flatten() {
                if v.requires_grad() {
                    out.push(g.wrt(v).unwrap().to_f64_vec().unwrap());
                }
            }
            out
        };
        let (a, b) = (run(true), run(false));
        assert_eq!(a.len(), b.len());
        for (p, q) in a.iter().zip(&b) {
            assert!(
                rel_diff(p, q) < 1e-13,
                "x var {xvar}, gamma {gm}: {:e}",
                rel_diff(p, q)
            );
        }
    }
}
