//! Fused attention on a GPU (`kernels/attention.cu`): one forward kernel
//! writing the output and `lse`; a backward of two kernels, `dq` (which
//! also writes each row's `D = <dO, o>`) then `dk`/`dv` (which reads it),
//! so no gradient is summed with atomics and two runs give the same bits.
//! Blocks tile the query rows (forward, dq) or the keys (dk/dv) of one
//! (batch, head); the launch geometry depends on the shape alone.

use super::Geometry;
use crate::device::cuda::addr;
use crate::device::cuda::{cfg, launch, Gpu};
use crate::device::Family;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tensor::{CudaBuf, Tensor};

/// This family's CUDA C (`kernels/attention.cu`).
pub(crate) static KERNELS: Family = Family {
    name: "attention",
    source: include_str!("../../kernels/attention.cu"),
};

/// Threads per block and the tiles of `kernels/attention.cu`.
const BLOCK: u32 = 128;
/// The dq kernel runs 8 warps of 4 rows (fewer registers per thread).
const DQ_BLOCK: u32 = 256;
const ROWS: usize = 32;
const KEYS: usize = 16;
/// The kernels keep a row in registers, two columns per lane.
pub(crate) const MAX_HEAD_DIM: usize = 64;

/// Blocks for `tiles` tiles of each of `bh` heads, capped (the kernels
/// loop over the rest).
fn grid(bh: usize, tiles: usize) -> u32 {
    bh.saturating_mul(tiles).clamp(1, 65_535) as u32
}

/// `Error::Cuda` for a head_dim the kernels cannot hold.
fn check_dim(op: &'static str, gpu: &Gpu, g: &Geometry) -> Result<()> {
    if g.d > MAX_HEAD_DIM {
        return Err(Error::Cuda {
            op,
            device: gpu.name(),
            msg: format!(
                "head_dim {} is above the CUDA kernel's {MAX_HEAD_DIM}; run on the CPU",
                g.d
            ),
        });
    }
    Ok(())
}

/// The output (in `g`'s output layout) and `lse` (`[batch, heads, t]`).
pub(crate) fn forward<T: Element>(
    op: &'static str,
    g: &Geometry,
    [q, k, v]: [&CudaBuf<T>; 3],
    scale: f64,
    causal: bool,
) -> Result<(Tensor<T>, Tensor<T::Acc>)> {
    let gpu = &q.gpu;
    check_dim(op, gpu, g)?;
    let bh = g.batch * g.heads;
    let mut o = gpu.uninit::<T>(bh * g.t * g.d)?;
    let mut lse = gpu.uninit::<T::Acc>(bh * g.t)?;
    if bh * g.t > 0 {
        launch!(gpu, op, gpu.function::<T>(&KERNELS, "attention_fwd")?,
            cfg(grid(bh, g.t.div_ceil(ROWS)), BLOCK, 0);
            &q.data, &k.data, &v.data, &mut o, &mut lse, &(bh as i64), &(g.heads as i64),
            &(g.t as i64), &(g.d as i64), &(g.packed as i32), &(causal as i32), &scale)?;
    }
    Ok((
        Tensor::from_cuda(&g.out_shape(), gpu.clone(), o)?,
        Tensor::from_cuda(&g.lse_shape(), gpu.clone(), lse)?,
    ))
}

/// `dq`, `dk`, `dv` in the inputs' layout: three tensors, or one packed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Element>(
    op: &'static str,
    g: &Geometry,
    [q, k, v]: [&CudaBuf<T>; 3],
    o: &CudaBuf<T>,
    dout: &CudaBuf<T>,
    lse: &CudaBuf<T::Acc>,
    scale: f64,
    causal: bool,
) -> Result<Vec<Tensor<T>>> {
    let gpu = &q.gpu;
    check_dim(op, gpu, g)?;
    let bh = g.batch * g.heads;
    let n = bh * g.t * g.d;
    let mut dd = gpu.uninit::<T::Acc>(bh * g.t)?;
    let mut bufs = Vec::new();
    for _ in 0..if g.packed { 1 } else { 3 } {
        bufs.push(gpu.uninit::<T>(if g.packed { 3 * n } else { n })?);
    }
    if n > 0 {
        let (a, c) = (bh as i64, (g.heads as i64, g.t as i64, g.d as i64));
        let flags = (g.packed as i32, causal as i32);
        // The dk/dv kernel's outputs by address: in the packed layout both
        // are the one gradient buffer, whose k and v parts it writes (never
        // the q part the dq kernel wrote, never an element twice).
        let (dk, dv) = match &bufs[..] {
            [one] => (addr(Some(one)), addr(Some(one))),
            [_, dk, dv] => (addr(Some(dk)), addr(Some(dv))),
            _ => {
                return Err(Error::InvalidArgument {
                    op,
                    msg: format!("{} gradient buffers, expected 1 or 3", bufs.len()),
                })
            }
        };
        launch!(gpu, op, gpu.function::<T>(&KERNELS, "attention_bwd_dq")?,
            cfg(grid(bh, g.t.div_ceil(ROWS)), DQ_BLOCK, 0);
            &q.data, &k.data, &v.data, &o.data, &dout.data, &lse.data, &mut dd, &mut bufs[0],
            &a, &c.0, &c.1, &c.2, &flags.0, &flags.1, &scale)?;
        launch!(gpu, op, gpu.function::<T>(&KERNELS, "attention_bwd_dkv")?,
            cfg(grid(bh, g.t.div_ceil(KEYS)), BLOCK, 0);
            &q.data, &k.data, &v.data, &dout.data, &lse.data, &dd, &dk, &dv,
            &a, &c.0, &c.1, &c.2, &flags.0, &flags.1, &scale)?;
    }
    let shape = if g.packed {
        vec![g.batch, g.t, 3 * g.heads * g.d]
    } else {
        vec![g.batch, g.heads, g.t, g.d]
    };
    bufs.into_iter()
        .map(|b| Tensor::from_cuda(&shape, gpu.clone(), b))
        .collect()
}
