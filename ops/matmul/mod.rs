//! Matrix product with NumPy batch broadcasting.
//!
//! `matmul(a, b)` takes `a: [..., m, k]` and `b: [..., k, n]` (rank >= 2
//! each) and returns `[..., m, n]`, where the leading (batch) dims broadcast
//! under NumPy's rules; a 2-D operand is shared by every batch entry.
//! 1-D operands are rejected rather than promoted (reshape to `[1, k]` or
//! `[k, 1]`), so the gradient always has the operand's own rank.
//!
//! ```text
//! Y[b] = A[b] @ B[b]        Y[b,i,j] = sum_p A[b,i,p] B[b,p,j]
//! dA[b] = G[b] @ B[b]^T     dB[b] = A[b]^T @ G[b]
//! ```
//!
//! with `G = dL/dY`; an operand broadcast over the batch gets its gradient
//! summed over those dims by the tape. Forward and both gradients are one
//! device-level kernel, `bmm`, a batched product with optional transposes
//! of its operands' last two dims.

#[cfg(target_arch = "x86_64")]
mod avx512;
pub(crate) mod cpu;
mod linear;
pub use linear::{linear, linear_composed};
#[cfg(feature = "cuda")]
mod cuda;

use super::elementwise::{binary, check_devices, Binary};
use crate::device::pool::Buffer;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::layout::{broadcast_shapes, checked_numel};
#[cfg(feature = "cuda")]
use crate::layout::{broadcast_strides, for_each_offset};
use crate::op::Op;
use crate::tape::{Tape, Var};
use crate::tensor::{Storage, Tensor};

const OP: &str = "matmul";

/// The CPU kernel on one `[m, k] @ [k, n]` f32 product (probes), each
/// operand stored transposed where its flag in `t` is set.
#[cfg(feature = "probes")]
pub(crate) fn kernel(
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    [m, k, n]: [usize; 3],
    [ta, tb]: [bool; 2],
) {
    let stored = |t: bool, r: usize, c: usize| if t { [c, r] } else { [r, c] };
    cpu::bmm(
        (a, &stored(ta, m, k), ta),
        (b, &stored(tb, k, n), tb),
        &[],
        [m, k, n],
        out,
    )
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

/// `shape` with its last two dims swapped (unchanged below rank 2, which
/// [`dims`] rejects).
fn swap_last2(shape: &[usize]) -> Vec<usize> {
    let mut s = shape.to_vec();
    let r = s.len();
    if r >= 2 {
        s.swap(r - 2, r - 1);
    }
    s
}

/// Batched `op(a) @ op(b)`, batch dims broadcast, where `op` swaps the last
/// two dims of an operand whose flag (`ta`, `tb`) is set: the device-level
/// kernel shared by forward and backward.
fn bmm<T: Element>(a: &Tensor<T>, b: &Tensor<T>, ta: bool, tb: bool) -> Result<Tensor<T>> {
    bmm_bias(a, b, ta, tb, None)
}

/// [`bmm`] plus `bias` (`[n]`) added to every output row: on the CPU in
/// f32 and f64 by the product's bands as they finish, elsewhere as a
/// broadcast add after it (the same bits either way).
fn bmm_bias<T: Element>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    ta: bool,
    tb: bool,
    bias: Option<&Tensor<T>>,
) -> Result<Tensor<T>> {
    check_devices(OP, a, b)?;
    let la = if ta {
        swap_last2(a.shape())
    } else {
        a.shape().to_vec()
    };
    let lb = if tb {
        swap_last2(b.shape())
    } else {
        b.shape().to_vec()
    };
    let Dims { batch, m, k, n } = dims(&la, &lb)?;
    let mut shape = batch.clone();
    shape.extend([m, n]);
    match (a.storage(), b.storage()) {
        (Storage::Cpu(xa), Storage::Cpu(xb)) => {
            // `[m, 1] @ [1, n]` is far larger than its operands: allocate
            // fallibly. The kernel writes every entry.
            let len = checked_numel(OP, &shape, std::mem::size_of::<T>())?;
            let mut out = Buffer::try_take(len).ok_or_else(|| Error::OutOfMemory {
                op: OP,
                shape: shape.clone(),
                bytes: len.saturating_mul(std::mem::size_of::<T>()),
            })?;
            let (oa, ob) = ((&xa[..], a.shape(), ta), (&xb[..], b.shape(), tb));
            let bias_cpu = match bias.map(|v| v.storage()) {
                Some(Storage::Cpu(v)) => Some(&v[..]),
                _ => None,
            };
            if bias_cpu.is_some() && cpu::bmm_bias(oa, ob, &batch, [m, k, n], bias_cpu, &mut out) {
                return Tensor::from_buffer(&shape, out);
            }
            cpu::bmm(oa, ob, &batch, [m, k, n], &mut out);
            let y = Tensor::from_buffer(&shape, out)?;
            match bias {
                Some(v) => binary(OP, Binary::Add, &y, v),
                None => Ok(y),
            }
        }
        #[cfg(feature = "cuda")]
        (Storage::Cuda(xa), Storage::Cuda(xb)) => {
            let index = |s: &[usize]| {
                let mut o = Vec::new();
                let st = broadcast_strides(&s[..s.len() - 2], &batch);
                for_each_offset(&batch, &st, |_, x| o.push(x));
                o
            };
            let oa = cuda::Operand {
                buf: xa,
                trans: ta,
                batch_index: index(a.shape()),
            };
            let ob = cuda::Operand {
                buf: xb,
                trans: tb,
                batch_index: index(b.shape()),
            };
            let y = cuda::bmm(oa, ob, &shape, [m, k, n])?;
            match bias {
                Some(v) => binary(OP, Binary::Add, &y, v),
                None => Ok(y),
            }
        }
        #[cfg(feature = "cuda")]
        _ => Err(Error::DeviceMismatch {
            op: OP,
            lhs: a.device().to_string(),
            rhs: b.device().to_string(),
        }),
    }
}

/// The rows of `a` when `a` is `[..., m, k]` (rank 3 or more) and `b` a
/// plain `[k, n]` matrix: then the product is one `[rows, k] @ [k, n]`
/// (tensors are stored row-major, so the reshape is free), and `b`'s
/// gradient needs no sum over the batch. `None` otherwise, or when the
/// shapes do not match (the general path reports that).
fn flat_rows<T: Element>(a: &Tensor<T>, b: &Tensor<T>) -> Option<usize> {
    let (sa, sb) = (a.shape(), b.shape());
    (sa.len() >= 3 && sb.len() == 2 && sa[sa.len() - 1] == sb[0] && sb[0] > 0)
        .then(|| a.numel() / sb[0])
}

/// Both gradients of `a @ b` for `a: [..., k]` read as `[rows, k]` and a
/// shared `b: [k, n]`, each where `need` asks: one product each, `dB = A^T
/// G` summed over every row at once, `dA` in `a`'s shape.
fn row_grads<T: Element>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    g: &Tensor<T>,
    rows: usize,
    need: [bool; 2],
) -> Result<[Option<Tensor<T>>; 2]> {
    let (k, n) = (b.shape()[0], b.shape()[1]);
    let (af, gf) = (a.reshape(&[rows, k])?, g.reshape(&[rows, n])?);
    let da = need[0]
        .then(|| bmm(&gf, b, false, true)?.reshape(a.shape()))
        .transpose()?;
    let db = need[1].then(|| bmm(&af, &gf, true, false)).transpose()?;
    Ok([da, db])
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
        let y = match flat_rows(a, b) {
            Some(rows) => {
                let k = a.shape()[a.shape().len() - 1];
                let mut shape = a.shape().to_vec();
                if let Some(last) = shape.last_mut() {
                    *last = b.shape()[1];
                }
                bmm(&a.reshape(&[rows, k])?, b, false, false)?.reshape(&shape)?
            }
            None => bmm(a, b, false, false)?,
        };
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
            let zeros = |i: usize, t: &Tensor<T>| {
                need(i).then(|| Tensor::zeros(t.shape()).and_then(|z| z.to_device(t.device())))
            };
            return Ok(vec![zeros(0, a).transpose()?, zeros(1, b).transpose()?]);
        }
        if let Some(rows) = flat_rows(a, b) {
            return Ok(row_grads(a, b, g, rows, [need(0), need(1)])?.into());
        }
        let da = if need(0) {
            Some(bmm(g, b, false, true)?)
        } else {
            None
        };
        let db = if need(1) {
            Some(bmm(a, g, true, false)?)
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
