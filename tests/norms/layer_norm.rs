//! Fused LayerNorm: the family's checks (`family.rs`), and what is
//! LayerNorm's own: hand-worked edge cases (D = 1, constant rows, zero
//! input or gamma) and input validation. The randomized three-way check
//! (fused = composed = finite differences) is the command's `props::`.

use super::family::{family_tests, Grads, Norm};
use crate::common::normal;
use fusegrad::gradcheck::rel_diff;
use fusegrad::rng::Rng;
use fusegrad::{ops, Element, Error, Tape, Tensor};
use half::f16;

family_tests!(Norm::Layer);

/// The fused LayerNorm's `(y, dx, dgamma, dbeta)` under cotangent `dy`.
fn fused<T: Element>(
    shape: &[usize],
    norm: &[usize],
    x: &[f64],
    gamma: &[f64],
    beta: &[f64],
    dy: &[f64],
    eps: f64,
) -> Grads {
    super::family::fused::<T>(Norm::Layer, shape, norm, x, gamma, beta, dy, eps)
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
