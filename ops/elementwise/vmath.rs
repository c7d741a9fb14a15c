//! Elementwise math in f32 written to vectorize: exp, log, tanh, sigmoid,
//! and the exact (erf) GELU and its slope. f32, f16 and bf16 compute in
//! f32 with these; f64 keeps the series of [`crate::special`].
//!
//! Every function is branch-free straight-line code over one value
//! (selects, not jumps; integer work on the bit pattern; rounding to an
//! integer by adding `1.5 * 2^23`), so a loop over a block of values
//! compiles to SIMD code for whatever instruction set the enclosing
//! function is built for ([`MapRow`] and [`ZipRow`] run through
//! [`dispatch`], as the other f32 kernels do). There is no fused
//! multiply-add: Rust never contracts `a * b + c`, so the portable, AVX2
//! and AVX-512 builds give the same bits.
//!
//! Accuracy, against the f64 reference rounded once to f32, measured over
//! a sweep of bit patterns spanning the whole f32 range (see the tests;
//! figures in docs/performance.md, "Elementwise kernels"), as the distance
//! in representable f32 values (subnormal results included, so there the
//! bound is absolute, in units of 2^-149):
//!
//! | function | max distance |
//! |---|---|
//! | `gelu_erf` | 2 |
//! | `exp`, `log`, `sigmoid`, `tanh` | 2 |
//! | `gelu_erf_slope` | 3, or 2^-24 absolute near its zero at x = -0.7518 |
//!
//! The polynomial coefficients were fitted (by interpolation at Chebyshev
//! nodes, in f64, then rounded to f32) by this project for these ranges.

use crate::device::cpu::{dispatch, Kernel, Lanes};
use crate::dtype::{Accum, Element};

type Acc<T> = <T as Element>::Acc;

/// `1.5 * 2^23`: for `|v| < 2^22`, `v + MAGIC` rounds `v` to the nearest
/// integer, held in the low mantissa bits (and `- MAGIC` gives it as f32).
const MAGIC: f32 = 12_582_912.0;
/// The bit pattern of [`MAGIC`].
const MAGIC_BITS: i32 = 0x4B40_0000;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split: `LN2_HI` has 15 significant bits, so `n * LN2_HI` is exact
/// for `|n| < 512`; `LN2_LO = ln 2 - LN2_HI` rounded.
const LN2_HI: f32 = 0.69314575;
const LN2_LO: f32 = 1.4286068e-06;
/// `1 / sqrt(2 pi)`.
const INV_SQRT_2PI: f32 = 0.3989423;

/// `(e^r - 1 - r) / r^2` on `|r| <= 0.36`.
const EXP_Q: [f32; 6] = [
    0.5,
    0.16666667,
    0.041666433,
    0.008333308,
    0.0013937182,
    0.00019894913,
];
/// `(tanh x - x) / x^3` as a polynomial in `x^2`, `|x| < 0.625`.
const TANH_P: [f32; 7] = [
    -0.33333334,
    0.13333333,
    -0.05396764,
    0.021859895,
    -0.008791004,
    0.0033062478,
    -0.00086221716,
];
/// `(2 atanh s - 2 s) / s^3` as a polynomial in `s^2`, `|s| <= 0.1716`.
const LOG_P: [f32; 4] = [0.6666667, 0.40000123, 0.28550732, 0.23332912];
/// `(Phi(x) - 1/2) / x` as a polynomial in `x^2`, `|x| < 1/2`.
const GELU_CORE: [f32; 6] = [
    0.3989423,
    -0.06649038,
    0.009973556,
    -0.0011873108,
    0.00011529948,
    -8.959383e-06,
];
/// `(Phi(x) + x phi(x) - 1/2) / x` as a polynomial in `x^2`, `|x| < 1/2`.
const SLOPE_CORE: [f32; 6] = [
    0.7978846,
    -0.26596153,
    0.059841327,
    -0.009498383,
    0.0011524643,
    -0.00010656979,
];

/// The Mills-type ratio `S(a) = a Phi(-a) e^(a^2/2)`, smooth and between
/// 0.17 and `1/sqrt(2 pi)` for `a >= 1/2`, in three pieces:
/// `S = C0 + (C0_LO + v R(v))` with `v = a - 1` on `[1/2, 3/2)`,
/// `v = a - 5/2` on `[3/2, 7/2)` (both subtractions exact) and `v = 1/a`
/// beyond. `C0` holds the
/// value at the piece's centre to f32 and `C0_LO` the rest, so that the
/// sum carries ~1/4 ulp of error before its last rounding.
const S_C0: [f32; 3] = [0.2615783, 0.35332832, INV_SQRT_2PI];
const S_C0_LO: [f32; 3] = [2.1053664e-10, 1.10476455e-08, -1.133517e-08];
const S_SHIFT: [f32; 2] = [1.0, 2.5];
const S_R: [[f32; 8]; 3] = [
    [
        0.1242143,
        -0.07525684,
        0.0370218,
        -0.015830299,
        0.0060841576,
        -0.0021497128,
        0.0007404851,
        -0.00022802758,
    ],
    [
        0.027296439,
        -0.011493385,
        0.0040708133,
        -0.0012872192,
        0.00037200202,
        -0.00010112157,
        2.9251338e-05,
        -7.0808937e-06,
    ],
    [
        -5.378126e-06,
        -0.3986679,
        -0.0054488955,
        1.2459939,
        -0.105197415,
        -7.771258,
        16.69651,
        -11.974376,
    ],
];

/// Where the GELU pieces change: below this `|x|` the core polynomial.
const GELU_SPLIT: f32 = 0.5;
/// Past this `|x|` both tails underflow f32 (`15 e^(-15^2/2) / sqrt(2 pi)
/// < 2^-150`): inputs are clamped here, so infinities give finite
/// intermediate values and the limits 0 and 1 exactly.
const GELU_CLAMP: f32 = 15.0;

/// `v` when `c`, else `w`: compiles to a blend.
#[inline(always)]
fn sel(c: bool, v: f32, w: f32) -> f32 {
    if c {
        v
    } else {
        w
    }
}

/// `c[0] + x c[1] + x^2 c[2] + ...` by Horner's rule.
#[inline(always)]
fn horner<const N: usize>(c: &[f32; N], x: f32) -> f32 {
    let mut r = c[N - 1];
    for k in (0..N - 1).rev() {
        r = r * x + c[k];
    }
    r
}

/// `2^n` for `-126 <= n <= 127`.
#[inline(always)]
fn pow2i(n: i32) -> f32 {
    f32::from_bits(((n + 127) as u32) << 23)
}

/// `v * 2^n` for `-252 <= n <= 254`, in two exact-or-final steps: the first
/// factor keeps `v 2^(n/2)` normal, so only the second rounds (once, also
/// into the subnormals).
#[inline(always)]
fn scale(v: f32, n: i32) -> f32 {
    let n1 = n >> 1;
    v * pow2i(n1) * pow2i(n - n1)
}

/// `(n, n as f32)` with `n` the integer nearest `v`, `|v| < 2^22`.
#[inline(always)]
fn round_int(v: f32) -> (i32, f32) {
    let k = v + MAGIC;
    (k.to_bits() as i32 - MAGIC_BITS, k - MAGIC)
}

/// `e^x`: `x = n ln 2 + r`, `|r| <= ln 2 / 2` (the first subtraction
/// exact), `e^r = 1 + r + r^2 Q(r)`, scaled by `2^n`. Overflows to +inf
/// past 88.72, is 0 below -103.98, keeps NaN.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    // Clamped so that `n` stays in `scale`'s range; NaN fails both tests.
    let xc = sel(x < -104.0, -104.0, sel(x > 89.0, 89.0, x));
    let (ni, n) = round_int(xc * LOG2E);
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let p = 1.0 + (r + (r * r) * horner(&EXP_Q, r));
    scale(p, ni)
}

/// `ln x`: `x = 2^k m`, `m` in `[sqrt(1/2), sqrt 2)`, `f = m - 1` (exact),
/// `ln(1 + f) = f - f^2/2 + s (f^2/2 + R)` with `s = f / (2 + f)` and `R =
/// 2 atanh s - 2 s`. Subnormals are scaled by 2^23 first; `ln 0 = -inf`,
/// `ln(x < 0) = NaN`, `ln inf = inf`, NaN stays NaN.
#[inline(always)]
pub(crate) fn ln(x: f32) -> f32 {
    let sub = x < f32::MIN_POSITIVE;
    let xs = sel(sub, x * 8_388_608.0, x);
    // Moves mantissas at or above sqrt 2 into the next binade.
    let ix = (xs.to_bits() as i32).wrapping_add(0x3F80_0000 - 0x3F35_04F3);
    let k = (ix >> 23) - 127 - if sub { 23 } else { 0 };
    let m = f32::from_bits(((ix & 0x007F_FFFF) + 0x3F35_04F3) as u32);
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let r = z * horner(&LOG_P, z);
    let hfsq = 0.5 * f * f;
    let kf = k as f32;
    let y = kf * LN2_HI - ((hfsq - (s * (hfsq + r) + kf * LN2_LO)) - f);
    let y = sel(x == f32::INFINITY, f32::INFINITY, y);
    let y = sel(x == 0.0, f32::NEG_INFINITY, y);
    let y = sel(x < 0.0, f32::NAN, y);
    sel(x.is_nan(), x, y)
}

/// `tanh x`: `x + x^3 P(x^2)` below `|x| = 0.625`, else `(1 - e)/(1 + e)`
/// with `e = e^(-2|x|)` (no cancellation there: `e <= 0.29`); the sign
/// is copied from `x` (so `tanh -0 = -0`), NaN stays NaN.
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let z = a * a;
    let small = a + (a * z) * horner(&TANH_P, z);
    // tanh is 1 in f32 past 9.01; NaN fails the test and stays.
    let e = exp(-2.0 * sel(a > 9.5, 9.5, a));
    let big = (1.0 - e) / (1.0 + e);
    sel(a < 0.625, small, big).copysign(x)
}

/// `1 / (1 + e^-x)` as `1 / (1 + e)` or `e / (1 + e)` with `e = e^-|x|`
/// (which never overflows); 0 at -inf, 1 at +inf, NaN stays NaN.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    let e = exp(-x.abs());
    sel(x >= 0.0, 1.0, e) / (1.0 + e)
}

/// The Gaussian tail at `a = |x| >= 1/2` (clamped to [`GELU_CLAMP`]):
/// `(S, rest, n)` with `a Phi(-a) = rest * 2^n` (to ~1 ulp before its last
/// rounding), `S` the ratio above in f32 and `e^(-a^2/2) = (1 + w) 2^n`
/// returned as `w` too.
#[inline(always)]
fn gauss_tail(a: f32) -> (f32, f32, f32, i32) {
    let a = sel(a > GELU_CLAMP, GELU_CLAMP, a);
    // The piece: its constants picked per lane.
    let (p0, p1) = (a < 1.5, a < 3.5);
    let pick = |t: &[f32; 3]| sel(p0, t[0], sel(p1, t[1], t[2]));
    let v = sel(p0, a - S_SHIFT[0], sel(p1, a - S_SHIFT[1], 1.0 / a));
    // Written out: an `array::from_fn` loop here stays a loop, and a loop
    // inside the body keeps the caller's element loop from vectorizing.
    let c = |k: usize| pick(&[S_R[0][k], S_R[1][k], S_R[2][k]]);
    let coef = [c(0), c(1), c(2), c(3), c(4), c(5), c(6), c(7)];
    let c0 = pick(&S_C0);
    let t = pick(&S_C0_LO) + v * horner(&coef, v);
    // -a^2/2 = hi + lo with hi exact: h keeps 12 significant bits of a,
    // so h^2 is exact, and a^2 - h^2 = (a - h)(a + h) is small.
    let h = f32::from_bits(a.to_bits() & 0xFFFF_F000);
    let hi = -0.5 * (h * h);
    let lo = (-0.5 * (a - h)) * (a + h);
    let (ni, n) = round_int((hi + lo) * LOG2E);
    // hi - n LN2_HI is exact (the two are within a factor 2, or n = 0);
    // r + rl = (that) + (lo - n LN2_LO) exactly (TwoSum).
    let y = hi - n * LN2_HI;
    let z = lo - n * LN2_LO;
    let r = y + z;
    let bb = r - y;
    let rl = (y - (r - bb)) + (z - bb);
    let w = r + (r * r) * horner(&EXP_Q, r);
    // S e^r = (c0 + t)(1 + w + rl): c0 is exact, the small terms go first.
    let rest = c0 + ((c0 * w + t) + (t * w + c0 * rl));
    (c0 + t, rest, w, ni)
}

/// GELU, exact: `x Phi(x)`. Below `|x| = 1/2`, `x (1/2 + x P(x^2))`;
/// beyond, from [`gauss_tail`], `-a Phi(-a)` for negative `x` (relative
/// accuracy all the way into the subnormals) and `x - a Phi(-a)` for
/// positive. `gelu(-inf) = -0`, `gelu(inf) = inf`, NaN stays NaN.
#[inline(always)]
pub(crate) fn gelu_erf(x: f32) -> f32 {
    gelu_of(x, gauss_tail(x.abs()))
}

/// GELU's slope `Phi(x) + x phi(x)`: below `|x| = 1/2`, `1/2 + x P(x^2)`;
/// beyond, with `G = a / sqrt(2 pi) - S / a` (so `e^(-a^2/2) G =
/// a phi(a) - Phi(-a)`), `-e^(-a^2/2) G` for negative `x` and `1 + e^(-a^2/2)
/// G` for positive. 0 at -inf (as -0), 1 at +inf, NaN stays NaN.
#[inline(always)]
pub(crate) fn gelu_erf_slope(x: f32) -> f32 {
    slope_of(x, gauss_tail(x.abs()))
}

/// [`gelu_erf`] and [`gelu_erf_slope`] of one value, the same bits as the
/// two, through one Gaussian tail.
#[inline(always)]
pub(crate) fn gelu_erf_and_slope(x: f32) -> (f32, f32) {
    let tail = gauss_tail(x.abs());
    (gelu_of(x, tail), slope_of(x, tail))
}

/// [`gelu_erf`] given `gauss_tail(|x|)`.
#[inline(always)]
fn gelu_of(x: f32, (_, rest, _, n): (f32, f32, f32, i32)) -> f32 {
    let core = x * (0.5 + x * horner(&GELU_CORE, x * x));
    let tail = scale(rest, n);
    let far = sel(x < 0.0, -tail, x - tail);
    sel(x.abs() < GELU_SPLIT, core, far)
}

/// [`gelu_erf_slope`] given `gauss_tail(|x|)`.
#[inline(always)]
fn slope_of(x: f32, (s, _, w, n): (f32, f32, f32, i32)) -> f32 {
    let a = x.abs();
    let core = 0.5 + x * horner(&SLOPE_CORE, x * x);
    let ac = sel(a > GELU_CLAMP, GELU_CLAMP, a);
    let g = ac * INV_SQRT_2PI - s / ac;
    let eg = scale(g + g * w, n);
    let far = sel(x < 0.0, -eg, 1.0 + eg);
    sel(a < GELU_SPLIT, core, far)
}

/// `e.to_acc()` as f32 (exact: the accumulation type is f32 wherever these
/// kernels are used, and the f64 round trip folds away).
#[inline(always)]
fn to_f32<T: Element>(e: T) -> f32 {
    e.to_acc().f64() as f32
}

/// `v` as an element (one rounding for f16 and bf16; none for f32).
#[inline(always)]
fn from_f32<T: Element>(v: f32) -> T {
    T::from_acc(<Acc<T> as Accum>::of(v as f64))
}

/// Values per block: widened into a stack array, mapped by a fixed-length
/// loop (which vectorizes whatever the element type's conversions do),
/// then narrowed.
const BLOCK: usize = 64;

/// `y[i] = f(x[i])` over one contiguous piece.
pub(crate) struct MapRow<'a, T, F> {
    pub f: F,
    pub x: &'a [T],
    pub y: &'a mut [T],
}

impl<T: Element, F: Fn(f32) -> f32> Kernel<T> for MapRow<'_, T, F> {
    type Output = ();
    #[inline(always)]
    fn run<V: Lanes<T>>(self) {
        let MapRow { f, x, y } = self;
        let mut xb = [0f32; BLOCK];
        for (xc, yc) in x.chunks(BLOCK).zip(y.chunks_mut(BLOCK)) {
            for (b, &e) in xb.iter_mut().zip(xc) {
                *b = to_f32(e);
            }
            // A plain counted loop: `array::from_fn`'s loop (with its drop
            // guard) is left scalar once the body is too big to unroll.
            let mut yb = [0f32; BLOCK];
            for (o, &v) in yb.iter_mut().zip(&xb) {
                *o = f(v);
            }
            for (o, &v) in yc.iter_mut().zip(&yb) {
                *o = from_f32(v);
            }
        }
    }
}

/// `y[i] = f(a[i], b[i])` over one contiguous piece.
pub(crate) struct ZipRow<'a, T, F> {
    pub f: F,
    pub a: &'a [T],
    pub b: &'a [T],
    pub y: &'a mut [T],
}

impl<T: Element, F: Fn(f32, f32) -> f32> Kernel<T> for ZipRow<'_, T, F> {
    type Output = ();
    #[inline(always)]
    fn run<V: Lanes<T>>(self) {
        let ZipRow { f, a, b, y } = self;
        let (mut ab, mut bb) = ([0f32; BLOCK], [0f32; BLOCK]);
        for ((ac, bc), yc) in a
            .chunks(BLOCK)
            .zip(b.chunks(BLOCK))
            .zip(y.chunks_mut(BLOCK))
        {
            for ((p, q), (&u, &v)) in ab.iter_mut().zip(bb.iter_mut()).zip(ac.iter().zip(bc)) {
                *p = to_f32(u);
                *q = to_f32(v);
            }
            let mut yb = [0f32; BLOCK];
            for (o, (&p, &q)) in yb.iter_mut().zip(ab.iter().zip(&bb)) {
                *o = f(p, q);
            }
            for (o, &v) in yc.iter_mut().zip(&yb) {
                *o = from_f32(v);
            }
        }
    }
}

/// `(y[i], z[i]) = (gelu(x[i]), gelu'(x[i]))` ([`gelu_erf_and_slope`])
/// over one contiguous piece. (The function is named, not a parameter:
/// passed in, its call was not inlined and the loop stayed scalar.)
pub(crate) struct GeluRow<'a, T> {
    pub x: &'a [T],
    pub y: &'a mut [T],
    pub z: &'a mut [T],
}

impl<T: Element> Kernel<T> for GeluRow<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run<V: Lanes<T>>(self) {
        let GeluRow { x, y, z } = self;
        let mut xb = [0f32; BLOCK];
        for ((xc, yc), zc) in x
            .chunks(BLOCK)
            .zip(y.chunks_mut(BLOCK))
            .zip(z.chunks_mut(BLOCK))
        {
            for (b, &e) in xb.iter_mut().zip(xc) {
                *b = to_f32(e);
            }
            // Counted loops over a block, as in `MapRow`.
            let (mut yb, mut zb) = ([0f32; BLOCK], [0f32; BLOCK]);
            for i in 0..BLOCK {
                (yb[i], zb[i]) = gelu_erf_and_slope(xb[i]);
            }
            for ((o, p), (&u, &v)) in yc.iter_mut().zip(zc.iter_mut()).zip(yb.iter().zip(&zb)) {
                *o = from_f32(u);
                *p = from_f32(v);
            }
        }
    }
}

/// [`MapRow`] in the best build for this CPU.
#[inline(always)]
pub(crate) fn map_row<T: Element>(f: impl Fn(f32) -> f32, x: &[T], y: &mut [T]) {
    dispatch(MapRow { f, x, y })
}

/// [`ZipRow`] in the best build for this CPU.
#[inline(always)]
pub(crate) fn zip_row<T: Element>(f: impl Fn(f32, f32) -> f32, a: &[T], b: &[T], y: &mut [T]) {
    dispatch(ZipRow { f, a, b, y })
}

/// Applies `f` (one of this module's f32 functions) to an element.
#[inline(always)]
pub(crate) fn via_f32<T: Element>(f: impl Fn(f32) -> f32, v: Acc<T>) -> Acc<T> {
    <Acc<T> as Accum>::of(f(v.f64() as f32) as f64)
}

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests;
