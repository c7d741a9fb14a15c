//! Reductions: `sum` and `mean` over every axis or over chosen axes.
//!
//! For `y = sum_{i in R} x_i` (R: the reduced positions mapped to one output
//! element) the local chain rule is `dx_i = g_{out(i)}`: the output gradient
//! broadcast back over the reduced axes. For `mean`, `y = (1/n) sum x_i`
//! with `n = |R|`, so `dx_i = g_{out(i)} / n`. Neither needs saved tensors;
//! the op keeps only the input's shape and the reduced axes (metadata).

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::op::Op;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub(crate) use cuda::KERNELS;
pub(crate) mod kernel;

use super::elementwise::{unary_to, Unary};
use crate::layout::{alloc_filled, checked_numel, normalize_axes};
use crate::tape::{Tape, Var};
use crate::tensor::{Storage, Tensor};
use kernel::sum_kernel;
use num_traits::Zero;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Sum,
    Mean,
}

struct Reduce {
    name: &'static str,
    kind: Kind,
    /// Shape of the input.
    in_shape: Vec<usize>,
    /// Input shape with every reduced axis set to 1.
    keep_shape: Vec<usize>,
    /// Output shape (`keep_shape`, or it without the reduced axes).
    out_shape: Vec<usize>,
    /// Number of input elements folded into each output element.
    count: usize,
    /// Per input axis, whether it is reduced.
    red: Vec<bool>,
}

impl Reduce {
    fn new(
        name: &'static str,
        kind: Kind,
        shape: &[usize],
        axes: &[isize],
        keepdim: bool,
    ) -> Result<Self> {
        let axes = normalize_axes(name, axes, shape)?;
        let mut keep_shape = shape.to_vec();
        let mut out_shape = Vec::with_capacity(shape.len());
        for (d, &n) in shape.iter().enumerate() {
            if axes.contains(&d) {
                keep_shape[d] = 1;
                if keepdim {
                    out_shape.push(1);
                }
            } else {
                out_shape.push(n);
            }
        }
        let red = (0..shape.len()).map(|d| axes.contains(&d)).collect();
        // The output's element count is checked here, before any work.
        checked_numel(name, &out_shape, 1)?;
        // For an empty input the reduced dims' product may overflow; the
        // count is then either 0 (a reduced dim is 0) or irrelevant (the
        // output is empty), so saturating is exact where it matters.
        let count = if axes.iter().any(|&a| shape[a] == 0) {
            0
        } else {
            axes.iter()
                .try_fold(1usize, |p, &a| p.checked_mul(shape[a]))
                .unwrap_or(usize::MAX)
        };
        Ok(Reduce {
            name,
            kind,
            in_shape: shape.to_vec(),
            keep_shape,
            out_shape,
            count,
            red,
        })
    }
}

impl<T: Element> Op<T> for Reduce {
    /// Nothing: backward needs only shapes, which the op itself holds.
    type State = ();

    fn name(&self) -> &'static str {
        self.name
    }

    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, ())> {
        if x[0].shape() != self.in_shape {
            return Err(Error::ShapeMismatch {
                op: self.name,
                lhs: x[0].shape().to_vec(),
                rhs: self.in_shape.clone(),
            });
        }
        if self.count == 0 {
            // Reducing over nothing: sums are 0, means 0/0 = NaN (as NumPy).
            // The output can be far larger than the (empty) input, so it is
            // allocated fallibly, in T.
            let zero = T::Acc::zero();
            let v = match self.kind {
                Kind::Sum => zero,
                Kind::Mean => <T::Acc as num_traits::Float>::nan(),
            };
            let y = match x[0].storage() {
                Storage::Cpu(_) => {
                    let out = alloc_filled(self.name, &self.out_shape, T::from_acc(v))?;
                    Tensor::from_vec(self.out_shape.clone(), out)?
                }
                // The output stays on the input's device.
                #[cfg(feature = "cuda")]
                Storage::Cuda(xs) => cuda::filled(xs, self.name, &self.out_shape, T::from_acc(v))?,
            };
            return Ok((y, ()));
        }
        let div = (self.kind == Kind::Mean).then_some(self.count);
        Ok((sum_kernel(x[0], &self.red, div, &self.out_shape)?, ()))
    }

    /// `dx_i = g_{out(i)}` (sum) or `g_{out(i)} / n` (mean): `g` read as if
    /// it had `keep_shape` (dropping size-1 axes does not change row-major
    /// order) and broadcast back over the reduced axes.
    fn backward(&self, _: &(), g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        let g = g.reshape(&self.keep_shape)?;
        let k = match self.kind {
            Kind::Sum => Unary::Copy,
            Kind::Mean => Unary::DivScalar(self.count as f64),
        };
        Ok(vec![Some(unary_to(self.name, k, &g, &self.in_shape)?)])
    }
}

/// Sum of every element; the result has shape `[]`.
pub fn sum<T: Element>(x: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Reduce::new("sum", Kind::Sum, x.shape(), &[], false)?, &[x])
}

/// Mean of every element; the result has shape `[]`. A tensor with no
/// elements gives NaN (0/0), as NumPy does.
pub fn mean<T: Element>(x: &Var<T>) -> Result<Var<T>> {
    Tape::apply(
        Reduce::new("mean", Kind::Mean, x.shape(), &[], false)?,
        &[x],
    )
}

/// Sum over `axes` (negative counts from the end; an empty list means every
/// axis). `keepdim` keeps each reduced axis with size 1. An axis outside
/// `-rank..rank` is [`crate::Error::AxisOutOfRange`]; an axis given twice is
/// [`crate::Error::InvalidArgument`].
pub fn sum_axes<T: Element>(x: &Var<T>, axes: &[isize], keepdim: bool) -> Result<Var<T>> {
    let op = Reduce::new("sum_axes", Kind::Sum, x.shape(), axes, keepdim)?;
    Tape::apply(op, &[x])
}

/// Mean over `axes`, with the same axis rules as [`sum_axes`]. Reducing over
/// zero elements gives NaN, as NumPy does.
pub fn mean_axes<T: Element>(x: &Var<T>, axes: &[isize], keepdim: bool) -> Result<Var<T>> {
    let op = Reduce::new("mean_axes", Kind::Mean, x.shape(), axes, keepdim)?;
    Tape::apply(op, &[x])
}
