//! Fused RMSNorm: the family's checks (`family.rs`), and what is RMSNorm's
//! own: hand-worked edge cases (D = 1, zero input or gamma) and input
//! validation. The randomized three-way check is the command's `props::`.

use super::family::{family_tests, Norm};
use crate::common::normal;
use fusegrad::gradcheck::rel_diff;
use fusegrad::rng::Rng;
use fusegrad::{ops, Element, Error, Tape, Tensor};

family_tests!(Norm::Rms);

/// The fused RMSNorm's `(y, dx, dgamma)` under cotangent `dy`.
fn fused<T: Element>(
    shape: &[usize],
    norm: &[usize],
    x: &[f64],
    gamma: &[f64],
    dy: &[f64],
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (y, dx, dg, _) = super::family::fused::<T>(Norm::Rms, shape, norm, x, gamma, &[], dy, eps);
    (y, dx, dg)
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
