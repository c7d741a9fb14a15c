//! The fused attention in f32 on AVX-512 (f32, f16 and bf16, whose
//! accumulation type is f32), used by `cpu.rs` where the CPU has AVX-512F:
//! the formulas and row tiles of the portable path, with every product in
//! 8 x 32 register blocks and the softmax's exponentials through
//! [`vmath::exp`] sixteen lanes at a time.
//!
//! A product here broadcasts single entries of `a` and reads `b` by rows
//! (32 columns, masked at the edge), and each output row sums over its own
//! depth range ([`Depth`]). Causal masking is those ranges: a masked pair
//! never enters a sum, so a NaN in `v_j` or in `dO_i` reaches only the rows
//! and positions that see it. (Score entries a little past a row's last
//! key are computed, since a block spans 8 rows, but never read.)
//!
//! Every output entry is one chain of fused multiply-adds in depth order,
//! so results do not depend on the thread count.

use super::cpu::{per_head, Shared};
use super::Geometry;
use crate::dtype::{Accum, Element};
use crate::ops::elementwise::vmath;
use std::any::TypeId;
use std::arch::x86_64::{
    __m512, _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mask_loadu_ps,
    _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps, _mm512_max_ps, _mm512_mul_ps,
    _mm512_reduce_add_ps, _mm512_reduce_max_ps, _mm512_set1_ps, _mm512_setzero_ps,
    _mm512_storeu_ps, _mm512_sub_ps,
};
use std::cell::RefCell;

type Acc<T> = <T as Element>::Acc;

/// Output rows per register block.
const R: usize = 8;
/// Output columns per register block: two 16-lane registers.
const NB: usize = 32;
/// Query rows per tile: the score tile is `TILE x T` values (the default
/// model's whole head, 16 KiB, at T = 64).
const TILE: usize = 64;

/// Whether the kernels run: the CPU has AVX-512F and the process-wide cap
/// ([`crate::device::cpu::set_simd_limit`]) allows it.
pub(super) fn available() -> bool {
    crate::device::cpu::simd() == crate::device::cpu::Simd::Avx512
}

thread_local! {
    /// Per-thread space for one head's operands, reused across calls.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The depth range each output row sums over (and, for a score tile, the
/// columns each row needs).
#[derive(Clone, Copy)]
enum Depth {
    /// `[0, k)` for every row.
    All(usize),
    /// Row `i` sums `[0, min(k, i + 1 + shift))`: query row `shift + i`
    /// against the keys it sees.
    Through { k: usize, shift: usize },
    /// Row `j` sums `[min(k, j - shift), k)` (from 0 when `j < shift`): key
    /// `j` against the tile's query rows `shift + p` that see it.
    From { k: usize, shift: usize },
}

impl Depth {
    #[inline(always)]
    fn range(self, row: usize) -> (usize, usize) {
        match self {
            Depth::All(k) => (0, k),
            Depth::Through { k, shift } => (0, k.min(row + 1 + shift)),
            Depth::From { k, shift } => (row.saturating_sub(shift).min(k), k),
        }
    }
}

/// Lanes `[0, n)` of a 16-lane register.
#[inline(always)]
fn lanes(n: usize) -> u16 {
    ((1u32 << n.min(16)) - 1) as u16
}

/// An operand read by broadcasting entries `a[row * rs + p * ps]`.
#[derive(Clone, Copy)]
struct Bcast<'a> {
    a: &'a [f32],
    rs: usize,
    ps: usize,
}

/// `c[i, j] = (c[i, j] if add) + alpha * sum A[i, p] b[p * ldb + j]`
/// over `p` in row `i`'s `depth` range, for rows `i < m` and columns `j`
/// below the end of row `i`'s `cols` range (a block computes up to its
/// rows' largest).
///
/// # Safety
/// AVX-512F is available.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn product(
    m: usize,
    depth: Depth,
    cols: Depth,
    a: Bcast,
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    alpha: f32,
    add: bool,
) {
    if m == 0 {
        return;
    }
    // Every index the blocks form lies within these spans (ranges and
    // column counts grow with the row for every `Depth`, or are constant).
    let (kmax, nmax) = (
        depth.range(m - 1).1.max(depth.range(0).1),
        cols.range(m - 1).1,
    );
    let reach = |rows: usize, rs: usize, n: usize, s: usize| {
        if rows == 0 || n == 0 {
            0
        } else {
            (rows - 1) * rs + (n - 1) * s + 1
        }
    };
    assert!(a.a.len() >= reach(m, a.rs, kmax, a.ps));
    assert!(b.len() >= reach(kmax, ldb, nmax, 1));
    assert!(c.len() >= reach(m, ldc, nmax, 1));
    let mut i0 = 0;
    while i0 < m {
        // SAFETY: in bounds by the spans checked above.
        if m - i0 >= R {
            unsafe { block::<R>(i0, depth, cols, a, (b, ldb), (c, ldc), alpha, add) };
            i0 += R;
        } else {
            unsafe { block::<1>(i0, depth, cols, a, (b, ldb), (c, ldc), alpha, add) };
            i0 += 1;
        }
    }
}

/// Rows `[i0, i0 + ROWS)` of [`product`].
///
/// # Safety
/// AVX-512F is available; the rows' ranges and columns are within the
/// operands (checked by [`product`]).
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const ROWS: usize>(
    i0: usize,
    depth: Depth,
    cols: Depth,
    a: Bcast,
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    alpha: f32,
    add: bool,
) {
    let (mut lo, mut hi) = ([0; ROWS], [0; ROWS]);
    let (mut first, mut last, mut all_lo, mut all_hi, mut n) = (usize::MAX, 0, 0, usize::MAX, 0);
    for r in 0..ROWS {
        (lo[r], hi[r]) = depth.range(i0 + r);
        hi[r] = hi[r].max(lo[r]);
        (first, last) = (first.min(lo[r]), last.max(hi[r]));
        (all_lo, all_hi) = (all_lo.max(lo[r]), all_hi.min(hi[r]));
        n = n.max(cols.range(i0 + r).1);
    }
    // The depths every row sums (none when the ranges do not all meet).
    if all_lo >= all_hi {
        (all_lo, all_hi) = (last, last);
    }
    let (ap, bp, cp) = (a.a.as_ptr().add(i0 * a.rs), b.as_ptr(), c.as_mut_ptr());
    let al = _mm512_set1_ps(alpha);
    for j0 in (0..n).step_by(NB) {
        let (m0, m1) = (lanes(n - j0), lanes((n - j0).saturating_sub(16)));
        let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
        // SAFETY (all below): `p` is in some row's range, `j0 + lane` below
        // `n`, rows below `i0 + ROWS`: within the spans `product` checked;
        // masked lanes are neither read nor written.
        // One depth step: every row (`true`) or those whose range holds `p`.
        macro_rules! step {
            ($p:expr, $every:expr) => {{
                let p = $p;
                let row = bp.add(p * ldb + j0);
                let (b0, b1) = (
                    _mm512_maskz_loadu_ps(m0, row),
                    _mm512_maskz_loadu_ps(m1, row.add(16)),
                );
                for r in 0..ROWS {
                    if $every || (lo[r] <= p && p < hi[r]) {
                        let x = _mm512_set1_ps(*ap.add(r * a.rs + p * a.ps));
                        acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
                        acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
                    }
                }
            }};
        }
        for p in first..all_lo {
            step!(p, false);
        }
        for p in all_lo..all_hi {
            step!(p, true);
        }
        for p in all_hi..last {
            step!(p, false);
        }
        for (r, acc) in acc.iter().enumerate() {
            let out = cp.add((i0 + r) * ldc + j0);
            for (h, mask) in [(0, m0), (1, m1)] {
                let at = out.add(16 * h);
                let mut v = _mm512_mul_ps(acc[h], al);
                if add {
                    v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, at), v);
                }
                _mm512_mask_storeu_ps(at, mask, v);
            }
        }
    }
}

/// `e^v` in every lane, by [`vmath::exp`].
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn exp16(v: __m512) -> __m512 {
    let mut x = [0f32; 16];
    _mm512_storeu_ps(x.as_mut_ptr(), v);
    // A counted loop over one register's lanes: vectorizes.
    for e in &mut x {
        *e = vmath::exp(*e);
    }
    _mm512_loadu_ps(x.as_ptr())
}

/// The softmax of `row` in place; returns its log-sum-exp.
#[target_feature(enable = "avx512f")]
unsafe fn softmax_row(row: &mut [f32]) -> f32 {
    let p = row.as_mut_ptr();
    let n = row.len();
    // SAFETY (all below): lanes past `n` are masked.
    let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
    for j in (0..n).step_by(16) {
        mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(mx, lanes(n - j), p.add(j)));
    }
    let m = _mm512_reduce_max_ps(mx);
    let mv = _mm512_set1_ps(m);
    let mut sum = _mm512_setzero_ps();
    for j in (0..n).step_by(16) {
        let k = lanes(n - j);
        let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p.add(j)), mv));
        _mm512_mask_storeu_ps(p.add(j), k, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(k, p.add(j)));
    }
    let sum = _mm512_reduce_add_ps(sum);
    let r = _mm512_set1_ps(1.0 / sum);
    for j in (0..n).step_by(16) {
        let k = lanes(n - j);
        _mm512_mask_storeu_ps(
            p.add(j),
            k,
            _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p.add(j)), r),
        );
    }
    m + sum.ln()
}

/// `p = exp(s - lse)` and `ds = scale p (dp - dd)` in place over one row
/// (`s` becomes `p`, `dp` becomes `ds`).
#[target_feature(enable = "avx512f")]
unsafe fn softmax_grad_row(s: &mut [f32], dp: &mut [f32], lse: f32, dd: f32, scale: f32) {
    let n = s.len().min(dp.len());
    let (sp, dpp) = (s.as_mut_ptr(), dp.as_mut_ptr());
    let (l, d, sc) = (
        _mm512_set1_ps(lse),
        _mm512_set1_ps(dd),
        _mm512_set1_ps(scale),
    );
    for j in (0..n).step_by(16) {
        let k = lanes(n - j);
        // SAFETY: lanes past `n` are masked.
        let p = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sp.add(j)), l));
        let g = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dpp.add(j)), d);
        _mm512_mask_storeu_ps(sp.add(j), k, p);
        _mm512_mask_storeu_ps(dpp.add(j), k, _mm512_mul_ps(sc, _mm512_mul_ps(p, g)));
    }
}

/// `<x, y>` over equal lengths.
#[target_feature(enable = "avx512f")]
unsafe fn dot(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let mut s = _mm512_setzero_ps();
    for j in (0..n).step_by(16) {
        let k = lanes(n - j);
        // SAFETY: lanes past `n` are masked.
        let (a, b) = (
            _mm512_maskz_loadu_ps(k, x.as_ptr().add(j)),
            _mm512_maskz_loadu_ps(k, y.as_ptr().add(j)),
        );
        s = _mm512_fmadd_ps(a, b, s);
    }
    _mm512_reduce_add_ps(s)
}

/// One head's shape and mask.
#[derive(Clone, Copy)]
struct Head {
    t: usize,
    d: usize,
    scale: f32,
    causal: bool,
}

impl Head {
    /// Tile `[r0, r1)`: its rows, the keys it reaches, and the keys each
    /// of its rows sees (as a [`Depth`] over the tile's rows).
    fn tile(&self, r0: usize) -> (usize, usize, Depth) {
        let r1 = (r0 + TILE).min(self.t);
        if self.causal {
            (r1 - r0, r1, Depth::Through { k: r1, shift: r0 })
        } else {
            (r1 - r0, self.t, Depth::All(self.t))
        }
    }

    /// `s = scale q[r0..] kt` over the tile's visible keys (row stride
    /// `end`).
    unsafe fn scores(&self, r0: usize, q: &[f32], kt: &[f32], s: &mut [f32]) {
        let (rows, end, seen) = self.tile(r0);
        let a = Bcast {
            a: &q[r0 * self.d..],
            rs: self.d,
            ps: 1,
        };
        let d = Depth::All(self.d);
        product(rows, d, seen, a, (kt, self.t), (s, end), self.scale, false);
    }
}

/// Forward of one head: `o` and `lse` from `q`, `kt` (`k` transposed,
/// `[d, t]`) and `v`; `s` holds a score tile.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn forward_head(
    h: Head,
    q: &[f32],
    kt: &[f32],
    v: &[f32],
    o: &mut [f32],
    s: &mut [f32],
    lse: &mut [f32],
) {
    let d = h.d;
    for r0 in (0..h.t).step_by(TILE) {
        let (rows, end, seen) = h.tile(r0);
        h.scores(r0, q, kt, s);
        for i in 0..rows {
            let n = seen.range(i).1;
            lse[r0 + i] = softmax_row(&mut s[i * end..i * end + n]);
        }
        // O = P V over the keys each row sees.
        let p = Bcast {
            a: s,
            rs: end,
            ps: 1,
        };
        product(
            rows,
            seen,
            Depth::All(d),
            p,
            (v, d),
            (&mut o[r0 * d..], d),
            1.0,
            false,
        );
    }
}

/// One head's backward operands: inputs (`kt`, `vt` transposed) and the
/// saved output and its gradient, each `[t, d]` unless noted.
struct Inputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    kt: &'a [f32],
    vt: &'a [f32],
    o: &'a [f32],
    go: &'a [f32],
    lse: &'a [f32],
}

/// Backward of one head into `dq`, `dk`, `dv` (all overwritten); `p` and
/// `ds` hold a tile each, `dd` one value per row.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn backward_head(
    h: Head,
    x: &Inputs,
    [dq, dk, dv]: [&mut [f32]; 3],
    p: &mut [f32],
    ds: &mut [f32],
    dd: &mut [f32],
) {
    let d = h.d;
    for (i, e) in dd.iter_mut().enumerate() {
        *e = dot(&x.go[i * d..(i + 1) * d], &x.o[i * d..(i + 1) * d]);
    }
    dk.fill(0.0);
    dv.fill(0.0);
    for r0 in (0..h.t).step_by(TILE) {
        let (rows, end, seen) = h.tile(r0);
        // P recomputed; dP = dO V^T.
        h.scores(r0, x.q, x.kt, p);
        let go = Bcast {
            a: &x.go[r0 * d..],
            rs: d,
            ps: 1,
        };
        product(
            rows,
            Depth::All(d),
            seen,
            go,
            (x.vt, h.t),
            (ds, end),
            1.0,
            false,
        );
        for i in 0..rows {
            let (at, n) = (i * end, seen.range(i).1);
            let (l, g) = (x.lse[r0 + i], dd[r0 + i]);
            softmax_grad_row(&mut p[at..at + n], &mut ds[at..at + n], l, g, h.scale);
        }
        // dV += P^T dO and dK += dS^T Q over the keys the tile sees, each
        // key from the rows that see it; dQ = dS K.
        let by_key = if h.causal {
            Depth::From { k: rows, shift: r0 }
        } else {
            Depth::All(rows)
        };
        let all = Depth::All(d);
        let (pt, dst) = (
            Bcast {
                a: p,
                rs: 1,
                ps: end,
            },
            Bcast {
                a: ds,
                rs: 1,
                ps: end,
            },
        );
        let (go, q) = (&x.go[r0 * d..], &x.q[r0 * d..]);
        product(end, by_key, all, pt, (go, d), (dv, d), 1.0, true);
        product(end, by_key, all, dst, (q, d), (dk, d), 1.0, true);
        let dsr = Bcast {
            a: ds,
            rs: end,
            ps: 1,
        };
        product(
            rows,
            seen,
            all,
            dsr,
            (x.k, d),
            (&mut dq[r0 * d..], d),
            1.0,
            false,
        );
    }
}

/// `n` values of this thread's scratch, split into `parts` lengths.
fn with_scratch<O>(parts: &[usize], f: impl FnOnce(Vec<&mut [f32]>) -> O) -> O {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let total = parts.iter().sum();
        if s.len() < total {
            s.resize(total, 0.0);
        }
        let mut rest = &mut s[..total];
        let mut out = Vec::with_capacity(parts.len());
        for &n in parts {
            let (a, b) = std::mem::take(&mut rest).split_at_mut(n);
            out.push(a);
            rest = b;
        }
        f(out)
    })
}

/// Row `i` of the `[t, d]` head at `(base, stride)` of `src`, in f32.
#[inline(always)]
fn row_of<T: Element>(src: &[T], (base, stride): (usize, usize), i: usize, d: usize) -> &[T] {
    &src[base + i * stride..base + i * stride + d]
}

#[inline(always)]
fn f32_of<T: Element>(e: T) -> f32 {
    e.to_acc().f64() as f32
}

/// The head at `rows` of `src` into `dst` (`[t, d]`), or transposed
/// (`[d, t]`).
fn gather<T: Element>(
    src: &[T],
    rows: (usize, usize),
    t: usize,
    d: usize,
    dst: &mut [f32],
    transpose: bool,
) {
    if transpose && TypeId::of::<T>() == TypeId::of::<f32>() && t > 0 && d > 0 {
        let (base, stride) = rows;
        // Rows `< t` of `d` values from `base` lie in `src`; `[d, t]` in `dst`.
        assert!(src.len() >= base + (t - 1) * stride + d && dst.len() >= t * d);
        // SAFETY: `T` is f32 (the cast is an identity); in bounds by the
        // check above; AVX-512F is available (the caller's `available`).
        unsafe {
            let from = src.as_ptr().add(base).cast::<f32>();
            crate::device::cpu::transpose::transpose(from, stride, [t, d], dst.as_mut_ptr(), t);
        }
        return;
    }
    for i in 0..t {
        let row = row_of(src, rows, i, d);
        if transpose {
            for (c, &e) in row.iter().enumerate() {
                dst[c * t + i] = f32_of(e);
            }
        } else {
            for (o, &e) in dst[i * d..(i + 1) * d].iter_mut().zip(row) {
                *o = f32_of(e);
            }
        }
    }
}

/// `src` (`[t, d]`) into the head at `(base, stride)` of `dst`.
fn scatter<T: Element>(src: &[f32], (base, stride): (usize, usize), d: usize, dst: &Shared<T>) {
    for (i, row) in src.chunks_exact(d.max(1)).enumerate() {
        let out = dst.row(base + i * stride, d);
        for (y, &a) in out.iter_mut().zip(row) {
            *y = T::from_acc(<Acc<T> as Accum>::of(a as f64));
        }
    }
}

/// [`super::cpu::forward`] on these kernels.
pub(super) fn forward<T: Element>(
    g: &Geometry,
    srcs: [&[T]; 3],
    scale: f64,
    causal: bool,
    out: &mut [T],
    lse: &mut [Acc<T>],
) {
    let (t, d) = (g.t, g.d);
    let h = Head {
        t,
        d,
        scale: scale as f32,
        causal,
    };
    let shared = Shared::new(out);
    let rows = per_head(g, |bh| {
        let parts = [t * d, d * t, t * d, t * d, TILE.min(t) * t, t];
        with_scratch(&parts, |mut b| {
            let [q, kt, v, o, s, l] = &mut b[..] else {
                unreachable!("six parts")
            };
            gather(srcs[0], g.input_rows(0, bh), t, d, q, false);
            gather(srcs[1], g.input_rows(1, bh), t, d, kt, true);
            gather(srcs[2], g.input_rows(2, bh), t, d, v, false);
            // SAFETY: `available()` was checked by the caller.
            unsafe { forward_head(h, q, kt, v, o, s, l) };
            scatter(o, g.out_rows(bh), d, &shared);
            l.iter()
                .map(|&x| <Acc<T> as Accum>::of(x as f64))
                .collect::<Vec<_>>()
        })
    });
    for (dst, src) in lse.chunks_mut(t.max(1)).zip(rows) {
        dst.copy_from_slice(&src);
    }
}

/// [`super::cpu::backward`] on these kernels.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward<T: Element>(
    g: &Geometry,
    srcs: [&[T]; 3],
    out: &[T],
    dout: &[T],
    lse: &[Acc<T>],
    scale: f64,
    causal: bool,
    grads: [&Shared<T>; 3],
) {
    let (t, d) = (g.t, g.d);
    let h = Head {
        t,
        d,
        scale: scale as f32,
        causal,
    };
    let td = t * d;
    let tile = TILE.min(t) * t;
    per_head(g, |bh| {
        let parts = [td, td, td, td, td, td, td, td, td, tile, tile, t, t];
        with_scratch(&parts, |mut b| {
            let [q, k, kt, vt, o, go, dq, dk, dv, p, ds, l, dd] = &mut b[..] else {
                unreachable!("thirteen parts")
            };
            gather(srcs[0], g.input_rows(0, bh), t, d, q, false);
            gather(srcs[1], g.input_rows(1, bh), t, d, k, false);
            gather(srcs[1], g.input_rows(1, bh), t, d, kt, true);
            gather(srcs[2], g.input_rows(2, bh), t, d, vt, true);
            gather(out, g.out_rows(bh), t, d, o, false);
            gather(dout, g.out_rows(bh), t, d, go, false);
            for (y, &x) in l.iter_mut().zip(&lse[bh * t..(bh + 1) * t]) {
                *y = x.f64() as f32;
            }
            let x = Inputs {
                q,
                k,
                kt,
                vt,
                o,
                go,
                lse: l,
            };
            // SAFETY: `available()` was checked by the caller.
            unsafe { backward_head(h, &x, [dq, dk, dv], p, ds, dd) };
            for (w, src) in [&**dq, &**dk, &**dv].into_iter().enumerate() {
                scatter(src, g.input_rows(w, bh), d, grads[w]);
            }
        })
    });
}
