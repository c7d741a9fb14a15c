//! Fused LayerNorm: an independent chain-rule derivation, edge cases, input
//! validation, saved memory, thread-count determinism and 16-bit accuracy.
//! The randomized three-way check (fused = composed = finite differences)
//! is in tests/layer_norm_props.rs.

use crate::common::{normal, tensor};
use fusegrad::gradcheck::rel_diff;
use fusegrad::rng::Rng;
use fusegrad::{ops, tolerance, Element, Error, Tape, Tensor};
use half::{bf16, f16};

/// Fused LayerNorm forward and backward (x, gamma, beta all leaves):
/// `(y, dx, dgamma, dbeta)` in f64.
type Grads = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);

fn fused<T: Element>(
    shape: &[usize],
    norm: &[usize],
    x: &[f64],
    gamma: &[f64],
    beta: &[f64],
    dy: &[f64],
    eps: f64,
) -> Grads {
    let tape = Tape::<T>::new();
    let xv = tape.var(tensor::<T>(shape, x));
    let gv = tape.var(tensor::<T>(norm, gamma));
    let bv = tape.var(tensor::<T>(norm, beta));
    let y = ops::layer_norm_nd(&xv, norm, Some(&gv), Some(&bv), eps).unwrap();
    let g = y.backward_with(&tensor::<T>(shape, dy)).unwrap();
    let f = |t: Tensor<T>| t.to_f64_vec().unwrap();
    (
        f(y.value().clone()),
        f(g.wrt(&xv).unwrap()),
        f(g.wrt(&gv).unwrap()),
        f(g.wrt(&bv).unwrap()),
    )
}

/// Reference LayerNorm in f64, differentiated step by step through the
/// graph `mu -> c = x - mu -> var -> rstd -> xhat -> y`, with no algebraic
/// simplification: every intermediate gets its own adjoint.
fn chain_rule(x: &[f64], gamma: &[f64], beta: &[f64], dy: &[f64], d: usize, eps: f64) -> Grads {
    let (mut y, mut dx) = (vec![], vec![]);
    let (mut dgamma, mut dbeta) = (vec![0.0; d], vec![0.0; d]);
    for (xr, dyr) in x.chunks(d).zip(dy.chunks(d)) {
        let df = d as f64;
        // Forward.
        let mu = xr.iter().sum::<f64>() / df;
        let c: Vec<f64> = xr.iter().map(|v| v - mu).collect();
        let var = c.iter().map(|v| v * v).sum::<f64>() / df;
        let rstd = 1.0 / (var + eps).sqrt();
        let xhat: Vec<f64> = c.iter().map(|v| v * rstd).collect();
        y.extend((0..d).map(|j| xhat[j] * gamma[j] + beta[j]));
        // Backward, node by node.
        let dxhat: Vec<f64> = (0..d).map(|j| dyr[j] * gamma[j]).collect();
        for j in 0..d {
            dgamma[j] += dyr[j] * xhat[j];
            dbeta[j] += dyr[j];
        }
        // xhat_j = c_j * rstd
        let mut dc: Vec<f64> = (0..d).map(|j| dxhat[j] * rstd).collect();
        let drstd: f64 = (0..d).map(|j| dxhat[j] * c[j]).sum();
        // rstd = (var + eps)^(-1/2)
        let dvar = drstd * -0.5 * (var + eps).powf(-1.5);
        // var = sum(c_j^2) / d
        for j in 0..d {
            dc[j] += dvar * 2.0 * c[j] / df;
        }
        // c_j = x_j - mu
        let dmu: f64 = -dc.iter().sum::<f64>();
        // mu = sum(x) / d
        dx.extend((0..d).map(|j| dc[j] + dmu / df));
    }
    (y, dx, dgamma, dbeta)
}

#[test]
fn consolidated_backward_matches_step_by_step_chain_rule() {
    let mut rng = Rng::new(11);
    for &(n, d, eps) in &[
        (5usize, 7usize, 1e-5),
        (3, 64, 1e-5),
        (4, 1000, 1e-3),
        (6, 3, 1e-12),
        // D = 2 with eps << var is ill-conditioned (dx is exactly 0 at
        // eps = 0, so only rounding noise is left); a large eps keeps it fair.
        (2, 2, 0.5),
        (7, 129, 1e-2),
    ] {
        let x = normal(&mut rng, n * d, 1.5, 0.3);
        let gamma = normal(&mut rng, d, 1.0, 0.0);
        let beta = normal(&mut rng, d, 1.0, 0.0);
        let dy = rng.vec(n * d);
        let got = fused::<f64>(&[n, d], &[d], &x, &gamma, &beta, &dy, eps);
        let want = chain_rule(&x, &gamma, &beta, &dy, d, eps);
        for (what, a, b) in [
            ("y", &got.0, &want.0),
            ("dx", &got.1, &want.1),
            ("dgamma", &got.2, &want.2),
            ("dbeta", &got.3, &want.3),
        ] {
            let r = rel_diff(a, b);
            assert!(r <= 1e-12, "n={n} d={d}: {what} rel diff {r:e}");
        }
    }
}

#[test]
fn d_equal_one_gives_beta_and_zero_dx() {
    let x = [3.0, -1e6, 0.25, 7.0];
    let dy = [0.5, -0.25, 1.0, 2.0];
    let (y, dx, dg, db) = fused::<f64>(&[4, 1], &[1], &x, &[1.7], &[-0.3], &dy, 1e-5);
    assert!(y.iter().all(|&v| v == -0.3), "{y:?}");
    assert!(dx.iter().all(|&v| v == 0.0), "{dx:?}");
    assert_eq!(dg, vec![0.0]);
    assert_eq!(db, vec![dy.iter().sum::<f64>()]);
}

#[test]
fn constant_rows_have_zero_variance_and_finite_grads() {
    let mut rng = Rng::new(3);
    for (d, c) in [(3usize, 0.1f64), (37, -12345.678), (1024, 1e8)] {
        let x = vec![c; 2 * d];
        let gamma = normal(&mut rng, d, 1.0, 0.0);
        let beta = normal(&mut rng, d, 1.0, 0.0);
        let dy = rng.vec(2 * d);
        let (y, dx, dg, db) = fused::<f64>(&[2, d], &[d], &x, &gamma, &beta, &dy, 1e-5);
        // The shifted mean is exact, so xhat = 0: y = beta, dgamma = 0.
        for (j, v) in y.iter().enumerate() {
            assert_eq!(*v, beta[j % d]);
        }
        assert!(dg.iter().all(|&v| v == 0.0));
        // dx = rstd * (g - mean(g)) with rstd = 1/sqrt(eps).
        let rstd = 1.0 / 1e-5f64.sqrt();
        let want: Vec<f64> = dy
            .chunks(d)
            .flat_map(|r| {
                let g: Vec<f64> = (0..d).map(|j| r[j] * gamma[j]).collect();
                let m = g.iter().sum::<f64>() / d as f64;
                g.into_iter().map(move |v| rstd * (v - m))
            })
            .collect();
        assert!(rel_diff(&dx, &want) < 1e-12);
        assert!(db.iter().all(|v| v.is_finite()));
        // The same in f32 and (where c fits in f16) f16.
        let (y32, dx32, ..) = fused::<f32>(&[2, d], &[d], &x, &gamma, &beta, &dy, 1e-5);
        assert!(y32.iter().chain(&dx32).all(|v| v.is_finite()));
        if c.abs() < 6e4 {
            let (y16, dx16, ..) = fused::<f16>(&[2, d], &[d], &x, &gamma, &beta, &dy, 1e-3);
            assert!(y16.iter().chain(&dx16).all(|v| v.is_finite()));
        }
    }
}

#[test]
fn zero_input_and_zero_gamma() {
    let mut rng = Rng::new(4);
    let (n, d) = (3, 16);
    let dy = rng.vec(n * d);
    let gamma = normal(&mut rng, d, 1.0, 0.0);
    let beta = normal(&mut rng, d, 1.0, 0.0);
    // x = 0: y = beta, dgamma = 0, dx = rstd * (g - mean g).
    let (y, dx, dg, db) = fused::<f64>(&[n, d], &[d], &vec![0.0; n * d], &gamma, &beta, &dy, 1e-4);
    assert!(y.iter().enumerate().all(|(i, v)| *v == beta[i % d]));
    assert!(dg.iter().all(|&v| v == 0.0));
    assert!(dx.iter().all(|v| v.is_finite()) && dx.iter().any(|&v| v != 0.0));
    let want_db: Vec<f64> = (0..d)
        .map(|j| (0..n).map(|i| dy[i * d + j]).sum())
        .collect();
    assert!(rel_diff(&db, &want_db) < 1e-15);
    // gamma = 0: y = beta, dx = 0 exactly, dgamma = sum dy * xhat != 0.
    let x = normal(&mut rng, n * d, 2.0, 1.0);
    let (y, dx, dg, _) = fused::<f64>(&[n, d], &[d], &x, &vec![0.0; d], &beta, &dy, 1e-5);
    assert!(y.iter().enumerate().all(|(i, v)| *v == beta[i % d]));
    assert!(dx.iter().all(|&v| v == 0.0));
    assert!(dg.iter().all(|v| v.is_finite()) && dg.iter().any(|&v| v != 0.0));
}

#[test]
fn no_rows_gives_empty_output_and_zero_param_grads() {
    for shape in [vec![0usize, 5], vec![2, 0, 5]] {
        let (y, dx, dg, db) = fused::<f32>(&shape, &[5], &[], &[1.0; 5], &[0.5; 5], &[], 1e-5);
        assert!(y.is_empty() && dx.is_empty());
        assert_eq!(dg, vec![0.0; 5]);
        assert_eq!(db, vec![0.0; 5]);
    }
    // The output keeps the input's shape.
    let tape = Tape::<f64>::new();
    let x = tape.var(Tensor::zeros(&[3, 0, 4]).unwrap());
    let y = ops::layer_norm(&x, None, None, 1e-5).unwrap();
    assert_eq!(y.shape(), &[3, 0, 4]);
}

#[test]
fn nan_stays_in_its_row() {
    let mut rng = Rng::new(5);
    let (n, d) = (4, 33);
    let mut x = normal(&mut rng, n * d, 1.0, 0.0);
    x[2 * d + 17] = f64::NAN;
    let gamma = normal(&mut rng, d, 1.0, 0.0);
    let beta = normal(&mut rng, d, 1.0, 0.0);
    let dy = rng.vec(n * d);
    let check = |(y, dx, dg, db): Grads| {
        for i in 0..n {
            let rows = [&y[i * d..(i + 1) * d], &dx[i * d..(i + 1) * d]];
            for r in rows {
                if i == 2 {
                    assert!(r.iter().all(|v| v.is_nan()), "row {i}");
                } else {
                    assert!(r.iter().all(|v| v.is_finite()), "row {i}");
                }
            }
        }
        // dgamma sums dy * xhat over rows, so NaN; dbeta only sums dy.
        assert!(dg.iter().all(|v| v.is_nan()));
        assert!(db.iter().all(|v| v.is_finite()));
    };
    check(fused::<f64>(&[n, d], &[d], &x, &gamma, &beta, &dy, 1e-5));
    check(fused::<f32>(&[n, d], &[d], &x, &gamma, &beta, &dy, 1e-5));
    check(fused::<bf16>(&[n, d], &[d], &x, &gamma, &beta, &dy, 1e-5));
    // An infinity behaves the same (x - mean is inf - inf).
    x[2 * d + 17] = f64::INFINITY;
    check(fused::<f64>(&[n, d], &[d], &x, &gamma, &beta, &dy, 1e-5));
}

#[test]
fn bad_arguments_are_errors() {
    let tape = Tape::<f32>::new();
    let x = tape.var(Tensor::zeros(&[2, 3, 4]).unwrap());
    let g4 = tape.var(Tensor::zeros(&[4]).unwrap());
    let g3 = tape.var(Tensor::zeros(&[3]).unwrap());
    let g34 = tape.var(Tensor::zeros(&[3, 4]).unwrap());
    let g14 = tape.var(Tensor::zeros(&[1, 4]).unwrap());
    let ok = |r: fusegrad::Result<_>| r.map(|_: fusegrad::Var<f32>| ()).unwrap();
    ok(ops::layer_norm(&x, Some(&g4), Some(&g4), 1e-5));
    ok(ops::layer_norm_nd(&x, &[3, 4], Some(&g34), None, 1e-5));
    ok(ops::layer_norm_nd(&x, &[2, 3, 4], None, None, 1e-5));
    // gamma / beta shapes.
    for (g, b) in [
        (Some(&g3), None),
        (None, Some(&g3)),
        (Some(&g14), None),
        (Some(&g4), Some(&g34)),
    ] {
        let e = ops::layer_norm(&x, g, b, 1e-5).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    }
    let e = ops::layer_norm_nd(&x, &[3, 4], Some(&g4), None, 1e-5).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    // eps.
    for eps in [
        0.0,
        -1e-5,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e-50,
        1e300,
    ] {
        let e = ops::layer_norm(&x, None, None, eps).unwrap_err();
        assert!(matches!(e, Error::BadEps { .. }), "eps {eps}: {e}");
    }
    // In f64, 1e-50 is a fine eps.
    let t64 = Tape::<f64>::new();
    let x64 = t64.var(Tensor::zeros(&[2, 3]).unwrap());
    assert!(ops::layer_norm(&x64, None, None, 1e-50).is_ok());
    // Empty normalized shape or D = 0.
    let e = ops::layer_norm_nd(&x, &[], None, None, 1e-5).unwrap_err();
    assert!(matches!(e, Error::EmptyNormalized { .. }), "{e}");
    let x0 = tape.var(Tensor::zeros(&[2, 0]).unwrap());
    let e = ops::layer_norm(&x0, None, None, 1e-5).unwrap_err();
    assert!(matches!(e, Error::EmptyNormalized { .. }), "{e}");
    let s = tape.var(Tensor::scalar(1.0f32));
    let e = ops::layer_norm(&s, None, None, 1e-5).unwrap_err();
    assert!(matches!(e, Error::EmptyNormalized { .. }), "{e}");
    // normalized_shape not the trailing dims.
    for norm in [&[3usize][..], &[2, 3], &[4, 4], &[1, 2, 3, 4], &[5]] {
        let e = ops::layer_norm_nd(&x, norm, None, None, 1e-5).unwrap_err();
        assert!(matches!(e, Error::NormalizedShape { .. }), "{norm:?}: {e}");
    }
    // Error messages name the op and the shapes.
    let e = ops::layer_norm_nd(&x, &[5], None, None, 1e-5).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("layer_norm") && msg.contains("[2, 3, 4]") && msg.contains("[5]"),
        "{msg}"
    );
    // Vars of different tapes.
    let other = Tape::<f32>::new();
    let go = other.var(Tensor::zeros(&[4]).unwrap());
    let e = ops::layer_norm(&x, Some(&go), None, 1e-5).unwrap_err();
    assert!(matches!(e, Error::TapeMismatch { .. }), "{e}");
}

#[test]
fn fused_saves_exactly_two_statistics_per_row() {
    fn check<T: Element>(shape: &[usize], d: usize) {
        let n: usize = shape.iter().product::<usize>() / d;
        let tape = Tape::<T>::new();
        let x = tape.var(Tensor::<T>::zeros(shape).unwrap());
        let g = tape.var(Tensor::<T>::zeros(&[d]).unwrap());
        let b = tape.var(Tensor::<T>::zeros(&[d]).unwrap());
        let before = tape.saved_bytes();
        ops::layer_norm(&x, Some(&g), Some(&b), 1e-5).unwrap();
        let acc = std::mem::size_of::<T::Acc>();
        assert_eq!(before, 0);
        assert_eq!(tape.saved_bytes(), 2 * n * acc, "{} {shape:?}", T::NAME);
        let per_node = tape.saved_bytes_per_node();
        assert_eq!(per_node.len(), 1);
        assert_eq!(per_node[0].op, "layer_norm");
    }
    check::<f32>(&[64, 256], 256);
    check::<f64>(&[3, 5, 7], 7);
    check::<f16>(&[10, 1024], 1024);
    check::<bf16>(&[0, 8], 8);
}

/// Runs fused LayerNorm backward inside `pool` and returns the raw bits of
/// `y`, `dx`, `dgamma`, `dbeta`.
fn bits_in_pool(pool: &rayon::ThreadPool, n: usize, d: usize) -> Vec<Vec<u32>> {
    pool.install(|| {
        let mut rng = Rng::new(99);
        let x = normal(&mut rng, n * d, 3.0, 10.0);
        let gamma = normal(&mut rng, d, 1.0, 0.0);
        let beta = normal(&mut rng, d, 1.0, 0.0);
        let dy = rng.vec(n * d);
        let tape = Tape::<f32>::new();
        let xv = tape.var(tensor::<f32>(&[n, d], &x));
        let gv = tape.var(tensor::<f32>(&[d], &gamma));
        let bv = tape.var(tensor::<f32>(&[d], &beta));
        let y = ops::layer_norm(&xv, Some(&gv), Some(&bv), 1e-5).unwrap();
        let g = y.backward_with(&tensor::<f32>(&[n, d], &dy)).unwrap();
        let bits = |t: &Tensor<f32>| t.as_slice().unwrap().iter().map(|v| v.to_bits()).collect();
        vec![
            bits(y.value()),
            bits(&g.wrt(&xv).unwrap()),
            bits(&g.wrt(&gv).unwrap()),
            bits(&g.wrt(&bv).unwrap()),
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
    // Several chunks; a few hundred chunks (grouped); a row longer than a chunk.
    for (n, d) in [(300usize, 1000usize), (1100, 4096), (5, 70_000)] {
        let a = bits_in_pool(&one, n, d);
        let b = bits_in_pool(&two, n, d);
        for (k, (p, q)) in a.iter().zip(&b).enumerate() {
            assert!(
                p == q,
                "n={n} d={d}: output {k} differs between 1 and 2 threads"
            );
        }
        // And run to run.
        assert!(a == bits_in_pool(&two, n, d));
    }
}

fn low_precision_vs_f64<T: Element>(tol: tolerance::Tolerance) {
    let mut rng = Rng::new(21);
    for &(n, d) in &[(8usize, 64usize), (4, 768), (2, 2048), (3, 13)] {
        let x = normal(&mut rng, n * d, 1.0, 0.5);
        let gamma = normal(&mut rng, d, 0.5, 1.0);
        let beta = normal(&mut rng, d, 0.5, 0.0);
        let dy = rng.vec(n * d);
        // Round the inputs to T first so both runs see the same values.
        let round =
            |v: &[f64]| -> Vec<f64> { v.iter().map(|&a| T::from_f64(a).to_f64()).collect() };
        let (x, gamma, beta, dy) = (round(&x), round(&gamma), round(&beta), round(&dy));
        let lo = fused::<T>(&[n, d], &[d], &x, &gamma, &beta, &dy, 1e-5);
        let hi = fused::<f64>(&[n, d], &[d], &x, &gamma, &beta, &dy, 1e-5);
        for (what, a, b) in [
            ("y", &lo.0, &hi.0),
            ("dx", &lo.1, &hi.1),
            ("dgamma", &lo.2, &hi.2),
            ("dbeta", &lo.3, &hi.3),
        ] {
            let r = rel_diff(a, b);
            assert!(
                r <= tol.rtol,
                "{} n={n} d={d}: {what} rel diff {r:e} > {:e}",
                T::NAME,
                tol.rtol
            );
        }
    }
}

#[test]
fn f16_and_bf16_follow_f64() {
    low_precision_vs_f64::<f16>(tolerance::F16_VS_F64);
    low_precision_vs_f64::<bf16>(tolerance::BF16_VS_F64);
    low_precision_vs_f64::<f32>(tolerance::F32_VS_F64);
}

#[test]
fn composed_twin_saves_at_least_one_value_per_element() {
    fn check<T: Element>(n: usize, d: usize) {
        let tape = Tape::<T>::new();
        let x = tape.var(Tensor::<T>::zeros(&[n, d]).unwrap());
        let g = tape.var(Tensor::<T>::zeros(&[d]).unwrap());
        let b = tape.var(Tensor::<T>::zeros(&[d]).unwrap());
        ops::layer_norm_composed(&x, Some(&g), Some(&b), 1e-5).unwrap();
        let saved = tape.saved_bytes();
        assert!(
            saved >= n * d * std::mem::size_of::<T>(),
            "{} {saved}",
            T::NAME
        );
        // And the fused op saves far less.
        let tape = Tape::<T>::new();
        let x = tape.var(Tensor::<T>::zeros(&[n, d]).unwrap());
        ops::layer_norm(&x, None, None, 1e-5).unwrap();
        assert!(tape.saved_bytes() * d / 4 <= saved);
    }
    check::<f32>(64, 256);
    check::<f64>(3, 7);
    check::<f16>(10, 1024);
}

/// Every combination of present parameters and of which inputs want a
/// gradient (the kernel has a specialized path for each) matches the
/// composed twin.
#[test]
fn optional_params_and_partial_gradients_match_composed() {
    let mut rng = Rng::new(31);
    let (n, d) = (5, 19);
    let x = normal(&mut rng, n * d, 2.0, 1.0);
    let gamma = normal(&mut rng, d, 1.0, 1.0);
    let beta = normal(&mut rng, d, 1.0, 0.0);
    let dy = rng.vec(n * d);
    for mask in 0..27u32 {
        // Each of x, gamma, beta: 0 = absent (x: constant), 1 = constant, 2 = var.
        let (mx, mg, mb) = (mask % 3, (mask / 3) % 3, mask / 9);
        if mx == 0 && mg < 2 && mb < 2 {
            continue; // nothing wants a gradient
        }
        let run = |fused: bool| -> Vec<Vec<f64>> {
            let tape = Tape::<f64>::new();
            let mk = |m: u32, shape: &[usize], v: &[f64]| match m {
                2 => Some(tape.var(tensor::<f64>(shape, v))),
                1 => Some(tape.constant(tensor::<f64>(shape, v))),
                _ => None,
            };
            let xv = mk(mx.max(1), &[n, d], &x).unwrap();
            let gv = mk(mg, &[d], &gamma);
            let bv = mk(mb, &[d], &beta);
            let y = if fused {
                ops::layer_norm(&xv, gv.as_ref(), bv.as_ref(), 1e-5)
            } else {
                ops::layer_norm_composed(&xv, gv.as_ref(), bv.as_ref(), 1e-5)
            }
            .unwrap();
            let mut out = vec![y.value().to_f64_vec().unwrap()];
            let g = y.backward_with(&tensor::<f64>(&[n, d], &dy)).unwrap();
            for v in [Some(&xv), gv.as_ref(), bv.as_ref()].into_iter().flatten() {
                if v.requires_grad() {
                    out.push(g.wrt(v).unwrap().to_f64_vec().unwrap());
                }
            }
            out
        };
        let (a, b) = (run(true), run(false));
        assert_eq!(a.len(), b.len(), "mask {mask}");
        for (p, q) in a.iter().zip(&b) {
            assert!(rel_diff(p, q) < 1e-13, "mask {mask}: {:e}", rel_diff(p, q));
        }
    }
}

#[test]
fn composed_twin_rejects_the_same_arguments() {
    let tape = Tape::<f32>::new();
    let x = tape.var(Tensor::zeros(&[2, 3, 4]).unwrap());
    let g3 = tape.var(Tensor::zeros(&[3]).unwrap());
    let e = ops::layer_norm_composed(&x, Some(&g3), None, 1e-5).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    let e = ops::layer_norm_composed(&x, None, Some(&g3), 1e-5).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    let e = ops::layer_norm_composed(&x, None, None, -1.0).unwrap_err();
    assert!(matches!(e, Error::BadEps { .. }), "{e}");
    let e = ops::layer_norm_composed_nd(&x, &[], None, None, 1e-5).unwrap_err();
    assert!(matches!(e, Error::EmptyNormalized { .. }), "{e}");
    let e = ops::layer_norm_composed_nd(&x, &[2, 4], None, None, 1e-5).unwrap_err();
    assert!(matches!(e, Error::NormalizedShape { .. }), "{e}");
}
