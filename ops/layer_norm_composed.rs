//! LayerNorm built only from primitive ops, the fused op's twin: every step
//! is its own tape node with its own backward, so the chain rule is applied
//! by the tape, not by hand. Used to check the fused op (outputs and
//! gradients must agree) and to show what an unfused graph costs in saved
//! memory. It shares argument validation with the fused op (so both reject
//! the same inputs) and no arithmetic.
//!
//! ```text
//! mu   = mean_axes(x, trailing, keepdim)
//! xc   = x - mu
//! var  = mean_axes(xc * xc, trailing, keepdim)
//! rstd = rsqrt(var + eps)
//! y    = (xc * rstd) * gamma + beta
//! ```

use super::layer_norm::{check_eps, check_param, last_axis, rows_and_len};
use super::{add, mean_axes, mul, rsqrt, scalar_add, sub};
use crate::dtype::Element;
use crate::error::Result;
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
    let op = "layer_norm_composed";
    check_eps::<T>(op, eps)?;
    rows_and_len(op, x.shape(), normalized_shape)?;
    check_param("layer_norm_composed: gamma", gamma, normalized_shape)?;
    check_param("layer_norm_composed: beta", beta, normalized_shape)?;
    let axes = trailing_axes(normalized_shape.len());
    let mu = mean_axes(x, &axes, true)?;
    let xc = sub(x, &mu)?;
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
