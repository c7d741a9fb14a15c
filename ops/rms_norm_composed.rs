//! RMSNorm built only from primitive ops, the fused op's twin (see
//! `layer_norm_composed.rs` for why it exists):
//!
//! ```text
//! ms   = mean_axes(x * x, trailing, keepdim)
//! rstd = rsqrt(ms + eps)
//! y    = (x * rstd) * gamma
//! ```

use super::layer_norm::{check_eps, check_param, last_axis, rows_and_len};
use super::layer_norm_composed::trailing_axes;
use super::{mean_axes, mul, rsqrt, scalar_add};
use crate::dtype::Element;
use crate::error::Result;
use crate::tape::Var;

/// [`rms_norm_composed_nd`] over the last axis.
pub fn rms_norm_composed<T: Element>(
    x: &Var<T>,
    gamma: Option<&Var<T>>,
    eps: f64,
) -> Result<Var<T>> {
    let normalized = last_axis("rms_norm_composed", x.shape())?;
    rms_norm_composed_nd(x, &normalized, gamma, eps)
}

/// RMSNorm over the trailing dims `normalized_shape` as a graph of
/// `mul`, `mean_axes`, `scalar_add` and `rsqrt` nodes. Same arguments,
/// results (up to rounding) and errors as [`crate::ops::rms_norm_nd`].
pub fn rms_norm_composed_nd<T: Element>(
    x: &Var<T>,
    normalized_shape: &[usize],
    gamma: Option<&Var<T>>,
    eps: f64,
) -> Result<Var<T>> {
    let op = "rms_norm_composed";
    check_eps::<T>(op, eps)?;
    rows_and_len(op, x.shape(), normalized_shape)?;
    check_param("rms_norm_composed: gamma", gamma, normalized_shape)?;
    let axes = trailing_axes(normalized_shape.len());
    let ms = mean_axes(&mul(x, x)?, &axes, true)?;
    let rstd = rsqrt(&scalar_add(&ms, eps)?)?;
    let y = mul(x, &rstd)?;
    match gamma {
        Some(g) => mul(&y, g),
        None => Ok(y),
    }
}
