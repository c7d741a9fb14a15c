//! CPU loops for the scalar losses: one pass over the elements (mse) or the
//! rows (cross-entropy), accumulating in `T::Acc` in element order.

use super::bad_target;
use crate::device::cpu::is_f32;
use crate::dtype::Element;
use crate::error::Result;
use crate::ops::elementwise::vmath;
use num_traits::{Float, One, Zero};

/// `y[j] = e^(x[j])`: in f32 through `vmath`'s vectorized kernel (2 ulp),
/// in f64 through the C library's.
fn exp_row<A: Element + Float>(x: &[A], y: &mut [A]) {
    if is_f32::<A>() {
        vmath::map_row(vmath::exp, x, y);
    } else {
        for (o, &v) in y.iter_mut().zip(x) {
            *o = v.exp();
        }
    }
}

/// `e^(row[j] - m - ls)` for every `j` into `p`, through `t` (scratch).
fn shifted_exp<T: Element>(row: &[T], (m, ls): (T::Acc, T::Acc), t: &mut [T::Acc], p: &mut [T::Acc])
where
    T::Acc: Element,
{
    for (o, &v) in t.iter_mut().zip(row) {
        *o = (v.to_acc() - m) - ls;
    }
    exp_row(t, p);
}

/// Per row of the logits the max `m` and `ln s`, `s = sum_j exp(x_j - m)`.
pub(crate) struct RowStats<A> {
    pub(crate) max: Vec<A>,
    pub(crate) log_sum: Vec<A>,
}

/// `n` in the accumulation type (infinity if it does not fit).
pub(crate) fn acc_of<T: Element>(n: usize) -> T::Acc {
    <T::Acc as num_traits::NumCast>::from(n).unwrap_or_else(T::Acc::infinity)
}

/// `(1/N) sum_i (p_i - t_i)^2` over same-length `p` and `t`.
pub(crate) fn mse<T: Element>(p: &[T], t: &[T]) -> T {
    let sum: T::Acc = p
        .iter()
        .zip(t)
        .map(|(&a, &b)| {
            let d = a.to_acc() - b.to_acc();
            d * d
        })
        .sum();
    T::from_acc(sum / acc_of::<T>(p.len()))
}

/// `sign (2g/N) (p_i - t_i)` for the scalar `g` (`g[0]`).
pub(crate) fn mse_grad<T: Element>(g: &[T], p: &[T], t: &[T], sign: T::Acc) -> Vec<T> {
    let g = g.first().map_or_else(T::Acc::zero, |v| v.to_acc());
    let two = T::Acc::one() + T::Acc::one();
    let k = two * g / acc_of::<T>(p.len());
    let ks = k * sign;
    p.iter()
        .zip(t)
        .map(|(&a, &b)| T::from_acc(ks * (a.to_acc() - b.to_acc())))
        .collect()
}

/// The mean over the rows of `[n, c]` logits of `(m_r - x_{r,t_r}) + ln s_r`,
/// with per row the max `m_r` and `ln s_r` (`s_r = sum_j exp(x_{r,j} - m_r)`).
pub(crate) fn cross_entropy<T: Element>(
    xs: &[T],
    shape: &[usize],
    c: usize,
    targets: &[usize],
) -> Result<(T, RowStats<T::Acc>)> {
    let n = targets.len();
    let mut max = vec![T::Acc::zero(); n];
    let mut log_sum = vec![T::Acc::zero(); n];
    let mut total = T::Acc::zero();
    if c > 0 {
        let zero = T::Acc::zero();
        // A row's scratch (no larger than the logits: `[0, huge]` has none).
        let w = c.min(xs.len());
        let (mut t, mut p) = (vec![zero; w], vec![zero; w]);
        for (r, ((row, &tr), (m, ls))) in xs
            .chunks_exact(c)
            .zip(targets)
            .zip(max.iter_mut().zip(log_sum.iter_mut()))
            .enumerate()
        {
            *m = row
                .iter()
                .fold(T::Acc::neg_infinity(), |a, &v| a.max(v.to_acc()));
            shifted_exp(row, (*m, zero), &mut t, &mut p);
            *ls = p.iter().fold(zero, |a, &e| a + e).ln();
            let xt = row.get(tr).ok_or_else(|| bad_target(shape, r, tr))?;
            total += (*m - xt.to_acc()) + *ls;
        }
    }
    let loss = total / acc_of::<T>(n);
    Ok((T::from_acc(loss), RowStats { max, log_sum }))
}

/// `(g/n) (softmax(x_r)_j - [j = t_r])` for the scalar `g` (`g[0]`), where
/// `softmax(x_r)_j = exp((x_{r,j} - m_r) - ln s_r)` from the saved stats.
pub(crate) fn cross_entropy_grad<T: Element>(
    g: &[T],
    xs: &[T],
    c: usize,
    targets: &[usize],
    RowStats { max, log_sum }: &RowStats<T::Acc>,
) -> Vec<T> {
    let g = g.first().map_or_else(T::Acc::zero, |v| v.to_acc());
    let k = g / acc_of::<T>(targets.len());
    let mut out = vec![T::ZERO; xs.len()];
    if c > 0 {
        let zero = T::Acc::zero();
        let w = c.min(xs.len());
        let (mut tmp, mut p) = (vec![zero; w], vec![zero; w]);
        for ((((orow, row), &t), &m), &ls) in out
            .chunks_exact_mut(c)
            .zip(xs.chunks_exact(c))
            .zip(targets)
            .zip(max.iter())
            .zip(log_sum.iter())
        {
            shifted_exp(row, (m, ls), &mut tmp, &mut p);
            for (j, (dx, &p)) in orow.iter_mut().zip(&p).enumerate() {
                let onehot = if j == t {
                    T::Acc::one()
                } else {
                    T::Acc::zero()
                };
                *dx = T::from_acc(k * (p - onehot));
            }
        }
    }
    out
}
