//! `RmsNorm` over the last axis, fused by default.

use super::layer_norm::check_norm_args;
use super::{check_last_dim, Module, NormImpl, ParamCursor, Parameters};
use crate::dtype::Element;
use crate::error::Result;
use crate::ops;
use crate::tape::Var;
use crate::tensor::Tensor;

/// RMSNorm over the last axis of size `d`:
/// `y = x / sqrt(mean(x^2) + eps) * gamma`, `gamma` `[d]` (init ones).
///
/// Parameter order: `gamma`.
#[derive(Debug, Clone)]
pub struct RmsNorm<T: Element> {
    d: usize,
    eps: f64,
    gamma: Option<Tensor<T>>,
    imp: NormImpl,
}

impl<T: Element> RmsNorm<T> {
    /// RMSNorm with `gamma` over `d` features, `eps = 1e-6`, fused.
    pub fn new(d: usize) -> Result<Self> {
        Self::with_options(d, 1e-6, true)
    }

    /// RMSNorm over `d` features with the given `eps` (finite, `> 0`, else
    /// `BadEps`), with or without `gamma`.
    pub fn with_options(d: usize, eps: f64, affine: bool) -> Result<Self> {
        check_norm_args("RmsNorm", d, eps)?;
        let gamma = if affine {
            Some(Tensor::full(&[d], T::ONE)?)
        } else {
            None
        };
        Ok(RmsNorm {
            d,
            eps,
            gamma,
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

    /// `gamma`, if affine.
    pub fn gamma(&self) -> Option<&Tensor<T>> {
        self.gamma.as_ref()
    }
}

impl<T: Element> Parameters<T> for RmsNorm<T> {
    /// `weight` (gamma), as PyTorch's.
    fn param_names(&self) -> Vec<super::ParamName> {
        self.gamma
            .iter()
            .map(|_| super::ParamName::new("weight"))
            .collect()
    }

    fn params(&self) -> Vec<&Tensor<T>> {
        self.gamma.iter().collect()
    }

    fn params_mut(&mut self) -> Vec<&mut Tensor<T>> {
        self.gamma.as_mut().into_iter().collect()
    }
}

impl<T: Element> Module<T> for RmsNorm<T> {
    /// Errors (`ShapeMismatch`) unless `x`'s last dim is `d`.
    fn forward_params(&self, p: &mut ParamCursor<'_, T>, x: &Var<T>) -> Result<Var<T>> {
        check_last_dim("RmsNorm", x.shape(), self.d)?;
        let gamma = match self.gamma {
            Some(_) => Some(p.take("RmsNorm: gamma", &[self.d])?),
            None => None,
        };
        match self.imp {
            NormImpl::Fused => ops::rms_norm(x, gamma, self.eps),
            NormImpl::Composed => ops::rms_norm_composed(x, gamma, self.eps),
        }
    }
}
