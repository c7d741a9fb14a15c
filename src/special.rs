//! Special functions the ops need and Rust's std lacks: the error function
//! and the standard normal distribution, in f64.
//!
//! ```text
//! |x| < 1.5   erf(x)  = (2/sqrt pi) x e^(-x^2) sum_n (2x^2)^n / (1 3 5 .. (2n+1))
//! x >= 1.5    erfc(x) = (2x e^(-x^2)/sqrt pi) / (2x^2+1 - 1*2/(2x^2+5 - 3*4/(2x^2+9 - ..)))
//! ```
//!
//! The series has only positive terms (no cancellation) and the continued
//! fraction is evaluated bottom-up with a depth chosen by `x`; the other
//! function is `1 -` the first. `e^(-x^2)` splits `x` into a high part whose
//! square is exact and a small rest, so it carries no `x^2 eps` error.
//! Relative error: erf below ~3e-16 everywhere; erfc below ~1e-15 outside
//! `[0.5, 1.5)`, where `1 - erf` leaves up to ~2e-14.

use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI as TWO_OVER_SQRT_PI, PI};

/// Where the series hands over to the continued fraction.
const SPLIT: f64 = 1.5;

/// Past this, `erfc(x)` underflows to 0 (`e^(-x^2)` does at `x^2 > 745`).
const ERFC_ZERO: f64 = 27.3;

/// `x` with the low 32 bits of its mantissa cleared: its square is exact.
fn high_part(x: f64) -> f64 {
    f64::from_bits(x.to_bits() & !0xFFFF_FFFF)
}

/// `e^(-x^2 / 2^k)` for `k` in {0, 1}, without the rounding error of
/// forming `x^2`: `x^2 = h^2 + (x - h)(x + h)` with `h^2` exact.
fn exp_neg_sq(x: f64, halve: bool) -> f64 {
    // At +-inf the split below would form inf - inf; the limit is 0.
    if x.is_infinite() {
        return 0.0;
    }
    let h = high_part(x);
    let s = if halve { 0.5 } else { 1.0 };
    (-(h * h) * s).exp() * (-((x - h) * (x + h)) * s).exp()
}

/// erf by the positive series, for `|x| < SPLIT`.
fn erf_series(x: f64) -> f64 {
    let z = 2.0 * x * x;
    let (mut term, mut sum) = (1.0f64, 1.0f64);
    let mut n = 0.0;
    // Terms fall below 2^-56 of the sum within 27 steps for |x| < 1.5.
    while term > sum * 1.5e-17 {
        n += 1.0;
        term *= z / (2.0 * n + 1.0);
        sum += term;
    }
    TWO_OVER_SQRT_PI * x * exp_neg_sq(x, false) * sum
}

/// `erfc(x) e^(x^2)` by the continued fraction, for `x >= SPLIT`; callers
/// multiply by `e^(-x^2)` formed from the most exact argument they have.
fn erfc_scaled(x: f64) -> f64 {
    // Depths that reach ~4e-16 relative over each range.
    let depth = match x {
        x if x < 2.0 => 44,
        x if x < 3.0 => 28,
        x if x < 6.0 => 16,
        _ => 8,
    };
    let z = 2.0 * x * x;
    let mut t = z + 1.0 + 4.0 * depth as f64;
    for k in (1..=depth).rev() {
        let k = k as f64;
        t = z + 1.0 + 4.0 * (k - 1.0) - (2.0 * k - 1.0) * (2.0 * k) / t;
    }
    TWO_OVER_SQRT_PI * x / t
}

/// erfc by the continued fraction, for `x >= SPLIT`.
fn erfc_fraction(x: f64) -> f64 {
    if x >= ERFC_ZERO {
        return 0.0;
    }
    erfc_scaled(x) * exp_neg_sq(x, false)
}

/// The error function `erf(x) = (2/sqrt pi) int_0^x e^(-t^2) dt`; odd,
/// `erf(±inf) = ±1`, NaN for NaN.
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    if a.is_nan() {
        x
    } else if a < SPLIT {
        erf_series(x)
    } else {
        (1.0 - erfc_fraction(a)).copysign(x)
    }
}

/// The complementary error function `erfc(x) = 1 - erf(x)`, accurate
/// relative to itself in the right tail (where `1 - erf` would be 0).
pub fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        x
    } else if x < SPLIT {
        1.0 - erf(x)
    } else {
        erfc_fraction(x)
    }
}

/// The standard normal CDF `Phi(x) = erfc(-x / sqrt 2) / 2`, accurate
/// relative to itself in the left tail: there `e^(-x^2/2)` is formed from
/// `x` itself, so the rounding of `x / sqrt 2` (which `e^(-a^2)` would
/// magnify `x^2` times) only touches the slowly varying fraction.
pub fn normal_cdf(x: f64) -> f64 {
    let a = -x * FRAC_1_SQRT_2;
    if a.is_nan() || a < SPLIT {
        0.5 * erfc(a)
    } else if a >= ERFC_ZERO {
        0.0
    } else {
        0.5 * erfc_scaled(a) * exp_neg_sq(x, true)
    }
}

/// The standard normal density `phi(x) = e^(-x^2/2) / sqrt(2 pi)`.
pub fn normal_pdf(x: f64) -> f64 {
    exp_neg_sq(x, true) / (2.0 * PI).sqrt()
}

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    // The tests, run by `tests/unit.rs`.
    unit_tests![erf_matches_reference_values, erfc_is_accurate_in_the_tail,];

    /// Reference values (50-digit evaluations rounded to f64).
    const ERF: [(f64, f64); 8] = [
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (-1.5, -0.966_105_146_475_310_8),
        (3.0, 0.999_977_909_503_001_4),
        (1e-10, 1.128_379_167_095_512_6e-10),
        (1.49, 0.964_897_864_843_204_2),
        (1.51, 0.967_276_748_128_711_7),
    ];

    fn erf_matches_reference_values() {
        for (x, want) in ERF {
            let got = erf(x);
            assert!(
                (got - want).abs() <= 1e-15 * want.abs(),
                "erf({x}) = {got:e}, want {want:e}"
            );
            assert_eq!(erf(-x), -got, "odd at {x}");
        }
        assert_eq!(erf(0.0), 0.0);
        assert_eq!(erf(f64::INFINITY), 1.0);
        assert_eq!(erf(f64::NEG_INFINITY), -1.0);
        assert!(erf(f64::NAN).is_nan());
    }

    fn erfc_is_accurate_in_the_tail() {
        // erfc(x) for x where 1 - erf(x) is 0 or all rounding.
        for (x, want) in [
            (2.0, 4.677_734_981_047_266e-3),
            (5.0, 1.537_459_794_428_035e-12),
            (10.0, 2.088_487_583_762_545e-45),
            (26.0, 5.663_192_408_856_143e-296),
        ] {
            let got = erfc(x);
            assert!(
                (got - want).abs() <= 2e-15 * want,
                "erfc({x}) = {got:e}, want {want:e}"
            );
        }
        assert_eq!(erfc(30.0), 0.0);
        assert_eq!(erfc(f64::INFINITY), 0.0);
        assert_eq!(erfc(f64::NEG_INFINITY), 2.0);
        // Phi in the left tail, relative to itself.
        let want = 7.619_853_024_160_525e-24; // Phi(-10)
        assert!((normal_cdf(-10.0) - want).abs() <= 1e-15 * want);
        let want = 5.725_571_222_524_577e-300; // Phi(-37)
        assert!((normal_cdf(-37.0) - want).abs() <= 1e-15 * want);
        assert_eq!(normal_cdf(0.0), 0.5);
        let want = 0.398_942_280_401_432_7; // 1 / sqrt(2 pi)
        assert!((normal_pdf(0.0) - want).abs() <= 1e-16);
    }
}
