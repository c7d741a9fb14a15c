//! The f32 matrix product on AVX-512: `b` packed into panels 32 columns
//! wide, `a` read in place where its rows are contiguous (else packed into
//! panels 12 rows tall), and a 12 x 32 tile of `c` held in 24 registers.
//!
//! Every entry of `c` is one chain of fused multiply-adds over `k` in order,
//! starting from zero (a block of `k` stores its partial sums in `c`, and
//! the next loads them back exactly), whatever the blocking and whichever
//! part of `c` a call computes: any split of `c` among threads gives the
//! same bits.

use crate::device::cpu::transpose::transpose;
use std::arch::x86_64::{
    __m512, _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mask_storeu_ps,
    _mm512_maskz_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps,
};
use std::cell::RefCell;

/// Rows of the register tile.
pub(super) const MR: usize = 12;
/// Columns of the register tile: two 16-lane registers.
pub(super) const NR: usize = 32;
/// Depth of a packed block: one panel of `b` is 64 KiB.
const KC: usize = 512;
/// Rows of `a` per packed block (240 KiB): stays in L2.
const MC: usize = 120;
/// Columns of `b` per packed block (1 MiB): stays in L2.
const NC: usize = 1024;

/// Whether this CPU runs [`sgemm`].
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

thread_local! {
    /// Packing space of this thread, reused across calls: `(a, b)`, in
    /// 64-byte units so every panel starts on a cache line.
    static PACK: RefCell<(Vec<__m512>, Vec<__m512>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `v` with room for `floats` f32, as a pointer to the first.
fn room(v: &mut Vec<__m512>, floats: usize) -> *mut f32 {
    let units = floats.div_ceil(16);
    if v.len() < units {
        v.resize(units, _mm512_setzero_ps_safe());
    }
    v.as_mut_ptr().cast()
}

/// A zero register value (the intrinsic needs the feature; zero bits do not).
fn _mm512_setzero_ps_safe() -> __m512 {
    // SAFETY: all-zero bits are a valid `__m512`, the f32 zeros.
    unsafe { std::mem::zeroed() }
}

/// `c = a @ b` (`c` overwritten) for `a: [m, k]` and `b: [k, n]` read at
/// `(row, column)` strides `sa` and `sb`, and `c: [m, n]` at row stride
/// `ldc` (columns adjacent); then, unless `bias` is null, `bias[j]` added
/// to every row's entry `j` (to the finished chain, in registers).
///
/// # Safety
/// [`available`] is true; every `a[i * sa[0] + p * sa[1]]`,
/// `b[p * sb[0] + j * sb[1]]`, `c[i * ldc + j]` and `bias[j]` (when not
/// null) for `i < m, p < k, j < n` is in bounds, and no other thread
/// touches that part of `c`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn sgemm(
    [m, k, n]: [usize; 3],
    a: *const f32,
    sa: [isize; 2],
    b: *const f32,
    sb: [isize; 2],
    bias: *const f32,
    c: *mut f32,
    ldc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for i in 0..m {
            // SAFETY: row `i` of `c` and `bias` are in bounds (the caller's
            // contract).
            unsafe {
                let row = std::slice::from_raw_parts_mut(c.add(i * ldc), n);
                for (j, y) in row.iter_mut().enumerate() {
                    *y = if bias.is_null() {
                        0.0
                    } else {
                        0.0 + *bias.add(j)
                    };
                }
            }
        }
        return;
    }
    PACK.with(|pack| {
        let mut pack = pack.borrow_mut();
        let (pa, pb) = &mut *pack;
        let pa = room(pa, MC.div_ceil(MR) * MR * KC);
        let pb = room(pb, NC.div_ceil(NR) * NR * KC);
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            for pc in (0..k).step_by(KC) {
                let kc = KC.min(k - pc);
                let off = |s: [isize; 2], i: usize, j: usize| i as isize * s[0] + j as isize * s[1];
                // SAFETY (all below): offsets stay within the caller's
                // bounds for `a`, `b` and `c`; the packing space holds a
                // block (`room` above).
                unsafe { pack_b([kc, nc], b.offset(off(sb, pc, jc)), sb, pb) };
                for ic in (0..m).step_by(MC) {
                    let mc = MC.min(m - ic);
                    let a_blk = unsafe { a.offset(off(sa, ic, pc)) };
                    // Rows of `a` in place when each is contiguous (a full
                    // tile reads 12 row streams); otherwise packed.
                    let in_place = sa[1] == 1;
                    if !in_place {
                        unsafe { pack_a([mc, kc], a_blk, sa, pa) };
                    }
                    for jr in (0..nc).step_by(NR) {
                        let cols = NR.min(nc - jr);
                        let b_tile = unsafe { pb.add(jr * kc) };
                        for ir in (0..mc).step_by(MR) {
                            let rows = MR.min(mc - ir);
                            let c_tile = unsafe { c.add((ic + ir) * ldc + jc + jr) };
                            let (ct, shape, add) = ((c_tile, ldc), [rows, cols], pc > 0);
                            // The bias goes on after the chain's last block.
                            let bias = if pc + kc == k && !bias.is_null() {
                                unsafe { bias.add(jc + jr) }
                            } else {
                                std::ptr::null()
                            };
                            if in_place && rows == MR {
                                let at = unsafe { a_blk.offset(ir as isize * sa[0]) };
                                let lda = sa[0] as usize;
                                unsafe {
                                    tile::<true>(kc, (at, lda), b_tile, ct, shape, add, bias)
                                };
                            } else {
                                let at = if in_place {
                                    // A short tile would read past `a`'s rows.
                                    let at = unsafe { a_blk.offset(ir as isize * sa[0]) };
                                    unsafe { pack_a([rows, kc], at, sa, pa) };
                                    pa
                                } else {
                                    unsafe { pa.add(ir * kc) }
                                };
                                unsafe {
                                    tile::<false>(kc, (at, MR), b_tile, ct, shape, add, bias)
                                };
                            }
                        }
                    }
                }
            }
        }
    });
}

/// Packs `a: [mc, kc]` (strides `sa`) into panels of `MR` rows, each
/// `kc x MR` with a column's `MR` entries adjacent; short panels are
/// padded with zeros.
///
/// # Safety
/// `a`'s `[mc, kc]` entries are in bounds; `out` holds
/// `mc.div_ceil(MR) * MR * kc` floats; AVX-512F is available.
#[target_feature(enable = "avx512f")]
unsafe fn pack_a([mc, kc]: [usize; 2], a: *const f32, sa: [isize; 2], out: *mut f32) {
    for i0 in (0..mc).step_by(MR) {
        let rows = MR.min(mc - i0);
        // SAFETY: in bounds by the contract above.
        unsafe {
            let dst = out.add(i0 * kc);
            if sa[0] == 1 {
                // A column's rows are adjacent: copy them whole.
                for p in 0..kc {
                    let src = a.offset(i0 as isize + p as isize * sa[1]);
                    copy::<MR>(src, dst.add(p * MR), rows);
                }
            } else if sa[1] == 1 {
                // A row's columns are adjacent: transposed in registers.
                let src = a.offset(i0 as isize * sa[0]);
                transpose(src, sa[0] as usize, [rows, kc], dst, MR);
            } else {
                for r in 0..rows {
                    let src = a.offset((i0 + r) as isize * sa[0]);
                    for p in 0..kc {
                        *dst.add(p * MR + r) = *src.offset(p as isize * sa[1]);
                    }
                }
            }
            for p in 0..kc {
                for r in rows..MR {
                    *dst.add(p * MR + r) = 0.0;
                }
            }
        }
    }
}

/// Packs `b: [kc, nc]` (strides `sb`) into panels of `NR` columns, each
/// `kc x NR` with a row's `NR` entries adjacent; short panels are padded
/// with zeros.
///
/// # Safety
/// `b`'s `[kc, nc]` entries are in bounds; `out` holds
/// `nc.div_ceil(NR) * NR * kc` floats; AVX-512F is available.
#[target_feature(enable = "avx512f")]
unsafe fn pack_b([kc, nc]: [usize; 2], b: *const f32, sb: [isize; 2], out: *mut f32) {
    for j0 in (0..nc).step_by(NR) {
        let cols = NR.min(nc - j0);
        // SAFETY: in bounds by the contract above.
        unsafe {
            let dst = out.add(j0 * kc);
            if sb[1] == 1 {
                for p in 0..kc {
                    let src = b.offset(p as isize * sb[0] + j0 as isize);
                    copy::<NR>(src, dst.add(p * NR), cols);
                }
            } else if sb[0] == 1 {
                // A column's rows are adjacent: transposed in registers,
                // 16 columns at a time.
                for j in (0..cols).step_by(16) {
                    let src = b.offset((j0 + j) as isize * sb[1]);
                    let shape = [16.min(cols - j), kc];
                    transpose(src, sb[1] as usize, shape, dst.add(j), NR);
                }
            } else {
                // Transposing: 16 rows at a time, so the rows written
                // (2 KiB) stay in L1 while every column is read.
                for p0 in (0..kc).step_by(16) {
                    let ps = 16.min(kc - p0);
                    for j in 0..cols {
                        let src = b.offset((j0 + j) as isize * sb[1] + p0 as isize * sb[0]);
                        for p in 0..ps {
                            *dst.add((p0 + p) * NR + j) = *src.offset(p as isize * sb[0]);
                        }
                    }
                }
            }
            if cols < NR {
                for p in 0..kc {
                    std::ptr::write_bytes(dst.add(p * NR + cols), 0, NR - cols);
                }
            }
        }
    }
}

/// Copies `len` (at most `N`) floats; a whole `N` as one fixed-size move
/// (not a call to `memcpy`).
///
/// # Safety
/// `src` and `dst` hold `len` floats and do not overlap.
#[inline(always)]
unsafe fn copy<const N: usize>(src: *const f32, dst: *mut f32, len: usize) {
    // SAFETY: the caller's contract; arrays of f32 need only f32 alignment.
    unsafe {
        if len == N {
            dst.cast::<[f32; N]>()
                .write_unaligned(src.cast::<[f32; N]>().read_unaligned());
        } else {
            std::ptr::copy_nonoverlapping(src, dst, len);
        }
    }
}

/// The first `n` of 16 lanes, as a mask.
fn lanes(n: usize) -> u16 {
    ((1u32 << n.min(16)) - 1) as u16
}

/// `c[..rows, ..cols] (+)= a @ b` over `kc`: `b` is a packed `kc x NR`
/// panel; `a` is `MR` rows at row stride `lda`, each contiguous, with
/// `ROWS`, else a packed `kc x MR` panel (`lda` unused); `c` is at row
/// stride `ldc`; with `add`, `c`'s values are the chains' start.
///
/// # Safety
/// AVX-512F is available; `a` and `b` hold their `MR x kc` and `kc x NR`
/// entries; `c`'s `[rows, cols]` entries are in bounds.
#[target_feature(enable = "avx512f")]
unsafe fn tile<const ROWS: bool>(
    kc: usize,
    (a, lda): (*const f32, usize),
    b: *const f32,
    (c, ldc): (*mut f32, usize),
    [rows, cols]: [usize; 2],
    add: bool,
    bias: *const f32,
) {
    let (m0, m1) = (lanes(cols), lanes(cols.saturating_sub(16)));
    let mut lo = [_mm512_setzero_ps(); MR];
    let mut hi = [_mm512_setzero_ps(); MR];
    // SAFETY (all below): in bounds by the contract above; masked lanes
    // are neither read nor written.
    if add {
        for r in 0..MR {
            if r < rows {
                unsafe {
                    lo[r] = _mm512_maskz_loadu_ps(m0, c.add(r * ldc));
                    hi[r] = _mm512_maskz_loadu_ps(m1, c.add(r * ldc + 16));
                }
            }
        }
    }
    let mut b = b;
    for p in 0..kc {
        let (b0, b1) = unsafe { (_mm512_loadu_ps(b), _mm512_loadu_ps(b.add(16))) };
        for r in 0..MR {
            let at = if ROWS { r * lda + p } else { p * MR + r };
            let x = _mm512_set1_ps(unsafe { *a.add(at) });
            lo[r] = _mm512_fmadd_ps(x, b0, lo[r]);
            hi[r] = _mm512_fmadd_ps(x, b1, hi[r]);
        }
        b = b.wrapping_add(NR);
    }
    if !bias.is_null() {
        // SAFETY: `cols` entries of `bias` are in bounds; the rest masked.
        let (v0, v1) = unsafe {
            (
                _mm512_maskz_loadu_ps(m0, bias),
                _mm512_maskz_loadu_ps(m1, bias.add(16)),
            )
        };
        for r in 0..MR {
            lo[r] = _mm512_add_ps(lo[r], v0);
            hi[r] = _mm512_add_ps(hi[r], v1);
        }
    }
    for r in 0..MR {
        if r < rows {
            unsafe {
                _mm512_mask_storeu_ps(c.add(r * ldc), m0, lo[r]);
                _mm512_mask_storeu_ps(c.add(r * ldc + 16), m1, hi[r]);
            }
        }
    }
}
