//! TEMPORARY: stand-ins for `ops::layer_norm_composed` / `ops::rms_norm_composed`
//! until branch `layernorm` lands them; then this file becomes a re-export.

use crate::dtype::Element;
use crate::error::Result;
use crate::ops;
use crate::tape::Var;

pub(crate) fn layer_norm_composed<T: Element>(
    x: &Var<T>,
    gamma: Option<&Var<T>>,
    beta: Option<&Var<T>>,
    eps: f64,
) -> Result<Var<T>> {
    let mean = ops::mean_axes(x, &[-1], true)?;
    let xc = ops::sub(x, &mean)?;
    let var = ops::mean_axes(&ops::mul(&xc, &xc)?, &[-1], true)?;
    let rstd = ops::rsqrt(&ops::scalar_add(&var, eps)?)?;
    let mut y = ops::mul(&xc, &rstd)?;
    if let Some(g) = gamma {
        y = ops::mul(&y, g)?;
    }
    if let Some(b) = beta {
        y = ops::add(&y, b)?;
    }
    Ok(y)
}

pub(crate) fn rms_norm_composed<T: Element>(
    x: &Var<T>,
    gamma: Option<&Var<T>>,
    eps: f64,
) -> Result<Var<T>> {
    let ms = ops::mean_axes(&ops::mul(x, x)?, &[-1], true)?;
    let r = ops::rsqrt(&ops::scalar_add(&ms, eps)?)?;
    let mut y = ops::mul(x, &r)?;
    if let Some(g) = gamma {
        y = ops::mul(&y, g)?;
    }
    Ok(y)
}
