//! CPU loops for the batched matrix product. f32 runs the AVX-512 kernel
//! of `avx512.rs` where the CPU has it, else `matrixmultiply`'s packed,
//! register-blocked kernels (AVX2/FMA where the CPU has them), as f64
//! does. f16 and bf16 are widened to f32 (their accumulation type) once
//! per operand, which costs O(mk + kn) beside the O(mkn) product.
//! Transposes are strides, never copies. Work is split into bands of
//! output rows (or columns, for a kernel whose entries do not depend on the
//! columns a call computes); a band's entries are computed exactly as in
//! one call over the whole product, so the result is bitwise the same for
//! any thread count.

#[cfg(target_arch = "x86_64")]
use super::avx512;
use crate::device::cpu::run_tasks;
use crate::dtype::{Accum, Element};
use crate::layout::{broadcast_strides, for_each_offset};
use std::any::TypeId;

/// Below this many multiply-adds a product runs on the calling thread.
const PAR_MIN_MACS: usize = 1 << 18;
/// Rows per band at least: each band packs its own panels of `b`.
const MIN_BAND_ROWS: usize = 32;

/// A scalar with a product kernel.
trait Gemm: Copy + Send + Sync + 'static {
    /// Bands of rows and columns this type's kernel is split into, as
    /// multiples of `(rows, columns)`; `None` for a kernel split by rows
    /// only (whose entries may depend on the columns a call computes).
    fn tiles() -> Option<(usize, usize)> {
        None
    }

    /// [`Gemm::gemm`] through this project's kernel where this CPU has one
    /// for the type: whether it ran (else `matrixmultiply` runs).
    ///
    /// # Safety
    /// As [`Gemm::gemm`], with the operands' spans checked.
    #[allow(clippy::too_many_arguments)]
    unsafe fn own_kernel(
        _mkn: [usize; 3],
        _a: &[Self],
        _sa: [isize; 2],
        _b: &[Self],
        _sb: [isize; 2],
        _bias: Option<&[Self]>,
        _c: *mut Self,
        _ldc: usize,
    ) -> bool {
        false
    }

    /// `c = a @ b` (`c` overwritten) for strided `a: [m, k]`, `b: [k, n]`
    /// with `(row, column)` strides, and `c: [m, n]` at row stride `ldc`
    /// with its columns adjacent; then `bias[j]` (`n` values) added to
    /// every row's entry `j`, when given.
    ///
    /// # Safety
    /// `c[i * ldc + j]` for `i < m, j < n` is in bounds, and no other
    /// thread touches it during the call.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm(
        mkn: [usize; 3],
        a: &[Self],
        sa: [isize; 2],
        b: &[Self],
        sb: [isize; 2],
        bias: Option<&[Self]>,
        c: *mut Self,
        ldc: usize,
    );
}

/// Panics unless `s` holds the `[r, c]` entries at strides `st`: the bounds
/// every kernel reads, checked once.
fn check_span<T>(s: &[T], [r, c]: [usize; 2], st: [isize; 2]) {
    let span = if r == 0 || c == 0 {
        0
    } else {
        (r - 1) * st[0] as usize + (c - 1) * st[1] as usize + 1
    };
    assert!(
        s.len() >= span,
        "matmul operand of {} for a span of {span}",
        s.len()
    );
}

/// `Gemm` for a type `matrixmultiply` has `$f` for, with the type's own
/// items (`tiles`, `own_kernel`) where it has them.
macro_rules! gemm_impl {
    ($t:ty, $f:ident $(, $own:item)*) => {
        impl Gemm for $t {
            $($own)*

            unsafe fn gemm(
                [m, k, n]: [usize; 3],
                a: &[Self],
                sa: [isize; 2],
                b: &[Self],
                sb: [isize; 2],
                bias: Option<&[Self]>,
                c: *mut Self,
                ldc: usize,
            ) {
                check_span(a, [m, k], sa);
                check_span(b, [k, n], sb);
                if let Some(v) = bias {
                    assert!(v.len() >= n, "matmul bias of {} for {n} columns", v.len());
                }
                // SAFETY (all): every index the kernel forms lies within
                // the spans just checked and the caller's bounds for `c`.
                if unsafe { Self::own_kernel([m, k, n], a, sa, b, sb, bias, c, ldc) } {
                    return;
                }
                unsafe {
                    matrixmultiply::$f(
                        m,
                        k,
                        n,
                        1.0,
                        a.as_ptr(),
                        sa[0],
                        sa[1],
                        b.as_ptr(),
                        sb[0],
                        sb[1],
                        0.0,
                        c,
                        ldc as isize,
                        1,
                    )
                }
                if let Some(v) = bias {
                    for i in 0..m {
                        // SAFETY: row `i` of `c`, written just above.
                        let row = unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), n) };
                        for (y, &b) in row.iter_mut().zip(v) {
                            *y += b;
                        }
                    }
                }
            }
        }
    };
}

gemm_impl!(
    f32,
    sgemm,
    fn tiles() -> Option<(usize, usize)> {
        #[cfg(target_arch = "x86_64")]
        if avx512::available() {
            return Some((avx512::MR, avx512::NR));
        }
        None
    },
    unsafe fn own_kernel(
        mkn: [usize; 3],
        a: &[f32],
        sa: [isize; 2],
        b: &[f32],
        sb: [isize; 2],
        bias: Option<&[f32]>,
        c: *mut f32,
        ldc: usize,
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if avx512::available() {
            let bias = bias.map_or(std::ptr::null(), |v| v.as_ptr());
            // SAFETY: the caller's contract, and the CPU has AVX-512F.
            unsafe { avx512::sgemm(mkn, a.as_ptr(), sa, b.as_ptr(), sb, bias, c, ldc) };
            return true;
        }
        let _ = (mkn, a, sa, b, sb, bias, c, ldc);
        false
    }
);
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
    if bmm_bias((a, sa, ta), (b, sb, tb), batch, mkn, None, out) {
        return;
    }
    // 16-bit types: the product in f32, rounded once per output.
    let wide = |s: &[T]| -> Vec<f32> { s.iter().map(|v| v.to_acc().f64() as f32).collect() };
    let (wa, wb) = (wide(a), wide(b));
    let mut wo = vec![0f32; out.len()];
    run((&wa, sa, ta), (&wb, sb, tb), batch, mkn, None, &mut wo);
    for (o, &v) in out.iter_mut().zip(&wo) {
        *o = T::from_acc(<T::Acc as Accum>::of(v as f64));
    }
}

/// [`bmm`] plus `bias` (`[n]`, one value per output column) added to every
/// output row, when `T` is f32 or f64: each band gets its bias right after
/// its product, while it is in cache (bitwise the product, rounded, plus the
/// bias, rounded once, as a separate add gives). Returns false, doing
/// nothing, for other types.
pub(crate) fn bmm_bias<T: Element>(
    (a, sa, ta): (&[T], &[usize], bool),
    (b, sb, tb): (&[T], &[usize], bool),
    batch: &[usize],
    mkn: [usize; 3],
    bias: Option<&[T]>,
    out: &mut [T],
) -> bool {
    if let (Some(a), Some(b)) = (same::<T, f32>(a), same::<T, f32>(b)) {
        if let Some(o) = same_mut::<T, f32>(out) {
            let bias = bias.map(|v| same::<T, f32>(v).unwrap_or_default());
            run((a, sa, ta), (b, sb, tb), batch, mkn, bias, o);
            return true;
        }
    }
    if let (Some(a), Some(b)) = (same::<T, f64>(a), same::<T, f64>(b)) {
        if let Some(o) = same_mut::<T, f64>(out) {
            let bias = bias.map(|v| same::<T, f64>(v).unwrap_or_default());
            run((a, sa, ta), (b, sb, tb), batch, mkn, bias, o);
            return true;
        }
    }
    false
}

/// [`bmm`] for a type with a kernel.
fn run<G: Gemm>(
    (a, sa, ta): (&[G], &[usize], bool),
    (b, sb, tb): (&[G], &[usize], bool),
    batch: &[usize],
    [m, k, n]: [usize; 3],
    bias: Option<&[G]>,
    out: &mut [G],
) {
    if let Some(v) = bias {
        assert_eq!(v.len(), n, "matmul bias of {} for {n} columns", v.len());
    }
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
    let entries = oa.len();
    // Bands `(rows, columns)` of each entry's `[m, n]`.
    let band = if macs < PAR_MIN_MACS {
        (m, n)
    } else if let Some((mr, nr)) = G::tiles() {
        // One band per thread, of whole register tiles, along the longer
        // side: every band packs its own panels, so fewer is cheaper.
        let parts = threads.div_ceil(entries);
        if n > m {
            (m, n.div_ceil(parts).next_multiple_of(nr))
        } else {
            (m.div_ceil(parts).next_multiple_of(mr), n)
        }
    } else {
        // Enough bands for two per thread, none under MIN_BAND_ROWS.
        let rows = (entries * m).div_ceil(2 * threads).max(MIN_BAND_ROWS);
        (rows.min(m), n)
    };
    let (rb, cb) = (band.0.max(1), band.1.max(1));
    let (row_bands, col_bands) = (m.div_ceil(rb), n.div_ceil(cb));
    let per_entry = row_bands * col_bands;
    let jobs = entries * per_entry;
    let c = SharedOut(out.as_mut_ptr());
    let job = |j: usize| {
        let (i, t) = (j / per_entry, j % per_entry);
        let (r0, c0) = ((t / col_bands) * rb, (t % col_bands) * cb);
        let (rows, cols) = (rb.min(m - r0), cb.min(n - c0));
        let a0 = oa[i] + r0 * st_a[0] as usize;
        let b0 = ob[i] + c0 * st_b[1] as usize;
        // SAFETY: the bands tile entry `i` of `out` (`[m, n]`, row-major)
        // without overlap, so each call writes only its own `[rows, cols]`.
        unsafe {
            G::gemm(
                [rows, k, cols],
                &a[a0..],
                st_a,
                &b[b0..],
                st_b,
                bias.map(|v| &v[c0..c0 + cols]),
                c.at(i * m * n + r0 * n + c0),
                n,
            )
        };
    };
    if jobs > 1 && macs >= PAR_MIN_MACS {
        run_tasks(jobs, &job);
    } else {
        (0..jobs).for_each(job);
    }
}

/// The output of a product, written by several bands at once.
#[derive(Clone, Copy)]
struct SharedOut<G>(*mut G);
// SAFETY: each band writes its own entries of the output only.
unsafe impl<G: Send> Sync for SharedOut<G> {}
unsafe impl<G: Send> Send for SharedOut<G> {}

impl<G> SharedOut<G> {
    /// The output's entry `i`.
    ///
    /// # Safety
    /// `i` is within the output.
    unsafe fn at(self, i: usize) -> *mut G {
        // SAFETY: the caller's contract.
        unsafe { self.0.add(i) }
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
        f32_entries_are_one_fma_chain_over_stale_output,
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
            // SAFETY: `whole` is `[m, n]` row-major.
            unsafe {
                G::gemm(
                    [m, k, n],
                    &a,
                    [k as isize, 1],
                    &b,
                    [n as isize, 1],
                    None,
                    whole.as_mut_ptr(),
                    n,
                )
            };
            for band in [1, 7, 32, 100, 257] {
                let mut banded = vec![of(0.0); m * n];
                for (r, o) in banded.chunks_mut(band * n).enumerate() {
                    let rows = o.len() / n;
                    let a0 = r * band * k;
                    // SAFETY: `o` is `[rows, n]` row-major.
                    unsafe {
                        G::gemm(
                            [rows, k, n],
                            &a[a0..],
                            [k as isize, 1],
                            &b,
                            [n as isize, 1],
                            None,
                            o.as_mut_ptr(),
                            n,
                        )
                    };
                }
                assert!(banded == whole, "bands of {band} rows");
            }
        }
        check(|v| v as f32);
        check(|v| v);
    }

    /// Every f32 product entry as the AVX-512 kernel defines it (one fused
    /// multiply-add chain over `k` from zero), or within rounding of the
    /// f64 sum where `matrixmultiply` runs; for shapes crossing every block
    /// edge of the kernel, all four stored transposes, a NaN and an
    /// infinity among the operands, and an output buffer full of NaN (the
    /// stale contents of a recycled buffer, which must all be written);
    /// with a bias, each entry is the product's plus the bias, bitwise.
    fn f32_entries_are_one_fma_chain_over_stale_output() {
        let mut rng = crate::rng::Rng::new(11);
        let cases = [
            ([130, 1100, 70], [false, false]),
            ([37, 20, 1100], [true, false]),
            ([250, 33, 45], [false, true]),
            ([13, 513, 33], [true, true]),
            ([700, 64, 12], [false, false]),
            ([5, 0, 40], [false, false]),
            ([1, 3, 1], [true, true]),
        ];
        for ([m, k, n], [ta, tb]) in cases {
            let mut a: Vec<f32> = (0..m * k).map(|_| rng.normal() as f32).collect();
            let mut b: Vec<f32> = (0..k * n).map(|_| rng.normal() as f32).collect();
            if m > 1 && k > 2 {
                a[k + 1] = f32::NAN; // row 1 of `a`
                b[n.min(k * n - 1)] = f32::INFINITY; // row 1 of `b`
            }
            // Logical `a[i, p]` and `b[p, j]`, and their stored forms.
            let (ag, bg) = (
                |i: usize, p: usize| a[i * k + p],
                |p: usize, j: usize| b[p * n + j],
            );
            let stored_a: Vec<f32> = if ta {
                (0..k * m).map(|x| ag(x % m, x / m)).collect()
            } else {
                a.clone()
            };
            let stored_b: Vec<f32> = if tb {
                (0..n * k).map(|x| bg(x % k, x / k)).collect()
            } else {
                b.clone()
            };
            let shape = |t: bool, r: usize, c: usize| if t { [c, r] } else { [r, c] };
            let mut out = vec![f32::NAN; m * n];
            bmm(
                (&stored_a, &shape(ta, m, k), ta),
                (&stored_b, &shape(tb, k, n), tb),
                &[],
                [m, k, n],
                &mut out,
            );
            // With a bias: the product's entry, then the bias added once.
            let bias: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
            let mut with_bias = vec![f32::NAN; m * n];
            assert!(bmm_bias(
                (&stored_a, &shape(ta, m, k), ta),
                (&stored_b, &shape(tb, k, n), tb),
                &[],
                [m, k, n],
                Some(&bias),
                &mut with_bias,
            ));
            for (x, (&y, &v)) in with_bias.iter().zip(out.iter().zip(bias.iter().cycle())) {
                let want = y + v;
                assert!(
                    x.to_bits() == want.to_bits() || (x.is_nan() && want.is_nan()),
                    "[{m}, {k}, {n}] t={ta},{tb} with bias: {x} vs {want}"
                );
            }
            let chained = <f32 as Gemm>::tiles().is_some();
            for i in 0..m {
                for j in 0..n {
                    let got = out[i * n + j];
                    let fma = (0..k).fold(0f32, |acc, p| ag(i, p).mul_add(bg(p, j), acc));
                    let wide: f64 = (0..k).map(|p| ag(i, p) as f64 * bg(p, j) as f64).sum();
                    let scale: f64 = (0..k)
                        .map(|p| (ag(i, p) as f64 * bg(p, j) as f64).abs())
                        .sum();
                    let ok = if got.is_nan() || fma.is_nan() {
                        got.is_nan() && fma.is_nan()
                    } else if chained {
                        got.to_bits() == fma.to_bits()
                    } else {
                        got == fma || (got as f64 - wide).abs() <= 1e-5 * scale
                    };
                    assert!(
                        ok,
                        "[{m}, {k}, {n}] t={ta},{tb} at ({i}, {j}): {got} vs {fma}"
                    );
                }
            }
        }
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
