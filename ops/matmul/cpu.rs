//! CPU loops for the batched matrix product, through `matrixmultiply`'s
//! packed, register-blocked kernels (AVX2/FMA where the CPU has them).
//! f32 and f64 run in their own type; f16 and bf16 are widened to f32 (their
//! accumulation type) once per operand, which costs O(mk + kn) beside the
//! O(mkn) product. Transposes are strides, never copies. Work is split
//! into bands of output rows; a band's entries are computed exactly as in
//! one call over all rows, so the result is bitwise the same for any
//! thread count.

use crate::device::cpu::run_each;
use crate::dtype::{Accum, Element};
use crate::layout::{broadcast_strides, for_each_offset};
use std::any::TypeId;

/// Below this many multiply-adds a product runs on the calling thread.
const PAR_MIN_MACS: usize = 1 << 18;
/// Rows per band at least: each band packs its own panels of `b`.
const MIN_BAND_ROWS: usize = 32;

/// A scalar `matrixmultiply` has a kernel for.
trait Gemm: Copy + Send + Sync + 'static {
    /// `c = a @ b` (`c` overwritten) for strided `a: [m, k]`, `b: [k, n]`
    /// and row-major `c: [m, n]`, with `(row, column)` strides.
    fn gemm(
        mkn: [usize; 3],
        a: &[Self],
        sa: [isize; 2],
        b: &[Self],
        sb: [isize; 2],
        c: &mut [Self],
    );
}

macro_rules! gemm_impl {
    ($t:ty, $f:ident) => {
        impl Gemm for $t {
            fn gemm(
                [m, k, n]: [usize; 3],
                a: &[Self],
                [rsa, csa]: [isize; 2],
                b: &[Self],
                [rsb, csb]: [isize; 2],
                c: &mut [Self],
            ) {
                debug_assert!(c.len() == m * n);
                let span = |r: usize, c: usize, rs: isize, cs: isize| {
                    if r == 0 || c == 0 {
                        0
                    } else {
                        (r - 1) * rs as usize + (c - 1) * cs as usize + 1
                    }
                };
                // The bounds the kernel reads and writes, checked once.
                assert!(a.len() >= span(m, k, rsa, csa) && b.len() >= span(k, n, rsb, csb));
                // SAFETY: every index the kernel forms lies within the spans
                // just checked; `c` is `[m, n]` row-major and exclusive.
                unsafe {
                    matrixmultiply::$f(
                        m,
                        k,
                        n,
                        1.0,
                        a.as_ptr(),
                        rsa,
                        csa,
                        b.as_ptr(),
                        rsb,
                        csb,
                        0.0,
                        c.as_mut_ptr(),
                        n as isize,
                        1,
                    )
                }
            }
        }
    };
}
gemm_impl!(f32, sgemm);
gemm_impl!(f64, dgemm);

/// `s` as a slice of `U` when `T` is `U`.
fn same<T: 'static, U: 'static>(s: &[T]) -> Option<&[U]> {
    // SAFETY: `T` and `U` are the same type.
    (TypeId::of::<T>() == TypeId::of::<U>())
        .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), s.len()) })
}

/// `s` as a mutable slice of `U` when `T` is `U`.
fn same_mut<T: 'static, U: 'static>(s: &mut [T]) -> Option<&mut [U]> {
    // SAFETY: `T` and `U` are the same type.
    (TypeId::of::<T>() == TypeId::of::<U>())
        .then(|| unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), s.len()) })
}

/// `out = op(a) @ op(b)` for every entry of the broadcast `batch`, where
/// `op` swaps the last two dims of an operand whose flag is set. Each
/// operand comes with its own stored shape (rank >= 2, batch dims
/// broadcasting to `batch`); `[m, k, n]` are the product's dims after `op`;
/// `out` holds the `[batch, m, n]` result. The caller has checked the
/// shapes.
pub(crate) fn bmm<T: Element>(
    (a, sa, ta): (&[T], &[usize], bool),
    (b, sb, tb): (&[T], &[usize], bool),
    batch: &[usize],
    mkn: [usize; 3],
    out: &mut [T],
) {
    if out.is_empty() {
        return;
    }
    if let (Some(a), Some(b)) = (same::<T, f32>(a), same::<T, f32>(b)) {
        if let Some(o) = same_mut::<T, f32>(out) {
            return run((a, sa, ta), (b, sb, tb), batch, mkn, o);
        }
    }
    if let (Some(a), Some(b)) = (same::<T, f64>(a), same::<T, f64>(b)) {
        if let Some(o) = same_mut::<T, f64>(out) {
            return run((a, sa, ta), (b, sb, tb), batch, mkn, o);
        }
    }
    // 16-bit types: the product in f32, rounded once per output.
    let wide = |s: &[T]| -> Vec<f32> { s.iter().map(|v| v.to_acc().f64() as f32).collect() };
    let (wa, wb) = (wide(a), wide(b));
    let mut wo = vec![0f32; out.len()];
    run((&wa, sa, ta), (&wb, sb, tb), batch, mkn, &mut wo);
    for (o, &v) in out.iter_mut().zip(&wo) {
        *o = T::from_acc(<T::Acc as Accum>::of(v as f64));
    }
}

/// [`bmm`] for a type with a kernel.
fn run<G: Gemm>(
    (a, sa, ta): (&[G], &[usize], bool),
    (b, sb, tb): (&[G], &[usize], bool),
    batch: &[usize],
    [m, k, n]: [usize; 3],
    out: &mut [G],
) {
    // Offsets (in elements) of each batch entry's operands.
    let offsets = |s: &[usize], size: usize| {
        let mut o = Vec::new();
        for_each_offset(
            batch,
            &broadcast_strides(&s[..s.len() - 2], batch),
            |_, x| o.push(x * size),
        );
        o
    };
    let (oa, ob) = (offsets(sa, m * k), offsets(sb, k * n));
    // Row and column strides of the stored matrices as read after `op`.
    let strides = |t: bool, rows: usize, cols: usize| -> [isize; 2] {
        if t {
            [1, rows as isize]
        } else {
            [cols as isize, 1]
        }
    };
    let (st_a, st_b) = (strides(ta, m, k), strides(tb, k, n));
    let macs = out.len().saturating_mul(k);
    let threads = rayon::current_num_threads().max(1);
    // Rows per band: enough bands for every thread, none under
    // MIN_BAND_ROWS; one band per entry when the work is small.
    let per_entry = (oa.len() * m).div_ceil(2 * threads).max(MIN_BAND_ROWS);
    let band = if macs < PAR_MIN_MACS {
        m
    } else {
        per_entry.min(m)
    };
    let mut jobs = Vec::new();
    for (i, entry) in out.chunks_mut(m * n).enumerate() {
        for (r, o) in entry.chunks_mut(band * n).enumerate() {
            jobs.push((i, r * band, o));
        }
    }
    let job = |(i, r0, o): (usize, usize, &mut [G])| {
        let rows = o.len() / n;
        let a0 = oa[i] + r0 * st_a[0] as usize;
        G::gemm([rows, k, n], &a[a0..], st_a, &b[ob[i]..], st_b, o);
    };
    if jobs.len() > 1 && macs >= PAR_MIN_MACS {
        run_each(jobs, job);
    } else {
        jobs.into_iter().for_each(job);
    }
}

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    // The tests, run by `tests/unit.rs`.
    unit_tests![
        banded_transposed_products_match_naive_exactly,
        a_band_computes_its_rows_as_the_whole_product_does,
        half_types_widen_and_batches_broadcast,
    ];

    fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    /// `[p, q]` stored row-major as `[q, p]`.
    fn transposed(s: &[f64], p: usize, q: usize) -> Vec<f64> {
        (0..p * q).map(|i| s[(i % p) * q + i / p]).collect()
    }

    fn banded_transposed_products_match_naive_exactly() {
        // Small integers: exact in any summation order. Large enough for
        // several bands; odd sizes leave partial tiles everywhere.
        let (m, k, n) = (203, 45, 301);
        let a: Vec<f64> = (0..m * k).map(|i| ((i * 7 % 13) as f64) - 6.0).collect();
        let b: Vec<f64> = (0..k * n).map(|i| ((i * 5 % 11) as f64) - 5.0).collect();
        let want = naive(&a, &b, m, k, n);
        let mut out = vec![0.0; m * n];
        bmm(
            (&a, &[m, k], false),
            (&b, &[k, n], false),
            &[],
            [m, k, n],
            &mut out,
        );
        assert_eq!(out, want);
        // The same product from stored transposes: a^T is [k, m], b^T [n, k].
        let (at, bt) = (transposed(&a, m, k), transposed(&b, k, n));
        let mut out_t = vec![0.0; m * n];
        bmm(
            (&at, &[k, m], true),
            (&bt, &[n, k], true),
            &[],
            [m, k, n],
            &mut out_t,
        );
        assert_eq!(out_t, want);
        // f32 gives the same integers.
        let (a32, b32): (Vec<f32>, Vec<f32>) = (
            a.iter().map(|&v| v as f32).collect(),
            b.iter().map(|&v| v as f32).collect(),
        );
        let mut o32 = vec![0f32; m * n];
        bmm(
            (&a32, &[m, k], false),
            (&b32, &[k, n], false),
            &[],
            [m, k, n],
            &mut o32,
        );
        let r32: Vec<f32> = want.iter().map(|&v| v as f32).collect();
        assert_eq!(o32, r32);
    }

    /// Bands of any height give the bits of one product over all rows
    /// (what makes the result independent of the thread count), for
    /// values that round, in both kernel types.
    fn a_band_computes_its_rows_as_the_whole_product_does() {
        fn check<G: Gemm + PartialEq + std::fmt::Debug>(of: impl Fn(f64) -> G) {
            let (m, k, n) = (300, 517, 129);
            let mut rng = crate::rng::Rng::new(3);
            let a: Vec<G> = (0..m * k).map(|_| of(rng.normal())).collect();
            let b: Vec<G> = (0..k * n).map(|_| of(rng.normal())).collect();
            let mut whole = vec![of(0.0); m * n];
            G::gemm(
                [m, k, n],
                &a,
                [k as isize, 1],
                &b,
                [n as isize, 1],
                &mut whole,
            );
            for band in [1, 7, 32, 100, 257] {
                let mut banded = vec![of(0.0); m * n];
                for (r, o) in banded.chunks_mut(band * n).enumerate() {
                    let rows = o.len() / n;
                    let a0 = r * band * k;
                    G::gemm(
                        [rows, k, n],
                        &a[a0..],
                        [k as isize, 1],
                        &b,
                        [n as isize, 1],
                        o,
                    );
                }
                assert!(banded == whole, "bands of {band} rows");
            }
        }
        check(|v| v as f32);
        check(|v| v);
    }

    fn half_types_widen_and_batches_broadcast() {
        use half::bf16;
        // [2, 3, 4] @ [4, 2] with a shared right operand.
        let a: Vec<bf16> = (0..24).map(|i| bf16::from_f32(i as f32 - 10.0)).collect();
        let b: Vec<bf16> = (0..8).map(|i| bf16::from_f32(i as f32 * 0.5)).collect();
        let mut out = vec![bf16::ZERO; 12];
        bmm(
            (&a, &[2, 3, 4], false),
            (&b, &[4, 2], false),
            &[2],
            [3, 4, 2],
            &mut out,
        );
        for e in 0..2 {
            for i in 0..3 {
                for j in 0..2 {
                    let want: f32 = (0..4)
                        .map(|p| a[e * 12 + i * 4 + p].to_f32() * b[p * 2 + j].to_f32())
                        .sum();
                    assert_eq!(out[e * 6 + i * 2 + j], bf16::from_f32(want));
                }
            }
        }
    }
}
