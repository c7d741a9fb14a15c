//! Elementwise unary arithmetic: neg, scalar add/mul, integer powers, sqrt,
//! rsqrt, exp, log. Each op keeps the one tensor its derivative needs, or
//! nothing: `exp`, `sqrt` and `rsqrt` keep their output (the derivative is a
//! function of it), `powi` and `log` keep their input.

use super::{binary, unary, Binary, Unary};
use crate::dtype::Element;
use crate::error::Result;
use crate::op::Op;
use crate::tape::{Tape, Var};
use crate::tensor::Tensor;

/// `y = -x`; `dx = -g`.
struct Neg;

impl<T: Element> Op<T> for Neg {
    /// Nothing.
    type State = ();
    fn name(&self) -> &'static str {
        "neg"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, ())> {
        Ok((unary(Unary::Neg, x[0])?, ()))
    }
    fn backward(&self, _: &(), g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(unary(Unary::Neg, g)?)])
    }
}

/// `y = x + c`; `dx = g`.
struct ScalarAdd(f64);

impl<T: Element> Op<T> for ScalarAdd {
    /// Nothing.
    type State = ();
    fn name(&self) -> &'static str {
        "scalar_add"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, ())> {
        Ok((unary(Unary::AddScalar(self.0), x[0])?, ()))
    }
    fn backward(&self, _: &(), g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(g.clone())])
    }
}

/// `y = c x`; `dx = c g`.
struct ScalarMul(f64);

impl<T: Element> Op<T> for ScalarMul {
    /// Nothing.
    type State = ();
    fn name(&self) -> &'static str {
        "scalar_mul"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, ())> {
        Ok((unary(Unary::MulScalar(self.0), x[0])?, ()))
    }
    fn backward(&self, _: &(), g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(unary(Unary::MulScalar(self.0), g)?)])
    }
}

/// `y = x^n`; `dx = g n x^(n-1)` (zero for `n = 0`).
struct Powi(i32);

impl<T: Element> Op<T> for Powi {
    /// The input `x`.
    type State = Tensor<T>;
    fn name(&self) -> &'static str {
        "powi"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Tensor<T>)> {
        Ok((unary(Unary::Powi(self.0), x[0])?, x[0].clone()))
    }
    fn backward(&self, x: &Tensor<T>, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        // For n = i32::MIN, where n - 1 overflows, the kind forms x^n / x.
        Ok(vec![Some(binary("powi", Binary::PowiGrad(self.0), g, x)?)])
    }
}

/// `y = sqrt(x)`; `dx = g / (2 y)`.
struct Sqrt;

impl<T: Element> Op<T> for Sqrt {
    /// The output `y`.
    type State = Tensor<T>;
    fn name(&self) -> &'static str {
        "sqrt"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Tensor<T>)> {
        let y = unary(Unary::Sqrt, x[0])?;
        Ok((y.clone(), y))
    }
    fn backward(&self, y: &Tensor<T>, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(binary("sqrt", Binary::SqrtGrad, g, y)?)])
    }
}

/// `y = 1 / sqrt(x)`; `dy/dx = -x^(-3/2) / 2 = -y^3 / 2`, so
/// `dx = -g y^3 / 2`.
struct Rsqrt;

impl<T: Element> Op<T> for Rsqrt {
    /// The output `y`.
    type State = Tensor<T>;
    fn name(&self) -> &'static str {
        "rsqrt"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Tensor<T>)> {
        let y = unary(Unary::Rsqrt, x[0])?;
        Ok((y.clone(), y))
    }
    fn backward(&self, y: &Tensor<T>, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(binary("rsqrt", Binary::RsqrtGrad, g, y)?)])
    }
}

/// `y = e^x`; `dx = g y`.
struct Exp;

impl<T: Element> Op<T> for Exp {
    /// The output `y`.
    type State = Tensor<T>;
    fn name(&self) -> &'static str {
        "exp"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Tensor<T>)> {
        let y = unary(Unary::Exp, x[0])?;
        Ok((y.clone(), y))
    }
    fn backward(&self, y: &Tensor<T>, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(binary("exp", Binary::Mul, g, y)?)])
    }
}

/// `y = ln x`; `dx = g / x`.
struct Log;

impl<T: Element> Op<T> for Log {
    /// The input `x`.
    type State = Tensor<T>;
    fn name(&self) -> &'static str {
        "log"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Tensor<T>)> {
        Ok((unary(Unary::Log, x[0])?, x[0].clone()))
    }
    fn backward(&self, x: &Tensor<T>, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(binary("log", Binary::Div, g, x)?)])
    }
}

/// `-x`.
pub fn neg<T: Element>(x: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Neg, &[x])
}

/// `x + c` for a constant `c` (rounded to the element's accumulation type).
pub fn scalar_add<T: Element>(x: &Var<T>, c: f64) -> Result<Var<T>> {
    Tape::apply(ScalarAdd(c), &[x])
}

/// `c * x` for a constant `c` (rounded to the element's accumulation type).
pub fn scalar_mul<T: Element>(x: &Var<T>, c: f64) -> Result<Var<T>> {
    Tape::apply(ScalarMul(c), &[x])
}

/// `x^n` elementwise for an integer `n` (negative allowed; `0^-k` is inf).
pub fn powi<T: Element>(x: &Var<T>, n: i32) -> Result<Var<T>> {
    Tape::apply(Powi(n), &[x])
}

/// `sqrt(x)`; NaN for negative `x`, and an infinite gradient at 0.
pub fn sqrt<T: Element>(x: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Sqrt, &[x])
}

/// `1 / sqrt(x)`; NaN for negative `x`, inf at 0.
pub fn rsqrt<T: Element>(x: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Rsqrt, &[x])
}

/// `e^x`.
pub fn exp<T: Element>(x: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Exp, &[x])
}

/// Natural log; NaN for negative `x`, -inf at 0.
pub fn log<T: Element>(x: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Log, &[x])
}
