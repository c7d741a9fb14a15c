//! Activations: tanh, sigmoid, relu, gelu (exact, erf form) and gelu_tanh
//! (tanh approximation), named as PyTorch's `gelu` and
//! `gelu(approximate='tanh')`.
//!
//! tanh and sigmoid keep their output (their derivatives are functions of
//! it); relu keeps one bit per element (where the input was positive); gelu
//! keeps its input, or (exact form, f32 on the CPU) its slope, computed in
//! the forward pass beside the output from the same Gaussian tail.

use super::{binary, gelu_and_slope, relu_backward, relu_forward, unary, Binary, ReluMask, Unary};
use crate::dtype::Element;
use crate::error::Result;
use crate::op::{Op, Saved, SavedItem};
use crate::tape::{Tape, Var};
use crate::tensor::Tensor;

/// `y = tanh x`; `dy/dx = 1 - y^2`, so `dx = g (1 - y^2)`.
struct Tanh;

impl<T: Element> Op<T> for Tanh {
    /// The output `y`.
    type State = Tensor<T>;
    fn name(&self) -> &'static str {
        "tanh"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Tensor<T>)> {
        let y = unary(Unary::Tanh, x[0])?;
        Ok((y.clone(), y))
    }
    fn backward(&self, y: &Tensor<T>, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(binary("tanh", Binary::TanhGrad, g, y)?)])
    }
}

/// `y = sigma(x) = 1 / (1 + e^-x)`, evaluated as `e^x / (1 + e^x)` for
/// negative `x` so that `e^-x` never overflows; `dy/dx = y (1 - y)`, so
/// `dx = g y (1 - y)`.
struct Sigmoid;

impl<T: Element> Op<T> for Sigmoid {
    /// The output `y`.
    type State = Tensor<T>;
    fn name(&self) -> &'static str {
        "sigmoid"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Tensor<T>)> {
        let y = unary(Unary::Sigmoid, x[0])?;
        Ok((y.clone(), y))
    }
    fn backward(&self, y: &Tensor<T>, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(binary("sigmoid", Binary::SigmoidGrad, g, y)?)])
    }
}

/// `y = max(x, 0)` (NaN stays NaN); `dx = g` where `x > 0` or `x` is NaN,
/// else 0 (the derivative at 0 is taken as 0, as PyTorch does).
struct Relu;

impl<T: Element> Op<T> for Relu {
    /// A bit mask of where the gradient passes: `n / 8` bytes, on x's device.
    type State = ReluMask;
    fn name(&self) -> &'static str {
        "relu"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, ReluMask)> {
        relu_forward(x[0])
    }
    fn backward(
        &self,
        mask: &ReluMask,
        g: &Tensor<T>,
        _: &[bool],
    ) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(relu_backward(mask, g)?)])
    }
}

/// `y = x/2 (1 + tanh u)`, `u = k (x + a x^3)`, `k = sqrt(2/pi)`,
/// `a = 0.044715`.
///
/// Since `(1 + tanh u)/2 = sigma(2u)`, this is evaluated as `y = x s` with
/// `s = sigma(2u)`, which for negative `x` avoids the cancellation in
/// `1 + tanh u` (there the tanh form loses all relative accuracy).
///
/// `dy/dx = s + x s' = s + 2 x s (1 - s) k (1 + 3 a x^2)`, with `1 - s =
/// sigma(-2u)` computed directly, so `dx = g dy/dx`. Where `s (1 - s)` is
/// exactly 0 (saturation) the second term is taken as 0, so huge `|x|`
/// (where `x^2` overflows) gives a finite gradient, not NaN.
///
/// Exact form (`tanh: false`): `y = x Phi(x)`, `Phi(x) = (1 + erf(x /
/// sqrt 2))/2 = erfc(-x / sqrt 2)/2` (the erfc form keeps the left tail's
/// relative accuracy), and `dy/dx = Phi(x) + x phi(x)` with `phi(x) =
/// e^(-x^2/2) / sqrt(2 pi)`; the second term is 0 where `phi` underflows.
struct Gelu {
    tanh: bool,
}

/// What GELU's backward multiplies the gradient by, or what it is
/// recomputed from: the same bytes either way.
enum GeluState<T: Element> {
    /// The input `x` (`s`, or `Phi` and `phi`, are recomputed in backward).
    Input(Tensor<T>),
    /// `dy/dx` itself, from the forward pass: backward is one product.
    Slope(Tensor<T>),
}

impl<T: Element> Saved for GeluState<T> {
    fn visit(&self, f: &mut dyn FnMut(SavedItem)) {
        match self {
            GeluState::Input(t) | GeluState::Slope(t) => t.visit(f),
        }
    }
}

impl<T: Element> Op<T> for Gelu {
    type State = GeluState<T>;
    fn name(&self) -> &'static str {
        if self.tanh {
            "gelu_tanh"
        } else {
            "gelu"
        }
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, GeluState<T>)> {
        if self.tanh {
            return Ok((
                unary(Unary::GeluTanh, x[0])?,
                GeluState::Input(x[0].clone()),
            ));
        }
        if let Some(both) = gelu_and_slope(x[0]) {
            let (y, slope) = both?;
            return Ok((y, GeluState::Slope(slope)));
        }
        Ok((unary(Unary::GeluErf, x[0])?, GeluState::Input(x[0].clone())))
    }
    fn backward(
        &self,
        state: &GeluState<T>,
        g: &Tensor<T>,
        _: &[bool],
    ) -> Result<Vec<Option<Tensor<T>>>> {
        let name = <Self as Op<T>>::name(self);
        let dx = match state {
            GeluState::Slope(slope) => binary(name, Binary::Mul, g, slope)?,
            GeluState::Input(x) if self.tanh => binary(name, Binary::GeluTanhGrad, g, x)?,
            GeluState::Input(x) => binary(name, Binary::GeluErfGrad, g, x)?,
        };
        Ok(vec![Some(dx)])
    }
}

/// `tanh(x)`.
pub fn tanh<T: Element>(x: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Tanh, &[x])
}

/// The logistic function `1 / (1 + e^-x)`, computed without overflow.
pub fn sigmoid<T: Element>(x: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Sigmoid, &[x])
}

/// `max(x, 0)`; NaN propagates. The graph keeps one bit per element.
pub fn relu<T: Element>(x: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Relu, &[x])
}

/// GELU, exact: `x/2 (1 + erf(x / sqrt 2))` (PyTorch's default
/// `gelu`), accurate to a few ulps in f64 including the negative tail;
/// f32 and the 16-bit types compute it in f32, within 2 ulp of the f64
/// value (`ops/elementwise/vmath.rs`). For f32 on the CPU the graph keeps
/// the slope, computed beside the output, instead of the input.
pub fn gelu<T: Element>(x: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Gelu { tanh: false }, &[x])
}

/// GELU, tanh approximation: `x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`
/// (PyTorch's `gelu(approximate='tanh')`).
pub fn gelu_tanh<T: Element>(x: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Gelu { tanh: true }, &[x])
}
