//! Shape ops: reshape, transpose, permute, broadcast_to, and (in
//! `slice.rs`) narrow and concat. None saves a tensor; each op holds the
//! shapes or axis order its backward needs.
//!
//! ```text
//! reshape       y = x (new shape)          dx = g (old shape)
//! permute       y = x[perm]                dx = permute(g, perm^-1)
//! transpose     permute by one swap        dx = transpose(g) (its own inverse)
//! broadcast_to  y_i = x_{j(i)}             dx_j = sum_{i: j(i) = j} g_i
//! ```
//!
//! Reshape shares the storage; permute copies through the device-level
//! kernel below; broadcast_to is the elementwise copy kernel to the new
//! shape, its adjoint the tape's sum back to the input shape.

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub(crate) use cuda::KERNELS;
mod slice;

pub use slice::*;

use super::elementwise::{unary_to, Unary};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::layout::{broadcast_shapes, checked_numel, normalize_axis, strides};
use crate::op::Op;
use crate::tape::{Tape, Var};
use crate::tensor::{Storage, Tensor};

/// `y = x` read with a new shape of the same element count (the storage is
/// shared, not copied); `dx = g` read with the input's shape.
struct Reshape {
    from: Vec<usize>,
    to: Vec<usize>,
}

impl<T: Element> Op<T> for Reshape {
    /// Nothing.
    type State = ();
    fn name(&self) -> &'static str {
        "reshape"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, ())> {
        Ok((x[0].reshape(&self.to)?, ()))
    }
    fn backward(&self, _: &(), g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(g.reshape(&self.from)?)])
    }
}

/// `y[i_0, .., i_{r-1}] = x[j]` with `j[perm[d]] = i_d`, i.e. output axis `d`
/// is input axis `perm[d]`. The adjoint of a permutation is its inverse:
/// `dx = permute(g, perm^-1)`.
struct Permute {
    name: &'static str,
    perm: Vec<usize>,
}

/// Copies `x` with its axes reordered by `perm` (already validated): the
/// device-level permute kernel. The identity order shares the storage.
fn permute_tensor<T: Element>(x: &Tensor<T>, perm: &[usize]) -> Result<Tensor<T>> {
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(x.clone());
    }
    let (shape, own) = (x.shape(), strides(x.shape()));
    let out: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let src: Vec<usize> = perm.iter().map(|&p| own[p]).collect();
    match x.storage() {
        Storage::Cpu(xs) => {
            let v = cpu::permute(xs, &out, &src);
            Tensor::from_vec(out, v)
        }
        #[cfg(feature = "cuda")]
        Storage::Cuda(xs) => cuda::permute(xs, &out, &src),
    }
}

impl<T: Element> Op<T> for Permute {
    /// Nothing.
    type State = ();
    fn name(&self) -> &'static str {
        self.name
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, ())> {
        if x[0].rank() != self.perm.len() {
            return Err(bad_perm(self.name, &self.perm, x[0].shape()));
        }
        Ok((permute_tensor(x[0], &self.perm)?, ()))
    }
    fn backward(&self, _: &(), g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        let mut inv = vec![0; self.perm.len()];
        for (d, &p) in self.perm.iter().enumerate() {
            inv[p] = d;
        }
        Ok(vec![Some(permute_tensor(g, &inv)?)])
    }
}

fn bad_perm(op: &'static str, perm: &[usize], shape: &[usize]) -> Error {
    Error::InvalidArgument {
        op,
        msg: format!("{perm:?} is not a permutation of the axes of shape {shape:?}"),
    }
}

/// `y = x` repeated along the axes where `x` has size 1 (or lacks the axis),
/// NumPy style. Backward returns `g` in the broadcast shape unchanged; the
/// tape's [`crate::ops::reduce::kernel::sum_to_shape`] sums it back over the repeated axes
/// (`dx_j = sum over the copies of x_j of g`), the one place that reduction
/// lives.
struct BroadcastTo {
    to: Vec<usize>,
}

impl<T: Element> Op<T> for BroadcastTo {
    /// Nothing.
    type State = ();
    fn name(&self) -> &'static str {
        "broadcast_to"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, ())> {
        let x = x[0];
        check_broadcast(x.shape(), &self.to)?;
        if x.shape() == self.to {
            return Ok((x.clone(), ()));
        }
        Ok((unary_to("broadcast_to", Unary::Copy, x, &self.to)?, ()))
    }
    fn backward(&self, _: &(), g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(g.clone())])
    }
}

/// `from` broadcasts to exactly `to` (not to something larger).
fn check_broadcast(from: &[usize], to: &[usize]) -> Result<()> {
    let err = || Error::BroadcastMismatch {
        op: "broadcast_to",
        lhs: from.to_vec(),
        rhs: to.to_vec(),
    };
    match broadcast_shapes("broadcast_to", from, to) {
        Ok(s) if s == to => Ok(()),
        _ => Err(err()),
    }
}

/// `x` with a new shape of the same element count, in row-major order; no
/// copy. A different element count is [`Error::ShapeMismatch`].
pub fn reshape<T: Element>(x: &Var<T>, shape: &[usize]) -> Result<Var<T>> {
    let n = checked_numel("reshape", shape, std::mem::size_of::<T>())?;
    if n != x.value().numel() {
        return Err(Error::ShapeMismatch {
            op: "reshape",
            lhs: x.shape().to_vec(),
            rhs: shape.to_vec(),
        });
    }
    let op = Reshape {
        from: x.shape().to_vec(),
        to: shape.to_vec(),
    };
    Tape::apply(op, &[x])
}

/// Swaps axes `a0` and `a1` (negative counts from the end). An axis outside
/// `-rank..rank` is [`Error::AxisOutOfRange`].
pub fn transpose<T: Element>(x: &Var<T>, a0: isize, a1: isize) -> Result<Var<T>> {
    let (a0, a1) = (
        normalize_axis("transpose", a0, x.shape())?,
        normalize_axis("transpose", a1, x.shape())?,
    );
    let mut perm: Vec<usize> = (0..x.value().rank()).collect();
    perm.swap(a0, a1);
    Tape::apply(
        Permute {
            name: "transpose",
            perm,
        },
        &[x],
    )
}

/// Reorders the axes: output axis `d` is input axis `perm[d]`. `perm` must
/// list each of `0..rank` once: an entry `>= rank` is
/// [`Error::AxisOutOfRange`]; a wrong length or a repeat is
/// [`Error::InvalidArgument`].
pub fn permute<T: Element>(x: &Var<T>, perm: &[usize]) -> Result<Var<T>> {
    let shape = x.shape();
    let rank = shape.len();
    if let Some(&p) = perm.iter().find(|&&p| p >= rank) {
        return Err(Error::AxisOutOfRange {
            op: "permute",
            axis: isize::try_from(p).unwrap_or(isize::MAX),
            rank,
            shape: shape.to_vec(),
        });
    }
    let mut seen = vec![false; rank];
    for &p in perm {
        seen[p] = true;
    }
    if perm.len() != rank || seen.contains(&false) {
        return Err(bad_perm("permute", perm, shape));
    }
    Tape::apply(
        Permute {
            name: "permute",
            perm: perm.to_vec(),
        },
        &[x],
    )
}

/// Broadcasts `x` to `shape` under NumPy's rules (align trailing axes; a
/// size-1 or missing axis repeats). Anything else, including a `shape` of
/// lower rank, is [`Error::BroadcastMismatch`].
pub fn broadcast_to<T: Element>(x: &Var<T>, shape: &[usize]) -> Result<Var<T>> {
    check_broadcast(x.shape(), shape)?;
    checked_numel("broadcast_to", shape, std::mem::size_of::<T>())?;
    Tape::apply(BroadcastTo { to: shape.to_vec() }, &[x])
}
