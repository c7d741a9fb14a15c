//! CPU kernels for the fused attention: one task per (batch, head), run on
//! the project's thread team ([`run_each`]); inside a task the query rows
//! are taken [`ROW_TILE`] at a time.
//!
//! A task first gathers its head's `q`, `k`, `v` rows (strided in the
//! packed layout) into contiguous `T::Acc` buffers, so every product below
//! runs on dense matrices in the accumulation type (f32 for f16/bf16),
//! through `matrixmultiply`'s packed kernels (the ones `ops::matmul` uses).
//!
//! Causal masking never multiplies a masked entry: for the row tile
//! `[r0, r1)`, keys `[0, r0)` are seen by every row of the tile and go
//! through the products; the triangle `r0 <= j <= i < r1` is added by plain
//! loops over the visible pairs only. So a NaN at position `j` reaches
//! exactly the rows `i >= j`, never an earlier one (`0 * NaN` is NaN, and a
//! product over the whole tile would leak it).
//!
//! Each task owns its (batch, head)'s output rows and gradient rows, which
//! no other task touches (see [`Shared`]); results do not depend on the
//! thread count.

use super::Geometry;
use crate::device::cpu::run_each;
use crate::dtype::{Accum, Element};
use num_traits::{Float, One, Zero};
use std::any::TypeId;

type Acc<T> = <T as Element>::Acc;

/// Query rows per tile: the score tile is `ROW_TILE x T` values. Measured
/// at T = 64, d = 32 (docs/performance.md, "Attention"): 16 and 32 tie, 8
/// leaves the products too small for `matrixmultiply`, and 64 (all of the
/// causal work in the triangle loops) is 2.5x slower.
pub(crate) const ROW_TILE: usize = 16;

/// Below this many multiply-adds (about `B H T^2 d`) the tasks run on the
/// calling thread.
const PAR_MIN_MACS: usize = 1 << 16;

/// `c = alpha * a @ b + beta * c` for strided `a: [m, k]`, `b: [k, n]`,
/// `c: [m, n]` (strides `(row, column)` in elements), through
/// `matrixmultiply` in `A` (f32 or f64, the only `Accum` types).
#[allow(clippy::too_many_arguments)]
fn gemm<A: Accum>(
    [m, k, n]: [usize; 3],
    alpha: A,
    (a, [rsa, csa]): (&[A], [usize; 2]),
    (b, [rsb, csb]): (&[A], [usize; 2]),
    beta: A,
    (c, [rsc, csc]): (&mut [A], [usize; 2]),
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // An empty sum: `c = beta * c`, and `c` is not read when beta is 0.
        for i in 0..m {
            for j in 0..n {
                let e = &mut c[i * rsc + j * csc];
                *e = if beta == A::zero() {
                    A::zero()
                } else {
                    beta * *e
                };
            }
        }
        return;
    }
    let span = |r: usize, c: usize, rs: usize, cs: usize| {
        if r == 0 || c == 0 {
            0
        } else {
            (r - 1) * rs + (c - 1) * cs + 1
        }
    };
    // Every index the kernel forms lies within these spans, checked once.
    assert!(
        a.len() >= span(m, k, rsa, csa)
            && b.len() >= span(k, n, rsb, csb)
            && c.len() >= span(m, n, rsc, csc)
    );
    let s = |v: usize| v as isize;
    if TypeId::of::<A>() == TypeId::of::<f32>() {
        let f = |v: A| v.f64() as f32;
        // SAFETY: `A` is f32 (so the casts are identities); the kernel reads
        // and writes only within the spans checked above, and `c` is
        // exclusive.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                f(alpha),
                a.as_ptr().cast(),
                s(rsa),
                s(csa),
                b.as_ptr().cast(),
                s(rsb),
                s(csb),
                f(beta),
                c.as_mut_ptr().cast(),
                s(rsc),
                s(csc),
            )
        }
    } else {
        assert!(TypeId::of::<A>() == TypeId::of::<f64>());
        // SAFETY: as above, with `A` f64.
        unsafe {
            matrixmultiply::dgemm(
                m,
                k,
                n,
                alpha.f64(),
                a.as_ptr().cast(),
                s(rsa),
                s(csa),
                b.as_ptr().cast(),
                s(rsb),
                s(csb),
                beta.f64(),
                c.as_mut_ptr().cast(),
                s(rsc),
                s(csc),
            )
        }
    }
}

/// `y += a * x` over equal-length rows (a loop LLVM vectorizes).
#[inline(always)]
fn axpy<A: Accum>(y: &mut [A], a: A, x: &[A]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// An output that tasks write at disjoint places: each (batch, head) task
/// writes only its own head's rows ([`Geometry`] gives every head rows that
/// no other head shares), so no element is written by two tasks.
pub(crate) struct Shared<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: tasks write disjoint elements (see the type's doc), and the
// buffer outlives the launch, which returns only when every task is done.
unsafe impl<T: Send> Send for Shared<T> {}
unsafe impl<T: Send> Sync for Shared<T> {}

impl<T> Shared<T> {
    pub(crate) fn new(s: &mut [T]) -> Self {
        Shared {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }

    /// `len` elements from `off`, which the caller's task alone writes.
    #[allow(clippy::mut_from_ref)]
    pub(super) fn row(&self, off: usize, len: usize) -> &mut [T] {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: in bounds (just checked); exclusive because each task
        // asks only for its own head's rows (the type's invariant).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }
}

/// The rows of head `(b, h)` of `which` (0 `q`, 1 `k`, 2 `v`) gathered into
/// a dense `[t, d]` buffer in `T::Acc`.
fn gather<T: Element>(g: &Geometry, src: &[T], which: usize, bh: usize) -> Vec<Acc<T>> {
    let (base, stride) = g.input_rows(which, bh);
    let mut out = Vec::with_capacity(g.t * g.d);
    for i in 0..g.t {
        let off = base + i * stride;
        out.extend(src[off..off + g.d].iter().map(|v| v.to_acc()));
    }
    out
}

/// The output-shaped rows of head `bh` (the output or its gradient)
/// gathered into a dense `[t, d]` buffer.
fn gather_out<T: Element>(g: &Geometry, src: &[T], bh: usize) -> Vec<Acc<T>> {
    let (base, stride) = g.out_rows(bh);
    let mut out = Vec::with_capacity(g.t * g.d);
    for i in 0..g.t {
        let off = base + i * stride;
        out.extend(src[off..off + g.d].iter().map(|v| v.to_acc()));
    }
    out
}

/// Runs `f(bh)` for every (batch, head), in parallel when the work is
/// large enough, and returns the results in order.
pub(super) fn per_head<O: Send>(g: &Geometry, f: impl Fn(usize) -> O + Sync + Send) -> Vec<O> {
    let heads: Vec<usize> = (0..g.batch * g.heads).collect();
    let macs = g.batch * g.heads * g.t * g.t * g.d.max(1);
    if macs < PAR_MIN_MACS {
        heads.into_iter().map(f).collect()
    } else {
        run_each(heads, f)
    }
}

/// The scores of rows `[r0, r1)` against keys `[0, end)`, scaled, into
/// `s` (row stride `end`): `S = scale * Q[r0..r1] K[0..end]^T`.
fn scores<A: Accum>(
    d: usize,
    scale: A,
    q: &[A],
    k: &[A],
    (r0, r1, end): (usize, usize, usize),
    s: &mut [A],
) {
    gemm(
        [r1 - r0, d, end],
        scale,
        (&q[r0 * d..], [d, 1]),
        (k, [1, d]),
        A::zero(),
        (s, [end, 1]),
    );
}

/// Whether `T` runs on the AVX-512 kernels (`avx512.rs`): f32
/// accumulation on a CPU that has them.
#[cfg(target_arch = "x86_64")]
fn wide<T: Element>() -> bool {
    TypeId::of::<Acc<T>>() == TypeId::of::<f32>() && super::avx512::available()
}

/// The number of keys row `i` sees.
fn seen(causal: bool, t: usize, i: usize) -> usize {
    if causal {
        i + 1
    } else {
        t
    }
}

/// Forward: the output (in `x`'s output layout) and each row's
/// log-sum-exp `lse = m + ln(sum_j exp(s_j - m))` (`[batch, heads, t]`).
/// `srcs` are the `q`, `k`, `v` slices (the same slice three times in the
/// packed layout).
pub(crate) fn forward<T: Element>(
    g: &Geometry,
    srcs: [&[T]; 3],
    scale: f64,
    causal: bool,
    out: &mut [T],
    lse: &mut [Acc<T>],
) {
    #[cfg(target_arch = "x86_64")]
    if wide::<T>() {
        return super::avx512::forward(g, srcs, scale, causal, out, lse);
    }
    let (t, d) = (g.t, g.d);
    let scale = <Acc<T> as Accum>::of(scale);
    let tile = ROW_TILE;
    let shared = Shared::new(out);
    let rows = per_head(g, |bh| {
        let (q, k, v) = (
            gather(g, srcs[0], 0, bh),
            gather(g, srcs[1], 1, bh),
            gather(g, srcs[2], 2, bh),
        );
        let mut lse = vec![Acc::<T>::zero(); t];
        let mut o = vec![Acc::<T>::zero(); tile * d];
        let mut s = vec![Acc::<T>::zero(); tile * t];
        let (obase, ostride) = g.out_rows(bh);
        for r0 in (0..t).step_by(tile) {
            let r1 = (r0 + tile).min(t);
            let end = if causal { r1 } else { t };
            let vis = if causal { r0 } else { t };
            scores(d, scale, &q, &k, (r0, r1, end), &mut s);
            // Softmax per row over the keys it sees; the rest of the tile's
            // row is 0 so the product below adds nothing for it.
            for i in r0..r1 {
                let row = &mut s[(i - r0) * end..(i - r0 + 1) * end];
                let n = seen(causal, t, i);
                let m = row[..n]
                    .iter()
                    .fold(Acc::<T>::neg_infinity(), |a, &b| a.max(b));
                let mut sum = Acc::<T>::zero();
                for e in &mut row[..n] {
                    *e = (*e - m).exp();
                    sum += *e;
                }
                let r = sum.recip();
                for e in &mut row[..n] {
                    *e *= r;
                }
                row[n..].fill(Acc::<T>::zero());
                lse[i] = m + sum.ln();
            }
            // O = P[:, ..vis] V[..vis], then the causal triangle.
            let rows = r1 - r0;
            gemm(
                [rows, vis, d],
                Acc::<T>::one(),
                (&s, [end, 1]),
                (&v, [d, 1]),
                Acc::<T>::zero(),
                (&mut o, [d, 1]),
            );
            if causal {
                for i in r0..r1 {
                    let orow = &mut o[(i - r0) * d..(i - r0 + 1) * d];
                    for j in r0..=i {
                        axpy(orow, s[(i - r0) * end + j], &v[j * d..(j + 1) * d]);
                    }
                }
            }
            for i in r0..r1 {
                let dst = shared.row(obase + i * ostride, d);
                for (y, &a) in dst.iter_mut().zip(&o[(i - r0) * d..]) {
                    *y = T::from_acc(a);
                }
            }
        }
        lse
    });
    for (dst, src) in lse.chunks_mut(t.max(1)).zip(rows) {
        dst.copy_from_slice(&src);
    }
}

/// Backward (FlashAttention-2's, per row tile; see the module doc of
/// `mod.rs` for the formulas): writes `dq`, `dk`, `dv` in the inputs'
/// layout into `grads` (three buffers, or one packed buffer three times
/// over: `grads[w]` receives input `w`'s rows).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Element>(
    g: &Geometry,
    srcs: [&[T]; 3],
    out: &[T],
    dout: &[T],
    lse: &[Acc<T>],
    scale: f64,
    causal: bool,
    grads: [&Shared<T>; 3],
) {
    #[cfg(target_arch = "x86_64")]
    if wide::<T>() {
        return super::avx512::backward(g, srcs, out, dout, lse, scale, causal, grads);
    }
    let (t, d) = (g.t, g.d);
    let scale = <Acc<T> as Accum>::of(scale);
    let tile = ROW_TILE;
    per_head(g, |bh| {
        let zero = Acc::<T>::zero();
        let (q, k, v) = (
            gather(g, srcs[0], 0, bh),
            gather(g, srcs[1], 1, bh),
            gather(g, srcs[2], 2, bh),
        );
        let (o, go) = (gather_out(g, out, bh), gather_out(g, dout, bh));
        let lse = &lse[bh * t..(bh + 1) * t];
        // D_i = sum_c dO_ic O_ic.
        let dd: Vec<Acc<T>> = (0..t)
            .map(|i| {
                let r = i * d..(i + 1) * d;
                go[r.clone()]
                    .iter()
                    .zip(&o[r])
                    .fold(zero, |a, (&x, &y)| a + x * y)
            })
            .collect();
        let (mut dq, mut dk, mut dv) = (vec![zero; t * d], vec![zero; t * d], vec![zero; t * d]);
        let mut p = vec![zero; tile * t];
        let mut ds = vec![zero; tile * t];
        for r0 in (0..t).step_by(tile) {
            let r1 = (r0 + tile).min(t);
            let rows = r1 - r0;
            let end = if causal { r1 } else { t };
            let vis = if causal { r0 } else { t };
            // P = exp(S - lse), recomputed; dP = dO V^T.
            scores(d, scale, &q, &k, (r0, r1, end), &mut p);
            gemm(
                [rows, d, end],
                Acc::<T>::one(),
                (&go[r0 * d..], [d, 1]),
                (&v, [1, d]),
                zero,
                (&mut ds, [end, 1]),
            );
            // dS = P o (dP - D); masked entries are exactly 0 in both.
            for i in r0..r1 {
                let at = (i - r0) * end..(i - r0 + 1) * end;
                let (prow, srow) = (&mut p[at.clone()], &mut ds[at]);
                let n = seen(causal, t, i);
                for (pe, se) in prow[..n].iter_mut().zip(&mut srow[..n]) {
                    *pe = (*pe - lse[i]).exp();
                    *se = *pe * (*se - dd[i]);
                }
                prow[n..].fill(zero);
                srow[n..].fill(zero);
            }
            let one = Acc::<T>::one();
            // dV[..vis] += P[:, ..vis]^T dO; dK[..vis] += scale dS^T Q;
            // dQ = scale dS[:, ..vis] K[..vis].
            gemm(
                [vis, rows, d],
                one,
                (&p, [1, end]),
                (&go[r0 * d..], [d, 1]),
                one,
                (&mut dv, [d, 1]),
            );
            gemm(
                [vis, rows, d],
                scale,
                (&ds, [1, end]),
                (&q[r0 * d..], [d, 1]),
                one,
                (&mut dk, [d, 1]),
            );
            gemm(
                [rows, vis, d],
                scale,
                (&ds, [end, 1]),
                (&k, [d, 1]),
                zero,
                (&mut dq[r0 * d..], [d, 1]),
            );
            if causal {
                for i in r0..r1 {
                    let (gi, qi) = (&go[i * d..(i + 1) * d], &q[i * d..(i + 1) * d]);
                    let dqi = &mut dq[i * d..(i + 1) * d];
                    for j in r0..=i {
                        let (pij, sij) = (p[(i - r0) * end + j], ds[(i - r0) * end + j] * scale);
                        let row = j * d..(j + 1) * d;
                        axpy(&mut dv[row.clone()], pij, gi);
                        axpy(&mut dk[row.clone()], sij, qi);
                        axpy(dqi, sij, &k[row]);
                    }
                }
            }
        }
        for (w, src) in [dq, dk, dv].iter().enumerate() {
            let (base, stride) = g.input_rows(w, bh);
            for i in 0..t {
                let dst = grads[w].row(base + i * stride, d);
                for (y, &a) in dst.iter_mut().zip(&src[i * d..]) {
                    *y = T::from_acc(a);
                }
            }
        }
    });
}
