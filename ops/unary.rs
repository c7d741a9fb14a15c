//! Elementwise unary arithmetic: neg, scalar add/mul, integer powers, sqrt,
//! rsqrt, exp, log. Each op keeps the one tensor its derivative needs, or
//! nothing: `exp`, `sqrt` and `rsqrt` keep their output (the derivative is a
//! function of it), `powi` and `log` keep their input.

use super::util::{map, zip};
use crate::dtype::{Accum, Element};
use crate::error::Result;
use crate::op::Op;
use crate::tape::{Tape, Var};
use crate::tensor::Tensor;
use num_traits::{Float, Zero};

/// `y = -x`; `dx = -g`.
struct Neg;

impl<T: Element> Op<T> for Neg {
    /// Nothing.
    type State = ();
    fn name(&self) -> &'static str {
        "neg"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, ())> {
        Ok((map(x[0], |v| -v)?, ()))
    }
    fn backward(&self, _: &(), g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(map(g, |v| -v)?)])
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
        let c = T::Acc::of(self.0);
        Ok((map(x[0], |v| v + c)?, ()))
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
        let c = T::Acc::of(self.0);
        Ok((map(x[0], |v| v * c)?, ()))
    }
    fn backward(&self, _: &(), g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        let c = T::Acc::of(self.0);
        Ok(vec![Some(map(g, |v| v * c)?)])
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
        let n = self.0;
        Ok((map(x[0], |v| v.powi(n))?, x[0].clone()))
    }
    fn backward(&self, x: &Tensor<T>, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        let n = self.0;
        let nf = T::Acc::of(n as f64);
        let d = match n {
            0 => map(g, |_| T::Acc::zero())?,
            // x^(n-1) overflows the exponent type only for n = i32::MIN.
            _ => match n.checked_sub(1) {
                Some(m) => zip(g, x, |g, x| g * nf * x.powi(m))?,
                None => zip(g, x, |g, x| g * nf * x.powi(n) / x)?,
            },
        };
        Ok(vec![Some(d)])
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
        let y = map(x[0], |v| v.sqrt())?;
        Ok((y.clone(), y))
    }
    fn backward(&self, y: &Tensor<T>, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        let two = T::Acc::of(2.0);
        Ok(vec![Some(zip(g, y, |g, y| g / (two * y))?)])
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
        let one = T::Acc::of(1.0);
        let y = map(x[0], |v| one / v.sqrt())?;
        Ok((y.clone(), y))
    }
    fn backward(&self, y: &Tensor<T>, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        let half = T::Acc::of(0.5);
        Ok(vec![Some(zip(g, y, |g, y| -half * g * y * y * y)?)])
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
        let y = map(x[0], |v| v.exp())?;
        Ok((y.clone(), y))
    }
    fn backward(&self, y: &Tensor<T>, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(zip(g, y, |g, y| g * y)?)])
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
        Ok((map(x[0], |v| v.ln())?, x[0].clone()))
    }
    fn backward(&self, x: &Tensor<T>, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        Ok(vec![Some(zip(g, x, |g, x| g / x)?)])
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
