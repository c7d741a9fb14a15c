//! Softmax and log-softmax along one axis, max-subtracted so that no
//! exponent is positive: stable for logits of any magnitude.
//!
//! Per lane (the elements along the axis), with `m = max_i x_i` and
//! `s = sum_i exp(x_i - m)`:
//!
//! ```text
//! softmax      y_i = exp(x_i - m) / s
//! log-softmax  y_i = (x_i - m) - ln s
//! ```
//!
//! Backward, with `g = dL/dy`: softmax `dx_i = y_i (g_i - sum_j g_j y_j)`;
//! log-softmax `dx_i = g_i - exp(y_i) sum_j g_j` (`exp(y)` is softmax). Both
//! are written in terms of the output, the only saved tensor. The data is
//! reached only through the device-level kernels below.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub(crate) use cuda::KERNELS;

use super::elementwise::check_devices;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::layout::normalize_axis;
use crate::op::Op;
use crate::tape::{Tape, Var};
use crate::tensor::{Storage, Tensor};

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

/// Softmax (or log-softmax when `log`) of `x` along `axis`: the device-level
/// forward kernel.
fn softmax_kernel<T: Element>(x: &Tensor<T>, axis: usize, log: bool) -> Result<Tensor<T>> {
    let (d, inner) = split(x.shape(), axis);
    match x.storage() {
        Storage::Cpu(xs) => Tensor::from_vec(x.shape().to_vec(), cpu::forward(xs, d, inner, log)),
        #[cfg(feature = "cuda")]
        Storage::Cuda(xs) => cuda::forward(xs, x.shape(), d, inner, log),
    }
}

/// The input gradient from the output `y` and its gradient `g` along
/// `axis`: the device-level backward kernel.
fn softmax_grad_kernel<T: Element>(
    op: &'static str,
    y: &Tensor<T>,
    g: &Tensor<T>,
    axis: usize,
    log: bool,
) -> Result<Tensor<T>> {
    check_devices(op, y, g)?;
    // The loops walk `y` and `g` in step, so they must agree element for
    // element.
    if y.shape() != g.shape() {
        return Err(Error::ShapeMismatch {
            op,
            lhs: y.shape().to_vec(),
            rhs: g.shape().to_vec(),
        });
    }
    let (d, inner) = split(y.shape(), axis);
    match (y.storage(), g.storage()) {
        (Storage::Cpu(ys), Storage::Cpu(gs)) => {
            Tensor::from_vec(y.shape().to_vec(), cpu::backward(ys, gs, d, inner, log))
        }
        #[cfg(feature = "cuda")]
        (Storage::Cuda(ys), Storage::Cuda(gs)) => cuda::backward(ys, gs, y.shape(), d, inner, log),
        // Unreachable after check_devices; an error, never a panic.
        #[cfg(feature = "cuda")]
        _ => Err(Error::DeviceMismatch {
            op,
            lhs: y.device().to_string(),
            rhs: g.device().to_string(),
        }),
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
        let y = softmax_kernel(x, self.axis, self.log)?;
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
        let name = <Self as Op<T>>::name(self);
        let dx = softmax_grad_kernel(name, y, g, self.axis, self.log)?;
        Ok(vec![Some(dx)])
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
