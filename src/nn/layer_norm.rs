//! `LayerNorm` over the last axis, fused by default, with the composed twin
//! one switch away.

use super::{check_last_dim, Module, ParamCursor, Parameters};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::ops;
use crate::tape::Var;
use crate::tensor::Tensor;

/// Which implementation a normalization layer (and the transformer's
/// attention, `MultiHeadAttention`) runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NormImpl {
    /// The fused op (one tape node; for a norm, 2N saved statistics).
    #[default]
    Fused,
    /// The twin built from primitive ops: same math, many nodes, far more
    /// saved memory. For checking the fused op.
    Composed,
}

/// Checks `eps` (finite, `> 0`) and `d > 0` when a layer is built.
pub(super) fn check_norm_args(op: &'static str, d: usize, eps: f64) -> Result<()> {
    if !(eps.is_finite() && eps > 0.0) {
        return Err(Error::BadEps { op, eps });
    }
    if d == 0 {
        return Err(Error::EmptyNormalized {
            op,
            input: vec![],
            normalized: vec![0],
        });
    }
    Ok(())
}

/// LayerNorm over the last axis of size `d`:
/// `y = (x - mean) / sqrt(var + eps) * gamma + beta`, with the biased
/// variance of each row, `gamma` `[d]` (init ones) and `beta` `[d]` (init
/// zeros). Without the affine part it has no parameters.
///
/// Parameter order: `gamma`, then `beta`.
#[derive(Debug, Clone)]
pub struct LayerNorm<T: Element> {
    d: usize,
    eps: f64,
    gamma: Option<Tensor<T>>,
    beta: Option<Tensor<T>>,
    imp: NormImpl,
}

impl<T: Element> LayerNorm<T> {
    /// Affine LayerNorm over `d` features, `eps = 1e-5`, fused.
    pub fn new(d: usize) -> Result<Self> {
        Self::with_options(d, 1e-5, true)
    }

    /// LayerNorm over `d` features with the given `eps` (finite, `> 0`,
    /// else `BadEps`) and with or without `gamma`/`beta`.
    pub fn with_options(d: usize, eps: f64, affine: bool) -> Result<Self> {
        check_norm_args("LayerNorm", d, eps)?;
        let (gamma, beta) = if affine {
            (
                Some(Tensor::full(&[d], T::ONE)?),
                Some(Tensor::zeros(&[d])?),
            )
        } else {
            (None, None)
        };
        Ok(LayerNorm {
            d,
            eps,
            gamma,
            beta,
            imp: NormImpl::Fused,
        })
    }

    /// The same layer running `imp`.
    pub fn with_impl(mut self, imp: NormImpl) -> Self {
        self.imp = imp;
        self
    }

    /// Switches the implementation.
    pub fn set_impl(&mut self, imp: NormImpl) {
        self.imp = imp;
    }

    /// The implementation in use.
    pub fn imp(&self) -> NormImpl {
        self.imp
    }

    /// Normalized size.
    pub fn dim(&self) -> usize {
        self.d
    }

    /// eps.
    pub fn eps(&self) -> f64 {
        self.eps
    }

    /// `gamma`, if affine.
    pub fn gamma(&self) -> Option<&Tensor<T>> {
        self.gamma.as_ref()
    }

    /// `beta`, if affine.
    pub fn beta(&self) -> Option<&Tensor<T>> {
        self.beta.as_ref()
    }
}

impl<T: Element> Parameters<T> for LayerNorm<T> {
    /// `weight` (gamma) and `bias` (beta), as PyTorch's.
    fn param_names(&self) -> Vec<super::ParamName> {
        let g = self.gamma.as_ref().map(|_| super::ParamName::new("weight"));
        let b = self.beta.as_ref().map(|_| super::ParamName::new("bias"));
        g.into_iter().chain(b).collect()
    }

    fn params(&self) -> Vec<&Tensor<T>> {
        self.gamma.iter().chain(&self.beta).collect()
    }

    fn params_mut(&mut self) -> Vec<&mut Tensor<T>> {
        self.gamma
            .as_mut()
            .into_iter()
            .chain(self.beta.as_mut())
            .collect()
    }
}

impl<T: Element> Module<T> for LayerNorm<T> {
    /// Errors (`ShapeMismatch`) unless `x`'s last dim is `d`.
    fn forward_params(&self, p: &mut ParamCursor<'_, T>, x: &Var<T>) -> Result<Var<T>> {
        check_last_dim("LayerNorm", x.shape(), self.d)?;
        let d = [self.d];
        let gamma = match self.gamma {
            Some(_) => Some(p.take("LayerNorm: gamma", &d)?),
            None => None,
        };
        let beta = match self.beta {
            Some(_) => Some(p.take("LayerNorm: beta", &d)?),
            None => None,
        };
        match self.imp {
            NormImpl::Fused => ops::layer_norm(x, gamma, beta, self.eps),
            NormImpl::Composed => ops::layer_norm_composed(x, gamma, beta, self.eps),
        }
    }
}
