//! The shape kernels on a GPU (`kernels/shape.cu`): permute as a strided
//! copy, row blocks for narrow and concat, zero-padding for narrow's
//! backward.

use crate::device::cuda::{blocks_for, cfg, launch, Strides, MAX_RANK};
use crate::device::Family;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tensor::{CudaBuf, Tensor};

/// This family's CUDA C (`kernels/shape.cu`).
pub(crate) static KERNELS: Family = Family {
    name: "shape",
    source: include_str!("../../kernels/shape.cu"),
};

const BLOCK: u32 = 256;

/// `x` (row-major over its own shape) read with `src` strides per output
/// dimension into a contiguous tensor of shape `out`.
pub(crate) fn permute<T: Element>(
    x: &CudaBuf<T>,
    out: &[usize],
    src: &[usize],
) -> Result<Tensor<T>> {
    if out.len() > MAX_RANK {
        return Err(Error::InvalidArgument {
            op: "permute",
            msg: format!(
                "rank {} is above the CUDA kernels' limit of {MAX_RANK}",
                out.len()
            ),
        });
    }
    let mut s = Strides {
        rank: out.len() as i32,
        ..Default::default()
    };
    for d in 0..out.len() {
        s.shape[d] = out[d] as i64;
        s.a[d] = src[d] as i64;
    }
    let n: usize = out.iter().product();
    let g = &x.gpu;
    let mut y = g.uninit::<T>(n)?;
    if n > 0 {
        launch!(g, "permute", g.function::<T>(&KERNELS, "permute")?,
            cfg(blocks_for(n, BLOCK as usize), BLOCK, 0);
            &x.data, &mut y, &(n as i64), &s)?;
    }
    Tensor::from_cuda(out, g.clone(), y)
}

/// Copies `outer` blocks of `width` elements from `x` (block `b` at
/// `b * src_stride + src_off`) into `y` (at `b * dst_stride + dst_off`).
#[allow(clippy::too_many_arguments)]
fn block_copy<T: Element>(
    x: &CudaBuf<T>,
    y: &mut cudarc::driver::CudaSlice<T>,
    outer: usize,
    width: usize,
    src: (usize, usize),
    dst: (usize, usize),
) -> Result<()> {
    let n = outer * width;
    if n == 0 {
        return Ok(());
    }
    let g = &x.gpu;
    launch!(g, "block_copy", g.function::<T>(&KERNELS, "block_copy")?,
        cfg(blocks_for(n, BLOCK as usize), BLOCK, 0);
        &x.data, y, &(outer as i64), &(width as i64),
        &(src.0 as i64), &(src.1 as i64), &(dst.0 as i64), &(dst.1 as i64))
}

/// Rows `start..start + len` of each of `outer` blocks of `d` rows of
/// `inner` elements.
pub(crate) fn take_rows<T: Element>(
    x: &CudaBuf<T>,
    shape: &[usize],
    (outer, inner, d): (usize, usize, usize),
    start: usize,
    len: usize,
) -> Result<Tensor<T>> {
    let mut y = x.gpu.uninit::<T>(outer * len * inner)?;
    block_copy(
        x,
        &mut y,
        outer,
        len * inner,
        (d * inner, start * inner),
        (len * inner, 0),
    )?;
    Tensor::from_cuda(shape, x.gpu.clone(), y)
}

/// `g`'s `len` rows per block placed at `start..` of `d` rows, zeros
/// elsewhere.
pub(crate) fn pad_rows<T: Element>(
    g: &CudaBuf<T>,
    shape: &[usize],
    (outer, inner, d): (usize, usize, usize),
    start: usize,
    len: usize,
) -> Result<Tensor<T>> {
    let n = outer * d * inner;
    let gpu = &g.gpu;
    let mut dx = gpu.uninit::<T>(n)?;
    if n > 0 {
        launch!(gpu, "narrow backward", gpu.function::<T>(&KERNELS, "narrow_backward")?,
            cfg(blocks_for(n, BLOCK as usize), BLOCK, 0);
            &g.data, &mut dx, &(outer as i64), &(d as i64), &(inner as i64),
            &(start as i64), &(len as i64))?;
    }
    Tensor::from_cuda(shape, gpu.clone(), dx)
}

/// The parts (each with its length along the axis) joined along the axis
/// of `shape`, which has `outer` blocks of rows of `inner` elements.
pub(crate) fn concat<T: Element>(
    parts: &[(&CudaBuf<T>, usize)],
    shape: &[usize],
    outer: usize,
    inner: usize,
) -> Result<Tensor<T>> {
    let total: usize = parts.iter().map(|p| p.1).sum();
    let gpu = parts[0].0.gpu.clone();
    let mut y = gpu.uninit::<T>(outer * total * inner)?;
    let mut off = 0;
    for &(x, d) in parts {
        block_copy(
            x,
            &mut y,
            outer,
            d * inner,
            (d * inner, 0),
            (total * inner, off * inner),
        )?;
        off += d;
    }
    Tensor::from_cuda(shape, gpu, y)
}
