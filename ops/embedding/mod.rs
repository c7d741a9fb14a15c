//! Embedding: a row gather from a `[vocab, dim]` weight.
//!
//! ```text
//! y[i.., :] = W[ids[i..], :]              (output shape ids_shape + [dim])
//! dW[v, :]  = sum_{p: ids[p] = v} g[p, :] (in increasing p)
//! ```
//!
//! The ids are host metadata given by the caller, like cross-entropy's
//! targets; the graph keeps one copy of them for backward and nothing of
//! the weight. The data is reached only through the kernels below.

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub(crate) use cuda::KERNELS;

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::layout::{alloc, checked_numel};
use crate::op::{Op, Saved, SavedItem};
use crate::tape::{Tape, Var};
use crate::tensor::{Storage, Tensor};
use std::sync::Arc;

/// The gather; `ids` is shared with the saved state, so it is held once.
struct Embedding {
    ids: Arc<[usize]>,
    ids_shape: Vec<usize>,
}

/// What backward needs: the ids and the vocabulary size.
struct EmbeddingState {
    ids: Arc<[usize]>,
    vocab: usize,
}

impl Saved for EmbeddingState {
    fn visit(&self, f: &mut dyn FnMut(SavedItem)) {
        f(SavedItem::Raw(
            self.ids.len() * std::mem::size_of::<usize>(),
        ))
    }
}

/// `(vocab, dim)` of a valid weight, ids and ids shape.
fn check(w: &[usize], ids: &[usize], ids_shape: &[usize]) -> Result<(usize, usize)> {
    let &[vocab, dim] = w else {
        return Err(Error::InvalidArgument {
            op: "embedding",
            msg: format!("weight must have shape [vocab, dim], got {w:?}"),
        });
    };
    let n = checked_numel("embedding", ids_shape, std::mem::size_of::<usize>())?;
    if n != ids.len() {
        return Err(Error::ElementCount {
            op: "embedding",
            shape: ids_shape.to_vec(),
            len: ids.len(),
        });
    }
    if let Some((position, &index)) = ids.iter().enumerate().find(|(_, &id)| id >= vocab) {
        return Err(Error::IndexOutOfRange {
            op: "embedding",
            index,
            position,
            bound: vocab,
        });
    }
    Ok((vocab, dim))
}

impl<T: Element> Op<T> for Embedding {
    type State = EmbeddingState;

    fn name(&self) -> &'static str {
        "embedding"
    }

    /// `y[i, :] = W[ids[i], :]`, shaped `ids_shape + [dim]`.
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, EmbeddingState)> {
        let w = x[0];
        let (vocab, dim) = check(w.shape(), &self.ids, &self.ids_shape)?;
        let mut shape = self.ids_shape.clone();
        shape.push(dim);
        let y = match w.storage() {
            Storage::Cpu(ws) => {
                let out = alloc::<T>("embedding", &shape)?;
                Tensor::from_vec(shape, cpu::gather(ws, dim, &self.ids, out))?
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(ws) => cuda::gather(ws, dim, &self.ids, shape)?,
        };
        let state = EmbeddingState {
            ids: self.ids.clone(),
            vocab,
        };
        Ok((y, state))
    }

    /// `dW[v, :] = sum_{p: ids[p] = v} g[p, :]`, summed per row in
    /// increasing `p`: deterministic, whatever the thread count.
    fn backward(
        &self,
        st: &EmbeddingState,
        g: &Tensor<T>,
        _: &[bool],
    ) -> Result<Vec<Option<Tensor<T>>>> {
        let dim = g.shape().last().copied().unwrap_or(0);
        if g.numel() != st.ids.len() * dim {
            return Err(Error::ElementCount {
                op: "embedding",
                shape: g.shape().to_vec(),
                len: st.ids.len() * dim,
            });
        }
        let dw = match g.storage() {
            Storage::Cpu(gs) => Tensor::from_vec(
                vec![st.vocab, dim],
                cpu::scatter_add(gs, dim, &st.ids, st.vocab),
            )?,
            #[cfg(feature = "cuda")]
            Storage::Cuda(gs) => cuda::scatter_add(gs, dim, &st.ids, st.vocab)?,
        };
        Ok(vec![Some(dw)])
    }
}

/// Rows of the `[vocab, dim]` `weight` picked by `ids` (row-major, of shape
/// `ids_shape`): the output has shape `ids_shape + [dim]`. The gradient
/// adds each position's output gradient into its id's row (repeated ids
/// sum, in position order, so it is the same bits on every run).
///
/// Errors (nothing is recorded): `InvalidArgument` unless `weight` is 2-D;
/// `ElementCount` if `ids.len()` is not the element count of `ids_shape`;
/// `IndexOutOfRange` naming the first id `>= vocab`, its position and
/// `vocab`.
pub fn embedding<T: Element>(
    weight: &Var<T>,
    ids: &[usize],
    ids_shape: &[usize],
) -> Result<Var<T>> {
    check(weight.shape(), ids, ids_shape)?;
    let op = Embedding {
        ids: ids.into(),
        ids_shape: ids_shape.to_vec(),
    };
    Tape::apply(op, &[weight])
}
