//! `Mask`: a boolean array with a shape, host metadata for
//! [`crate::ops::masked_fill`], and the causal mask of attention.

use crate::error::{Error, Result};
use crate::layout::checked_numel;

/// A row-major boolean array. `true` marks the elements an op such as
/// [`crate::ops::masked_fill`] replaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mask {
    shape: Vec<usize>,
    values: Vec<bool>,
}

impl Mask {
    /// A mask of `shape` from its values in row-major order;
    /// `ElementCount` if their number is not the shape's element count.
    pub fn new(shape: &[usize], values: Vec<bool>) -> Result<Self> {
        let n = checked_numel("Mask::new", shape, 1)?;
        if n != values.len() {
            return Err(Error::ElementCount {
                op: "Mask::new",
                shape: shape.to_vec(),
                len: values.len(),
            });
        }
        Ok(Mask {
            shape: shape.to_vec(),
            values,
        })
    }

    /// A mask of `shape` with `f(row-major index list)` at each element.
    pub fn from_fn(shape: &[usize], mut f: impl FnMut(&[usize]) -> bool) -> Result<Self> {
        let n = checked_numel("Mask::from_fn", shape, 1)?;
        let mut idx = vec![0usize; shape.len()];
        let mut values = Vec::with_capacity(n);
        for _ in 0..n {
            values.push(f(&idx));
            for d in (0..shape.len()).rev() {
                idx[d] += 1;
                if idx[d] < shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Mask::new(shape, values)
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The values, row-major.
    pub fn values(&self) -> &[bool] {
        &self.values
    }
}

/// The `[t, t]` causal mask of self-attention: row `i` (the query position)
/// is `true` at columns `j > i` (the future keys), strictly above the
/// diagonal, as PyTorch's `triu(ones(t, t), diagonal=1).bool()`. With
/// `masked_fill(scores, &mask, -inf)` before a softmax over the last axis,
/// each position attends to itself and the past; it broadcasts over any
/// leading `[batch, heads]` dims. `ShapeTooLarge` if `t * t` overflows.
pub fn causal_mask(t: usize) -> Result<Mask> {
    Mask::from_fn(&[t, t], |ij| ij[1] > ij[0])
}
