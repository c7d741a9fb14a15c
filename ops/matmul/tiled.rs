//! The hand-written tiled product the crate used before `matrixmultiply`:
//! the reference the GFLOP/s probe compares against (`benches/matmul.rs`)
//! and a second opinion in the tests. Each product accumulates in `T::Acc`,
//! four output rows at a time against column panels of `b` (i-k-j order).

use crate::device::cpu::run_each;
use crate::dtype::Element;
use num_traits::Zero;

/// Rows per register tile.
const MR: usize = 4;
/// Columns per panel: a 4-row accumulator tile of this width stays in L1.
const NC: usize = 256;
/// Below this many multiply-adds a product runs on the calling thread.
const PAR_MIN_MACS: usize = 1 << 16;
/// Target multiply-adds per parallel task.
const TASK_MACS: usize = 1 << 15;

/// The elements of `s` (of `shape`, rank >= 2) with the last two dims
/// swapped.
#[cfg(test)]
pub(crate) fn transpose_last2<T: Element>(s: &[T], shape: &[usize]) -> Vec<T> {
    let r = shape.len();
    let (p, q) = (shape[r - 2], shape[r - 1]);
    let mut out = vec![T::ZERO; s.len()];
    // `p * q` may overflow for an empty tensor such as [0, 2^40, 2^40].
    if !s.is_empty() {
        for (src, dst) in s.chunks_exact(p * q).zip(out.chunks_exact_mut(p * q)) {
            for (i, row) in src.chunks_exact(q).enumerate() {
                for (j, &v) in row.iter().enumerate() {
                    dst[j * p + i] = v;
                }
            }
        }
    }
    out
}

/// `out = a @ b` for one `[m, k] @ [k, n]` pair of row-major slices
/// (`out` is `[m, n]`). Rows are split into bands run in parallel when the
/// product is large enough.
pub(crate) fn gemm<T: Element>(
    a: &[T],
    b: &[T],
    out: &mut [T],
    k: usize,
    n: usize,
    parallel: bool,
) {
    if out.is_empty() {
        return;
    }
    if k == 0 {
        out.fill(T::ZERO);
        return;
    }
    let m = out.len() / n;
    let macs = m.saturating_mul(k).saturating_mul(n);
    if !parallel || macs < PAR_MIN_MACS || m <= MR {
        gemm_rows(a, b, out, k, n);
        return;
    }
    // Whole register tiles per band, about TASK_MACS work each.
    let band = (TASK_MACS / (k * n).max(1)).div_ceil(MR).max(1) * MR;
    let bands = out.chunks_mut(band * n).zip(a.chunks(band * k));
    run_each(bands.collect(), |(o, a)| gemm_rows(a, b, o, k, n));
}

/// Serial kernel over a band of rows: `out[r, :] = sum_p a[r, p] * b[p, :]`.
fn gemm_rows<T: Element>(a: &[T], b: &[T], out: &mut [T], k: usize, n: usize) {
    let rows = out.len() / n;
    let width = NC.min(n);
    let mut acc = vec![T::Acc::zero(); MR * width];
    for j0 in (0..n).step_by(NC) {
        let nc = width.min(n - j0);
        for i0 in (0..rows).step_by(MR) {
            let mr = MR.min(rows - i0);
            let tile = &mut acc[..MR * nc];
            tile.fill(T::Acc::zero());
            let a_tile = &a[i0 * k..(i0 + mr) * k];
            if mr == MR {
                let (c0, rest) = tile.split_at_mut(nc);
                let (c1, rest) = rest.split_at_mut(nc);
                let (c2, c3) = rest.split_at_mut(nc);
                for p in 0..k {
                    let a0 = a_tile[p].to_acc();
                    let a1 = a_tile[k + p].to_acc();
                    let a2 = a_tile[2 * k + p].to_acc();
                    let a3 = a_tile[3 * k + p].to_acc();
                    let brow = &b[p * n + j0..p * n + j0 + nc];
                    for ((((x0, x1), x2), x3), &bv) in c0
                        .iter_mut()
                        .zip(c1.iter_mut())
                        .zip(c2.iter_mut())
                        .zip(c3.iter_mut())
                        .zip(brow)
                    {
                        let bv = bv.to_acc();
                        *x0 += a0 * bv;
                        *x1 += a1 * bv;
                        *x2 += a2 * bv;
                        *x3 += a3 * bv;
                    }
                }
            } else {
                for (r, c) in tile.chunks_exact_mut(nc).take(mr).enumerate() {
                    for p in 0..k {
                        let av = a_tile[r * k + p].to_acc();
                        let brow = &b[p * n + j0..p * n + j0 + nc];
                        for (x, &bv) in c.iter_mut().zip(brow) {
                            *x += av * bv.to_acc();
                        }
                    }
                }
            }
            for (r, c) in tile.chunks_exact(nc).take(mr).enumerate() {
                let o = &mut out[(i0 + r) * n + j0..(i0 + r) * n + j0 + nc];
                for (y, &v) in o.iter_mut().zip(c) {
                    *y = T::from_acc(v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn tiled_parallel_kernel_matches_naive() {
        // Sizes with remainders in every blocking (rows % 4, cols % NC) and
        // large enough to take the parallel path.
        let (m, k, n) = (67, 45, 301);
        let a: Vec<f64> = (0..m * k).map(|i| ((i * 7 % 13) as f64) - 6.0).collect();
        let b: Vec<f64> = (0..k * n).map(|i| ((i * 5 % 11) as f64) - 5.0).collect();
        let mut out = vec![0.0; m * n];
        gemm(&a, &b, &mut out, k, n, true);
        // Small integers: exact in any summation order.
        assert_eq!(out, naive(&a, &b, m, k, n));
    }

    #[test]
    fn transpose_swaps_last_two() {
        let t: Vec<f64> = (0..12).map(|v| v as f64).collect();
        let shape = [2, 2, 3];
        assert_eq!(super::super::swap_last2(&shape), [2, 3, 2]);
        assert_eq!(
            transpose_last2(&t, &shape),
            [0., 3., 1., 4., 2., 5., 6., 9., 7., 10., 8., 11.]
        );
    }
}
