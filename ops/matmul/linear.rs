//! `linear(x, w, b) = x @ w + b`: a Linear layer with a bias as one op.
//!
//! ```text
//! Y = X W + b        Y[r, j] = sum_p X[r, p] W[p, j] + b[j]
//! dX = G W^T         dW = X^T G          db[j] = sum_r G[r, j]
//! ```
//!
//! with `X` the input's rows (`[..., k]` read as `[rows, k]`), `W` of
//! `[k, n]`, `b` of `[n]` and `G = dL/dY`. The forward pass adds the bias
//! to each band of the product as the band finishes (f32 and f64 on the
//! CPU), so the output is never read back from memory for it; the bits are
//! those of `matmul` then `add` ([`linear_composed`], the readable twin):
//! each entry is the product's, rounded, plus the bias, rounded once. The
//! backward pass is the matmul's, with `G` itself for the bias (the tape
//! sums it over the rows, as for `add`).

use super::{bmm_bias, row_grads};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::tape::{Tape, Var};
use crate::tensor::Tensor;

const OP: &str = "linear";

/// `[rows, k]` and `[k, n]` from `x: [..., k]` (rank >= 2), `w: [k, n]`
/// and `b: [n]`, or the error naming the shapes.
fn dims<T: Element>(x: &Tensor<T>, w: &Tensor<T>, b: &Tensor<T>) -> Result<[usize; 3]> {
    let (sx, sw) = (x.shape(), w.shape());
    let (Some(&k), &[k2, n]) = (sx.last(), sw) else {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!("expects x [..., k] and w [k, n], got x {sx:?} and w {sw:?}"),
        });
    };
    if sx.len() < 2 {
        return Err(Error::InvalidArgument {
            op: OP,
            msg: format!("x needs rank >= 2, got {sx:?} (reshape a vector to [1, k])"),
        });
    }
    if k != k2 {
        return Err(Error::MatmulMismatch {
            op: OP,
            lhs: sx.to_vec(),
            rhs: sw.to_vec(),
            k_lhs: k,
            k_rhs: k2,
        });
    }
    if b.shape() != [n] {
        return Err(Error::ShapeMismatch {
            op: OP,
            lhs: b.shape().to_vec(),
            rhs: vec![n],
        });
    }
    Ok([sx[..sx.len() - 1].iter().product(), k, n])
}

struct Linear;

impl<T: Element> Op<T> for Linear {
    /// The input and the weight: each one's gradient needs the other.
    type State = (Tensor<T>, Tensor<T>);

    fn name(&self) -> &'static str {
        OP
    }

    /// `Y[r, j] = sum_p X[r, p] W[p, j] + b[j]` over the rows of `x`.
    fn forward(&self, inputs: &[&Tensor<T>]) -> Result<(Tensor<T>, Self::State)> {
        let [x, w, b] = inputs else {
            return Err(Error::InvalidArgument {
                op: OP,
                msg: format!("expects 3 inputs, got {}", inputs.len()),
            });
        };
        let [rows, k, n] = dims(x, w, b)?;
        let mut shape = x.shape().to_vec();
        if let Some(last) = shape.last_mut() {
            *last = n;
        }
        let y = bmm_bias(&x.reshape(&[rows, k])?, w, false, false, Some(b))?;
        Ok((y.reshape(&shape)?, ((*x).clone(), (*w).clone())))
    }

    /// `dX = G W^T`, `dW = X^T G` (one product over all rows), and `G` for
    /// the bias, which the tape sums to `[n]`.
    fn backward(
        &self,
        (x, w): &Self::State,
        g: &Tensor<T>,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor<T>>>> {
        let need = |i: usize| needs.get(i).copied().unwrap_or(false);
        let k = w.shape()[0];
        let rows: usize = x.shape()[..x.shape().len() - 1].iter().product();
        if g.numel() == 0 || k == 0 {
            // No rows, or an empty sum: zeros of each operand's shape.
            let zeros = |i: usize, t: &Tensor<T>| {
                need(i).then(|| Tensor::zeros(t.shape()).and_then(|z| z.to_device(t.device())))
            };
            let db = need(2).then(|| g.clone());
            return Ok(vec![zeros(0, x).transpose()?, zeros(1, w).transpose()?, db]);
        }
        let [dx, dw] = row_grads(x, w, g, rows, [need(0), need(1)])?;
        Ok(vec![dx, dw, need(2).then(|| g.clone())])
    }
}

/// `x @ w + b` for `x: [..., k]` (rank >= 2), `w: [k, n]`, `b: [n]`, in one
/// op; returns `[..., n]`. The same values as [`linear_composed`], bit for
/// bit, with one pass less over the output.
///
/// Errors: `InvalidArgument` for `x` of rank < 2 or `w` not 2-D,
/// `MatmulMismatch` if `x`'s last dim is not `w`'s first,
/// `ShapeMismatch` if `b` is not `[n]`.
pub fn linear<T: Element>(x: &Var<T>, w: &Var<T>, b: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Linear, &[x, w, b])
}

/// [`linear`] as `matmul` then `add`: the twin it is checked against.
pub fn linear_composed<T: Element>(x: &Var<T>, w: &Var<T>, b: &Var<T>) -> Result<Var<T>> {
    crate::ops::add(&super::matmul(x, w)?, b)
}
