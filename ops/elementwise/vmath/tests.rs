//! The f32 functions against the f64 reference rounded once to f32, over
//! a sweep of bit patterns across the whole f32 range plus a dense sweep
//! of where each function bends, with the IEEE special values.

use super::*;
use crate::device::cpu::{best_simd, set_simd_limit, Simd, SIMD_TESTS};
use crate::special::{normal_cdf, normal_pdf};

// The tests, run by `tests/unit.rs`.
unit_tests![
    exp_is_within_2_ulp_and_ieee_at_the_edges,
    log_is_within_2_ulp_and_ieee_at_the_edges,
    tanh_is_within_2_ulp_and_saturates,
    sigmoid_is_within_2_ulp_and_saturates,
    gelu_is_within_2_ulp_of_the_f64_reference,
    gelu_slope_is_within_3_ulp_or_2_pow_minus_24,
    every_build_gives_the_scalar_bits,
    half_types_are_within_1_unit_everywhere,
];

/// A named f32 function.
type F32Fn = (&'static str, fn(f32) -> f32);
/// A unary kind and its f64 reference.
type Reference = (crate::ops::elementwise::Unary, fn(f64) -> f64);

/// The bit pattern as an integer that increases with the value (-0 and
/// +0 both 0), so the difference of two is the count of f32 values
/// between them.
fn ordered(v: f32) -> i64 {
    let b = v.to_bits() as i64;
    if b & 0x8000_0000 != 0 {
        -(b & 0x7FFF_FFFF)
    } else {
        b
    }
}

/// Distance from `got` to `want` rounded to f32: f32 values between them
/// (subnormals count in units of 2^-149, so this is an absolute bound
/// there). NaN must meet NaN; infinities must match.
fn dist(got: f32, want: f64) -> i64 {
    let w = want as f32;
    if w.is_nan() || got.is_nan() {
        return if w.is_nan() && got.is_nan() {
            0
        } else {
            i64::MAX
        };
    }
    if w.is_infinite() || got.is_infinite() {
        return if w == got { 0 } else { i64::MAX };
    }
    (ordered(got) - ordered(w)).abs()
}

/// Every 1021st bit pattern (both signs, all exponents), a dense even
/// sweep of `[-span, span]`, and the special values.
fn sweep(span: f32) -> Vec<f32> {
    let mut v: Vec<f32> = (0..=u32::MAX).step_by(1021).map(f32::from_bits).collect();
    let n = 1 << 21;
    v.extend((0..=n).map(|i| -span + 2.0 * span * i as f32 / n as f32));
    v.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::from_bits(0x007F_FFFF),
        f32::MAX,
        f32::MIN,
        f32::EPSILON,
    ]);
    v
}

/// The largest distance of `f` from `reference` over `xs`, and where.
fn worst(xs: &[f32], f: impl Fn(f32) -> f32, reference: impl Fn(f64) -> f64) -> (i64, f32) {
    xs.iter()
        .map(|&x| (dist(f(x), reference(x as f64)), x))
        .fold((0, 0.0), |a, b| if b.0 > a.0 { b } else { a })
}

fn sigmoid64(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        x.exp() / (1.0 + x.exp())
    }
}

/// `x Phi(x)`, with its limits at the infinities (where `x * Phi(x)`
/// would form `-inf * 0`).
fn gelu64(x: f64) -> f64 {
    if x.is_infinite() {
        return x.max(0.0);
    }
    x * normal_cdf(x)
}

fn slope64(x: f64) -> f64 {
    let p = normal_pdf(x);
    if p == 0.0 {
        normal_cdf(x)
    } else {
        normal_cdf(x) + x * p
    }
}

fn exp_is_within_2_ulp_and_ieee_at_the_edges() {
    let (d, at) = worst(&sweep(110.0), exp, f64::exp);
    eprintln!("worst exp: {d} ulp at {at:e}");
    assert!(d <= 2, "exp: {d} ulp at {at:e}");
    assert_eq!(exp(f32::INFINITY), f32::INFINITY);
    assert_eq!(exp(89.0), f32::INFINITY);
    assert!(exp(88.72).is_finite());
    assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp(-104.0), 0.0);
    assert!(exp(-103.0) > 0.0, "subnormal results");
    assert_eq!(exp(0.0), 1.0);
    assert!(exp(f32::NAN).is_nan());
}

fn log_is_within_2_ulp_and_ieee_at_the_edges() {
    let (d, at) = worst(&sweep(1e4), ln, f64::ln);
    eprintln!("worst log: {d} ulp at {at:e}");
    assert!(d <= 2, "log: {d} ulp at {at:e}");
    assert_eq!(ln(0.0), f32::NEG_INFINITY);
    assert_eq!(ln(-0.0), f32::NEG_INFINITY);
    assert!(ln(-1.0).is_nan());
    assert!(ln(f32::NEG_INFINITY).is_nan());
    assert_eq!(ln(f32::INFINITY), f32::INFINITY);
    assert_eq!(ln(1.0), 0.0);
    assert!(ln(f32::NAN).is_nan());
    assert_eq!(dist(ln(f32::from_bits(1)), (2f64).powi(-149).ln()), 0);
}

fn tanh_is_within_2_ulp_and_saturates() {
    let (d, at) = worst(&sweep(12.0), tanh, f64::tanh);
    eprintln!("worst tanh: {d} ulp at {at:e}");
    assert!(d <= 2, "tanh: {d} ulp at {at:e}");
    assert_eq!(tanh(f32::INFINITY), 1.0);
    assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
    assert_eq!(tanh(-0.0).to_bits(), (-0.0f32).to_bits());
    assert!(tanh(f32::NAN).is_nan());
}

fn sigmoid_is_within_2_ulp_and_saturates() {
    let (d, at) = worst(&sweep(110.0), sigmoid, sigmoid64);
    eprintln!("worst sigmoid: {d} ulp at {at:e}");
    assert!(d <= 2, "sigmoid: {d} ulp at {at:e}");
    assert_eq!(sigmoid(f32::INFINITY), 1.0);
    assert_eq!(sigmoid(f32::NEG_INFINITY), 0.0);
    assert!(sigmoid(f32::NAN).is_nan());
}

fn gelu_is_within_2_ulp_of_the_f64_reference() {
    let (d, at) = worst(&sweep(15.0), gelu_erf, gelu64);
    eprintln!("worst gelu: {d} ulp at {at:e}");
    assert!(d <= 2, "gelu: {d} ulp at {at:e}");
    assert_eq!(gelu_erf(f32::INFINITY), f32::INFINITY);
    assert_eq!(gelu_erf(f32::NEG_INFINITY), 0.0);
    assert_eq!(gelu_erf(-20.0), 0.0);
    assert!(gelu_erf(-13.5) < 0.0, "the tail reaches the subnormals");
    assert_eq!(gelu_erf(0.0), 0.0);
    assert_eq!(gelu_erf(1e30), 1e30);
    assert!(gelu_erf(f32::NAN).is_nan());
}

fn gelu_slope_is_within_3_ulp_or_2_pow_minus_24() {
    // Near its zero at x = -0.7518 no formula keeps relative accuracy:
    // there the bound is absolute, 2^-24 (a unit of 1/2's last place).
    let xs = sweep(15.0);
    let mut worst_rel = 0;
    for &x in &xs {
        let (got, want) = (gelu_erf_slope(x), slope64(x as f64));
        let d = dist(got, want);
        if d <= 3 {
            worst_rel = worst_rel.max(d);
            continue;
        }
        let abs = (got as f64 - want).abs();
        assert!(
            abs <= (2f64).powi(-24),
            "slope at {x:e}: {got:e}, want {want:e} ({d} ulp)"
        );
    }
    eprintln!("worst slope (relative part): {worst_rel} ulp");
    assert!(worst_rel <= 3);
    assert_eq!(gelu_erf_slope(f32::INFINITY), 1.0);
    assert_eq!(gelu_erf_slope(f32::NEG_INFINITY), 0.0);
    assert_eq!(gelu_erf_slope(0.0), 0.5);
    assert!(gelu_erf_slope(f32::NAN).is_nan());
}

/// The SIMD builds of the row kernels give the scalar function's bits.
fn every_build_gives_the_scalar_bits() {
    let _hold = SIMD_TESTS.lock();
    let x: Vec<f32> = (0..=u32::MAX).step_by(65_537).map(f32::from_bits).collect();
    let funs: [F32Fn; 6] = [
        ("exp", exp),
        ("log", ln),
        ("tanh", tanh),
        ("sigmoid", sigmoid),
        ("gelu", gelu_erf),
        ("slope", gelu_erf_slope),
    ];
    for limit in [Simd::Avx512, Simd::Avx2, Simd::Portable] {
        if limit > best_simd() {
            continue;
        }
        set_simd_limit(limit);
        for (name, f) in funs {
            let mut y = vec![0f32; x.len()];
            map_row(f, &x, &mut y);
            for (&xi, &yi) in x.iter().zip(&y) {
                let want = f(xi);
                assert!(
                    yi.to_bits() == want.to_bits() || (yi.is_nan() && want.is_nan()),
                    "{name} ({limit}) at {xi:e}: {yi:e} vs {want:e}"
                );
            }
        }
        // The forward pass that keeps GELU's slope: both kernels' bits.
        let (y, z) = crate::ops::elementwise::cpu::gelu_and_slope(&x);
        for ((&xi, &yi), &zi) in x.iter().zip(y.iter()).zip(z.iter()) {
            for (name, got, want) in [
                ("gelu", yi, gelu_erf(xi)),
                ("slope", zi, gelu_erf_slope(xi)),
            ] {
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "{name} of gelu_and_slope ({limit}) at {xi:e}: {got:e} vs {want:e}"
                );
            }
        }
    }
    set_simd_limit(Simd::Avx512);
}

/// f16 and bf16 through the op: every bit pattern is within 1 unit of the
/// f64 reference rounded once to the type.
fn half_types_are_within_1_unit_everywhere() {
    use crate::ops::elementwise::cpu::{binary, unary};
    use crate::ops::elementwise::{Binary, Unary};
    fn check<T: Element + Copy>(
        name: &str,
        from: fn(f64) -> T,
        bits: fn(T) -> u16,
        of_bits: fn(u16) -> T,
    ) {
        let x: Vec<T> = (0..=u16::MAX).map(of_bits).collect();
        let n = x.len();
        let ord = |t: T| {
            let b = bits(t) as i64;
            if b & 0x8000 != 0 {
                -(b & 0x7FFF)
            } else {
                b
            }
        };
        let funs: [Reference; 5] = [
            (Unary::Exp, f64::exp),
            (Unary::Log, f64::ln),
            (Unary::Tanh, f64::tanh),
            (Unary::Sigmoid, sigmoid64),
            (Unary::GeluErf, gelu64),
        ];
        let ones = vec![from(1.0); x.len()];
        let mut dx = vec![from(0.0); x.len()];
        binary(
            Binary::GeluErfGrad,
            (&ones[..], &[n][..]),
            (&x[..], &[n][..]),
            &[n],
            &mut dx,
        );
        type Out<T> = (String, Vec<T>, fn(f64) -> f64);
        let mut outs: Vec<Out<T>> = funs
            .iter()
            .map(|(k, r)| (format!("{k:?}"), unary(*k, &x).to_vec(), *r))
            .collect();
        outs.push(("slope".into(), dx, slope64));
        for (what, y, r) in outs {
            for (&xi, &yi) in x.iter().zip(&y) {
                let want = from(r(xi.to_f64()));
                let (g, w) = (yi.to_f64(), want.to_f64());
                if g.is_nan() || w.is_nan() {
                    assert!(g.is_nan() && w.is_nan(), "{name} {what} at {}", xi.to_f64());
                    continue;
                }
                let d = (ord(yi) - ord(want)).abs();
                // The slope's zero: absolute, as in f32.
                let near_zero = what == "slope" && (g - w).abs() <= (2f64).powi(-20);
                assert!(
                    d <= 1 || near_zero,
                    "{name} {what} at {}: {g:e}, want {w:e}",
                    xi.to_f64()
                );
            }
        }
    }
    use half::{bf16, f16};
    check::<f16>("f16", f16::from_f64, f16::to_bits, f16::from_bits);
    check::<bf16>("bf16", bf16::from_f64, bf16::to_bits, bf16::from_bits);
}
