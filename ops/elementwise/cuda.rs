//! Elementwise kernels on a GPU (`kernels/elementwise.cu`): the kind enums
//! become the kernels' integer codes, one kernel per shape class.

use super::{Binary, Unary};
use crate::device::cuda::{blocks_for, cfg, launch, strides};
use crate::device::Family;
use crate::dtype::Element;
use crate::error::Result;
use crate::tensor::{CudaBuf, Tensor};
use cudarc::driver::CudaSlice;

/// This family's CUDA C (`kernels/elementwise.cu`).
pub(crate) static KERNELS: Family = Family {
    name: "elementwise",
    source: include_str!("../../kernels/elementwise.cu"),
};

const BLOCK: u32 = 256;

/// `(kind, c, ni)` of the unary kernels (codes in declaration order).
fn unary_code(k: Unary) -> (i32, f64, i32) {
    match k {
        Unary::Copy => (0, 0.0, 0),
        Unary::Fill(c) => (1, c, 0),
        Unary::Neg => (2, 0.0, 0),
        Unary::AddScalar(c) => (3, c, 0),
        Unary::MulScalar(c) => (4, c, 0),
        Unary::DivScalar(c) => (5, c, 0),
        Unary::Powi(n) => (6, 0.0, n),
        Unary::Sqrt => (7, 0.0, 0),
        Unary::Rsqrt => (8, 0.0, 0),
        Unary::Exp => (9, 0.0, 0),
        Unary::Log => (10, 0.0, 0),
        Unary::Tanh => (11, 0.0, 0),
        Unary::Sigmoid => (12, 0.0, 0),
        Unary::GeluTanh => (13, 0.0, 0),
        Unary::GeluErf => (14, 0.0, 0),
    }
}

/// `(kind, ni)` of the binary kernels (codes in declaration order).
fn binary_code(k: Binary) -> (i32, i32) {
    match k {
        Binary::Add => (0, 0),
        Binary::Sub => (1, 0),
        Binary::Mul => (2, 0),
        Binary::Div => (3, 0),
        Binary::NegMul => (4, 0),
        Binary::PowiGrad(n) => (5, n),
        Binary::SqrtGrad => (6, 0),
        Binary::RsqrtGrad => (7, 0),
        Binary::TanhGrad => (8, 0),
        Binary::SigmoidGrad => (9, 0),
        Binary::GeluTanhGrad => (10, 0),
        Binary::GeluErfGrad => (11, 0),
    }
}

fn grid(n: usize) -> u32 {
    blocks_for(n, BLOCK as usize).min(65_535)
}

/// `k` of every element of `x` (contiguous, shape `shape`), or of `x`
/// broadcast to `shape` when `from` (x's own shape) differs.
pub(crate) fn unary<T: Element>(
    k: Unary,
    x: &CudaBuf<T>,
    from: &[usize],
    shape: &[usize],
) -> Result<Tensor<T>> {
    let g = &x.gpu;
    let n: usize = shape.iter().product();
    let mut y = g.uninit::<T>(n)?;
    let (kind, c, ni) = unary_code(k);
    if n > 0 && from == shape {
        launch!(g, "unary", g.function::<T>(&KERNELS, "unary")?, cfg(grid(n), BLOCK, 0);
            &x.data, &mut y, &(n as i64), &kind, &c, &ni)?;
    } else if n > 0 {
        let s = strides("unary", shape, from, &[])?;
        launch!(g, "unary", g.function::<T>(&KERNELS, "unary_strided")?,
            cfg(grid(n), BLOCK, 0);
            &x.data, &mut y, &s, &(n as i64), &kind, &c, &ni)?;
    }
    Tensor::from_cuda(shape, g.clone(), y)
}

/// `k(a, b)` with NumPy broadcasting to `out`.
pub(crate) fn binary<T: Element>(
    k: Binary,
    (a, sa): (&CudaBuf<T>, &[usize]),
    (b, sb): (&CudaBuf<T>, &[usize]),
    out: &[usize],
) -> Result<Tensor<T>> {
    let g = &a.gpu;
    let n: usize = out.iter().product();
    let mut y = g.uninit::<T>(n)?;
    let (kind, ni) = binary_code(k);
    if n > 0 && sa == out && sb == out {
        launch!(g, "binary", g.function::<T>(&KERNELS, "binary_flat")?,
            cfg(grid(n), BLOCK, 0);
            &a.data, &b.data, &mut y, &(n as i64), &kind, &ni)?;
    } else if n > 0 {
        let s = strides("binary", out, sa, sb)?;
        launch!(g, "binary", g.function::<T>(&KERNELS, "binary")?, cfg(grid(n), BLOCK, 0);
            &a.data, &b.data, &mut y, &s, &(n as i64), &kind, &ni)?;
    }
    Tensor::from_cuda(out, g.clone(), y)
}

/// `(g b, g a)`, all of one shape.
pub(crate) fn mul_grads<T: Element>(
    gr: &CudaBuf<T>,
    a: &CudaBuf<T>,
    b: &CudaBuf<T>,
    shape: &[usize],
) -> Result<(Tensor<T>, Tensor<T>)> {
    let g = &gr.gpu;
    let n = gr.len;
    let (mut da, mut db) = (g.uninit::<T>(n)?, g.uninit::<T>(n)?);
    if n > 0 {
        launch!(g, "mul backward", g.function::<T>(&KERNELS, "mul_grads")?,
            cfg(grid(n), BLOCK, 0);
            &gr.data, &a.data, &b.data, &mut da, &mut db, &(n as i64))?;
    }
    Ok((
        Tensor::from_cuda(shape, g.clone(), da)?,
        Tensor::from_cuda(shape, g.clone(), db)?,
    ))
}

/// Relu's output and its pass mask, which stays on the GPU: bit `i % 32` of
/// word `i / 32`.
pub(crate) fn relu_forward<T: Element>(
    x: &CudaBuf<T>,
    shape: &[usize],
) -> Result<(Tensor<T>, CudaSlice<u32>)> {
    let g = &x.gpu;
    let n = x.len;
    let mut y = g.uninit::<T>(n)?;
    let mut mask = g.zeros::<u32>(n.div_ceil(32))?;
    if n > 0 {
        launch!(g, "relu", g.function::<T>(&KERNELS, "relu_fwd")?, cfg(grid(n), BLOCK, 0);
            &x.data, &mut y, &mut mask, &(n as i64))?;
    }
    Ok((Tensor::from_cuda(shape, g.clone(), y)?, mask))
}

/// `g` where the mask (from [`relu_forward`]) passes, else 0.
pub(crate) fn relu_backward<T: Element>(
    mask: &CudaSlice<u32>,
    gr: &CudaBuf<T>,
    shape: &[usize],
) -> Result<Tensor<T>> {
    let g = &gr.gpu;
    let n = gr.len;
    let mut dx = g.uninit::<T>(n)?;
    if n > 0 {
        launch!(g, "relu backward", g.function::<T>(&KERNELS, "relu_bwd")?,
            cfg(grid(n), BLOCK, 0);
            mask, &gr.data, &mut dx, &(n as i64))?;
    }
    Tensor::from_cuda(shape, g.clone(), dx)
}
