//! `Linear`: `y = x @ W + b`.

use super::{check_last_dim, Init, Module, ParamCursor, Parameters};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::ops;
use crate::rng::Rng;
use crate::tape::Var;
use crate::tensor::Tensor;

/// An affine map over the last axis: `y = x @ W + b` with `W` of shape
/// `[in, out]` and `b` (optional) of shape `[out]`. `x` may have any rank
/// `>= 1` with last dim `in`; leading dims are batch dims.
///
/// Parameter order: `W`, then `b`.
#[derive(Debug, Clone)]
pub struct Linear<T: Element> {
    inp: usize,
    out: usize,
    weight: Tensor<T>,
    bias: Option<Tensor<T>>,
}

impl<T: Element> Linear<T> {
    /// `in -> out` with a bias, `W` Kaiming uniform (gain `sqrt(2)`), `b`
    /// zeros. Errors for a zero dim.
    pub fn new(inp: usize, out: usize, rng: &mut Rng) -> Result<Self> {
        Self::with_init(inp, out, true, Init::kaiming_relu(), Init::Zeros, rng)
    }

    /// `in -> out` with explicit weight and bias schemes (fans `in`, `out`);
    /// `bias: false` leaves the bias out. Errors for a zero dim or a bad
    /// scheme.
    pub fn with_init(
        inp: usize,
        out: usize,
        bias: bool,
        weight_init: Init,
        bias_init: Init,
        rng: &mut Rng,
    ) -> Result<Self> {
        if inp == 0 || out == 0 {
            return Err(Error::InvalidArgument {
                op: "Linear",
                msg: format!("features must be > 0, got in {inp}, out {out}"),
            });
        }
        let weight = weight_init.tensor(&[inp, out], inp, out, rng)?;
        let bias = if bias {
            Some(bias_init.tensor(&[out], inp, out, rng)?)
        } else {
            None
        };
        Ok(Linear {
            inp,
            out,
            weight,
            bias,
        })
    }

    /// A layer from given tensors: `weight` `[in, out]`, `bias` `[out]`.
    /// Errors (`ShapeMismatch`) for any other shapes.
    pub fn from_tensors(weight: Tensor<T>, bias: Option<Tensor<T>>) -> Result<Self> {
        let &[inp, out] = weight.shape() else {
            return Err(Error::InvalidArgument {
                op: "Linear::from_tensors",
                msg: format!("weight must be [in, out], got {:?}", weight.shape()),
            });
        };
        if inp == 0 || out == 0 {
            return Err(Error::InvalidArgument {
                op: "Linear::from_tensors",
                msg: format!("features must be > 0, got weight {:?}", weight.shape()),
            });
        }
        if let Some(b) = &bias {
            if b.shape() != [out] {
                return Err(Error::ShapeMismatch {
                    op: "Linear::from_tensors",
                    lhs: b.shape().to_vec(),
                    rhs: vec![out],
                });
            }
        }
        Ok(Linear {
            inp,
            out,
            weight,
            bias,
        })
    }

    /// Input features.
    pub fn in_features(&self) -> usize {
        self.inp
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        self.out
    }

    /// The weight `[in, out]`.
    pub fn weight(&self) -> &Tensor<T> {
        &self.weight
    }

    /// The bias `[out]`, if any.
    pub fn bias(&self) -> Option<&Tensor<T>> {
        self.bias.as_ref()
    }
}

impl<T: Element> Parameters<T> for Linear<T> {
    /// `weight` (stored `[out, in]`, as PyTorch's) and `bias`.
    fn param_names(&self) -> Vec<super::ParamName> {
        let mut n = vec![super::ParamName::transposed("weight")];
        if self.bias.is_some() {
            n.push(super::ParamName::new("bias"));
        }
        n
    }

    fn params(&self) -> Vec<&Tensor<T>> {
        std::iter::once(&self.weight).chain(&self.bias).collect()
    }

    fn params_mut(&mut self) -> Vec<&mut Tensor<T>> {
        std::iter::once(&mut self.weight)
            .chain(self.bias.as_mut())
            .collect()
    }
}

impl<T: Element> Module<T> for Linear<T> {
    /// Errors (`ShapeMismatch`) unless `x`'s last dim is `in`.
    fn forward_params(&self, p: &mut ParamCursor<'_, T>, x: &Var<T>) -> Result<Var<T>> {
        let (inp, out) = (self.in_features(), self.out_features());
        check_last_dim("Linear", x.shape(), inp)?;
        let w = p.take("Linear: weight", &[inp, out])?;
        let b = match self.bias {
            Some(_) => Some(p.take("Linear: bias", &[out])?),
            None => None,
        };
        // One op, `x @ w + b` (the bias added as the product finishes).
        let affine = |x: &Var<T>| match b {
            Some(b) => ops::linear(x, w, b),
            None => ops::matmul(x, w),
        };
        if x.shape().len() == 1 {
            ops::reshape(&affine(&ops::reshape(x, &[1, inp])?)?, &[out])
        } else {
            affine(x)
        }
    }
}
