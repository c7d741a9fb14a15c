//! Embedding on a GPU (`kernels/embedding.cu`): a row gather, and its
//! backward as a gather over positions sorted by id on the host, so the
//! sums run in the CPU's order with no atomics.

use super::cpu::positions_by_id;
use crate::device::cuda::{blocks_for, cfg, launch};
use crate::device::Family;
use crate::dtype::Element;
use crate::error::Result;
use crate::tensor::{CudaBuf, Tensor};

/// This family's CUDA C (`kernels/embedding.cu`).
pub(crate) static KERNELS: Family = Family {
    name: "embedding",
    source: include_str!("../../kernels/embedding.cu"),
};

const BLOCK: u32 = 256;

fn as_i64(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}

/// Rows of `w` (`[vocab, dim]`) picked by `ids`, shaped `shape`.
pub(crate) fn gather<T: Element>(
    w: &CudaBuf<T>,
    dim: usize,
    ids: &[usize],
    shape: Vec<usize>,
) -> Result<Tensor<T>> {
    let g = &w.gpu;
    let n = ids.len() * dim;
    let mut y = g.uninit::<T>(n)?;
    if n > 0 {
        let d_ids = g.upload_owned(as_i64(ids))?;
        launch!(g, "embedding", g.function::<T>(&KERNELS, "embedding")?,
            cfg(blocks_for(n, BLOCK as usize), BLOCK, 0);
            &w.data, &d_ids, &mut y, &(ids.len() as i64), &(dim as i64))?;
    }
    Tensor::from_cuda(&shape, g.clone(), y)
}

/// `dW[v] = sum of g's rows at the positions of id v`, ascending.
pub(crate) fn scatter_add<T: Element>(
    gr: &CudaBuf<T>,
    dim: usize,
    ids: &[usize],
    vocab: usize,
) -> Result<Tensor<T>> {
    let g = &gr.gpu;
    let n = vocab * dim;
    let mut dw = g.zeros::<T>(n)?;
    if n > 0 && !ids.is_empty() {
        let (start, pos) = positions_by_id(ids, vocab);
        let (d_start, d_pos) = (
            g.upload_owned(as_i64(&start))?,
            g.upload_owned(as_i64(&pos))?,
        );
        launch!(g, "embedding backward", g.function::<T>(&KERNELS, "embedding_backward")?,
            cfg(blocks_for(n, BLOCK as usize), BLOCK, 0);
            &gr.data, &d_start, &d_pos, &mut dw, &(vocab as i64), &(dim as i64))?;
    }
    Tensor::from_cuda(&[vocab, dim], g.clone(), dw)
}
