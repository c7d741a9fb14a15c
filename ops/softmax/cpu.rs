//! CPU loops for softmax and log-softmax. The tensor is seen as
//! `[outer, d, inner]` around the axis (length `d`). Each `[d, inner]` block
//! is independent; the loops sweep it row by row with `inner`-wide work
//! vectors, so the reads stay contiguous whatever the axis. Large tensors
//! run the blocks in parallel.

use crate::device::cpu::run_each;
use crate::dtype::Element;
use num_traits::{Float, Zero};

/// Below this many elements the blocks run on the calling thread.
const PAR_MIN: usize = 1 << 15;

/// Runs `f(block_index, out_block)` over `out` cut into blocks of `block`.
fn per_block<T: Element>(out: &mut [T], block: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
    if block == 0 || out.is_empty() {
        return;
    }
    if out.len() >= PAR_MIN && out.len() > block {
        run_each(out.chunks_mut(block).enumerate().collect(), |(i, o)| {
            f(i, o)
        });
    } else {
        out.chunks_mut(block).enumerate().for_each(|(i, o)| f(i, o));
    }
}

/// Per-lane max `m` and `s = sum exp(x - m)` of a `[d, inner]` block.
/// `e`, if given, receives `exp(x - m)`. A NaN in a lane makes its `s` NaN.
pub(crate) fn lane_stats<T: Element>(
    x: &[T],
    inner: usize,
    m: &mut [T::Acc],
    s: &mut [T::Acc],
    mut e: Option<&mut [T::Acc]>,
) {
    m.fill(T::Acc::neg_infinity());
    for row in x.chunks_exact(inner) {
        for (mi, &v) in m.iter_mut().zip(row) {
            *mi = mi.max(v.to_acc());
        }
    }
    s.fill(T::Acc::zero());
    for (r, row) in x.chunks_exact(inner).enumerate() {
        for (i, (&v, (&mi, si))) in row.iter().zip(m.iter().zip(s.iter_mut())).enumerate() {
            let ev = (v.to_acc() - mi).exp();
            *si += ev;
            if let Some(e) = e.as_deref_mut() {
                e[r * inner + i] = ev;
            }
        }
    }
}

/// Softmax (or log-softmax when `log`) of `x` over blocks `[d, inner]`.
pub(crate) fn forward<T: Element>(xs: &[T], d: usize, inner: usize, log: bool) -> Vec<T> {
    let block = d.saturating_mul(inner);
    let mut out = vec![T::ZERO; xs.len()];
    per_block(&mut out, block, |b, o| {
        let xb = &xs[b * block..(b + 1) * block];
        let mut m = vec![T::Acc::zero(); inner];
        let mut s = vec![T::Acc::zero(); inner];
        if log {
            lane_stats::<T>(xb, inner, &mut m, &mut s, None);
            let ls: Vec<T::Acc> = s.iter().map(|v| v.ln()).collect();
            for (orow, xrow) in o.chunks_exact_mut(inner).zip(xb.chunks_exact(inner)) {
                for (((y, &v), &mi), &li) in orow.iter_mut().zip(xrow).zip(&m).zip(&ls) {
                    *y = T::from_acc((v.to_acc() - mi) - li);
                }
            }
        } else {
            let mut e = vec![T::Acc::zero(); block];
            lane_stats::<T>(xb, inner, &mut m, &mut s, Some(&mut e));
            let rs: Vec<T::Acc> = s.iter().map(|v| v.recip()).collect();
            for (orow, erow) in o.chunks_exact_mut(inner).zip(e.chunks_exact(inner)) {
                for ((y, &ev), &r) in orow.iter_mut().zip(erow).zip(&rs) {
                    *y = T::from_acc(ev * r);
                }
            }
        }
    });
    out
}

/// The input gradient from the output `y` and its gradient `g` (same
/// length) over blocks `[d, inner]`.
pub(crate) fn backward<T: Element>(
    ys: &[T],
    gs: &[T],
    d: usize,
    inner: usize,
    log: bool,
) -> Vec<T> {
    let block = d.saturating_mul(inner);
    let mut out = vec![T::ZERO; ys.len()];
    per_block(&mut out, block, |b, o| {
        let range = b * block..(b + 1) * block;
        let (yb, gb) = (&ys[range.clone()], &gs[range]);
        // dot = sum_j g_j y_j (softmax) or sum_j g_j (log-softmax).
        let mut dot = vec![T::Acc::zero(); inner];
        for (yrow, grow) in yb.chunks_exact(inner).zip(gb.chunks_exact(inner)) {
            for ((t, &yv), &gv) in dot.iter_mut().zip(yrow).zip(grow) {
                *t += if log {
                    gv.to_acc()
                } else {
                    gv.to_acc() * yv.to_acc()
                };
            }
        }
        for ((orow, yrow), grow) in o
            .chunks_exact_mut(inner)
            .zip(yb.chunks_exact(inner))
            .zip(gb.chunks_exact(inner))
        {
            for (((dx, &yv), &gv), &t) in orow.iter_mut().zip(yrow).zip(grow).zip(&dot) {
                let (yv, gv) = (yv.to_acc(), gv.to_acc());
                *dx = T::from_acc(if log {
                    gv - yv.exp() * t
                } else {
                    yv * (gv - t)
                });
            }
        }
    });
    out
}
