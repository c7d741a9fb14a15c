//! Softmax and log-softmax along one axis, max-subtracted so that no
//! exponent is positive: stable for logits of any magnitude.
//!
//! The tensor is seen as `[outer, d, inner]` around the axis (length `d`).
//! Each `[d, inner]` block is independent; the kernels sweep it row by row
//! with `inner`-wide work vectors, so the reads stay contiguous whatever the
//! axis. Large tensors run the blocks in parallel.

use crate::device::cpu::run_each;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::shape::normalize_axis;
use crate::tape::{Tape, Var};
use crate::tensor::Tensor;
use num_traits::{Float, Zero};

/// Below this many elements the blocks run on the calling thread.
const PAR_MIN: usize = 1 << 15;

/// `(d, inner)` around `axis`: the axis length and the product of the dims
/// after it.
///
/// For an empty tensor the product may overflow; it saturates, which is
/// harmless because nothing is visited.
fn split(shape: &[usize], axis: usize) -> (usize, usize) {
    let d = shape.get(axis).copied().unwrap_or(1);
    let inner = shape
        .iter()
        .skip(axis + 1)
        .fold(1usize, |p, &v| p.saturating_mul(v));
    (d, inner)
}

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

struct Softmax {
    axis: usize,
    log: bool,
}

impl<T: Element> Op<T> for Softmax {
    /// The output `y`: both backward rules are written in terms of it.
    type State = Tensor<T>;

    fn name(&self) -> &'static str {
        if self.log {
            "log_softmax"
        } else {
            "softmax"
        }
    }

    /// Per lane, with `m = max_i x_i` and `s = sum_i exp(x_i - m)`:
    /// softmax `y_i = exp(x_i - m) / s`; log-softmax `y_i = (x_i - m) - ln s`.
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Self::State)> {
        let name = <Self as Op<T>>::name(self);
        let [x] = x else {
            return Err(Error::InvalidArgument {
                op: name,
                msg: format!("expects 1 input, got {}", x.len()),
            });
        };
        let (d, inner) = split(x.shape(), self.axis);
        let block = d.saturating_mul(inner);
        let xs = x.as_slice()?;
        let mut out = vec![T::ZERO; xs.len()];
        let log = self.log;
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
        let y = Tensor::from_vec(x.shape().to_vec(), out)?;
        Ok((y.clone(), y))
    }

    /// With `g = dL/dy`, per lane:
    /// softmax: `dx_i = y_i (g_i - sum_j g_j y_j)`;
    /// log-softmax: `dx_i = g_i - exp(y_i) sum_j g_j` (`exp(y)` is softmax).
    fn backward(
        &self,
        y: &Self::State,
        g: &Tensor<T>,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor<T>>>> {
        if !needs.first().copied().unwrap_or(false) {
            return Ok(vec![None]);
        }
        let (d, inner) = split(y.shape(), self.axis);
        let block = d.saturating_mul(inner);
        let (ys, gs) = (y.as_slice()?, g.as_slice()?);
        let mut out = vec![T::ZERO; ys.len()];
        let log = self.log;
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
        Ok(vec![Some(Tensor::from_vec(y.shape().to_vec(), out)?)])
    }
}

/// Softmax along `axis` (negative counts from the end):
/// `y_i = exp(x_i - max x) / sum_j exp(x_j - max x)`.
///
/// Errors: `AxisOutOfRange` unless `-rank <= axis < rank` (a rank-0 tensor
/// has no axis). NaN in a lane makes that lane NaN.
pub fn softmax<T: Element>(x: &Var<T>, axis: isize) -> Result<Var<T>> {
    let axis = normalize_axis("softmax", axis, x.shape())?;
    Tape::apply(Softmax { axis, log: false }, &[x])
}

/// Log-softmax along `axis`: `y_i = (x_i - max x) - ln sum_j exp(x_j - max x)`,
/// accurate where `ln(softmax(x))` would underflow to `-inf`.
///
/// Errors: `AxisOutOfRange` as for [`softmax`].
pub fn log_softmax<T: Element>(x: &Var<T>, axis: isize) -> Result<Var<T>> {
    let axis = normalize_axis("log_softmax", axis, x.shape())?;
    Tape::apply(Softmax { axis, log: true }, &[x])
}
