//! Broadcasting binary arithmetic: add, sub, mul, div. Each backward returns
//! gradients in the broadcast output shape; the tape sums them back.

use super::{binary as bz, mul_grads, unary, Binary as K, Unary};
use crate::dtype::Element;
use crate::error::Result;
use crate::op::Op;
use crate::tape::{Tape, Var};
use crate::tensor::Tensor;

#[derive(Clone, Copy)]
enum Kind {
    Add,
    Sub,
    Mul,
    Div,
}

struct Arith(Kind);

impl<T: Element> Op<T> for Arith {
    /// add/sub save nothing; mul/div save both inputs.
    type State = Option<(Tensor<T>, Tensor<T>)>;

    fn name(&self) -> &'static str {
        match self.0 {
            Kind::Add => "add",
            Kind::Sub => "sub",
            Kind::Mul => "mul",
            Kind::Div => "div",
        }
    }

    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Self::State)> {
        let name = <Self as Op<T>>::name(self);
        let (a, b) = (x[0], x[1]);
        let (y, keep) = match self.0 {
            Kind::Add => (bz(name, K::Add, a, b)?, false),
            Kind::Sub => (bz(name, K::Sub, a, b)?, false),
            Kind::Mul => (bz(name, K::Mul, a, b)?, true),
            Kind::Div => (bz(name, K::Div, a, b)?, true),
        };
        Ok((y, keep.then(|| (a.clone(), b.clone()))))
    }

    /// d(a+b) = (g, g); d(a-b) = (g, -g); d(ab) = (g b, g a);
    /// d(a/b) = (g / b, -(g / b) (a / b)). The last is `-g a / b^2` with
    /// both factors bounded by quantities the forward already formed (the
    /// first gradient and the output), so it never forms `b^2`, which
    /// overflows or underflows for |b| past the square root of the range.
    fn backward(
        &self,
        s: &Self::State,
        g: &Tensor<T>,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor<T>>>> {
        let name = <Self as Op<T>>::name(self);
        let neg = || unary(Unary::Neg, g);
        let need = |i: usize| needs.get(i).copied().unwrap_or(true);
        Ok(match (self.0, s) {
            (Kind::Add, _) => vec![Some(g.clone()), Some(g.clone())],
            (Kind::Sub, _) => vec![Some(g.clone()), need(1).then(neg).transpose()?],
            // Both wanted, no broadcasting: one pass for both products.
            (Kind::Mul, Some((a, b)))
                if need(0) && need(1) && a.shape() == g.shape() && b.shape() == g.shape() =>
            {
                let (da, db) = mul_grads(g, a, b)?;
                vec![Some(da), Some(db)]
            }
            (Kind::Mul, Some((a, b))) => vec![
                need(0).then(|| bz(name, K::Mul, g, b)).transpose()?,
                need(1).then(|| bz(name, K::Mul, g, a)).transpose()?,
            ],
            (Kind::Div, Some((a, b))) => {
                // g / b in the output shape (g's), shared by both gradients.
                let gb = bz(name, K::Div, g, b)?;
                let db = if need(1) {
                    let y = bz(name, K::Div, a, b)?;
                    Some(bz(name, K::NegMul, &gb, &y)?)
                } else {
                    None
                };
                vec![need(0).then_some(gb), db]
            }
            _ => unreachable_state(name)?,
        })
    }
}

fn unreachable_state<X>(op: &'static str) -> Result<X> {
    Err(crate::Error::InvalidArgument {
        op,
        msg: "saved state missing".into(),
    })
}

/// `a + b` with broadcasting.
pub fn add<T: Element>(a: &Var<T>, b: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Arith(Kind::Add), &[a, b])
}

/// `a - b` with broadcasting.
pub fn sub<T: Element>(a: &Var<T>, b: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Arith(Kind::Sub), &[a, b])
}

/// `a * b` elementwise with broadcasting.
pub fn mul<T: Element>(a: &Var<T>, b: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Arith(Kind::Mul), &[a, b])
}

/// `a / b` elementwise with broadcasting.
pub fn div<T: Element>(a: &Var<T>, b: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Arith(Kind::Div), &[a, b])
}
