//! Finite inputs give finite, correct LayerNorm and RMSNorm results.
//!
//! For every finite `x` (any magnitude: 1e-40 subnormals to +-f32::MAX in
//! f32, 1e-320 to 1e308 in f64, mixed row by row), every `eps > 0` and
//! moderate `gamma`, `beta` and cotangent, the fused ops' `y`, `dx`,
//! `dgamma` and `dbeta` are finite and agree with an f64 reference computed
//! here (for f64 inputs, on rows scaled by a power of two). The bounds on
//! `gamma`, `beta` and `dy` (docs/reliability.md) are what keeps the *true*
//! results representable; they are tested at their edge below.
//!
//! The composed twins are plain IEEE arithmetic: `mean((x - mean)^2)`
//! overflows once `D * spread^2` passes the type's MAX. That bound is
//! documented and tested too.

use fusegrad::rng::Rng;
use fusegrad::{ops, Element, Tape, Tensor};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

// ---------------------------------------------------------------------------
// Reference

/// `v * 2^k` by exact power-of-two steps.
fn ldexp(mut v: f64, mut k: i32) -> f64 {
    while k > 500 {
        v *= 2f64.powi(500);
        k -= 500;
    }
    while k < -500 {
        v *= 2f64.powi(-500);
        k += 500;
    }
    v * 2f64.powi(k)
}

/// Reference results for one node, in f64, with the size of the terms each
/// value is made of (`*_scale`) and an absolute floor (`*_floor`) for what
/// the input's own quantum `q` (its smallest subnormal) allows: a mean of
/// subnormal values is only known to `q`, so `xhat` only to `rstd * q`.
#[derive(Debug, Default)]
struct Ref {
    y: Vec<f64>,
    dx: Vec<f64>,
    dgamma: Vec<f64>,
    dbeta: Vec<f64>,
    /// Per element of `y`: the size of the terms it is made of.
    y_scale: Vec<f64>,
    /// Per element of `dx`: the size of the terms it is made of.
    dx_scale: Vec<f64>,
    dgamma_scale: Vec<f64>,
    dbeta_scale: Vec<f64>,
    y_floor: Vec<f64>,
    dx_floor: Vec<f64>,
    dgamma_floor: Vec<f64>,
}

/// LayerNorm (`rms = false`) or RMSNorm of rows of `d`, with gradients for
/// the cotangent `dy`. Each row is scaled into `[1, 2)` first (exactly), so
/// f64 rows of any magnitude are fine; when `eps` so scaled overflows it
/// dwarfs the variance and the row is normalized by `1/sqrt(eps)` directly.
#[allow(clippy::too_many_arguments)]
fn reference(
    x: &[f64],
    d: usize,
    gamma: &[f64],
    beta: &[f64],
    dy: &[f64],
    eps: f64,
    rms: bool,
    q: f64,
) -> Ref {
    let mut r = Ref {
        dgamma: vec![0.0; d],
        dbeta: vec![0.0; d],
        dgamma_scale: vec![0.0; d],
        dbeta_scale: vec![0.0; d],
        dgamma_floor: vec![0.0; d],
        ..Ref::default()
    };
    for (xr, dyr) in x.chunks(d).zip(dy.chunks(d)) {
        let big = xr.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let k = if big > 0.0 {
            -(big.log2().floor() as i32)
        } else {
            0
        };
        let z: Vec<f64> = xr.iter().map(|&v| ldexp(v, k)).collect();
        let df = d as f64;
        // Shifted by z[0], so that a constant row's mean is exact.
        let mz = if rms {
            0.0
        } else {
            z[0] + z.iter().map(|v| v - z[0]).sum::<f64>() / df
        };
        let vz = z.iter().map(|v| (v - mz) * (v - mz)).sum::<f64>() / df;
        let ez = ldexp(eps, 2 * k);
        // xhat = (z - mz) * s; dx = (..) * t.
        let (s, t) = if ez.is_finite() && vz > 0.0 {
            let rz = 1.0 / (vz + ez).sqrt();
            (rz, (rz, k))
        } else {
            let re = 1.0 / eps.sqrt();
            // (z - mz) 2^-k is x - mean.
            (ldexp(re, -k), (re, 0))
        };
        let xh: Vec<f64> = z.iter().map(|v| (v - mz) * s).collect();
        let g: Vec<f64> = dyr.iter().zip(gamma).map(|(a, b)| a * b).collect();
        let mg = if rms { 0.0 } else { g.iter().sum::<f64>() / df };
        let mgx = g.iter().zip(&xh).map(|(a, b)| a * b).sum::<f64>() / df;
        let mag = g.iter().map(|v| v.abs()).sum::<f64>() / df;
        let magx = g.iter().zip(&xh).map(|(a, b)| (a * b).abs()).sum::<f64>() / df;
        // The terms of xhat_j = (x_j - mean) rstd: |x_j| and the row's
        // values that make up the mean, so cancellation in x_j - mean is
        // judged against what was cancelled.
        let zmax = z.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let xt: Vec<f64> = z.iter().map(|v| (v.abs() + zmax) * s).collect();
        let mgxt = g.iter().zip(&xt).map(|(a, b)| (a * b).abs()).sum::<f64>() / df;
        // rstd * q, the quantum of xhat.
        let xq = ldexp(t.0 * q, t.1);
        for j in 0..d {
            r.y_floor.push(4.0 * gamma[j].abs() * xq);
            r.dx_floor
                .push(4.0 * ldexp(t.0 * xq * (mag * (1.0 + xh[j].abs()) + mgx.abs()), t.1));
            r.dgamma_floor[j] += 4.0 * dyr[j].abs() * xq;
            r.y.push(xh[j] * gamma[j] + beta[j]);
            r.y_scale
                .push(gamma[j].abs() * (1.0 + xt[j]) + beta[j].abs());
            let inner = g[j] - mg - xh[j] * mgx;
            r.dx.push(ldexp(t.0 * inner, t.1));
            let sc = g[j].abs() + mag + xt[j] * magx + xh[j].abs() * mgxt;
            r.dx_scale.push(ldexp(t.0 * sc, t.1));
            r.dgamma[j] += dyr[j] * xh[j];
            r.dgamma_scale[j] += dyr[j].abs() * xt[j];
            r.dbeta[j] += dyr[j];
            r.dbeta_scale[j] += dyr[j].abs();
        }
    }
    r
}

// ---------------------------------------------------------------------------
// Running the fused ops

/// The fused op's `(y, dx, dgamma, dbeta)` in f64 (`dbeta` empty for RMS).
fn fused<T: Element>(
    x: &[f64],
    d: usize,
    gamma: &[f64],
    beta: &[f64],
    dy: &[f64],
    eps: f64,
    rms: bool,
) -> [Vec<f64>; 4] {
    let n = x.len() / d;
    let t = |v: &[f64], s: &[usize]| {
        Tensor::from_vec(s.to_vec(), v.iter().map(|&a| T::from_f64(a)).collect()).unwrap()
    };
    let tape = Tape::<T>::new();
    let xv = tape.var(t(x, &[n, d]));
    let gv = tape.var(t(gamma, &[d]));
    let bv = tape.var(t(beta, &[d]));
    let y = if rms {
        ops::rms_norm(&xv, Some(&gv), eps).unwrap()
    } else {
        ops::layer_norm(&xv, Some(&gv), Some(&bv), eps).unwrap()
    };
    let g = y.backward_with(&t(dy, &[n, d])).unwrap();
    let f = |v: fusegrad::Tensor<T>| v.to_f64_vec().unwrap();
    [
        f(y.value().clone()),
        f(g.wrt(&xv).unwrap()),
        f(g.wrt(&gv).unwrap()),
        if rms { vec![] } else { f(g.wrt(&bv).unwrap()) },
    ]
}

/// Values as `T` sees them (rounded), back in f64.
fn round<T: Element>(v: &[f64]) -> Vec<f64> {
    v.iter().map(|&a| T::from_f64(a).to_f64()).collect()
}

/// Unit roundoff and smallest subnormal of an element type.
fn unit_and_tiny<T: Element>() -> (f64, f64) {
    match T::NAME {
        "f64" => (f64::EPSILON / 2.0, 5e-324),
        "f32" => (f32::EPSILON as f64 / 2.0, 1.5e-45),
        "bf16" => (2f64.powi(-8), 2f64.powi(-133)),
        _ => (2f64.powi(-11), 2f64.powi(-24)),
    }
}

/// Every `got` is finite and within `tol * scale + floor` (plus a few of the
/// output type's smallest subnormal, `tiny`) of `want`.
fn check(
    what: &str,
    got: &[f64],
    want: &[f64],
    (scale, floor): (&[f64], &[f64]),
    tol: f64,
    tiny: f64,
) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} values, want {}", got.len(), want.len()));
    }
    let floor = |i: usize| floor.get(i).copied().unwrap_or(0.0);
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        if !g.is_finite() {
            return Err(format!("{what}[{i}] = {g} (want {w})"));
        }
        // The smallest positive subnormal of the output type is a floor for
        // values that round to (or from) nothing.
        if (g - w).abs() > tol * s + floor(i) + 64.0 * tiny {
            return Err(format!(
                "{what}[{i}] = {g:e}, want {w:e} (terms {s:e}, tol {tol:e})"
            ));
        }
    }
    Ok(())
}

/// Runs the fused op on `x` (rounded to `T`) and compares with the
/// reference.
#[allow(clippy::too_many_arguments)]
fn compare<T: Element>(
    x: &[f64],
    d: usize,
    gamma: &[f64],
    beta: &[f64],
    dy: &[f64],
    eps: f64,
    rms: bool,
    tol: f64,
) -> Result<(), String> {
    let (x, gamma, beta, dy) = (
        round::<T>(x),
        round::<T>(gamma),
        round::<T>(beta),
        round::<T>(dy),
    );
    // The op rounds eps to its accumulation type.
    let eps_acc = <T::Acc as fusegrad::Accum>::of(eps);
    let eps_r = fusegrad::Accum::f64(eps_acc);
    // RMSNorm has no beta.
    let beta = if rms { vec![0.0; d] } else { beta };
    let (u, tiny) = unit_and_tiny::<T>();
    let r = reference(&x, d, &gamma, &beta, &dy, eps_r, rms, tiny);
    let [y, dx, dg, db] = fused::<T>(&x, d, &gamma, &beta, &dy, eps, rms);
    let tag = |s: &str| format!("{} {} {s}", T::NAME, if rms { "rms" } else { "ln" });
    // Outputs are rounded to T: allow that rounding on top.
    let tol = tol + u;
    check(&tag("y"), &y, &r.y, (&r.y_scale, &r.y_floor), tol, tiny)?;
    check(
        &tag("dx"),
        &dx,
        &r.dx,
        (&r.dx_scale, &r.dx_floor),
        tol,
        tiny,
    )?;
    let dgf = (&r.dgamma_scale[..], &r.dgamma_floor[..]);
    check(&tag("dgamma"), &dg, &r.dgamma, dgf, tol, tiny)?;
    if !rms {
        check(
            &tag("dbeta"),
            &db,
            &r.dbeta,
            (&r.dbeta_scale, &[]),
            tol,
            tiny,
        )?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Extreme rows

/// Row magnitudes: spread, with an offset of up to twice the spread.
const F32_SCALES: &[f64] = &[1.0, 1e30, 1e-30, 1e19, 1e-19, 1e36, 1e-38, 1e-42];
const F64_SCALES: &[f64] = &[1.0, 1e30, 1e-30, 1e160, 1e-160, 1e300, 1e-300, 1e-310];

/// `n` rows of `d`: each row drawn at a random scale from `scales`, or a
/// constant row, or one spanning +-`max`.
fn extreme_rows(rng: &mut Rng, n: usize, d: usize, scales: &[f64], max: f64) -> Vec<f64> {
    let mut x = Vec::with_capacity(n * d);
    for _ in 0..n {
        match rng.below(scales.len() + 2) {
            i if i < scales.len() => {
                let s = scales[i];
                let off = s * [0.0, 1.0, -2.0][rng.below(3)];
                x.extend((0..d).map(|_| off + s * rng.normal()));
            }
            i if i == scales.len() => {
                let c = scales[rng.below(scales.len())] * rng.range(-2.0, 2.0);
                x.extend(std::iter::repeat_n(c, d));
            }
            _ => x.extend((0..d).map(|_| max * rng.range(-1.0, 1.0))),
        }
    }
    x
}

fn params(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n).map(|_| rng.range(-4.0, 4.0)).collect()
}

const F32_EPS: &[f64] = &[1e-5, 1e-12, 1.0, 1e-45, 1e-40, 1.1754944e-38, 3.4e38];
const F64_EPS: &[f64] = &[
    1e-5,
    1e-12,
    1.0,
    5e-324,
    1e-310,
    2.2250738585072014e-308,
    1e300,
    1.7e308,
];

/// 256 cases per dtype by default, from a fixed seed; `FUSEGRAD_FUZZ_CASES`
/// and `FUSEGRAD_FUZZ_SEED` as for tests/robustness.rs.
fn config() -> ProptestConfig {
    fn env<V: std::str::FromStr>(k: &str) -> Option<V> {
        std::env::var(k).ok().and_then(|v| v.parse().ok())
    }
    ProptestConfig {
        cases: env("FUSEGRAD_FUZZ_CASES").map_or(256, |c: u32| (c / 8).max(256)),
        rng_seed: RngSeed::Fixed(env("FUSEGRAD_FUZZ_SEED").unwrap_or(0xF1_417E)),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn f32_rows_of_any_magnitude_stay_finite_and_correct(
        seed in any::<u64>(), n in 1usize..6, d in 1usize..40, e in 0..F32_EPS.len(), rms in any::<bool>()
    ) {
        let mut rng = Rng::new(seed);
        let x = extreme_rows(&mut rng, n, d, F32_SCALES, f32::MAX as f64);
        let (g, b, dy) = (params(&mut rng, d), params(&mut rng, d), params(&mut rng, n * d));
        compare::<f32>(&x, d, &g, &b, &dy, F32_EPS[e], rms, 2e-5).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn bf16_rows_of_any_magnitude_stay_finite_and_correct(
        seed in any::<u64>(), n in 1usize..6, d in 1usize..40, e in 0..F32_EPS.len(), rms in any::<bool>()
    ) {
        let mut rng = Rng::new(seed);
        let x = extreme_rows(&mut rng, n, d, F32_SCALES, 3.3e38);
        let (g, b, dy) = (params(&mut rng, d), params(&mut rng, d), params(&mut rng, n * d));
        compare::<half::bf16>(&x, d, &g, &b, &dy, F32_EPS[e], rms, 2e-5).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn f64_rows_of_any_magnitude_stay_finite_and_correct(
        seed in any::<u64>(), n in 1usize..6, d in 1usize..40, e in 0..F64_EPS.len(), rms in any::<bool>()
    ) {
        let mut rng = Rng::new(seed);
        let x = extreme_rows(&mut rng, n, d, F64_SCALES, f64::MAX);
        let (g, b, dy) = (params(&mut rng, d), params(&mut rng, d), params(&mut rng, n * d));
        compare::<f64>(&x, d, &g, &b, &dy, F64_EPS[e], rms, 1e-11).map_err(TestCaseError::fail)?;
    }
}

// ---------------------------------------------------------------------------
// Hard rows, one by one.

fn one_row_case<T: Element>(row: &[f64], eps: f64, tol: f64) {
    let d = row.len();
    let mut rng = Rng::new(3);
    let (g, b) = (params(&mut rng, d), params(&mut rng, d));
    let dy = params(&mut rng, d);
    for rms in [false, true] {
        compare::<T>(row, d, &g, &b, &dy, eps, rms, tol).unwrap();
    }
}

#[test]
fn rows_of_1e30_and_1e_30_in_f32() {
    let mut rng = Rng::new(1);
    for scale in [1e30, -1e30, 1e-30, 1.3e38, 1e-40] {
        let row: Vec<f64> = (0..16)
            .map(|_| scale * (1.0 + rng.range(-1.5, 1.5)))
            .collect();
        for eps in [1e-5, 1e-45, 3.4e38] {
            one_row_case::<f32>(&row, eps, 2e-5);
        }
    }
    // +-MAX in one row: the mean's own sum overflows in f32.
    let row = [f32::MAX as f64, -(f32::MAX as f64), 1.0, f32::MAX as f64];
    one_row_case::<f32>(&row, 1e-5, 2e-5);
}

#[test]
fn rows_of_1e300_and_1e_300_in_f64() {
    let mut rng = Rng::new(2);
    for scale in [1e300, 1e-300, 1e160, 1e-160] {
        let row: Vec<f64> = (0..16).map(|_| scale * (1.0 + rng.normal())).collect();
        for eps in [1e-5, 5e-324, 1.7e308] {
            one_row_case::<f64>(&row, eps, 1e-11);
        }
    }
    let row = [f64::MAX, -f64::MAX, 0.0, f64::MAX];
    one_row_case::<f64>(&row, 1e-5, 1e-11);
}

/// Normalization does not see a power-of-two scale: the fused f64 result
/// for `x 2^k` (eps negligible) equals the one for `x`, for k across the
/// whole exponent range, and dx scales by `2^-k`.
#[test]
fn f64_results_are_invariant_under_power_of_two_scaling() {
    let unit = [3.0, -1.0, 0.5, 2.0, -4.0, 1.25];
    let d = unit.len();
    let (g, b, dy) = ([1.5; 6], [0.25; 6], [0.3, -0.2, 0.9, 0.1, 0.4, -0.7]);
    for rms in [false, true] {
        let [y0, dx0, dg0, db0] = fused::<f64>(&unit, d, &g, &b, &dy, 5e-324, rms);
        // Down to 2^-500: below that, even the smallest eps is not
        // negligible next to the variance.
        for k in [-500, -300, 600, 1000] {
            let x: Vec<f64> = unit.iter().map(|&v| ldexp(v, k)).collect();
            let [y, dx, dg, db] = fused::<f64>(&x, d, &g, &b, &dy, 5e-324, rms);
            let close = |a: &[f64], b: &[f64], s: i32| {
                a.iter().zip(b).all(|(p, q)| {
                    (p - ldexp(*q, s)).abs() <= 1e-13 * ldexp(1.0, s) * (1.0 + q.abs())
                })
            };
            assert!(close(&y, &y0, 0), "k {k} rms {rms}: y {y:?} vs {y0:?}");
            assert!(
                close(&dx, &dx0, -k),
                "k {k} rms {rms}: dx {dx:?} vs {dx0:?}"
            );
            assert!(close(&dg, &dg0, 0) && close(&db, &db0, 0), "k {k}");
        }
    }
}

// ---------------------------------------------------------------------------
// Bounds

/// `y = xhat gamma + beta` with `|xhat| <= sqrt(D)`: finite for
/// `sqrt(D) max|gamma| + max|beta| < MAX`, right up to that edge.
#[test]
fn y_stays_finite_up_to_the_documented_gamma_bound() {
    let d = 64;
    // The largest |xhat|: one outlier in a row of zeros, sqrt(D - 1).
    let mut row = vec![0.0; d];
    row[0] = 1e30;
    let gamma = vec![0.99 * f32::MAX as f64 / (d as f64).sqrt(); d];
    let beta = vec![0.0; d];
    let dy = vec![0.0; d];
    let [y, ..] = fused::<f32>(&row, d, &gamma, &beta, &dy, 1e-5, false);
    assert!(y.iter().all(|v| v.is_finite()), "{y:?}");
    // xhat = sqrt(D - 1) for the outlier, -1/sqrt(D - 1) elsewhere.
    let want0 = gamma[0] * ((d - 1) as f64).sqrt();
    assert!((y[0] - want0).abs() <= 1e-5 * want0, "{} vs {want0}", y[0]);
    let want1 = -gamma[1] / ((d - 1) as f64).sqrt();
    assert!(
        (y[1] - want1).abs() <= 1e-5 * want1.abs(),
        "{} vs {want1}",
        y[1]
    );
}

/// The composed twin squares `x - mean` in the element's own type, so in
/// f32 it is finite and accurate only while `D * spread^2 < f32::MAX`
/// (spread below `sqrt(f32::MAX / D)`, about 1.8e19 / sqrt(D)); past that,
/// its variance overflows and `y` collapses to `beta`, while the fused op
/// stays right.
#[test]
fn composed_twin_is_finite_within_its_documented_bound() {
    let d = 16;
    let bound = (f32::MAX as f64 / d as f64).sqrt();
    let mut rng = Rng::new(4);
    let unit: Vec<f64> = (0..d).map(|_| rng.range(-1.0, 1.0)).collect();
    let run = |spread: f64, composed: bool| {
        let tape = Tape::<f32>::new();
        let x: Vec<f32> = unit.iter().map(|&v| (v * spread) as f32).collect();
        let x = tape.var(Tensor::from_vec(vec![1, d], x).unwrap());
        let y = if composed {
            ops::layer_norm_composed(&x, None, None, 1e-5).unwrap()
        } else {
            ops::layer_norm(&x, None, None, 1e-5).unwrap()
        };
        y.value().to_f64_vec().unwrap()
    };
    let want = run(1.0, false);
    let near = |y: &[f64]| y.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-4);
    // Inside the bound both agree with the unit-scale result.
    for spread in [1e10, 0.25 * bound] {
        assert!(near(&run(spread, true)), "composed at {spread:e}");
        assert!(near(&run(spread, false)), "fused at {spread:e}");
    }
    // Past it only the fused op does.
    let past = run(4.0 * bound, true);
    assert!(!near(&past), "composed past the bound: {past:?}");
    assert!(near(&run(4.0 * bound, false)));
    assert!(near(&run(1e38, false)));
}

/// Ordinary rows never reach the fallback, so its cost is only the scan of
/// the per-row statistics; results of mixed tensors (ordinary rows next to
/// extreme ones) match row by row what each row gives alone.
#[test]
fn extreme_rows_do_not_disturb_their_neighbours() {
    let d = 8;
    let mut rng = Rng::new(5);
    let ordinary: Vec<f64> = (0..d).map(|_| rng.normal()).collect();
    let extreme: Vec<f64> = (0..d).map(|_| 1e35 * rng.normal()).collect();
    let (g, b) = (params(&mut rng, d), params(&mut rng, d));
    let dy: Vec<f64> = params(&mut rng, 2 * d);
    let both: Vec<f64> = ordinary.iter().chain(&extreme).copied().collect();
    let [y, dx, ..] = fused::<f32>(&both, d, &g, &b, &dy, 1e-5, false);
    let [y1, dx1, ..] = fused::<f32>(&ordinary, d, &g, &b, &dy[..d], 1e-5, false);
    for (a, b) in y[..d].iter().zip(&y1).chain(dx[..d].iter().zip(&dx1)) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{a} vs {b}");
    }
}
