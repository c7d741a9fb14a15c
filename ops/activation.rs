//! Activations: tanh, sigmoid, relu, gelu (tanh approximation).
//!
//! tanh and sigmoid keep their output (their derivatives are functions of
//! it); relu keeps one bit per element (where the input was positive); gelu
//! keeps its input.

use super::util::{map, zip};
use crate::dtype::{Accum, Element};
use crate::error::Result;
use crate::op::Op;
use crate::tape::{Tape, Var};
use crate::tensor::Tensor;
use num_traits::{Float, Zero};

/// `y = tanh x`; `dy/dx = 1 - y^2`, so `dx = g (1 - y^2)`.
struct Tanh;

impl<T: Element> Op<T> for Tanh {
    /// The output `y`.
    type State = Tensor<T>;
    fn name(&self) -> &'static str {
        "tanh"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Tensor<T>)> {
        let y = map(x[0], |v| v.tanh())?;
        Ok((y.clone(), y))
    }
    fn backward(&self, y: &Tensor<T>, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        let one = T::Acc::of(1.0);
        Ok(vec![Some(zip(g, y, |g, y| g * (one - y * y))?)])
    }
}

/// `sigma(x) = 1 / (1 + e^-x)`, evaluated as `e^x / (1 + e^x)` for negative
/// `x` so that `e^-x` never overflows.
fn sigmoid_acc<A: Accum>(x: A) -> A {
    let one = A::one();
    if x >= A::zero() {
        one / (one + (-x).exp())
    } else {
        let e = x.exp();
        e / (one + e)
    }
}

/// `y = sigma(x)`; `dy/dx = y (1 - y)`, so `dx = g y (1 - y)`.
struct Sigmoid;

impl<T: Element> Op<T> for Sigmoid {
    /// The output `y`.
    type State = Tensor<T>;
    fn name(&self) -> &'static str {
        "sigmoid"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Tensor<T>)> {
        let y = map(x[0], sigmoid_acc)?;
        Ok((y.clone(), y))
    }
    fn backward(&self, y: &Tensor<T>, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        let one = T::Acc::of(1.0);
        Ok(vec![Some(zip(g, y, |g, y| g * y * (one - y))?)])
    }
}

/// `y = max(x, 0)` (NaN stays NaN); `dx = g` where `x > 0` or `x` is NaN,
/// else 0 (the derivative at 0 is taken as 0, as PyTorch does).
struct Relu;

/// One bit per element, bit `i % 8` of byte `i / 8`: set where the gradient
/// passes.
type Mask = Vec<u8>;

impl<T: Element> Op<T> for Relu {
    /// A bit mask of where the gradient passes: `n / 8` bytes.
    type State = Mask;
    fn name(&self) -> &'static str {
        "relu"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Mask)> {
        let xs = x[0].as_slice()?;
        let zero = T::zero();
        let mut v = Vec::with_capacity(xs.len());
        let mut mask = Vec::with_capacity(xs.len().div_ceil(8));
        for chunk in xs.chunks(8) {
            let mut bits = 0u8;
            for (j, &a) in chunk.iter().enumerate() {
                let a_acc = a.to_acc();
                let pass = a_acc > T::Acc::zero() || a_acc.is_nan();
                bits |= u8::from(pass) << j;
                v.push(if pass { a } else { zero });
            }
            mask.push(bits);
        }
        Ok((Tensor::from_vec(x[0].shape().to_vec(), v)?, mask))
    }
    fn backward(&self, mask: &Mask, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        let gs = g.as_slice()?;
        let zero = T::zero();
        let v = gs
            .iter()
            .enumerate()
            .map(|(i, &gv)| if get_bit(mask, i) { gv } else { zero })
            .collect();
        Ok(vec![Some(Tensor::from_vec(g.shape().to_vec(), v)?)])
    }
}

fn get_bit(mask: &[u8], i: usize) -> bool {
    mask.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0)
}

/// sqrt(2 / pi).
const GELU_K: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the tanh approximation.
const GELU_A: f64 = 0.044_715;

/// `(sigma(v), sigma(-v))` from one exponential, each without cancellation.
fn sigmoid_pair<A: Accum>(v: A) -> (A, A) {
    let one = A::one();
    let e = (-v.abs()).exp();
    let (big, small) = (one / (one + e), e / (one + e));
    if v >= A::zero() {
        (big, small)
    } else {
        (small, big)
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
struct Gelu;

impl<T: Element> Op<T> for Gelu {
    /// The input `x` (`s` is recomputed in backward).
    type State = Tensor<T>;
    fn name(&self) -> &'static str {
        "gelu"
    }
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Tensor<T>)> {
        let (k, a, two) = consts::<T::Acc>();
        let y = map(x[0], |x| x * sigmoid_acc(two * k * (x + a * x * x * x)))?;
        Ok((y, x[0].clone()))
    }
    fn backward(&self, x: &Tensor<T>, g: &Tensor<T>, _: &[bool]) -> Result<Vec<Option<Tensor<T>>>> {
        let (k, a, two) = consts::<T::Acc>();
        let (one, three) = (T::Acc::of(1.0), T::Acc::of(3.0));
        let d = zip(g, x, |g, x| {
            let (s, s_neg) = sigmoid_pair(two * k * (x + a * x * x * x));
            let ss = s * s_neg;
            let tail = if ss == T::Acc::zero() {
                T::Acc::zero()
            } else {
                two * x * ss * k * (one + three * a * x * x)
            };
            g * (s + tail)
        })?;
        Ok(vec![Some(d)])
    }
}

/// `(k, a, 2)` in the accumulation type.
fn consts<A: Accum>() -> (A, A, A) {
    (A::of(GELU_K), A::of(GELU_A), A::of(2.0))
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

/// GELU, tanh approximation: `x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu<T: Element>(x: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Gelu, &[x])
}
