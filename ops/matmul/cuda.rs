//! Matmul on a GPU through cuBLAS: row-major `op(A) @ op(B)` computed as
//! the column-major `op(B)^T op(A)^T`, transposes as cuBLAS flags, one
//! strided-batched call when each operand's batch is whole or broadcast as
//! a block, else one call per batch entry.

use crate::device::cuda::Gpu;
use crate::dtype::Element;
use crate::error::Result;
use crate::tensor::{CudaBuf, Tensor};
use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::{Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::CudaSlice;

/// An operand: its data, whether it is transposed, and for each output
/// batch entry the offset (in matrices) of its own matrix.
pub(crate) struct Operand<'a, T: Element> {
    pub(crate) buf: &'a CudaBuf<T>,
    pub(crate) trans: bool,
    pub(crate) batch_index: Vec<usize>,
}

/// The common stride between consecutive batch entries' matrices, if any
/// (0 for a broadcast operand).
fn uniform(ix: &[usize]) -> Option<i64> {
    if ix.len() < 2 {
        return Some(0);
    }
    let d = ix[1] as i64 - ix[0] as i64;
    (ix[0] == 0 && ix.windows(2).all(|w| w[1] as i64 - w[0] as i64 == d)).then_some(d)
}

macro_rules! gemm_as {
    ($U:ty, $one:expr, $zero:expr, $g:expr, $a:expr, $b:expr, $c:expr, $mkn:expr) => {{
        let (a, b, c): (&Operand<_>, &Operand<_>, &mut CudaSlice<_>) = ($a, $b, $c);
        let [m, k, n] = $mkn;
        let blas = $g.blas()?;
        let blas = blas.lock().unwrap_or_else(|e| e.into_inner());
        let (la, lb) = (a.buf.len, b.buf.len);
        // SAFETY: `T::NAME` named `$U`, so the element types are the same.
        let av = unsafe { a.buf.data.transmute::<$U>(la) };
        let bv = unsafe { b.buf.data.transmute::<$U>(lb) };
        let cl = c.len();
        let cv = unsafe { c.transmute_mut::<$U>(cl) };
        let (Some(av), Some(bv), Some(mut cv)) = (av, bv, cv) else {
            return Err($g.err("matmul", "buffer reinterpretation failed"));
        };
        let gemm = GemmConfig::<$U> {
            transa: if b.trans { CUBLAS_OP_T } else { CUBLAS_OP_N },
            transb: if a.trans { CUBLAS_OP_T } else { CUBLAS_OP_N },
            m: n as i32,
            n: m as i32,
            k: k as i32,
            alpha: $one,
            lda: if b.trans { k } else { n } as i32,
            ldb: if a.trans { m } else { k } as i32,
            beta: $zero,
            ldc: n as i32,
        };
        let batch = a.batch_index.len();
        match (uniform(&a.batch_index), uniform(&b.batch_index)) {
            (Some(sa), Some(sb)) => {
                let cfg = StridedBatchedConfig {
                    gemm,
                    batch_size: batch as i32,
                    stride_a: sb * (k * n) as i64,
                    stride_b: sa * (m * k) as i64,
                    stride_c: (m * n) as i64,
                };
                // SAFETY: every matrix the strides reach lies in its buffer
                // (the batch indices come from the operands' shapes).
                unsafe { blas.gemm_strided_batched(cfg, &bv, &av, &mut cv) }
                    .map_err(|e| $g.err("cublasGemmStridedBatched", e))?;
            }
            _ => {
                for i in 0..batch {
                    let ao = a.batch_index[i] * m * k;
                    let bo = b.batch_index[i] * k * n;
                    let a1 = av.slice(ao..ao + m * k);
                    let b1 = bv.slice(bo..bo + k * n);
                    let mut c1 = cv.slice_mut(i * m * n..(i + 1) * m * n);
                    // SAFETY: each view holds exactly one matrix.
                    unsafe { blas.gemm(gemm, &b1, &a1, &mut c1) }
                        .map_err(|e| $g.err("cublasGemm", e))?;
                }
            }
        }
        Ok(())
    }};
}

fn run<T: Element>(
    g: &Gpu,
    a: &Operand<T>,
    b: &Operand<T>,
    c: &mut CudaSlice<T>,
    mkn: [usize; 3],
) -> Result<()> {
    match T::NAME {
        "f32" => gemm_as!(f32, 1.0, 0.0, g, a, b, c, mkn),
        "f64" => gemm_as!(f64, 1.0, 0.0, g, a, b, c, mkn),
        "f16" => gemm_as!(half::f16, half::f16::ONE, half::f16::ZERO, g, a, b, c, mkn),
        "bf16" => gemm_as!(
            half::bf16,
            half::bf16::ONE,
            half::bf16::ZERO,
            g,
            a,
            b,
            c,
            mkn
        ),
        other => Err(g.err("matmul", format!("no cuBLAS path for {other}"))),
    }
}

/// The batched product, shaped `shape` (`batch + [m, n]`).
pub(crate) fn bmm<T: Element>(
    a: Operand<T>,
    b: Operand<T>,
    shape: &[usize],
    [m, k, n]: [usize; 3],
) -> Result<Tensor<T>> {
    let g = a.buf.gpu.clone();
    let total = a.batch_index.len() * m * n;
    if total == 0 || k == 0 {
        let z = g.zeros::<T>(total)?;
        return Tensor::from_cuda(shape, g, z);
    }
    let mut c = g.uninit::<T>(total)?;
    run(&g, &a, &b, &mut c, [m, k, n])?;
    Tensor::from_cuda(shape, g, c)
}
