//! The scaled fallback of the fused LayerNorm and RMSNorm: rows whose values
//! are all finite but out of the fast kernels' range.
//!
//! The kernels square deviations in `T::Acc`. In f32, `(x - mean)^2`
//! overflows once the row's spread passes about `1.8e19` (so `var` is inf,
//! `rstd` is 0 and `y` would silently be `beta`), `x - x0` overflows for a
//! spread past `f32::MAX`, and squares below `f32::MIN_POSITIVE` lose bits
//! (which matters only when `eps` is tiny too). The same happens in f64 at
//! `1.3e154`. Such rows are recognised from the kernel's own statistics
//! ([`suspect_rows`]: `mean` not finite, `rstd` zero, not finite, or above
//! [`rstd_limit`]) and recomputed here, in f64, on the row scaled by a power
//! of two.
//!
//! Scaling is exact. With `z = x 2^k` and `k` chosen so that
//! `1 <= max |z| < 2`:
//!
//! ```text
//! mean_z = mean(z),  var_z = mean((z - mean_z)^2)   (<= 4: nothing overflows)
//! eps_z  = eps 2^(2k)
//! r_z    = 1 / sqrt(var_z + eps_z)
//! xhat   = (z - mean_z) r_z = (x - mean) / sqrt(var + eps)
//! mean   = mean_z 2^-k,   rstd = r_z 2^k
//! ```
//!
//! If `eps_z` overflows, `eps` exceeds `var` by a factor of at least
//! `2^1020`, and if `var_z` is 0 the row is constant: either way the row is
//! normalized unscaled with `rstd = 1/sqrt(eps)`.
//! RMSNorm is the same with `mean_z = 0`. Backward, with these `xhat` and
//! `g = dy gamma`: `dx = rstd (g - <g> - xhat <g xhat>)` (no `<g>` for
//! RMSNorm), computed as `2^k (r_z (...))` so that `rstd` itself never
//! under- or overflows. When any row of a node took the fallback, its whole
//! backward runs here (rows in order, sums in f64), so `dgamma` and `dbeta`
//! never mix a poisoned kernel partial.

use crate::dtype::{Accum, Element};
use num_traits::{Float, Zero};

type Acc<T> = <T as Element>::Acc;

/// `v 2^k` for any `k`, in steps that stay within f64's exponent range; exact
/// unless the result is subnormal, over- or underflows.
fn scale(mut v: f64, mut k: i32) -> f64 {
    const STEP: i32 = 1000;
    while k > STEP {
        v *= pow2(STEP);
        k -= STEP;
    }
    while k < -STEP {
        v *= pow2(-STEP);
        k += STEP;
    }
    v * pow2(k)
}

/// `2^k` for `-1022 <= k <= 1023`.
fn pow2(k: i32) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// The binary exponent `e` of a finite `m > 0`: `2^e <= m < 2^(e+1)`.
fn exponent(m: f64) -> i32 {
    let e = ((m.to_bits() >> 52) & 0x7ff) as i32;
    if e == 0 {
        // Subnormal: lift into the normal range first.
        exponent(m * pow2(64)) - 64
    } else {
        e - 1023
    }
}

/// How one row is normalized: `xhat_i = (x_i 2^kx - shift) r`, and
/// `rstd = r 2^kout`.
struct RowNorm {
    kx: i32,
    shift: f64,
    r: f64,
    kout: i32,
}

impl RowNorm {
    /// `centre`: LayerNorm (subtract the mean) or RMSNorm (do not).
    fn new(x: &[f64], eps: f64, centre: bool) -> Self {
        let big = x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        // Unscaled for a zero row and for rows with NaN or inf, which then
        // propagate through the same formulas as IEEE arithmetic says.
        let k = if big > 0.0 && big.is_finite() {
            -exponent(big)
        } else {
            0
        };
        let d = x.len().max(1) as f64;
        let z0 = x.first().map_or(0.0, |&v| scale(v, k));
        let mean_z = if centre {
            // Shifted by the first value, so a constant row has var 0.
            z0 + x.iter().map(|&v| scale(v, k) - z0).sum::<f64>() / d
        } else {
            0.0
        };
        let var_z = x
            .iter()
            .map(|&v| {
                let e = scale(v, k) - mean_z;
                e * e
            })
            .sum::<f64>()
            / d;
        let eps_z = scale(eps, 2 * k);
        // A constant row (var_z = 0: deviations of a row scaled to [1, 2)
        // cannot underflow) has rstd = 1/sqrt(eps) exactly, whether or not
        // eps survives the scaling.
        if eps_z.is_finite() && var_z > 0.0 {
            RowNorm {
                kx: k,
                shift: mean_z,
                r: 1.0 / (var_z + eps_z).sqrt(),
                kout: k,
            }
        } else {
            // eps dwarfs var (or var is 0): unscaled, nothing overflows.
            RowNorm {
                kx: 0,
                shift: scale(mean_z, -k),
                r: 1.0 / eps.sqrt(),
                kout: 0,
            }
        }
    }

    fn xhat(&self, x: f64) -> f64 {
        (scale(x, self.kx) - self.shift) * self.r
    }

    fn mean(&self) -> f64 {
        scale(self.shift, -self.kx)
    }

    fn rstd(&self) -> f64 {
        scale(self.r, self.kout)
    }
}

/// Largest `rstd` the kernels are trusted with: above it `var + eps` is
/// within `2^(2p)` of the smallest normal number (p = mantissa bits), so the
/// squares that make up `var` may have lost bits in subnormal range. Only
/// reachable with `eps` that small.
pub(crate) fn rstd_limit<A: Accum>() -> A {
    let e = A::epsilon();
    (A::min_positive_value() / (e * e)).sqrt().recip()
}

/// Whether one row's kernel statistics are in the range the kernels are
/// trusted with: `mean` finite (0 for RMSNorm) and `0 < rstd <= limit`
/// ([`rstd_limit`]); false for NaN. The kernels fold it into the flag they
/// return, so no caller reads the statistics back unless it is raised.
#[inline(always)]
pub(crate) fn trusted<A: Accum>(mean: A, rstd: A, limit: A) -> bool {
    mean.is_finite() & (rstd > A::zero()) & (rstd <= limit)
}

/// Rows (by index) whose values are all finite but whose kernel statistics
/// show overflow or subnormal loss. `mean` is `None` for RMSNorm. Called
/// only when the kernel's flag says some row is out of range.
pub(crate) fn suspect_rows<T: Element>(
    x: &[T],
    d: usize,
    mean: Option<&[Acc<T>]>,
    rstd: &[Acc<T>],
) -> Vec<usize> {
    let limit = rstd_limit::<Acc<T>>();
    let zero = Acc::<T>::zero();
    let mut rows = Vec::new();
    for (i, &r) in rstd.iter().enumerate() {
        let m = mean.map_or(Some(zero), |m| m.get(i).copied());
        if m.is_some_and(|m| trusted(m, r, limit)) {
            continue;
        }
        let finite = x
            .get(i * d..(i + 1) * d)
            .is_some_and(|row| row.iter().all(|v| v.to_acc().is_finite()));
        if finite {
            rows.push(i);
        }
    }
    rows
}

/// Widened row `i` of `x` into `buf`.
fn row_f64<'a, T: Element>(x: &[T], d: usize, i: usize, buf: &'a mut Vec<f64>) -> &'a [f64] {
    buf.clear();
    if let Some(r) = x.get(i * d..(i + 1) * d) {
        buf.extend(r.iter().map(|v| v.to_f64()));
    }
    buf
}

fn param<T: Element>(p: Option<&[T]>, j: usize, default: f64) -> f64 {
    p.and_then(|p| p.get(j)).map_or(default, |v| v.to_f64())
}

/// Recomputes `rows` of a forward in place: `y`, and `mean` (if given) and
/// `rstd`. `centre` and `beta` are LayerNorm's; RMSNorm passes
/// `false`/`None`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_rows<T: Element>(
    x: &[T],
    d: usize,
    gamma: Option<&[T]>,
    beta: Option<&[T]>,
    eps: f64,
    centre: bool,
    rows: &[usize],
    y: &mut [T],
    mut mean: Option<&mut [Acc<T>]>,
    rstd: &mut [Acc<T>],
) {
    let mut buf = Vec::with_capacity(d);
    for &i in rows {
        let xr = row_f64(x, d, i, &mut buf);
        let rn = RowNorm::new(xr, eps, centre);
        if let Some(yr) = y.get_mut(i * d..(i + 1) * d) {
            for (j, (yv, &xv)) in yr.iter_mut().zip(xr).enumerate() {
                let v = rn.xhat(xv) * param(gamma, j, 1.0) + param(beta, j, 0.0);
                *yv = T::from_f64(v);
            }
        }
        if let Some(m) = mean.as_deref_mut().and_then(|m| m.get_mut(i)) {
            *m = Acc::<T>::of(rn.mean());
        }
        if let Some(r) = rstd.get_mut(i) {
            *r = Acc::<T>::of(rn.rstd());
        }
    }
}

/// Gradients of the fallback backward; `None` where not asked for.
pub(crate) struct Grads<T> {
    pub dx: Option<Vec<T>>,
    pub dgamma: Option<Vec<T>>,
    pub dbeta: Option<Vec<T>>,
}

/// The whole backward of a node in f64, row by row in order (see the module
/// doc). `want` is `(dx, dgamma, dbeta)`.
pub(crate) fn backward<T: Element>(
    x: &[T],
    dy: &[T],
    d: usize,
    gamma: Option<&[T]>,
    eps: f64,
    centre: bool,
    want: (bool, bool, bool),
) -> Grads<T> {
    let n = x.len().checked_div(d).unwrap_or(0);
    let (want_dx, want_dg, want_db) = want;
    let mut dx = Vec::with_capacity(if want_dx { n * d } else { 0 });
    let mut sg = vec![0.0f64; if want_dg { d } else { 0 }];
    let mut sb = vec![0.0f64; if want_db { d } else { 0 }];
    let (mut buf, mut xh, mut g) = (Vec::new(), vec![0.0; d], vec![0.0; d]);
    let inv_d = 1.0 / d.max(1) as f64;
    for i in 0..n {
        let xr = row_f64(x, d, i, &mut buf);
        let rn = RowNorm::new(xr, eps, centre);
        let dyr = dy.get(i * d..(i + 1) * d).unwrap_or(&[]);
        let (mut s1, mut s2) = (0.0, 0.0);
        for (j, ((h, gj), (&xv, dv))) in xh
            .iter_mut()
            .zip(g.iter_mut())
            .zip(xr.iter().zip(dyr))
            .enumerate()
        {
            let dv = dv.to_f64();
            *h = rn.xhat(xv);
            *gj = dv * param(gamma, j, 1.0);
            s1 += *gj;
            s2 += *gj * *h;
            if let Some(s) = sg.get_mut(j) {
                *s += dv * *h;
            }
            if let Some(s) = sb.get_mut(j) {
                *s += dv;
            }
        }
        if want_dx {
            let mg = if centre { s1 * inv_d } else { 0.0 };
            let mgx = s2 * inv_d;
            dx.extend(
                xh.iter()
                    .zip(&g)
                    .map(|(&h, &gj)| T::from_f64(scale(rn.r * (gj - mg - h * mgx), rn.kout))),
            );
        }
    }
    let round = |v: Vec<f64>| v.into_iter().map(T::from_f64).collect();
    Grads {
        dx: want_dx.then_some(dx),
        dgamma: want_dg.then(|| round(sg)),
        dbeta: want_db.then(|| round(sb)),
    }
}

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    // The tests, run by `tests/unit.rs`.
    unit_tests![
        scaling_is_exact_across_the_range,
        huge_and_tiny_rows_normalize_like_unit_rows,
    ];

    fn scaling_is_exact_across_the_range() {
        assert_eq!(exponent(1.0), 0);
        assert_eq!(exponent(1.5e300), 997);
        assert_eq!(exponent(2f64.powi(-1000) * 1.5), -1000);
        assert_eq!(exponent(f64::from_bits(1)), -1074);
        assert_eq!(scale(3.0, -1074), f64::from_bits(3));
        assert_eq!(scale(f64::from_bits(1), 1074), 1.0);
        assert_eq!(scale(1.0, 2000), f64::INFINITY);
    }

    fn huge_and_tiny_rows_normalize_like_unit_rows() {
        let unit = [1.0, -0.5, 0.25, 3.0];
        let want = RowNorm::new(&unit, 0.0, true);
        for k in [-1070, -300, 300, 1020] {
            let row: Vec<f64> = unit.iter().map(|&v| scale(v, k)).collect();
            let rn = RowNorm::new(&row, 0.0, true);
            for (&a, &b) in row.iter().zip(&unit) {
                let (got, exp) = (rn.xhat(a), want.xhat(b));
                assert!((got - exp).abs() < 1e-14, "k {k}: {got} vs {exp}");
            }
        }
        // eps dominating a tiny row: xhat = x / sqrt(eps), no underflow to 0.
        let rn = RowNorm::new(&[1e-310, -1e-310], 1.0, true);
        assert_eq!(rn.xhat(1e-310), 1e-310);
    }
}
