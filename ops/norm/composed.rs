//! LayerNorm and RMSNorm built only from primitive ops, the fused op's
//! twins: every step is its own tape node with its own backward, so the
//! chain rule is applied by the tape, not by hand. Used to check the fused
//! op (outputs and gradients must agree) and to show what an unfused graph
//! costs in saved memory. They share argument validation with the fused op
//! (so both reject the same inputs) and no arithmetic. RMSNorm is the same
//! graph without the centring step and the shift:
//!
//! ```text
//! xc   = x - mean_axes(x, trailing, keepdim)     (RMSNorm: xc = x)
//! var  = mean_axes(xc * xc, trailing, keepdim)
//! rstd = rsqrt(var + eps)
//! y    = (xc * rstd) * gamma + beta             (RMSNorm: no beta)
//! ```

use super::{check_args, last_axis, names};
use crate::dtype::Element;
use crate::error::Result;
use crate::ops::{add, mean_axes, mul, rsqrt, scalar_add, sub};
use crate::tape::Var;

/// The trailing `k` axes as negative indices: `[-k, .., -1]`.
pub(crate) fn trailing_axes(k: usize) -> Vec<isize> {
    (1..=k as isize).rev().map(|a| -a).collect()
}

/// [`layer_norm_composed_nd`] over the last axis.
pub fn layer_norm_composed<T: Element>(
    x: &Var<T>,
    gamma: Option<&Var<T>>,
    beta: Option<&Var<T>>,
    eps: f64,
) -> Result<Var<T>> {
    let normalized = last_axis("layer_norm_composed", x.shape())?;
    layer_norm_composed_nd(x, &normalized, gamma, beta, eps)
}

/// LayerNorm over the trailing dims `normalized_shape`, as a graph of
/// `mean_axes`, `sub`, `mul`, `scalar_add`, `rsqrt` and `add` nodes. Same
/// arguments, results (up to rounding) and errors as
/// [`crate::ops::layer_norm_nd`].
pub fn layer_norm_composed_nd<T: Element>(
    x: &Var<T>,
    normalized_shape: &[usize],
    gamma: Option<&Var<T>>,
    beta: Option<&Var<T>>,
    eps: f64,
) -> Result<Var<T>> {
    composed_nd(true, x, normalized_shape, gamma, beta, eps)
}

/// [`rms_norm_composed_nd`] over the last axis.
pub fn rms_norm_composed<T: Element>(
    x: &Var<T>,
    gamma: Option<&Var<T>>,
    eps: f64,
) -> Result<Var<T>> {
    let normalized = last_axis("rms_norm_composed", x.shape())?;
    rms_norm_composed_nd(x, &normalized, gamma, eps)
}

/// RMSNorm over the trailing dims `normalized_shape` as a graph of `mul`,
/// `mean_axes`, `scalar_add` and `rsqrt` nodes. Same arguments, results
/// (up to rounding) and errors as [`crate::ops::rms_norm_nd`].
pub fn rms_norm_composed_nd<T: Element>(
    x: &Var<T>,
    normalized_shape: &[usize],
    gamma: Option<&Var<T>>,
    eps: f64,
) -> Result<Var<T>> {
    composed_nd(false, x, normalized_shape, gamma, None, eps)
}

/// The graph above, centred (LayerNorm) or not (RMSNorm).
fn composed_nd<T: Element>(
    centre: bool,
    x: &Var<T>,
    normalized_shape: &[usize],
    gamma: Option<&Var<T>>,
    beta: Option<&Var<T>>,
    eps: f64,
) -> Result<Var<T>> {
    check_args(names(centre, true), (x, normalized_shape, gamma, beta, eps))?;
    let axes = trailing_axes(normalized_shape.len());
    let xc = if centre {
        sub(x, &mean_axes(x, &axes, true)?)?
    } else {
        x.clone()
    };
    let var = mean_axes(&mul(&xc, &xc)?, &axes, true)?;
    let rstd = rsqrt(&scalar_add(&var, eps)?)?;
    let mut y = mul(&xc, &rstd)?;
    if let Some(g) = gamma {
        y = mul(&y, g)?;
    }
    if let Some(b) = beta {
        y = add(&y, b)?;
    }
    Ok(y)
}
