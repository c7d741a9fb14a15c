//! masked_fill: replace the elements a boolean [`Mask`] marks by a constant.
//!
//! ```text
//! y_i  = value if mask_i else x_i      (mask broadcast to x's shape)
//! dx_i = 0     if mask_i else g_i
//! ```
//!
//! The mask is host metadata, like embedding ids; the graph keeps one copy
//! of it (one byte per mask element) and nothing of `x`.

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub(crate) use cuda::KERNELS;

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::layout::broadcast_shapes;
use crate::op::{Op, Saved, SavedItem};
use crate::tape::{Tape, Var};
use crate::tensor::{Storage, Tensor};
use std::sync::Arc;

pub use crate::mask::{causal_mask, Mask};

/// The mask, shared by the op and its saved state so it is held once.
struct Held(Arc<Mask>);

impl Saved for Held {
    fn visit(&self, f: &mut dyn FnMut(SavedItem)) {
        f(SavedItem::Raw(self.0.values().len()))
    }
}

/// `fill` where the mask is true, else `x`: the device-level kernel.
fn select<T: Element>(x: &Tensor<T>, mask: &Mask, fill: T) -> Result<Tensor<T>> {
    check(x.shape(), mask)?;
    match x.storage() {
        Storage::Cpu(xs) => Tensor::from_buffer(
            x.shape(),
            cpu::select(xs, x.shape(), mask.values(), mask.shape(), fill),
        ),
        #[cfg(feature = "cuda")]
        Storage::Cuda(xs) => cuda::select(xs, x.shape(), mask.values(), mask.shape(), fill),
    }
}

/// The mask broadcasts to exactly `shape`.
fn check(shape: &[usize], mask: &Mask) -> Result<()> {
    match broadcast_shapes("masked_fill", shape, mask.shape()) {
        Ok(s) if s == shape => Ok(()),
        _ => Err(Error::BroadcastMismatch {
            op: "masked_fill",
            lhs: shape.to_vec(),
            rhs: mask.shape().to_vec(),
        }),
    }
}

struct MaskedFill {
    mask: Arc<Mask>,
    value: f64,
}

impl<T: Element> Op<T> for MaskedFill {
    type State = Held;
    fn name(&self) -> &'static str {
        "masked_fill"
    }
    /// `y_i = value` where the mask is true, else `x_i` (NaN in `x` stays
    /// where unmasked).
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Held)> {
        let y = select(x[0], &self.mask, T::from_f64(self.value))?;
        Ok((y, Held(self.mask.clone())))
    }
    /// `dx_i = 0` where the mask is true, else `g_i`.
    fn backward(&self, m: &Held, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(select(g, &m.0, T::ZERO)?)])
    }
}

/// `x` with `value` (rounded to `T`; `-inf` stays `-inf`) wherever `mask`
/// is true. The mask broadcasts to `x`'s shape under NumPy's rules
/// (trailing dims align), so a `[t, t]` [`causal_mask`] serves scores of
/// shape `[batch, heads, t, t]`: `softmax(masked_fill(s, &causal_mask(t)?,
/// f64::NEG_INFINITY)?, -1)` attends to the present and the past. The
/// gradient passes where the mask is false and is 0 where it is true.
///
/// Errors (nothing is recorded): `BroadcastMismatch` unless the mask's
/// shape broadcasts to exactly `x`'s.
pub fn masked_fill<T: Element>(x: &Var<T>, mask: &Mask, value: f64) -> Result<Var<T>> {
    check(x.shape(), mask)?;
    let op = MaskedFill {
        mask: Arc::new(mask.clone()),
        value,
    };
    Tape::apply(op, &[x])
}
