//! Softmax and log-softmax on a GPU (`kernels/softmax.cu`), the tensor seen
//! as `[outer, d, inner]` around the axis: contiguous rows (`inner == 1`)
//! take a warp per row, or a block per row when long; strided lanes take a
//! thread per lane. The variant and block size come from the shape alone,
//! so the sums' order (and the bits) do not depend on the device.

use crate::device::cuda::{cfg, launch};
use crate::device::Family;
use crate::dtype::Element;
use crate::error::Result;
use crate::tensor::{CudaBuf, Tensor};
use cudarc::driver::LaunchConfig;

/// This family's CUDA C (`kernels/softmax.cu`).
pub(crate) static KERNELS: Family = Family {
    name: "softmax",
    source: include_str!("../../kernels/softmax.cu"),
};

/// Blocks for `units` work items, capped at the kernels' grid limit (their
/// loops stride over the rest).
fn grid(units: usize) -> u32 {
    units.clamp(1, 65_535) as u32
}

/// How a `[outer, d, inner]` tensor is launched.
enum Plan {
    /// Rows of `d` (`inner == 1`): kernel suffix `warp` or `block`.
    Rows(&'static str, LaunchConfig),
    /// A thread per lane.
    Cols(LaunchConfig),
}

fn plan(outer: usize, d: usize, inner: usize) -> Plan {
    if inner > 1 {
        return Plan::Cols(cfg(grid((outer * inner).div_ceil(256)), 256, 0));
    }
    if d <= 1024 {
        // 8 warps of a 256-thread block, a row each.
        Plan::Rows("warp", cfg(grid(outer.div_ceil(8)), 256, 0))
    } else {
        let block = if d >= 8192 { 1024 } else { 256 };
        Plan::Rows("block", cfg(grid(outer), block, 0))
    }
}

/// Softmax (or log-softmax when `log`) of `x` (of `shape`) over lanes of
/// `d` elements `inner` apart.
pub(crate) fn forward<T: Element>(
    x: &CudaBuf<T>,
    shape: &[usize],
    d: usize,
    inner: usize,
    log: bool,
) -> Result<Tensor<T>> {
    let g = &x.gpu;
    let n = x.len;
    let mut y = g.uninit::<T>(n)?;
    // Empty tensors: no launch (and d * inner may then have saturated).
    if n > 0 {
        let outer = n / (d * inner);
        let lg = log as i32;
        match plan(outer, d, inner) {
            Plan::Rows(v, c) => {
                launch!(g, "softmax", g.function::<T>(&KERNELS, &format!("softmax_fwd_{v}"))?, c;
                    &x.data, &mut y, &(outer as i64), &(d as i64), &lg)?;
            }
            Plan::Cols(c) => {
                launch!(g, "softmax", g.function::<T>(&KERNELS, "softmax_fwd_cols")?, c;
                    &x.data, &mut y, &(outer as i64), &(d as i64), &(inner as i64), &lg)?;
            }
        }
    }
    Tensor::from_cuda(shape, g.clone(), y)
}

/// The input gradient from the forward's output `y` and its gradient `gr`
/// (both of `shape`, on one GPU).
pub(crate) fn backward<T: Element>(
    y: &CudaBuf<T>,
    gr: &CudaBuf<T>,
    shape: &[usize],
    d: usize,
    inner: usize,
    log: bool,
) -> Result<Tensor<T>> {
    let g = &y.gpu;
    let n = y.len;
    let mut dx = g.uninit::<T>(n)?;
    if n > 0 {
        let outer = n / (d * inner);
        let lg = log as i32;
        match plan(outer, d, inner) {
            Plan::Rows(v, c) => {
                launch!(g, "softmax backward",
                    g.function::<T>(&KERNELS, &format!("softmax_bwd_{v}"))?, c;
                    &y.data, &gr.data, &mut dx, &(outer as i64), &(d as i64), &lg)?;
            }
            Plan::Cols(c) => {
                launch!(g, "softmax backward", g.function::<T>(&KERNELS, "softmax_bwd_cols")?, c;
                    &y.data, &gr.data, &mut dx, &(outer as i64), &(d as i64), &(inner as i64),
                    &lg)?;
            }
        }
    }
    Tensor::from_cuda(shape, g.clone(), dx)
}
