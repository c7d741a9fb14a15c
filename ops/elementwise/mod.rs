//! Elementwise ops: unary arithmetic, broadcasting binary arithmetic and
//! activations. Each op's forward and chain rule sit in `pointwise.rs`,
//! `arith.rs` or `activation.rs`; they reach data only through the
//! device-level kernels below, which take a kind (what to compute per
//! element) and pick the device's loops with one `match` on the storage.

mod activation;
mod arith;
pub(crate) mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub(crate) use cuda::KERNELS;
mod pointwise;
pub(crate) mod vmath;

pub use activation::*;
pub use arith::*;
pub use pointwise::*;

use crate::device::cpu::is_f32;
use crate::device::pool::Buffer;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::layout::{alloc_filled, broadcast_shapes};
use crate::op::{Saved, SavedItem};
use crate::tensor::{Dims, Storage, Tensor};

/// A function of one value, evaluated in the accumulation type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Unary {
    /// `x`.
    Copy,
    /// `c`, whatever `x` is (a tensor of `c` shaped and placed like `x`).
    Fill(f64),
    /// `-x`.
    Neg,
    /// `x + c`.
    AddScalar(f64),
    /// `c x`.
    MulScalar(f64),
    /// `x / c`.
    DivScalar(f64),
    /// `x^n`.
    Powi(i32),
    /// `sqrt x`.
    Sqrt,
    /// `1 / sqrt x`.
    Rsqrt,
    /// `e^x`.
    Exp,
    /// `ln x`.
    Log,
    /// `tanh x`.
    Tanh,
    /// `1 / (1 + e^-x)`, without overflow.
    Sigmoid,
    /// `x sigma(2 k (x + a x^3))`: GELU, tanh approximation.
    GeluTanh,
    /// `x Phi(x) = x/2 (1 + erf(x / sqrt 2))`: GELU, exact.
    GeluErf,
}

/// A function of two values. For the chain-rule kinds the first is the
/// output gradient `g` and the second what the op saved.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Binary {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a b`.
    Mul,
    /// `a / b`.
    Div,
    /// `-(a b)`.
    NegMul,
    /// `g n x^(n-1)` (0 for `n = 0`): the slope of `x^n`.
    PowiGrad(i32),
    /// `g / (2 y)` for `y = sqrt x`.
    SqrtGrad,
    /// `-g y^3 / 2` for `y = 1 / sqrt x`.
    RsqrtGrad,
    /// `g (1 - y^2)` for `y = tanh x`.
    TanhGrad,
    /// `g y (1 - y)` for `y = sigma(x)`.
    SigmoidGrad,
    /// `g` times the slope of the tanh-approximation GELU at `x`.
    GeluTanhGrad,
    /// `g (Phi(x) + x phi(x))`: the slope of the exact GELU at `x`.
    GeluErfGrad,
}

/// `k` applied to every element of `x`.
pub(crate) fn unary<T: Element>(k: Unary, x: &Tensor<T>) -> Result<Tensor<T>> {
    match x.storage() {
        Storage::Cpu(xs) => Tensor::from_buffer(x.shape(), cpu::unary(k, xs)),
        #[cfg(feature = "cuda")]
        Storage::Cuda(xs) => cuda::unary(k, xs, x.shape(), x.shape()),
    }
}

/// The exact GELU of `x` and its slope `Phi(x) + x phi(x)`, in one pass,
/// where `x` is an f32 tensor on the CPU; `None` elsewhere.
pub(crate) fn gelu_and_slope<T: Element>(x: &Tensor<T>) -> Option<Result<(Tensor<T>, Tensor<T>)>> {
    let Storage::Cpu(xs) = x.storage() else {
        return None;
    };
    if !is_f32::<T>() {
        return None;
    }
    let (y, z) = cpu::gelu_and_slope(xs);
    Some(
        Tensor::from_buffer(x.shape(), y).and_then(|y| Ok((y, Tensor::from_buffer(x.shape(), z)?))),
    )
}

/// `k` applied to `x` broadcast to `shape` (NumPy rules; `x` must
/// broadcast to exactly `shape`).
pub(crate) fn unary_to<T: Element>(
    op: &'static str,
    k: Unary,
    x: &Tensor<T>,
    shape: &[usize],
) -> Result<Tensor<T>> {
    if x.shape() == shape {
        return unary(k, x);
    }
    if broadcast_shapes(op, x.shape(), shape)? != shape {
        return Err(Error::ShapeMismatch {
            op,
            lhs: x.shape().to_vec(),
            rhs: shape.to_vec(),
        });
    }
    match x.storage() {
        Storage::Cpu(xs) => {
            let mut dst = output::<T>(op, shape)?;
            cpu::unary_broadcast(k, xs, x.shape(), shape, &mut dst);
            Tensor::from_buffer(shape, dst)
        }
        #[cfg(feature = "cuda")]
        Storage::Cuda(xs) => cuda::unary(k, xs, x.shape(), shape),
    }
}

/// `k(a, b)` elementwise with NumPy broadcasting.
pub(crate) fn binary<T: Element>(
    op: &'static str,
    k: Binary,
    a: &Tensor<T>,
    b: &Tensor<T>,
) -> Result<Tensor<T>> {
    check_devices(op, a, b)?;
    let out = if a.shape() == b.shape() {
        Dims::from_slice(a.shape())
    } else {
        Dims::from_vec(broadcast_shapes(op, a.shape(), b.shape())?)
    };
    match (a.storage(), b.storage()) {
        (Storage::Cpu(x), Storage::Cpu(y)) => {
            let mut dst = if *out == *a.shape() {
                Buffer::take(a.numel())
            } else if *out == *b.shape() {
                Buffer::take(b.numel())
            } else {
                output::<T>(op, &out)?
            };
            cpu::binary(k, (x, a.shape()), (y, b.shape()), &out, &mut dst);
            Tensor::from_buffer(&out, dst)
        }
        #[cfg(feature = "cuda")]
        (Storage::Cuda(x), Storage::Cuda(y)) => {
            cuda::binary(k, (x, a.shape()), (y, b.shape()), &out)
        }
        #[cfg(feature = "cuda")]
        _ => Err(mixed(op, a, b)),
    }
}

/// `(g b, g a)`: both gradients of `a b` when `g`, `a` and `b` share one
/// shape, in one pass over memory.
pub(crate) fn mul_grads<T: Element>(
    g: &Tensor<T>,
    a: &Tensor<T>,
    b: &Tensor<T>,
) -> Result<(Tensor<T>, Tensor<T>)> {
    check_devices("mul", g, a)?;
    check_devices("mul", g, b)?;
    if a.shape() != g.shape() || b.shape() != g.shape() {
        return Err(Error::ShapeMismatch {
            op: "mul",
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
        });
    }
    match (g.storage(), a.storage(), b.storage()) {
        (Storage::Cpu(gs), Storage::Cpu(x), Storage::Cpu(y)) => {
            let (da, db) = cpu::mul_grads(gs, x, y);
            Ok((
                Tensor::from_buffer(g.shape(), da)?,
                Tensor::from_buffer(g.shape(), db)?,
            ))
        }
        #[cfg(feature = "cuda")]
        (Storage::Cuda(gs), Storage::Cuda(x), Storage::Cuda(y)) => {
            cuda::mul_grads(gs, x, y, g.shape())
        }
        #[cfg(feature = "cuda")]
        _ => Err(mixed("mul", a, b)),
    }
}

/// Where relu's gradient passes, one bit per element, kept on the device
/// that computed it: bit `i % 8` of byte `i / 8` on the CPU; bit `i % 32`
/// of word `i / 32` on a GPU (the same bits, little-endian).
pub(crate) enum ReluMask {
    Cpu(Vec<u8>),
    #[cfg(feature = "cuda")]
    Cuda(cudarc::driver::CudaSlice<u32>),
}

impl Saved for ReluMask {
    fn visit(&self, f: &mut dyn FnMut(SavedItem)) {
        f(SavedItem::Raw(match self {
            ReluMask::Cpu(m) => m.len(),
            #[cfg(feature = "cuda")]
            ReluMask::Cuda(m) => 4 * m.len(),
        }))
    }
}

/// Relu's output and the bit mask of where its gradient passes.
pub(crate) fn relu_forward<T: Element>(x: &Tensor<T>) -> Result<(Tensor<T>, ReluMask)> {
    match x.storage() {
        Storage::Cpu(xs) => {
            let (y, mask) = cpu::relu_forward(xs);
            Ok((Tensor::from_buffer(x.shape(), y)?, ReluMask::Cpu(mask)))
        }
        #[cfg(feature = "cuda")]
        Storage::Cuda(xs) => {
            let (y, mask) = cuda::relu_forward(xs, x.shape())?;
            Ok((y, ReluMask::Cuda(mask)))
        }
    }
}

/// `g` where `mask` (from [`relu_forward`]) passes, else 0.
pub(crate) fn relu_backward<T: Element>(mask: &ReluMask, g: &Tensor<T>) -> Result<Tensor<T>> {
    match (mask, g.storage()) {
        (ReluMask::Cpu(m), Storage::Cpu(gs)) => {
            Tensor::from_buffer(g.shape(), cpu::relu_backward(m, gs))
        }
        #[cfg(feature = "cuda")]
        (ReluMask::Cuda(m), Storage::Cuda(gs)) => cuda::relu_backward(m, gs, g.shape()),
        #[cfg(feature = "cuda")]
        (m, _) => Err(Error::DeviceMismatch {
            op: "relu backward",
            lhs: match m {
                ReluMask::Cpu(_) => "cpu (saved mask)".into(),
                ReluMask::Cuda(_) => "cuda (saved mask)".into(),
            },
            rhs: g.device().to_string(),
        }),
    }
}

/// A buffer for an output of `shape` that may be far larger than any
/// input: its size is checked and its memory asked for fallibly.
fn output<T: Element>(op: &'static str, shape: &[usize]) -> Result<Buffer<T>> {
    Ok(Buffer::from_vec(alloc_filled(op, shape, T::ZERO)?))
}

/// `DeviceMismatch` for `op` on `a` and `b`.
#[cfg(feature = "cuda")]
fn mixed<T: Element>(op: &'static str, a: &Tensor<T>, b: &Tensor<T>) -> Error {
    Error::DeviceMismatch {
        op,
        lhs: a.device().to_string(),
        rhs: b.device().to_string(),
    }
}

/// Both operands on one device, or `DeviceMismatch` naming the op.
pub(crate) fn check_devices<T: Element>(
    op: &'static str,
    a: &Tensor<T>,
    b: &Tensor<T>,
) -> Result<()> {
    if a.device() != b.device() {
        return Err(Error::DeviceMismatch {
            op,
            lhs: a.device().to_string(),
            rhs: b.device().to_string(),
        });
    }
    Ok(())
}
