//! `LayerNorm` and `RmsNorm` over the last axis, fused by default, with the
//! composed twin one switch away: two public types over one layer, as the
//! ops are one family (`ops/norm`), RMSNorm being LayerNorm without the
//! centring and without `beta`.

use super::{check_last_dim, Module, ParamCursor, ParamName, Parameters};
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

/// The layer both norms are: its size, eps, parameters and implementation.
#[derive(Debug, Clone)]
struct NormLayer<T: Element> {
    /// The layer's name in errors: `LayerNorm` or `RmsNorm`.
    name: &'static str,
    /// Whether the rows are centred (LayerNorm), which is also whether
    /// there is a `beta`.
    centre: bool,
    d: usize,
    eps: f64,
    gamma: Option<Tensor<T>>,
    beta: Option<Tensor<T>>,
    imp: NormImpl,
}

impl<T: Element> NormLayer<T> {
    /// Checks `eps` (finite, `> 0`) and `d > 0`; `gamma` ones and (when
    /// centred) `beta` zeros if `affine`.
    fn new(name: &'static str, centre: bool, d: usize, eps: f64, affine: bool) -> Result<Self> {
        if !(eps.is_finite() && eps > 0.0) {
            return Err(Error::BadEps { op: name, eps });
        }
        if d == 0 {
            return Err(Error::EmptyNormalized {
                op: name,
                input: vec![],
                normalized: vec![0],
            });
        }
        let gamma = affine.then(|| Tensor::full(&[d], T::ONE)).transpose()?;
        let beta = (affine && centre)
            .then(|| Tensor::zeros(&[d]))
            .transpose()?;
        Ok(NormLayer {
            name,
            centre,
            d,
            eps,
            gamma,
            beta,
            imp: NormImpl::Fused,
        })
    }

    /// `weight` (gamma) and `bias` (beta), as PyTorch's.
    fn param_names(&self) -> Vec<ParamName> {
        let g = self.gamma.as_ref().map(|_| ParamName::new("weight"));
        let b = self.beta.as_ref().map(|_| ParamName::new("bias"));
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

    /// Errors (`ShapeMismatch`) unless `x`'s last dim is `d`.
    fn forward(&self, p: &mut ParamCursor<'_, T>, x: &Var<T>) -> Result<Var<T>> {
        check_last_dim(self.name, x.shape(), self.d)?;
        let d = [self.d];
        let (gw, bw) = match self.centre {
            true => ("LayerNorm: gamma", "LayerNorm: beta"),
            false => ("RmsNorm: gamma", "RmsNorm: beta"),
        };
        let gamma = self.gamma.as_ref().map(|_| p.take(gw, &d)).transpose()?;
        let beta = self.beta.as_ref().map(|_| p.take(bw, &d)).transpose()?;
        let eps = self.eps;
        match (self.centre, self.imp) {
            (true, NormImpl::Fused) => ops::layer_norm(x, gamma, beta, eps),
            (true, NormImpl::Composed) => ops::layer_norm_composed(x, gamma, beta, eps),
            (false, NormImpl::Fused) => ops::rms_norm(x, gamma, eps),
            (false, NormImpl::Composed) => ops::rms_norm_composed(x, gamma, eps),
        }
    }
}

/// Writes a norm layer's public type over [`NormLayer`]: what both norms
/// offer, and the `Parameters` and `Module` impls.
macro_rules! norm_layer {
    ($(#[$doc:meta])* $ty:ident, $name:literal, centre: $centre:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $ty<T: Element>(NormLayer<T>);

        impl<T: Element> $ty<T> {
            /// The layer over `d` features with the given `eps` (finite,
            /// `> 0`, else `BadEps`), with or without its parameters.
            pub fn with_options(d: usize, eps: f64, affine: bool) -> Result<Self> {
                NormLayer::new($name, $centre, d, eps, affine).map(Self)
            }

            /// The same layer running `imp`.
            pub fn with_impl(mut self, imp: NormImpl) -> Self {
                self.0.imp = imp;
                self
            }

            /// Switches the implementation.
            pub fn set_impl(&mut self, imp: NormImpl) {
                self.0.imp = imp;
            }

            /// The implementation in use.
            pub fn imp(&self) -> NormImpl {
                self.0.imp
            }

            /// Normalized size.
            pub fn dim(&self) -> usize {
                self.0.d
            }

            /// eps.
            pub fn eps(&self) -> f64 {
                self.0.eps
            }

            /// `gamma`, if affine.
            pub fn gamma(&self) -> Option<&Tensor<T>> {
                self.0.gamma.as_ref()
            }
        }

        impl<T: Element> Parameters<T> for $ty<T> {
            fn param_names(&self) -> Vec<ParamName> {
                self.0.param_names()
            }

            fn params(&self) -> Vec<&Tensor<T>> {
                self.0.params()
            }

            fn params_mut(&mut self) -> Vec<&mut Tensor<T>> {
                self.0.params_mut()
            }
        }

        impl<T: Element> Module<T> for $ty<T> {
            /// Errors (`ShapeMismatch`) unless `x`'s last dim is `d`.
            fn forward_params(&self, p: &mut ParamCursor<'_, T>, x: &Var<T>) -> Result<Var<T>> {
                self.0.forward(p, x)
            }
        }
    };
}

norm_layer!(
    /// LayerNorm over the last axis of size `d`:
    /// `y = (x - mean) / sqrt(var + eps) * gamma + beta`, with the biased
    /// variance of each row, `gamma` `[d]` (init ones) and `beta` `[d]`
    /// (init zeros). Without the affine part it has no parameters.
    ///
    /// Parameter order: `gamma` (`weight`), then `beta` (`bias`).
    LayerNorm, "LayerNorm", centre: true
);

norm_layer!(
    /// RMSNorm over the last axis of size `d`:
    /// `y = x / sqrt(mean(x^2) + eps) * gamma`, `gamma` `[d]` (init ones).
    ///
    /// Parameter order: `gamma` (`weight`).
    RmsNorm, "RmsNorm", centre: false
);

impl<T: Element> LayerNorm<T> {
    /// Affine LayerNorm over `d` features, `eps = 1e-5`, fused.
    pub fn new(d: usize) -> Result<Self> {
        Self::with_options(d, 1e-5, true)
    }

    /// `beta`, if affine.
    pub fn beta(&self) -> Option<&Tensor<T>> {
        self.0.beta.as_ref()
    }
}

impl<T: Element> RmsNorm<T> {
    /// RMSNorm with `gamma` over `d` features, `eps = 1e-6`, fused.
    pub fn new(d: usize) -> Result<Self> {
        Self::with_options(d, 1e-6, true)
    }
}
