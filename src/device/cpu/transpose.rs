//! A block of up to 16 x 16 f32 transposed in AVX-512 registers: the
//! matrix product's operand packing and the attention's transposed heads
//! use it where they would otherwise move one float at a time.

use std::arch::x86_64::{
    __m512, _mm512_castpd_ps, _mm512_castps_pd, _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps,
    _mm512_setzero_ps, _mm512_shuffle_f32x4, _mm512_unpackhi_pd, _mm512_unpackhi_ps,
    _mm512_unpacklo_pd, _mm512_unpacklo_ps,
};

/// The first `n` of 16 lanes, as a mask.
fn lanes(n: usize) -> u16 {
    ((1u32 << n.min(16)) - 1) as u16
}

/// `dst[c * ldd + r] = src[r * lds + c]` for `r < rows` and `c < cols`
/// (each at most 16); nothing else is read or written.
///
/// # Safety
/// AVX-512F is available, and those entries of `src` and `dst` are in
/// bounds and do not overlap.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn block16(
    src: *const f32,
    lds: usize,
    [rows, cols]: [usize; 2],
    dst: *mut f32,
    ldd: usize,
) {
    let (rm, cm) = (lanes(rows), lanes(cols));
    let mut r = [_mm512_setzero_ps(); 16];
    for (i, v) in r.iter_mut().enumerate().take(rows.min(16)) {
        // SAFETY: row `i < rows`, lanes `< cols`: in bounds.
        *v = unsafe { _mm512_maskz_loadu_ps(cm, src.add(i * lds)) };
    }
    // In 128-bit lane `L` (columns 4L..4L+3): pairs of rows interleaved,
    // then quads, so `u[4g + k]` holds column `4L + k` of rows 4g..4g+3.
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    let (pd, ps) = (_mm512_castps_pd, _mm512_castpd_ps);
    let mut u = [_mm512_setzero_ps(); 16];
    for g in 0..4 {
        let (a, b, c, d) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
        u[4 * g] = ps(_mm512_unpacklo_pd(pd(a), pd(c)));
        u[4 * g + 1] = ps(_mm512_unpackhi_pd(pd(a), pd(c)));
        u[4 * g + 2] = ps(_mm512_unpacklo_pd(pd(b), pd(d)));
        u[4 * g + 3] = ps(_mm512_unpackhi_pd(pd(b), pd(d)));
    }
    // A 4 x 4 transpose of 128-bit lanes over u[k], u[4+k], u[8+k],
    // u[12+k]: output row `4L + k` takes lane `L` of each.
    let mut out: [__m512; 16] = [_mm512_setzero_ps(); 16];
    for k in 0..4 {
        let v0 = _mm512_shuffle_f32x4::<0x88>(u[k], u[4 + k]);
        let v1 = _mm512_shuffle_f32x4::<0xdd>(u[k], u[4 + k]);
        let v2 = _mm512_shuffle_f32x4::<0x88>(u[8 + k], u[12 + k]);
        let v3 = _mm512_shuffle_f32x4::<0xdd>(u[8 + k], u[12 + k]);
        out[k] = _mm512_shuffle_f32x4::<0x88>(v0, v2);
        out[4 + k] = _mm512_shuffle_f32x4::<0x88>(v1, v3);
        out[8 + k] = _mm512_shuffle_f32x4::<0xdd>(v0, v2);
        out[12 + k] = _mm512_shuffle_f32x4::<0xdd>(v1, v3);
    }
    for (c, v) in out.iter().enumerate().take(cols.min(16)) {
        // SAFETY: row `c < cols` of `dst`, lanes `< rows`: in bounds.
        unsafe { _mm512_mask_storeu_ps(dst.add(c * ldd), rm, *v) };
    }
}

/// `dst[c * ldd + r] = src[r * lds + c]` for `r < rows`, `c < cols`, in
/// blocks of 16 x 16.
///
/// # Safety
/// As [`block16`], for the whole `rows x cols`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose(
    src: *const f32,
    lds: usize,
    [rows, cols]: [usize; 2],
    dst: *mut f32,
    ldd: usize,
) {
    for r0 in (0..rows).step_by(16) {
        for c0 in (0..cols).step_by(16) {
            let shape = [16.min(rows - r0), 16.min(cols - c0)];
            // SAFETY: a sub-block of the caller's bounds.
            unsafe {
                block16(
                    src.add(r0 * lds + c0),
                    lds,
                    shape,
                    dst.add(c0 * ldd + r0),
                    ldd,
                )
            };
        }
    }
}
