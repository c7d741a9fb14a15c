//! Slicing along one axis: narrow and its adjoint, concat.
//!
//! Around the axis a tensor is `[outer, d, inner]` (`outer` the product of
//! the dims before it, `inner` of those after it):
//!
//! ```text
//! narrow  y = x[.., start..start+len, ..]   dx = g padded with zeros to x's shape
//! concat  y = [x_0 | x_1 | ..] along axis   dx_k = g[.., off_k..off_k+d_k, ..]
//! ```
//!
//! Neither saves a tensor; each op holds the sizes its backward needs.

use super::cpu;
#[cfg(feature = "cuda")]
use super::cuda;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::layout::normalize_axis;
use crate::op::Op;
use crate::tape::{Tape, Var};
use crate::tensor::{Storage, Tensor};

/// `(outer, d, inner)` of `shape` around `axis`.
fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

/// Rows `start..start + len` of `x` along `axis` (checked by the caller):
/// the device-level slice kernel.
fn slice<T: Element>(x: &Tensor<T>, axis: usize, start: usize, len: usize) -> Result<Tensor<T>> {
    let (outer, d, inner) = around(x.shape(), axis);
    let mut shape = x.shape().to_vec();
    shape[axis] = len;
    match x.storage() {
        Storage::Cpu(xs) => {
            Tensor::from_buffer(&shape, cpu::take_rows(xs, outer, inner, d, start, len))
        }
        #[cfg(feature = "cuda")]
        Storage::Cuda(xs) => cuda::take_rows(xs, &shape, (outer, inner, d), start, len),
    }
}

/// `y = x[.., start..start+len, ..]` along `axis`; `dx` is `g` at those rows
/// and 0 elsewhere.
struct Narrow {
    axis: usize,
    start: usize,
    len: usize,
    shape: Vec<usize>,
}

impl<T: Element> Op<T> for Narrow {
    /// Nothing.
    type State = ();
    fn name(&self) -> &'static str {
        "narrow"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, ())> {
        check_narrow(x[0].shape(), self.axis, self.start, self.len)?;
        Ok((slice(x[0], self.axis, self.start, self.len)?, ()))
    }
    fn backward(&self, _: &(), g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        let (outer, d, inner) = around(&self.shape, self.axis);
        if g.numel() != outer * self.len * inner {
            return Err(Error::ElementCount {
                op: "narrow",
                shape: g.shape().to_vec(),
                len: outer * self.len * inner,
            });
        }
        let dx = match g.storage() {
            Storage::Cpu(gs) => Tensor::from_vec(
                self.shape.clone(),
                cpu::pad_rows(gs, outer, inner, d, self.start, self.len),
            )?,
            #[cfg(feature = "cuda")]
            Storage::Cuda(gs) => {
                cuda::pad_rows(gs, &self.shape, (outer, inner, d), self.start, self.len)?
            }
        };
        Ok(vec![Some(dx)])
    }
}

/// `start + len` fits in axis `axis` of `shape`.
fn check_narrow(shape: &[usize], axis: usize, start: usize, len: usize) -> Result<()> {
    let size = shape[axis];
    match start.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::SliceOutOfRange {
            op: "narrow",
            axis,
            start,
            len,
            size,
            shape: shape.to_vec(),
        }),
    }
}

/// The inputs joined along `axis`; `dx_k` is `g`'s rows of input `k`.
struct Concat {
    axis: usize,
    shapes: Vec<Vec<usize>>,
}

impl<T: Element> Op<T> for Concat {
    /// Nothing.
    type State = ();
    fn name(&self) -> &'static str {
        "concat"
    }
    fn forward(&self, xs: &[&Tensor<T>]) -> Result<(Tensor<T>, ())> {
        let shapes: Vec<&[usize]> = xs.iter().map(|x| x.shape()).collect();
        let shape = concat_shape::<T>(&shapes, self.axis)?;
        let (outer, _, inner) = around(&shape, self.axis);
        for x in &xs[1..] {
            crate::ops::elementwise::check_devices("concat", xs[0], x)?;
        }
        let mut parts = Vec::with_capacity(xs.len());
        #[cfg(feature = "cuda")]
        let mut gpu_parts = Vec::new();
        for x in xs {
            match x.storage() {
                Storage::Cpu(s) => parts.push((&s[..], x.shape()[self.axis])),
                #[cfg(feature = "cuda")]
                Storage::Cuda(s) => gpu_parts.push((s, x.shape()[self.axis])),
            }
        }
        #[cfg(feature = "cuda")]
        if !gpu_parts.is_empty() {
            return Ok((cuda::concat(&gpu_parts, &shape, outer, inner)?, ()));
        }
        let y = Tensor::from_buffer(&shape, cpu::concat_rows(&parts, outer, inner))?;
        Ok((y, ()))
    }
    fn backward(&self, _: &(), g: &Tensor<T>, needs: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        let mut start = 0;
        let mut out = Vec::with_capacity(self.shapes.len());
        for (k, s) in self.shapes.iter().enumerate() {
            let len = s[self.axis];
            let need = needs.get(k).copied().unwrap_or(true);
            out.push(need.then(|| slice(g, self.axis, start, len)).transpose()?);
            start += len;
        }
        Ok(out)
    }
}

/// The shape of the inputs joined along `axis`: every input has the rank
/// and the other dims of the first, else `ShapeMismatch` naming the first
/// and the offending shape.
fn concat_shape<T: Element>(shapes: &[&[usize]], axis: usize) -> Result<Vec<usize>> {
    let Some(&first) = shapes.first() else {
        return Err(Error::InvalidArgument {
            op: "concat",
            msg: "needs at least one input".into(),
        });
    };
    let mut out = first.to_vec();
    for &s in &shapes[1..] {
        let same = s.len() == first.len()
            && s.iter()
                .zip(first)
                .enumerate()
                .all(|(d, (a, b))| d == axis || a == b);
        if !same {
            return Err(Error::ShapeMismatch {
                op: "concat",
                lhs: first.to_vec(),
                rhs: s.to_vec(),
            });
        }
        out[axis] += s[axis];
    }
    crate::layout::checked_numel("concat", &out, std::mem::size_of::<T>())?;
    Ok(out)
}

/// Elements `start..start + len` of `x` along `axis` (negative counts from
/// the end), like PyTorch's `narrow`; a copy. The gradient is the output
/// gradient padded with zeros back to `x`'s shape.
///
/// Errors (nothing is recorded): `AxisOutOfRange` unless `-rank <= axis <
/// rank`; `SliceOutOfRange` if `start + len` exceeds the axis's size.
pub fn narrow<T: Element>(x: &Var<T>, axis: isize, start: usize, len: usize) -> Result<Var<T>> {
    let ax = normalize_axis("narrow", axis, x.shape())?;
    check_narrow(x.shape(), ax, start, len)?;
    let op = Narrow {
        axis: ax,
        start,
        len,
        shape: x.shape().to_vec(),
    };
    Tape::apply(op, &[x])
}

/// `xs` joined along `axis` (negative counts from the end, against the
/// first input's rank), like PyTorch's `cat`. Each input's gradient is its
/// slice of the output gradient.
///
/// Errors (nothing is recorded): `InvalidArgument` for no inputs;
/// `AxisOutOfRange` unless `-rank <= axis < rank`; `ShapeMismatch` if an
/// input differs from the first in rank or in a dim other than `axis`;
/// `TapeMismatch` / `DeviceMismatch` for mixed inputs.
pub fn concat<T: Element>(xs: &[&Var<T>], axis: isize) -> Result<Var<T>> {
    let first = xs.first().ok_or_else(|| Error::InvalidArgument {
        op: "concat",
        msg: "needs at least one input".into(),
    })?;
    let ax = normalize_axis("concat", axis, first.shape())?;
    let shapes: Vec<&[usize]> = xs.iter().map(|x| x.shape()).collect();
    concat_shape::<T>(&shapes, ax)?;
    let op = Concat {
        axis: ax,
        shapes: shapes.iter().map(|s| s.to_vec()).collect(),
    };
    Tape::apply(op, xs)
}
