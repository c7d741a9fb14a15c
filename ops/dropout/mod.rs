//! Dropout: in training, each element is kept with probability `1 - p` and
//! scaled by `1 / (1 - p)`, so the expectation is unchanged.
//!
//! ```text
//! y_i  = x_i m_i,   m_i = 1/(1-p) if kept else 0
//! dx_i = g_i m_i
//! ```
//!
//! The mask is drawn from the caller's [`Rng`] (one uniform draw per
//! element, in row-major order), so a seed fixes it; the graph keeps it as
//! one bit per element.

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub(crate) use cuda::KERNELS;

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::op::{Op, Saved, SavedItem};
use crate::rng::Rng;
use crate::tape::{Tape, Var};
use crate::tensor::{Storage, Tensor};
use std::sync::Arc;

/// Keep bits, bit `i % 8` of byte `i / 8`; shared by the op and its state.
struct Keep(Arc<[u8]>);

impl Saved for Keep {
    fn visit(&self, f: &mut dyn FnMut(SavedItem)) {
        f(SavedItem::Raw(self.0.len()))
    }
}

/// `x m` for the keep bits and scale: the device-level kernel.
fn apply<T: Element>(x: &Tensor<T>, keep: &[u8], scale: f64) -> Result<Tensor<T>> {
    if keep.len() != x.numel().div_ceil(8) {
        return Err(Error::ElementCount {
            op: "dropout",
            shape: x.shape().to_vec(),
            len: keep.len() * 8,
        });
    }
    match x.storage() {
        Storage::Cpu(xs) => Tensor::from_buffer(x.shape(), cpu::apply(xs, keep, scale)),
        #[cfg(feature = "cuda")]
        Storage::Cuda(xs) => cuda::apply(xs, x.shape(), keep, scale),
    }
}

struct Dropout {
    keep: Arc<[u8]>,
    scale: f64,
}

impl<T: Element> Op<T> for Dropout {
    type State = Keep;
    fn name(&self) -> &'static str {
        "dropout"
    }
    /// `y_i = x_i / (1 - p)` where kept, else `x_i * 0`.
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Keep)> {
        let y = apply(x[0], &self.keep, self.scale)?;
        Ok((y, Keep(self.keep.clone())))
    }
    /// `dx_i = g_i / (1 - p)` where kept, else `g_i * 0`.
    fn backward(&self, k: &Keep, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(apply(g, &k.0, self.scale)?)])
    }
}

/// Dropout with drop probability `p`. When `training` and `p > 0`, each
/// element is kept with probability `1 - p` (one `rng.uniform() >= p` draw
/// per element, row-major, so the same seed gives the same mask) and kept
/// values are `x * s` with `s = 1 / (1 - p)` rounded to the accumulation
/// type; dropped ones are `x * 0` (0, or NaN for NaN or infinite `x`, as in
/// PyTorch). Otherwise it returns `x` itself: no node, no draw.
///
/// Errors: `BadProbability` unless `0 <= p < 1` (checked even when not
/// training).
pub fn dropout<T: Element>(x: &Var<T>, p: f64, rng: &mut Rng, training: bool) -> Result<Var<T>> {
    if !(0.0..1.0).contains(&p) {
        return Err(Error::BadProbability { op: "dropout", p });
    }
    if !training || p == 0.0 {
        return Ok(x.clone());
    }
    let op = Dropout {
        keep: cpu::draw_keep(x.value().numel(), p, rng).into(),
        scale: 1.0 / (1.0 - p),
    };
    Tape::apply(op, &[x])
}
