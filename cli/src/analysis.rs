//! Measurements behind docs/layernorm.md: every figure the page reports is
//! computed here, from the real ops, not typed in.
//!
//! - [`report`]: for LayerNorm and RMSNorm, fused and composed:
//!   * FLOPs, *counted* by running the real kernels and graphs on a
//!     counting number type ([`Counted`]: every `+ - * /`, `sqrt` and other
//!     arithmetic call on the element or accumulation type adds one; `mul_add`
//!     adds two; comparisons, negation and conversions add none). Counts at
//!     four shapes are fitted exactly by `a*N*D + b*N + c*D + e`, so `a` is
//!     the per-element cost, `b` the per-row cost, `c` per column (the
//!     dgamma/dbeta reduction) and a fifth shape checks the fit.
//!   * Bytes moved, from a traffic model applied node by node to the graph
//!     actually recorded on a tape ([`Tape::nodes`]): see [`node_traffic`].
//!   * Bytes saved for backward, from [`Tape::saved_bytes`].
//! - [`three_way`] / [`three_way_table`]: fused vs composed vs finite
//!   differences on representative cases.
//!
//! Files: this one holds the cases ([`Case`], [`Norm`]); `check` the
//! three-way check and the sweep, `flops` the FLOP counting, `traffic` the
//! traffic model, and `summary` the report built from them.

use fusegrad::dtype::Element;
use fusegrad::error::{Error, Result};
use fusegrad::gradcheck::{self, Options};
use fusegrad::ops;
use fusegrad::probes::{alloc, checked_numel};
use fusegrad::rng::Rng;
use fusegrad::tape::{NodeInfo, NodeMemory, Tape, Var};
use fusegrad::tensor::Tensor;
use std::fmt;

// ------------------------------------------------------------------------
// Cases
// ------------------------------------------------------------------------

/// Which normalization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Norm {
    /// LayerNorm with gamma and beta.
    LayerNorm,
    /// RMSNorm with gamma.
    RmsNorm,
}

impl Norm {
    /// The fused op's name.
    pub fn name(self) -> &'static str {
        match self {
            Norm::LayerNorm => "layer_norm",
            Norm::RmsNorm => "rms_norm",
        }
    }
}

/// One randomized input set: `x = offset + scale * z` with `z` standard
/// normal, `gamma = 1 + 0.5 z'`, `beta = 0.5 z''` (LayerNorm only).
#[derive(Debug, Clone)]
pub struct Case {
    /// LayerNorm or RMSNorm.
    pub norm: Norm,
    /// Shape of `x`.
    pub shape: Vec<usize>,
    /// The normalized trailing dims (the shape of gamma and beta).
    pub normalized: Vec<usize>,
    /// Spread of `x`.
    pub scale: f64,
    /// Common offset of `x`.
    pub offset: f64,
    /// eps.
    pub eps: f64,
    /// Seed for the values and the cotangent.
    pub seed: u64,
}

impl Case {
    /// A well-scaled case (scale 1, offset 0, eps 1e-5).
    pub fn new(norm: Norm, shape: &[usize], normalized: &[usize]) -> Self {
        Case {
            norm,
            shape: shape.to_vec(),
            normalized: normalized.to_vec(),
            scale: 1.0,
            offset: 0.0,
            eps: 1e-5,
            seed: 1,
        }
    }

    /// Row length D (saturating: a D that overflows is no real row).
    pub fn d(&self) -> usize {
        self.normalized
            .iter()
            .fold(1usize, |p, &v| p.saturating_mul(v))
    }

    /// The inputs `[x, gamma, beta?]` in f64. `ShapeTooLarge` /
    /// `OutOfMemory` for shapes that cannot be allocated.
    pub fn values(&self) -> Result<Vec<Tensor<f64>>> {
        let mut rng = Rng::new(self.seed ^ 0xA11C_E5ED);
        let op = "analysis::Case::values";
        let (mut x, mut gamma) = (alloc(op, &self.shape)?, alloc(op, &self.normalized)?);
        let n = checked_numel(op, &self.shape, 8)?;
        let d = checked_numel(op, &self.normalized, 8)?;
        x.extend((0..n).map(|_| self.offset + self.scale * rng.normal()));
        gamma.extend((0..d).map(|_| 1.0 + 0.5 * rng.normal()));
        let mut out = vec![
            Tensor::from_vec(self.shape.clone(), x)?,
            Tensor::from_vec(self.normalized.clone(), gamma)?,
        ];
        if self.norm == Norm::LayerNorm {
            let beta = (0..d).map(|_| 0.5 * rng.normal()).collect();
            out.push(Tensor::from_vec(self.normalized.clone(), beta)?);
        }
        Ok(out)
    }

    /// [`Case::values`] rounded to `T`.
    pub fn inputs<T: Element>(&self) -> Result<Vec<Tensor<T>>> {
        self.values()?.iter().map(|t| t.cast::<T>()).collect()
    }

    /// Applies the fused (`fused = true`) or composed op to `x` and params
    /// `[gamma, beta?]`.
    pub fn apply<T: Element>(&self, fused: bool, x: &Var<T>, p: &[Var<T>]) -> Result<Var<T>> {
        let (g, b) = (p.first(), p.get(1));
        let nd = &self.normalized;
        match (self.norm, fused) {
            (Norm::LayerNorm, true) => ops::layer_norm_nd(x, nd, g, b, self.eps),
            (Norm::LayerNorm, false) => ops::layer_norm_composed_nd(x, nd, g, b, self.eps),
            (Norm::RmsNorm, true) => ops::rms_norm_nd(x, nd, g, self.eps),
            (Norm::RmsNorm, false) => ops::rms_norm_composed_nd(x, nd, g, self.eps),
        }
    }

    /// The fused op on `[x, gamma, beta?]`.
    pub fn fused<T: Element>(&self, v: &[Var<T>]) -> Result<Var<T>> {
        let (x, p) = split_first(v)?;
        self.apply(true, x, p)
    }

    /// The composed twin on `[x, gamma, beta?]`.
    pub fn composed<T: Element>(&self, v: &[Var<T>]) -> Result<Var<T>> {
        let (x, p) = split_first(v)?;
        self.apply(false, x, p)
    }
}

fn split_first<T: Element>(v: &[Var<T>]) -> Result<(&Var<T>, &[Var<T>])> {
    v.split_first().ok_or_else(|| Error::InvalidArgument {
        op: "analysis",
        msg: "no inputs".into(),
    })
}

/// Per-row statistics of `x` (rows of `d`) in f64: for each row
/// `(max |x_j|, scale)` where scale is `sqrt(var + eps)` (LayerNorm) or
/// `sqrt(mean(x^2) + eps)` (RMSNorm).
fn row_scales(norm: Norm, x: &[f64], d: usize, eps: f64) -> Vec<(f64, f64)> {
    x.chunks(d.max(1))
        .map(|r| {
            let df = r.len() as f64;
            let big = r.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let spread = match norm {
                Norm::LayerNorm => {
                    let m = r.iter().sum::<f64>() / df;
                    r.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / df
                }
                Norm::RmsNorm => r.iter().map(|v| v * v).sum::<f64>() / df,
            };
            (big, (spread + eps).sqrt())
        })
        .collect()
}

/// Condition number of the normalization of `x`: the largest
/// `max|x| / sqrt(var + eps)` over rows (`sqrt(mean(x^2) + eps)` for
/// RMSNorm), at least 1. An input's rounding error `|x| * u` becomes an
/// error of about `cond * u` in `xhat`; it is about 3 for centred data and
/// `offset / std` for data with a large common offset. RMSNorm's is at most
/// `sqrt(D)`.
pub fn condition(norm: Norm, x: &[f64], d: usize, eps: f64) -> f64 {
    row_scales(norm, x, d, eps)
        .iter()
        .map(|(b, s)| b / s)
        .fold(1.0, f64::max)
}

mod check;
mod flops;
mod summary;
mod traffic;

pub use check::*;
pub use flops::*;
pub use summary::*;
pub use traffic::*;
