//! The scalar losses on a GPU (`kernels/loss.cu`): per-item partial sums in
//! the accumulator, then one block folds them and divides by the count
//! (`loss_final`). Chunk and block sizes are fixed, so the bits do not
//! depend on the device; no atomics.

use crate::device::cuda::{cfg, launch, Gpu, NULL};
use crate::device::Family;
use crate::dtype::Element;
use crate::error::Result;
use crate::tensor::{CudaBuf, Tensor};
use cudarc::driver::CudaSlice;
use std::sync::Arc;

/// This family's CUDA C (`kernels/loss.cu`).
pub(crate) static KERNELS: Family = Family {
    name: "loss",
    source: include_str!("../../kernels/loss.cu"),
};

const BLOCK: u32 = 256;
/// Elements per partial sum of mse (`mse_part`).
const MSE_CHUNK: usize = 16_384;

/// Blocks for `units` work items, capped at the kernels' grid limit (their
/// loops stride over the rest).
fn grid(units: usize) -> u32 {
    units.clamp(1, 65_535) as u32
}

/// Cross-entropy's per-row statistics, left on the logits' GPU for
/// backward: the max `m_r` and `ln s_r` of each of the `n` rows.
pub(crate) struct RowStats<A> {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) max: CudaSlice<A>,
    pub(crate) log_sum: CudaSlice<A>,
    pub(crate) n: usize,
}

fn as_i64(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&t| t as i64).collect()
}

/// `y[0] = (sum of part[..nparts]) / n`, the rank-0 loss; no `part`
/// (passed as null, not read) sums nothing and gives `0 / n`: NaN for
/// `n = 0`, the CPU's empty mean.
fn finish<T: Element>(
    g: &Arc<Gpu>,
    part: Option<(&CudaSlice<T::Acc>, usize)>,
    n: usize,
) -> Result<Tensor<T>> {
    let mut y = g.uninit::<T>(1)?;
    let f = g.function::<T>(&KERNELS, "loss_final")?;
    // One block of 1024: the fold's order is fixed by it.
    match part {
        Some((p, nparts)) => launch!(g, "loss", f, cfg(1, 1024, 0);
            p, &mut y, &(nparts as i64), &(n as i64))?,
        None => launch!(g, "loss", f, cfg(1, 1024, 0);
            &NULL, &mut y, &0i64, &(n as i64))?,
    }
    Tensor::from_cuda(&[], g.clone(), y)
}

/// `(1/N) sum_i (p_i - t_i)^2` over same-length `p` and `t`, rank 0.
pub(crate) fn mse<T: Element>(p: &CudaBuf<T>, t: &CudaBuf<T>) -> Result<Tensor<T>> {
    let g = &p.gpu;
    let n = p.len;
    if n == 0 {
        return finish::<T>(g, None, 0);
    }
    let nchunk = n.div_ceil(MSE_CHUNK);
    let mut part = g.uninit::<T::Acc>(nchunk)?;
    launch!(g, "mse", g.function::<T>(&KERNELS, "mse_part")?, cfg(grid(nchunk), BLOCK, 0);
        &p.data, &t.data, &mut part, &(n as i64), &(MSE_CHUNK as i64))?;
    finish::<T>(g, Some((&part, nchunk)), n)
}

/// `sign (2g/N) (p_i - t_i)` for the scalar gradient `gr` (one element on
/// the same GPU), shaped `shape`.
pub(crate) fn mse_grad<T: Element>(
    gr: &CudaBuf<T>,
    p: &CudaBuf<T>,
    t: &CudaBuf<T>,
    shape: &[usize],
    sign: f64,
) -> Result<Tensor<T>> {
    let g = &p.gpu;
    let n = p.len;
    let mut dx = g.uninit::<T>(n)?;
    if n > 0 {
        launch!(g, "mse backward", g.function::<T>(&KERNELS, "mse_grad")?,
            cfg(grid(n.div_ceil(BLOCK as usize)), BLOCK, 0);
            &gr.data, &p.data, &t.data, &mut dx, &(n as i64), &sign)?;
    }
    Tensor::from_cuda(shape, g.clone(), dx)
}

/// The mean cross-entropy of `[n, c]` logits `x` against `targets` (one
/// in-range class per row, checked by the caller), rank 0, and the row
/// statistics on the device.
pub(crate) fn cross_entropy<T: Element>(
    x: &CudaBuf<T>,
    c: usize,
    targets: &[usize],
) -> Result<(Tensor<T>, RowStats<T::Acc>)> {
    let g = &x.gpu;
    let n = targets.len();
    let mut max = g.uninit::<T::Acc>(n)?;
    let mut log_sum = g.uninit::<T::Acc>(n)?;
    let loss = if n == 0 {
        // No rows (c may be 0 too): nothing to launch but the NaN mean.
        finish::<T>(g, None, 0)?
    } else {
        let tg = g.upload_owned(as_i64(targets))?;
        let mut row_loss = g.uninit::<T::Acc>(n)?;
        // A warp per row up to 1024 classes, else a block per row.
        let (f, c_fg) = if c <= 1024 {
            ("ce_fwd_warp", cfg(grid(n.div_ceil(8)), BLOCK, 0))
        } else {
            let block = if c >= 8192 { 1024 } else { 256 };
            ("ce_fwd_block", cfg(grid(n), block, 0))
        };
        launch!(g, "cross_entropy", g.function::<T>(&KERNELS, f)?, c_fg;
            &x.data, &tg, &mut max, &mut log_sum, &mut row_loss, &(n as i64), &(c as i64))?;
        finish::<T>(g, Some((&row_loss, n)), n)?
    };
    let stats = RowStats {
        gpu: g.clone(),
        max,
        log_sum,
        n,
    };
    Ok((loss, stats))
}

/// `(g/n) (softmax(x_r)_j - [j = t_r])` for the scalar gradient `gr`, from
/// the forward's statistics (all on one GPU).
pub(crate) fn cross_entropy_grad<T: Element>(
    gr: &CudaBuf<T>,
    x: &CudaBuf<T>,
    shape: &[usize],
    c: usize,
    targets: &[usize],
    st: &RowStats<T::Acc>,
) -> Result<Tensor<T>> {
    let g = &x.gpu;
    let n = targets.len();
    let total = n * c;
    let mut dx = g.uninit::<T>(total)?;
    if total > 0 {
        let tg = g.upload_owned(as_i64(targets))?;
        launch!(g, "cross_entropy backward", g.function::<T>(&KERNELS, "ce_bwd")?,
            cfg(grid(total.div_ceil(BLOCK as usize)), BLOCK, 0);
            &gr.data, &x.data, &tg, &st.max, &st.log_sum, &mut dx, &(n as i64), &(c as i64))?;
    }
    Tensor::from_cuda(shape, g.clone(), dx)
}
