//! Matrix product with NumPy batch broadcasting.
//!
//! `matmul(a, b)` takes `a: [..., m, k]` and `b: [..., k, n]` (rank >= 2
//! each) and returns `[..., m, n]`, where the leading (batch) dims broadcast
//! under NumPy's rules; a 2-D operand is shared by every batch entry.
//! 1-D operands are rejected rather than promoted (reshape to `[1, k]` or
//! `[k, 1]`), so the gradient always has the operand's own rank.
//!
//! The CPU kernel accumulates in `T::Acc`: each task owns a band of output
//! rows, computes it four rows at a time against column panels of `b`
//! (i-k-j order: the inner loop is a contiguous axpy that vectorizes), and
//! rounds to `T` once at the end. Bands are independent, so the result is
//! bitwise the same for any thread count.

use crate::device::cpu::run_each;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::shape::{alloc_filled, broadcast_shapes, broadcast_strides, for_each_offset};
use crate::tape::{Tape, Var};
use crate::tensor::Tensor;
use num_traits::Zero;

const OP: &str = "matmul";
/// Rows per register tile.
const MR: usize = 4;
/// Columns per panel: a 4-row accumulator tile of this width stays in L1.
const NC: usize = 256;
/// Below this many multiply-adds a product runs on the calling thread.
const PAR_MIN_MACS: usize = 1 << 16;
/// Target multiply-adds per parallel task.
const TASK_MACS: usize = 1 << 15;

/// `out = a @ b` for one `[m, k] @ [k, n]` pair of row-major slices
/// (`out` is `[m, n]`). Rows are split into bands run in parallel when the
/// product is large enough.
fn gemm<T: Element>(a: &[T], b: &[T], out: &mut [T], k: usize, n: usize, parallel: bool) {
    if out.is_empty() {
        return;
    }
    if k == 0 {
        out.fill(T::ZERO);
        return;
    }
    let m = out.len() / n;
    let macs = m.saturating_mul(k).saturating_mul(n);
    if !parallel || macs < PAR_MIN_MACS || m <= MR {
        gemm_rows(a, b, out, k, n);
        return;
    }
    // Whole register tiles per band, about TASK_MACS work each.
    let band = (TASK_MACS / (k * n).max(1)).div_ceil(MR).max(1) * MR;
    let bands = out.chunks_mut(band * n).zip(a.chunks(band * k));
    run_each(bands.collect(), |(o, a)| gemm_rows(a, b, o, k, n));
}

/// Serial kernel over a band of rows: `out[r, :] = sum_p a[r, p] * b[p, :]`.
fn gemm_rows<T: Element>(a: &[T], b: &[T], out: &mut [T], k: usize, n: usize) {
    let rows = out.len() / n;
    let width = NC.min(n);
    let mut acc = vec![T::Acc::zero(); MR * width];
    for j0 in (0..n).step_by(NC) {
        let nc = width.min(n - j0);
        for i0 in (0..rows).step_by(MR) {
            let mr = MR.min(rows - i0);
            let tile = &mut acc[..MR * nc];
            tile.fill(T::Acc::zero());
            let a_tile = &a[i0 * k..(i0 + mr) * k];
            if mr == MR {
                let (c0, rest) = tile.split_at_mut(nc);
                let (c1, rest) = rest.split_at_mut(nc);
                let (c2, c3) = rest.split_at_mut(nc);
                for p in 0..k {
                    let a0 = a_tile[p].to_acc();
                    let a1 = a_tile[k + p].to_acc();
                    let a2 = a_tile[2 * k + p].to_acc();
                    let a3 = a_tile[3 * k + p].to_acc();
                    let brow = &b[p * n + j0..p * n + j0 + nc];
                    for ((((x0, x1), x2), x3), &bv) in c0
                        .iter_mut()
                        .zip(c1.iter_mut())
                        .zip(c2.iter_mut())
                        .zip(c3.iter_mut())
                        .zip(brow)
                    {
                        let bv = bv.to_acc();
                        *x0 += a0 * bv;
                        *x1 += a1 * bv;
                        *x2 += a2 * bv;
                        *x3 += a3 * bv;
                    }
                }
            } else {
                for (r, c) in tile.chunks_exact_mut(nc).take(mr).enumerate() {
                    for p in 0..k {
                        let av = a_tile[r * k + p].to_acc();
                        let brow = &b[p * n + j0..p * n + j0 + nc];
                        for (x, &bv) in c.iter_mut().zip(brow) {
                            *x += av * bv.to_acc();
                        }
                    }
                }
            }
            for (r, c) in tile.chunks_exact(nc).take(mr).enumerate() {
                let o = &mut out[(i0 + r) * n + j0..(i0 + r) * n + j0 + nc];
                for (y, &v) in o.iter_mut().zip(c) {
                    *y = T::from_acc(v);
                }
            }
        }
    }
}

/// Validated shapes of a batched product.
struct Dims {
    /// Broadcast batch shape.
    batch: Vec<usize>,
    m: usize,
    k: usize,
    n: usize,
}

fn dims(a: &[usize], b: &[usize]) -> Result<Dims> {
    let (ra, rb) = (a.len(), b.len());
    if ra < 2 || rb < 2 {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!(
                "operands need rank >= 2, got {a:?} @ {b:?} \
                 (reshape a vector to [1, k] or [k, 1])"
            ),
        });
    }
    let (m, k) = (a[ra - 2], a[ra - 1]);
    let (k2, n) = (b[rb - 2], b[rb - 1]);
    if k != k2 {
        return Err(Error::MatmulMismatch {
            op: OP,
            lhs: a.to_vec(),
            rhs: b.to_vec(),
            k_lhs: k,
            k_rhs: k2,
        });
    }
    let batch =
        broadcast_shapes(OP, &a[..ra - 2], &b[..rb - 2]).map_err(|_| Error::BroadcastMismatch {
            op: OP,
            lhs: a.to_vec(),
            rhs: b.to_vec(),
        })?;
    Ok(Dims { batch, m, k, n })
}

/// Batched `a @ b` on tensors, batch dims broadcast. Shared by forward and
/// backward (which passes transposed operands).
fn bmm<T: Element>(a: &Tensor<T>, b: &Tensor<T>) -> Result<Tensor<T>> {
    let Dims { batch, m, k, n } = dims(a.shape(), b.shape())?;
    let mut shape = batch.clone();
    shape.extend([m, n]);
    // `[m, 1] @ [1, n]` is far larger than its operands: allocate fallibly.
    let mut out = alloc_filled(OP, &shape, T::ZERO)?;
    let total = out.len();
    let (sa, sb) = (a.as_slice()?, b.as_slice()?);
    if total == 0 {
        return Tensor::from_vec(shape, out);
    }
    // Offsets (in matrices) of each batch entry's operands.
    let (ra, rb) = (a.rank(), b.rank());
    let mut oa = Vec::new();
    for_each_offset(
        &batch,
        &broadcast_strides(&a.shape()[..ra - 2], &batch),
        |_, o| oa.push(o * m * k),
    );
    let mut ob = Vec::new();
    for_each_offset(
        &batch,
        &broadcast_strides(&b.shape()[..rb - 2], &batch),
        |_, o| ob.push(o * k * n),
    );
    let run = |(i, o): (usize, &mut [T])| {
        let am = &sa[oa[i]..oa[i] + m * k];
        let bm = &sb[ob[i]..ob[i] + k * n];
        gemm(am, bm, o, k, n, true);
    };
    let per = m * n;
    if oa.len() > 1 && total.saturating_mul(k) >= PAR_MIN_MACS {
        run_each(out.chunks_mut(per).enumerate().collect(), run);
    } else {
        out.chunks_mut(per).enumerate().for_each(run);
    }
    Tensor::from_vec(shape, out)
}

/// Swaps the last two dims (a copy). Rank >= 2 is checked by the callers.
fn transpose_last2<T: Element>(t: &Tensor<T>) -> Result<Tensor<T>> {
    let r = t.rank();
    let mut shape = t.shape().to_vec();
    if r < 2 {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!("cannot transpose shape {shape:?}"),
        });
    }
    let (p, q) = (shape[r - 2], shape[r - 1]);
    shape.swap(r - 2, r - 1);
    let s = t.as_slice()?;
    let mut out = vec![T::ZERO; s.len()];
    // `p * q` may overflow for an empty tensor such as [0, 2^40, 2^40].
    if !s.is_empty() {
        for (src, dst) in s.chunks_exact(p * q).zip(out.chunks_exact_mut(p * q)) {
            for (i, row) in src.chunks_exact(q).enumerate() {
                for (j, &v) in row.iter().enumerate() {
                    dst[j * p + i] = v;
                }
            }
        }
    }
    Tensor::from_vec(shape, out)
}

struct Matmul;

impl<T: Element> Op<T> for Matmul {
    /// Both operands: each one's gradient needs the other.
    type State = (Tensor<T>, Tensor<T>);

    fn name(&self) -> &'static str {
        OP
    }

    /// `Y[b] = A[b] @ B[b]`, i.e. `Y[b,i,j] = sum_p A[b,i,p] B[b,p,j]`, where
    /// `b` runs over the broadcast batch and indexes each operand through
    /// its own (broadcast) batch dims.
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Self::State)> {
        let [a, b] = x else {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: format!("expects 2 inputs, got {}", x.len()),
            });
        };
        let y = bmm(a, b)?;
        Ok((y, ((*a).clone(), (*b).clone())))
    }

    /// With `G = dL/dY` of shape `[batch, m, n]`:
    /// `dA[b] = G[b] @ B[b]^T` (`[batch, m, k]`) and
    /// `dB[b] = A[b]^T @ G[b]` (`[batch, k, n]`).
    /// Both come back in the broadcast batch shape; where an operand was
    /// broadcast over the batch, the tape's `sum_to_shape` sums its gradient
    /// over those dims (`dW = sum_b A[b]^T G[b]` for a shared 2-D `W`).
    fn backward(
        &self,
        (a, b): &Self::State,
        g: &Tensor<T>,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor<T>>>> {
        let need = |i: usize| needs.get(i).copied().unwrap_or(false);
        if g.numel() == 0 {
            // Every entry of dA and dB is a sum over entries of G: with none,
            // all are 0. Zeros of the operand's own shape also avoid a
            // broadcast-batch intermediate, which for an empty output can be
            // far larger than anything that exists ([2^56, 0, 1] @ [1, 3]).
            let zeros = |i: usize, t: &Tensor<T>| need(i).then(|| Tensor::zeros(t.shape()));
            return Ok(vec![zeros(0, a).transpose()?, zeros(1, b).transpose()?]);
        }
        let da = if need(0) {
            Some(bmm(g, &transpose_last2(b)?)?)
        } else {
            None
        };
        let db = if need(1) {
            Some(bmm(&transpose_last2(a)?, g)?)
        } else {
            None
        };
        Ok(vec![da, db])
    }
}

/// Matrix product `a @ b` of `[..., m, k]` and `[..., k, n]` with NumPy
/// broadcasting of the batch dims; returns `[..., m, n]`.
///
/// Errors: `MatmulMismatch` if the inner dims differ, `BroadcastMismatch`
/// if the batch dims do not broadcast, `InvalidArgument` for an operand of
/// rank < 2 (vectors are not promoted as NumPy does).
pub fn matmul<T: Element>(a: &Var<T>, b: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Matmul, &[a, b])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn tiled_parallel_kernel_matches_naive() {
        // Sizes with remainders in every blocking (rows % 4, cols % NC) and
        // large enough to take the parallel path.
        let (m, k, n) = (67, 45, 301);
        let a: Vec<f64> = (0..m * k).map(|i| ((i * 7 % 13) as f64) - 6.0).collect();
        let b: Vec<f64> = (0..k * n).map(|i| ((i * 5 % 11) as f64) - 5.0).collect();
        let mut out = vec![0.0; m * n];
        gemm(&a, &b, &mut out, k, n, true);
        // Small integers: exact in any summation order.
        assert_eq!(out, naive(&a, &b, m, k, n));
    }

    #[test]
    fn transpose_swaps_last_two() {
        let t = Tensor::from_vec(vec![2, 2, 3], (0..12).map(|v| v as f64).collect()).unwrap();
        let r = transpose_last2(&t).unwrap();
        assert_eq!(r.shape(), &[2, 3, 2]);
        assert_eq!(
            r.as_slice().unwrap(),
            &[0., 3., 1., 4., 2., 5., 6., 9., 7., 10., 8., 11.]
        );
    }
}
