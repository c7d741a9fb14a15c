//! CPU kernels for the fused LayerNorm.
//!
//! Work split: rows are cut into chunks of [`rows_per_chunk`]`(d)` rows (a
//! function of the row length only). The forward runs one rayon task per
//! chunk (for rows in lockstep, at least [`FWD_TASK_STEPS`] steps of rows:
//! [`fwd_rows_per_task`]). The backward runs one task per *group* of consecutive chunks (see
//! [`rows_per_group`]); each group sums its rows' `dy * xhat` and `dy` into
//! its own partial row, in row order, and the partials are then added in
//! group order. Nothing depends on the number of threads, so every output
//! (`y`, `dx`, `dgamma`, `dbeta`) is bitwise identical for any thread count.
//!
//! The kernels compute in [`Lanes`] of [`LANES`] values; a row sum runs in
//! [`UNROLL`] accumulators (chunk `k` of the row into accumulator
//! `k % UNROLL`, or, for forward rows past 64 KiB, run `j` of [`UNROLL`]
//! equal runs into accumulator `j`: [`segmented`]), added lane-wise and
//! folded pairwise at the end of the row ([`fold_all`]); elements past the
//! last whole chunk are added after the fold, in order. Rows of 16-64 KiB
//! are taken [`ROWS_IN_STEP`] at a time in lockstep ([`rows_in_step`]),
//! which changes no bits: each row keeps its own accumulators, and the
//! dgamma/dbeta partials still add the rows in row order. Each task runs through [`dispatch`], which picks an
//! AVX-512, AVX2 or plain-Rust build for f32 (plain Rust for the other
//! types); all do the same IEEE operations in the same order, so they give
//! the same bits. 16-bit elements are widened to `T::Acc` (f32) on load and
//! every sum, statistic and partial is kept in `T::Acc`. The first pass over
//! each row prefetches a page ahead ([`prefetch`]).
//!
//! Memory traffic is the minimum: the forward reads each row of `x` from
//! memory once (the second statistics pass and the output pass find it in
//! cache) and writes `y` once; the backward reads `x` and `dy` once and
//! writes `dx` once. Outputs come from the buffer pool
//! ([`Tensor::scratch`]), so a large output does not fault in fresh pages
//! on every call, and f32 outputs above [`should_stream`]'s threshold are
//! written with non-temporal stores ([`write_row`]).

pub(crate) use crate::device::cpu::LANES;
use crate::device::cpu::{
    dispatch, dispatch_all, each_chunk, each_chunk_in, fence, fold_all, long_fwd_tasks, overlap,
    paired_partials, prefetch, prefetch_next, rows_in_step, rows_per_chunk, segmented,
    should_stream, stats_first, write_rows, write_rows_with, Kernel, Lanes, ROWS_IN_STEP,
    STATS_FIRST_ROWS, STEP_ROW_BYTES, UNROLL,
};
use crate::device::pool::Buffer;
use crate::dtype::{Accum, Element};
use crate::tensor::Tensor;
use num_traits::{Float, One, Zero};
use rayon::prelude::*;

/// Upper bound on the number of backward groups (and so on partial rows for
/// dgamma/dbeta). A constant, so the partition depends on the shape only.
pub(crate) const MAX_GROUPS: usize = 64;

/// A backward group aims at this many rows at least, so the partial rows
/// (written and read once each) stay within about 2% of the traffic.
pub(crate) const MIN_GROUP_ROWS: usize = 64;

type Acc<T> = <T as Element>::Acc;

/// `d` as an accumulator value.
#[inline(always)]
pub(crate) fn count<A: Accum>(d: usize) -> A {
    A::of(d as f64)
}

/// Rows per backward group: a whole number of chunks, chosen so that there
/// are at most [`MAX_GROUPS`] groups and, where the chunks allow, about
/// [`MIN_GROUP_ROWS`] rows or more in each. Depends only on `(n, d)`.
pub(crate) fn rows_per_group(n: usize, d: usize) -> usize {
    let rpc = rows_per_chunk(d);
    let chunks = n.div_ceil(rpc);
    let target = n.div_ceil(MIN_GROUP_ROWS).clamp(1, MAX_GROUPS);
    rpc * chunks.div_ceil(target).max(1)
}

/// Number of backward groups for `n` rows of `d`.
pub(crate) fn groups(n: usize, d: usize) -> usize {
    n.div_ceil(rows_per_group(n, d))
}

/// `s[i]`, or zero past the end (callers stay in range).
#[inline(always)]
pub(crate) fn at<A: Copy + Default>(s: &[A], i: usize) -> A {
    s.get(i).copied().unwrap_or_default()
}

/// `s[i]` widened, or zero past the end (callers stay in range).
#[inline(always)]
pub(crate) fn wide<T: Element>(s: &[T], i: usize) -> Acc<T> {
    s.get(i).map_or_else(Acc::<T>::zero, |v| v.to_acc())
}

/// A statistics pass over `R` rows of `len()` elements, chunk by chunk:
/// [`RowPass::chunk`] adds one chunk (as [`each_chunk_in`] hands them out),
/// [`RowPass::finish`] folds and adds the elements past the last whole
/// chunk, in order. A joined loop calls `chunk` itself.
trait RowPass<A, const R: usize>: Sized {
    fn len(&self) -> usize;

    /// The chunk at `i` into accumulator `j`.
    ///
    /// # Safety
    /// `i + LANES <= self.len()`.
    unsafe fn chunk(&mut self, j: usize, i: usize);

    fn finish(self) -> [A; R];

    /// The whole pass (`seg` as in [`each_chunk_in`]).
    #[inline(always)]
    fn run(mut self, seg: bool) -> [A; R] {
        each_chunk_in(
            self.len(),
            seg,
            // SAFETY: `each_chunk_in` passes `i + LANES <= len`.
            #[inline(always)]
            |j, i| unsafe { self.chunk(j, i) },
        );
        self.finish()
    }
}

/// Means of `R` rows (advanced in lockstep), each shifted by its first
/// element: `mean = x0 + sum(x - x0) / d` (a [`RowPass`]).
///
/// The shift makes a constant row's mean exact (so its variance is exactly
/// 0) and, for rows with a large common offset, keeps the summands as small
/// as the spread instead of the offset. Each row's sum runs in the same
/// accumulators in the same order whatever `R` is.
struct MeanPass<'a, T: Element, V: Lanes<T>, const R: usize> {
    x: [&'a [T]; R],
    x0: [Acc<T>; R],
    v0: [V; R],
    acc: [[V; UNROLL]; R],
    /// Elements per row (every row is at least this long).
    n: usize,
}

impl<'a, T: Element, V: Lanes<T>, const R: usize> MeanPass<'a, T, V, R> {
    #[inline(always)]
    fn new(x: [&'a [T]; R]) -> Self {
        let zero = Acc::<T>::zero();
        let n = x.iter().map(|r| r.len()).min().unwrap_or(0);
        let x = x.map(|r| head(r, n));
        let x0 = x.map(|r| r.first().map_or(zero, |v| v.to_acc()));
        MeanPass {
            x,
            x0,
            v0: splats::<T, V, R>(x0),
            acc: [[V::splat(zero); UNROLL]; R],
            n,
        }
    }
}

impl<T: Element, V: Lanes<T>, const R: usize> RowPass<Acc<T>, R> for MeanPass<'_, T, V, R> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.n
    }

    #[inline(always)]
    unsafe fn chunk(&mut self, j: usize, i: usize) {
        for s in 0..R {
            prefetch::<T, R>(self.x[s], i);
            // SAFETY: the caller's contract; every row is `n` long.
            let v = unsafe { V::load_at(self.x[s], i) };
            self.acc[s][j] = self.acc[s][j].add(v.sub(self.v0[s]));
        }
    }

    #[inline(always)]
    fn finish(self) -> [Acc<T>; R] {
        let mut out = [Acc::<T>::zero(); R];
        if self.n == 0 {
            return out;
        }
        for (s, o) in out.iter_mut().enumerate() {
            let mut t = fold_all(self.acc[s]);
            for v in self.x[s].as_chunks::<LANES>().1 {
                t += v.to_acc() - self.x0[s];
            }
            *o = self.x0[s] + t / count(self.n);
        }
        out
    }
}

/// `sum((x - m)^2)` over each of `R` rows, given their means: the second
/// of the two passes (a [`RowPass`]).
struct VarPass<'a, T: Element, V: Lanes<T>, const R: usize> {
    x: [&'a [T]; R],
    m: [Acc<T>; R],
    mv: [V; R],
    acc: [[V; UNROLL]; R],
    /// Elements per row (every row is at least this long).
    n: usize,
}

impl<'a, T: Element, V: Lanes<T>, const R: usize> VarPass<'a, T, V, R> {
    #[inline(always)]
    fn new(x: [&'a [T]; R], m: [Acc<T>; R]) -> Self {
        let n = x.iter().map(|r| r.len()).min().unwrap_or(0);
        VarPass {
            x: x.map(|r| head(r, n)),
            m,
            mv: splats::<T, V, R>(m),
            acc: [[V::splat(Acc::<T>::zero()); UNROLL]; R],
            n,
        }
    }
}

impl<T: Element, V: Lanes<T>, const R: usize> RowPass<Acc<T>, R> for VarPass<'_, T, V, R> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.n
    }

    #[inline(always)]
    unsafe fn chunk(&mut self, j: usize, i: usize) {
        for s in 0..R {
            // SAFETY: the caller's contract; every row is `n` long.
            let e = unsafe { V::load_at(self.x[s], i) }.sub(self.mv[s]);
            self.acc[s][j] = self.acc[s][j].add(e.mul(e));
        }
    }

    #[inline(always)]
    fn finish(self) -> [Acc<T>; R] {
        let mut out = [Acc::<T>::zero(); R];
        for (s, o) in out.iter_mut().enumerate() {
            let mut t = fold_all(self.acc[s]);
            for v in self.x[s].as_chunks::<LANES>().1 {
                let e = v.to_acc() - self.m[s];
                t += e * e;
            }
            *o = t;
        }
        out
    }
}

/// Each value in all lanes (a loop, not `array::map`, so that it inlines
/// into the SIMD build).
#[inline(always)]
fn splats<T: Element, V: Lanes<T>, const R: usize>(a: [Acc<T>; R]) -> [V; R] {
    let mut v = [V::splat(Acc::<T>::zero()); R];
    for s in 0..R {
        v[s] = V::splat(a[s]);
    }
    v
}

/// Rows `i..i + R` of `x` (each `d` long; empty past the end).
#[inline(always)]
fn rows_at<A, const R: usize>(x: &[A], i: usize, d: usize) -> [&[A]; R] {
    std::array::from_fn(|s| x.get((i + s) * d..(i + s + 1) * d).unwrap_or_default())
}

/// Rows `i..i + R` of `y`, mutable (each `d` long; empty past the end).
#[inline(always)]
fn rows_at_mut<A, const R: usize>(y: &mut [A], i: usize, d: usize) -> [&mut [A]; R] {
    // Split off row by row: `chunks_exact_mut` divides by `d`, an integer
    // division on every call.
    let mut rest = y.get_mut(i * d..).unwrap_or_default();
    std::array::from_fn(|_| {
        if rest.len() < d {
            return Default::default();
        }
        let (row, tail) = std::mem::take(&mut rest).split_at_mut(d);
        rest = tail;
        row
    })
}

/// `xhat = (x - m) * r` for the lanes at `x[i..]`.
///
/// # Safety
/// `i + LANES <= x.len()`.
#[inline(always)]
unsafe fn xhat_at<T: Element, V: Lanes<T>>(x: &[T], i: usize, m: V, r: V) -> V {
    // SAFETY: the caller's contract.
    unsafe { V::load_at(x, i) }.sub(m).mul(r)
}

/// `xhat = (x - m) * r` for `x[i]` (zero past the end).
#[inline(always)]
fn xhat_one<T: Element>(x: &[T], i: usize, m: Acc<T>, r: Acc<T>) -> Acc<T> {
    (wide(x, i) - m) * r
}

/// The first `n` elements of `s`, or all of it if shorter (callers pass
/// slices of one length; this lets LLVM drop the bounds checks).
#[inline(always)]
pub(crate) fn head<A>(s: &[A], n: usize) -> &[A] {
    &s[..n.min(s.len())]
}

/// One forward task: whole rows of `x` and the matching `y`, `mean`, `rstd`.
/// `G`/`B` say whether gamma/beta are present (their slices are empty if
/// not); `NT` streams `y` past the cache.
struct Fwd<'a, T: Element, const G: bool, const B: bool, const NT: bool> {
    x: &'a [T],
    y: &'a mut [T],
    mean: &'a mut [Acc<T>],
    rstd: &'a mut [Acc<T>],
    gamma: &'a [Acc<T>],
    beta: &'a [Acc<T>],
    d: usize,
    eps: Acc<T>,
    /// Rows ahead that the output pass prefetches (at least `R`).
    ahead_rows: usize,
}

impl<T: Element, const G: bool, const B: bool, const NT: bool> Kernel<T> for Fwd<'_, T, G, B, NT> {
    type Output = ();

    /// Per row: statistics, then `y = (x - m) * rstd * g + b`; the rows go
    /// [`rows_in_step`] at a time, the last few one by one. Where the next
    /// rows exist (and rows are not [`segmented`]), later rows' statistics
    /// passes run inside this rows' output pass ([`write_rows_with`]), so
    /// `x` streams in while `y` streams out: for rows taken one at a time,
    /// the next row's variance pass and the mean pass of the row after it
    /// (no pass then runs on its own); for rows in lockstep, the next rows'
    /// mean pass. Rows too short for that may go [`stats_first`].
    #[inline(always)]
    fn run<V: Lanes<T>>(mut self) {
        let n = self.mean.len().min(self.rstd.len());
        let n = n.min(self.x.len() / self.d.max(1));
        let row_bytes = self.d * std::mem::size_of::<T>();
        let fuse = NT && overlap(row_bytes) && !segmented(row_bytes);
        let mut i = 0;
        if rows_in_step(row_bytes) == ROWS_IN_STEP {
            const S: usize = ROWS_IN_STEP;
            let mut ahead = Ahead::default();
            while i + S <= n {
                ahead = self.rows::<V, S>(i, ahead, fuse && i + 2 * S <= n, false);
                i += S;
            }
        }
        if !fuse && stats_first(row_bytes) {
            while i + STATS_FIRST_ROWS <= n {
                self.stats_first::<V>(i);
                i += STATS_FIRST_ROWS;
            }
        }
        let mut ahead = Ahead::default();
        while i < n {
            ahead = self.rows::<V, 1>(i, ahead, fuse && i + 1 < n, fuse && i + 2 < n);
            i += 1;
        }
        fence::<NT>();
    }
}

/// The statistics passes a forward step has already run for the steps
/// after it: the next rows' means and `sum((x - m)^2)`, and the means of the
/// rows after those.
struct Ahead<A, const R: usize> {
    m: Option<[A; R]>,
    sq: Option<[A; R]>,
    m_after: Option<[A; R]>,
}

impl<A, const R: usize> Default for Ahead<A, R> {
    fn default() -> Self {
        Ahead {
            m: None,
            sq: None,
            m_after: None,
        }
    }
}

impl<T: Element, const G: bool, const B: bool, const NT: bool> Fwd<'_, T, G, B, NT> {
    /// Rows `i..i + STATS_FIRST_ROWS`, one at a time: the statistics
    /// passes of all of them back to back, then their output passes, which
    /// prefetch the rows as many rows ahead (see [`stats_first`]). Each
    /// row's arithmetic is that of [`Fwd::rows`], so the bits are too.
    #[inline(always)]
    fn stats_first<V: Lanes<T>>(&mut self, i: usize) {
        const K: usize = STATS_FIRST_ROWS;
        // Two arrays read back one value at a time: copied out whole, the
        // array of pairs (written one scalar at a time) cost a failed
        // store-to-load forward on every batch.
        let (mut ms, mut sqs) = ([Acc::<T>::zero(); K], [Acc::<T>::zero(); K]);
        for k in 0..K {
            let xr = rows_at::<T, 1>(self.x, i + k, self.d);
            let [m] = MeanPass::<T, V, 1>::new(xr).run(false);
            let [sq] = VarPass::<T, V, 1>::new(xr, [m]).run(false);
            (ms[k], sqs[k]) = (m, sq);
        }
        self.ahead_rows = K;
        for k in 0..K {
            let have = Ahead {
                m: Some([ms[k]]),
                sq: Some([sqs[k]]),
                m_after: None,
            };
            self.rows::<V, 1>(i + k, have, false, false);
        }
        self.ahead_rows = 1;
    }

    /// Rows `i..i + R`, in lockstep: the mean and variance passes (unless
    /// `have` has them already), then the output pass. With `next`, the
    /// output pass carries a pass over rows `i + R..i + 2R`: their mean pass
    /// if `R > 1`, else their variance pass (after their mean pass, unless
    /// `have` has it) and, with `after`, the mean pass of rows
    /// `i + 2R..i + 3R`. What they find is returned.
    #[inline(always)]
    fn rows<V: Lanes<T>, const R: usize>(
        &mut self,
        i: usize,
        have: Ahead<Acc<T>, R>,
        next: bool,
        after: bool,
    ) -> Ahead<Acc<T>, R> {
        let (d, eps) = (self.d, self.eps);
        let xr = rows_at::<T, R>(self.x, i, d);
        let seg = R == 1 && segmented(d * std::mem::size_of::<T>());
        let m = have
            .m
            .unwrap_or_else(|| MeanPass::<T, V, R>::new(xr).run(seg));
        let sq = have
            .sq
            .unwrap_or_else(|| VarPass::<T, V, R>::new(xr, m).run(seg));
        let r = sq.map(|q| Acc::<T>::one() / (q / count(d) + eps).sqrt());
        for s in 0..R {
            if let (Some(mo), Some(ro)) = (self.mean.get_mut(i + s), self.rstd.get_mut(i + s)) {
                (*mo, *ro) = (m[s], r[s]);
            }
        }
        let n = d.min(if G { self.gamma.len() } else { d });
        let n = n.min(if B { self.beta.len() } else { d });
        let xr = xr.map(|x| head(x, n));
        let yr = rows_at_mut::<T, R>(&mut *self.y, i, d).map(|y| {
            let k = n.min(y.len());
            &mut y[..k]
        });
        let (g, b) = (head(self.gamma, n), head(self.beta, n));
        let (mv, rv) = (splats::<T, V, R>(m), splats::<T, V, R>(r));
        // `G` and `B` are constants: each build keeps only its terms, in
        // the order `xhat * g + b`. The next rows are fetched a row ahead
        // only where `y` is streamed, and not when their mean pass runs
        // alongside (it reads them).
        let ahead = NT && !next;
        let (v, sc) = (
            // SAFETY: the writers pass `i + LANES <= n`, and `xr[k]`, `g`,
            // `b` have length `n` (when present).
            #[inline(always)]
            |k: usize, i: usize| unsafe {
                if ahead {
                    prefetch_next(xr[k], R.max(self.ahead_rows) * d, i);
                }
                let mut v = xhat_at(xr[k], i, mv[k], rv[k]);
                if G {
                    v = v.mul(V::load_acc_at(g, i));
                }
                if B {
                    v = v.add(V::load_acc_at(b, i));
                }
                v
            },
            #[inline(always)]
            |k: usize, i: usize| {
                let mut v = xhat_one(xr[k], i, m[k], r[k]);
                if G {
                    v *= at(g, i);
                }
                if B {
                    v += at(b, i);
                }
                v
            },
        );
        if !next {
            write_rows::<T, V, NT, R>(yr, seg, v, sc);
            return Ahead::default();
        }
        let xn = rows_at::<T, R>(self.x, i + R, d);
        if R > 1 {
            // Rows in lockstep carry the next rows' mean pass only: with
            // their variance pass too (three rows' worth of accumulators
            // per row in step), the forward at 8192 x 4096 took 1.05x as
            // long.
            let mut a = MeanPass::<T, V, R>::new(xn);
            write_rows_with::<T, V, NT, R>(
                yr,
                v,
                sc,
                a.n,
                // SAFETY: `write_rows_with` calls this as `each_chunk(a.n,
                // ..)` would, so `k + LANES <= a.n`.
                #[inline(always)]
                |j, k| unsafe { a.chunk(j, k) },
            );
            return Ahead {
                m: Some(a.finish()),
                ..Ahead::default()
            };
        }
        let m_next = have
            .m_after
            .unwrap_or_else(|| MeanPass::<T, V, R>::new(xn).run(false));
        let mut var = VarPass::<T, V, R>::new(xn, m_next);
        let mut mean = MeanPass::<T, V, R>::new(rows_at::<T, R>(self.x, i + 2 * R, d));
        let m_after = if after && mean.n == var.n {
            write_rows_with::<T, V, NT, R>(
                yr,
                v,
                sc,
                var.n,
                // SAFETY: `write_rows_with` calls this as `each_chunk(var.n,
                // ..)` would, so `k + LANES <= var.n = mean.n`.
                #[inline(always)]
                |j, k| unsafe {
                    var.chunk(j, k);
                    mean.chunk(j, k);
                },
            );
            Some(mean.finish())
        } else {
            write_rows_with::<T, V, NT, R>(
                yr,
                v,
                sc,
                var.n,
                // SAFETY: as above, `k + LANES <= var.n`.
                #[inline(always)]
                |j, k| unsafe { var.chunk(j, k) },
            );
            None
        };
        Ahead {
            m: Some(m_next),
            sq: Some(var.finish()),
            m_after,
        }
    }
}

/// The forward's outputs: `y` and the per-row statistics backward needs.
pub(crate) struct Forward<T: Element> {
    pub y: Buffer<T>,
    pub mean: Vec<Acc<T>>,
    pub rstd: Vec<Acc<T>>,
}

/// Widens an optional parameter row to the accumulation type.
pub(crate) fn widen<T: Element>(p: Option<&[T]>) -> Vec<Acc<T>> {
    p.map(|p| p.iter().map(|v| v.to_acc()).collect())
        .unwrap_or_default()
}

/// Steps of [`ROWS_IN_STEP`] rows a forward task over rows in lockstep
/// takes at least (see [`fwd_rows_per_task`]).
pub(crate) const FWD_TASK_STEPS: usize = 16;

/// Rows per forward task: `rpc` ([`rows_per_chunk`]), but for rows taken
/// [`ROWS_IN_STEP`] at a time at least [`FWD_TASK_STEPS`] steps (unless
/// [`long_fwd_tasks`] is off). Only a step with a next step in its task
/// carries that step's mean pass; a chunk of 16384-wide f32 rows is one
/// step, which never did. Measured here, forward time with it on over off
/// (31 reps, interleaved): 0.971-0.977 at 1024 x 16384, 0.983 at
/// 2048 x 8192, 0.986-1.006 at 8192 x 4096 (16 rows, four steps, a chunk).
fn fwd_rows_per_task(row_bytes: usize, rpc: usize) -> usize {
    if long_fwd_tasks() && rows_in_step(row_bytes) == ROWS_IN_STEP {
        rpc.max(FWD_TASK_STEPS * ROWS_IN_STEP)
    } else {
        rpc
    }
}

/// Runs the forward tasks: one per chunk of rows, in parallel when there
/// is more than one.
#[allow(clippy::too_many_arguments)]
fn fwd_launch<T: Element, const G: bool, const B: bool, const NT: bool>(
    x: &[T],
    y: &mut [T],
    mean: &mut [Acc<T>],
    rstd: &mut [Acc<T>],
    gamma: &[Acc<T>],
    beta: &[Acc<T>],
    d: usize,
    eps: Acc<T>,
) {
    let task = |x, y, mean, rstd| {
        dispatch(Fwd::<T, G, B, NT> {
            x,
            y,
            mean,
            rstd,
            gamma,
            beta,
            d,
            eps,
            ahead_rows: 1,
        })
    };
    let rpc = fwd_rows_per_task(d * std::mem::size_of::<T>(), rows_per_chunk(d));
    if mean.len() <= rpc {
        task(x, y, mean, rstd);
    } else {
        x.par_chunks(rpc * d)
            .zip(y.par_chunks_mut(rpc * d))
            .zip(mean.par_chunks_mut(rpc).zip(rstd.par_chunks_mut(rpc)))
            .for_each(|((xc, yc), (mc, rc))| task(xc, yc, mc, rc));
    }
}

/// LayerNorm forward over `x.len() / d` rows of `d` (`d > 0`; a parameter,
/// when given, has `d` elements).
pub(crate) fn forward<T: Element>(
    x: &[T],
    d: usize,
    gamma: Option<&[T]>,
    beta: Option<&[T]>,
    eps: Acc<T>,
) -> Forward<T> {
    let n = x.len() / d;
    let (g, b) = (widen(gamma), widen(beta));
    let mut y = Tensor::<T>::scratch(n * d);
    let mut mean = vec![Acc::<T>::zero(); n];
    let mut rstd = vec![Acc::<T>::zero(); n];
    let run = match (gamma.is_some(), beta.is_some(), should_stream::<T>(n * d)) {
        (true, true, false) => fwd_launch::<T, true, true, false>,
        (true, false, false) => fwd_launch::<T, true, false, false>,
        (false, true, false) => fwd_launch::<T, false, true, false>,
        (false, false, false) => fwd_launch::<T, false, false, false>,
        (true, true, true) => fwd_launch::<T, true, true, true>,
        (true, false, true) => fwd_launch::<T, true, false, true>,
        (false, true, true) => fwd_launch::<T, false, true, true>,
        (false, false, true) => fwd_launch::<T, false, false, true>,
    };
    run(&x[..n * d], &mut y, &mut mean, &mut rstd, &g, &b, d, eps);
    Forward { y, mean, rstd }
}

/// Rows that pass A reads: `x`, `dy` and their saved statistics, as scalars
/// and splatted.
struct Rows<'a, T: Element, V: Lanes<T>, const R: usize> {
    x: [&'a [T]; R],
    dy: [&'a [T]; R],
    m: [Acc<T>; R],
    r: [Acc<T>; R],
    mv: [V; R],
    rv: [V; R],
}

impl<'a, T: Element, V: Lanes<T>, const R: usize> Rows<'a, T, V, R> {
    #[inline(always)]
    fn new(x: [&'a [T]; R], dy: [&'a [T]; R], (m, r): ([Acc<T>; R], [Acc<T>; R])) -> Self {
        Rows {
            x,
            dy,
            m,
            r,
            mv: splats::<T, V, R>(m),
            rv: splats::<T, V, R>(r),
        }
    }

    /// The shortest of the row slices.
    #[inline(always)]
    fn len(&self) -> usize {
        self.x
            .iter()
            .chain(&self.dy)
            .map(|v| v.len())
            .min()
            .unwrap_or(0)
    }

    /// The rows cut to `n` elements.
    #[inline(always)]
    fn head(self, n: usize) -> Self {
        Rows {
            x: self.x.map(|v| head(v, n)),
            dy: self.dy.map(|v| head(v, n)),
            ..self
        }
    }

    /// Row `s`'s chunk at `i`: `(xhat, dy)`; with `pf`, prefetches ahead
    /// of it (rows read from memory, not the cached `prev`).
    ///
    /// # Safety
    /// `i + LANES` within row `s`'s slices.
    #[inline(always)]
    unsafe fn load(&self, s: usize, i: usize, pf: bool) -> (V, V) {
        // SAFETY: the caller's contract.
        unsafe {
            if pf {
                prefetch::<T, R>(self.x[s], i);
                prefetch::<T, R>(self.dy[s], i);
            }
            let xh = V::load_at(self.x[s], i).sub(self.mv[s]).mul(self.rv[s]);
            (xh, V::load_at(self.dy[s], i))
        }
    }

    /// Adds the rows' terms at `k` past the last whole chunk to the
    /// partials, row after row.
    #[inline(always)]
    fn add_tail(&self, pg: &mut [Acc<T>], pb: &mut [Acc<T>], t: usize, n: usize) {
        for s in 0..R {
            for k in t..n {
                let xh = (wide(self.x[s], k) - self.m[s]) * self.r[s];
                let dyv = wide(self.dy[s], k);
                if let (Some(pgv), Some(pbv)) = (pg.get_mut(k), pb.get_mut(k)) {
                    *pgv += dyv * xh;
                    *pbv += dyv;
                }
            }
        }
    }
}

/// Pass A of `R` backward rows in lockstep (reads `x`, `dy` from memory):
/// `xhat = (x - m) * r`, `g = dy * gamma`; sums `g` and `g * xhat` per row
/// (if `DX`) and adds the partials `pg += dy * xhat`, `pb += dy` (if `P`),
/// row after row, so each partial sees the rows in row order whatever `R`
/// is. [`PassA::chunk`] does one chunk (as [`each_chunk`] hands them out),
/// [`PassA::finish`] folds and adds the elements past the last whole chunk,
/// in order.
///
/// Paired partials: with `own` false the rows' partials are left to the
/// next rows' pass A, which gets them as `prev` and adds them, then its
/// own, in one read-modify-write of `pg`, `pb` (so the partial row is read
/// and written once per two groups of rows, and every element still sees
/// the rows in row order: the same bits).
struct PassA<'a, T: Element, V: Lanes<T>, const DX: bool, const P: bool, const R: usize> {
    cur: Rows<'a, T, V, R>,
    prev: Option<Rows<'a, T, V, R>>,
    /// Whether this pass adds its own rows' partials.
    own: bool,
    gamma: &'a [Acc<T>],
    s1: [[V; UNROLL]; R],
    s2: [[V; UNROLL]; R],
    /// Elements per row that pass A covers (every slice is at least this
    /// long).
    n: usize,
}

impl<'a, T: Element, V: Lanes<T>, const DX: bool, const P: bool, const R: usize>
    PassA<'a, T, V, DX, P, R>
{
    #[inline(always)]
    fn new(
        cur: Rows<'a, T, V, R>,
        prev: Option<Rows<'a, T, V, R>>,
        own: bool,
        gamma: &'a [Acc<T>],
        (pg, pb): (&[Acc<T>], &[Acc<T>]),
    ) -> Self {
        let zero = V::splat(Acc::<T>::zero());
        let n = cur.len().min(gamma.len());
        let n = prev.as_ref().map_or(n, |p| n.min(p.len()));
        let n = if P { n.min(pg.len()).min(pb.len()) } else { n };
        PassA {
            cur: cur.head(n),
            prev: prev.map(|p| p.head(n)),
            own: P && own,
            gamma,
            s1: [[zero; UNROLL]; R],
            s2: [[zero; UNROLL]; R],
            n,
        }
    }

    /// The chunk at `i` into accumulator `j`, adding the partials of the
    /// rows themselves if `OWN` and of `prev` first if `PREV`: constants,
    /// so that the hot loop has no branches on them; the caller picks them
    /// to match `own` and `prev` (see [`PassA::mode`]).
    ///
    /// # Safety
    /// `i + LANES <= self.n`, and `pg`, `pb` (if `P`) at least `self.n`
    /// long.
    #[inline(always)]
    unsafe fn chunk<const OWN: bool, const PREV: bool>(
        &mut self,
        pg: &mut [Acc<T>],
        pb: &mut [Acc<T>],
        j: usize,
        i: usize,
    ) {
        let zero = V::splat(Acc::<T>::zero());
        let part = P && (OWN || PREV);
        // SAFETY: the caller's contract; every slice read or written here
        // is at least `n` long.
        unsafe {
            let gam = V::load_acc_at(self.gamma, i);
            let (mut pgv, mut pbv) = (zero, zero);
            if part {
                (pgv, pbv) = (V::load_acc_at(pg, i), V::load_acc_at(pb, i));
            }
            if let (true, true, Some(p)) = (P, PREV, &self.prev) {
                for s in 0..R {
                    let (xh, dyv) = p.load(s, i, false);
                    pgv = pgv.add(dyv.mul(xh));
                    pbv = pbv.add(dyv);
                }
            }
            for s in 0..R {
                let (xh, dyv) = self.cur.load(s, i, true);
                let g = dyv.mul(gam);
                if DX {
                    self.s1[s][j] = self.s1[s][j].add(g);
                    self.s2[s][j] = self.s2[s][j].add(g.mul(xh));
                }
                if P && OWN {
                    pgv = pgv.add(dyv.mul(xh));
                    pbv = pbv.add(dyv);
                }
            }
            if part {
                pgv.store_acc_at(pg, i);
                pbv.store_acc_at(pb, i);
            }
        }
    }

    /// Per row, the sums of `g` and `g * xhat` (zero unless `DX`).
    #[inline(always)]
    fn finish(self, pg: &mut [Acc<T>], pb: &mut [Acc<T>]) -> [(Acc<T>, Acc<T>); R] {
        let (n, gamma) = (self.n, self.gamma);
        let t = n / LANES * LANES;
        if let (true, Some(p)) = (P, &self.prev) {
            p.add_tail(pg, pb, t, n);
        }
        if self.own {
            self.cur.add_tail(pg, pb, t, n);
        }
        let mut out = [(Acc::<T>::zero(), Acc::<T>::zero()); R];
        if !DX {
            return out;
        }
        for (s, o) in out.iter_mut().enumerate() {
            let (mut a1, mut a2) = (fold_all(self.s1[s]), fold_all(self.s2[s]));
            let c = &self.cur;
            for k in t..n {
                let xh = (wide(c.x[s], k) - c.m[s]) * c.r[s];
                let g = wide(c.dy[s], k) * at(gamma, k);
                a1 += g;
                a2 += g * xh;
            }
            *o = (a1, a2);
        }
        out
    }

    /// Which partials the chunks add: 0, the rows' own; 1, none (left to
    /// the next pass A); 2, `prev`'s then the own.
    #[inline(always)]
    fn mode(&self) -> u8 {
        if !P || R > 1 {
            // No partials, or lockstep rows, which never pair: one build.
            return 0;
        }
        match (self.prev.is_some(), self.own) {
            (true, _) => 2,
            (false, true) => 0,
            (false, false) => 1,
        }
    }

    /// The whole pass.
    #[inline(always)]
    fn run(mut self, pg: &mut [Acc<T>], pb: &mut [Acc<T>]) -> [(Acc<T>, Acc<T>); R] {
        // SAFETY (each closure): `each_chunk` passes `i + LANES <= n`;
        // `new` made `pg`, `pb` at least `n` long when `P`.
        match self.mode() {
            0 => each_chunk(
                self.n,
                #[inline(always)]
                |j, i| unsafe { self.chunk::<true, false>(pg, pb, j, i) },
            ),
            1 => each_chunk(
                self.n,
                #[inline(always)]
                |j, i| unsafe { self.chunk::<false, false>(pg, pb, j, i) },
            ),
            _ => each_chunk(
                self.n,
                #[inline(always)]
                |j, i| unsafe { self.chunk::<true, true>(pg, pb, j, i) },
            ),
        }
        self.finish(pg, pb)
    }
}

/// Row sums from pass A, `(sum g, sum g * xhat)` per row.
type Sums<T, const R: usize> = [(Acc<T>, Acc<T>); R];

/// One backward task: a group of consecutive rows, their `dx` (empty unless
/// `DX`) and, if `P`, its partial row `[pg | pb]` of `2d` (its contents on
/// entry do not matter: the task zeroes it). `NT` streams `dx` past the
/// cache.
struct Bwd<'a, T: Element, const DX: bool, const P: bool, const NT: bool> {
    x: &'a [T],
    dy: &'a [T],
    mean: &'a [Acc<T>],
    rstd: &'a [Acc<T>],
    dx: &'a mut [T],
    gamma: &'a [Acc<T>],
    d: usize,
    part: &'a mut [Acc<T>],
}

impl<T: Element, const DX: bool, const P: bool, const NT: bool> Kernel<T>
    for Bwd<'_, T, DX, P, NT>
{
    type Output = ();

    /// Per row: pass A ([`PassA`]), then, with the row still in cache,
    /// pass B: `dx = r * (g - mean(g) - xhat * mean(g * xhat))`; the rows go
    /// [`rows_in_step`] at a time, the last few one by one. Where the next
    /// rows exist, their pass A runs inside this rows' pass B
    /// ([`write_rows_with`]), so `x` and `dy` stream in while `dx` streams
    /// out.
    #[inline(always)]
    fn run<V: Lanes<T>>(mut self) {
        let d = self.d;
        let part = std::mem::take(&mut self.part);
        part.fill(Acc::<T>::zero());
        let (pg, pb) = part.split_at_mut(if P { d } else { 0 });
        let n = self.mean.len().min(self.rstd.len());
        let n = n.min(self.x.len().min(self.dy.len()) / d.max(1));
        let fuse = DX && NT && overlap(d * std::mem::size_of::<T>());
        let mut i = 0;
        if rows_in_step(d * std::mem::size_of::<T>()) == ROWS_IN_STEP {
            let mut sums = None;
            while i + ROWS_IN_STEP <= n {
                let next = fuse && i + 2 * ROWS_IN_STEP <= n;
                let after = fuse && i + 3 * ROWS_IN_STEP <= n;
                sums = self.rows::<V, ROWS_IN_STEP>(i, pg, pb, sums, (next, after));
                i += ROWS_IN_STEP;
            }
        }
        let mut sums = None;
        while i < n {
            let (next, after) = (fuse && i + 1 < n, fuse && i + 2 < n);
            sums = self.rows::<V, 1>(i, pg, pb, sums, (next, after));
            i += 1;
        }
        fence::<NT>();
    }
}

impl<'a, T: Element, const DX: bool, const P: bool, const NT: bool> Bwd<'a, T, DX, P, NT> {
    /// The saved mean and rstd of rows `i..i + R` (zero past the end).
    #[inline(always)]
    fn stats<const R: usize>(&self, i: usize) -> ([Acc<T>; R], [Acc<T>; R]) {
        let stat = |v: &[Acc<T>], s: usize| v.get(i + s).copied().unwrap_or_default();
        (
            std::array::from_fn(|s| stat(self.mean, s)),
            std::array::from_fn(|s| stat(self.rstd, s)),
        )
    }

    /// Rows `i..i + R` as pass A reads them (they borrow the rows, not
    /// `self`).
    #[inline(always)]
    fn rows_a<V: Lanes<T>, const R: usize>(&self, i: usize) -> Rows<'a, T, V, R> {
        let d = self.d;
        Rows::new(
            rows_at::<T, R>(self.x, i, d),
            rows_at::<T, R>(self.dy, i, d),
            self.stats::<R>(i),
        )
    }

    /// Pass A's state for rows `i..i + R`, carrying the partials of rows
    /// `prev..prev + R` if given, and adding its own unless `defer`.
    #[inline(always)]
    fn pass_a<V: Lanes<T>, const R: usize>(
        &self,
        i: usize,
        prev: Option<usize>,
        defer: bool,
        pg: &[Acc<T>],
        pb: &[Acc<T>],
    ) -> PassA<'a, T, V, DX, P, R> {
        let prev = prev.map(|k| self.rows_a::<V, R>(k));
        PassA::new(self.rows_a::<V, R>(i), prev, !defer, self.gamma, (pg, pb))
    }

    /// Rows `i..i + R`, in lockstep: pass A (unless `sums` has it already),
    /// then pass B; with `next`, pass A of rows `i + R..i + 2R` runs inside
    /// pass B, and its sums are returned. The flag beside the sums says
    /// that pass A left its rows' partials to the next pass A (paired
    /// partials, see [`PassA`]): for single rows only, and only where that
    /// next pass A exists (`next` here, `after` for rows `i + R..`).
    #[inline(always)]
    fn rows<V: Lanes<T>, const R: usize>(
        &mut self,
        i: usize,
        pg: &mut [Acc<T>],
        pb: &mut [Acc<T>],
        sums: Option<(Sums<T, R>, bool)>,
        (next, after): (bool, bool),
    ) -> Option<(Sums<T, R>, bool)> {
        let d = self.d;
        let pair = P && R == 1 && paired_partials(d * std::mem::size_of::<T>());
        let (sums, deferred) = match sums {
            Some(s) => s,
            None => {
                let defer = pair && next;
                let sums = self.pass_a::<V, R>(i, None, defer, pg, pb).run(pg, pb);
                (sums, defer)
            }
        };
        if !DX {
            return None;
        }
        let (m, r) = self.stats::<R>(i);
        let inv_d = Acc::<T>::one() / count(d);
        let mg = sums.map(|(s1, _)| s1 * inv_d);
        let mgx = sums.map(|(_, s2)| s2 * inv_d);
        let gamma = self.gamma;
        let n = d.min(gamma.len());
        let (xr, dyr, g) = (
            rows_at::<T, R>(self.x, i, d).map(|v| head(v, n)),
            rows_at::<T, R>(self.dy, i, d).map(|v| head(v, n)),
            head(gamma, n),
        );
        let (mv, rv) = (splats::<T, V, R>(m), splats::<T, V, R>(r));
        let (mgv, mgxv) = (splats::<T, V, R>(mg), splats::<T, V, R>(mgx));
        let defer = pair && !deferred && after;
        let a = next.then(|| self.pass_a::<V, R>(i + R, deferred.then_some(i), defer, pg, pb));
        let dxr = rows_at_mut::<T, R>(&mut *self.dx, i, d).map(|v| {
            let k = n.min(v.len());
            &mut v[..k]
        });
        // The next rows' `x` and `dy` are fetched a row ahead only for
        // outputs large enough to stream (smaller data is in cache anyway,
        // and the prefetches cost 5-10% at 512 x 2048), not for rows past
        // 64 KiB, whose next `x` and `dy` would not fit in L2 beside this
        // row's, `gamma` and the partials (80 -> 87 ms at 2048 x 65536), and
        // not when the next rows' pass A runs alongside (it reads them).
        let ahead = !next && NT && d * std::mem::size_of::<T>() <= *STEP_ROW_BYTES.end();
        // SAFETY (both closures' loads): the writers pass `k + LANES <= n`;
        // `xr[s]`, `dyr[s]` and `g` have length `n`.
        let (v, sc) = (
            #[inline(always)]
            |s: usize, k: usize| unsafe {
                if ahead {
                    prefetch_next(xr[s], R * d, k);
                    prefetch_next(dyr[s], R * d, k);
                }
                let xh = V::load_at(xr[s], k).sub(mv[s]).mul(rv[s]);
                let g = V::load_at(dyr[s], k).mul(V::load_acc_at(g, k));
                rv[s].mul(g.sub(mgv[s]).sub(xh.mul(mgxv[s])))
            },
            #[inline(always)]
            |s: usize, k: usize| {
                let xh = (wide(xr[s], k) - m[s]) * r[s];
                let g = wide(dyr[s], k) * at(g, k);
                r[s] * (g - mg[s] - xh * mgx[s])
            },
        );
        let Some(mut a) = a else {
            write_rows::<T, V, NT, R>(dxr, false, v, sc);
            if deferred {
                // Not reached (rows defer only when `next`), but never lose
                // the partials.
                self.pass_a::<V, R>(i, None, false, pg, pb).run(pg, pb);
            }
            return None;
        };
        // SAFETY (each closure): `write_rows_with` calls it as
        // `each_chunk(a.n, ..)` would, so `k + LANES <= a.n`; `new` made
        // `pg`, `pb` that long.
        let n = a.n;
        match a.mode() {
            0 => write_rows_with::<T, V, NT, R>(
                dxr,
                v,
                sc,
                n,
                #[inline(always)]
                |j, k| unsafe { a.chunk::<true, false>(pg, pb, j, k) },
            ),
            1 => write_rows_with::<T, V, NT, R>(
                dxr,
                v,
                sc,
                n,
                #[inline(always)]
                |j, k| unsafe { a.chunk::<false, false>(pg, pb, j, k) },
            ),
            _ => write_rows_with::<T, V, NT, R>(
                dxr,
                v,
                sc,
                n,
                #[inline(always)]
                |j, k| unsafe { a.chunk::<true, true>(pg, pb, j, k) },
            ),
        }
        Some((a.finish(pg, pb), defer))
    }
}

/// The backward's outputs; `None` where not asked for.
pub(crate) struct Backward<T: Element> {
    pub dx: Option<Buffer<T>>,
    pub dgamma: Option<Buffer<T>>,
    pub dbeta: Option<Buffer<T>>,
}

/// The backward groups' partial rows, if `want`: one row of `width` per
/// group of `rpg` rows of `d` in `len` elements, in one buffer from the
/// pool (each task zeroes its own row); else none. As
/// fresh vectors, the 32 partial rows of 512 KiB at 2048 x 65536 f32
/// faulted 16 MiB of new pages into every backward call. Measured here,
/// backward time pooled over fresh (21 reps, interleaved, two runs):
/// 0.91-0.94 at 1024 x 16384, 0.94-0.96 at 16384 x 1024, 0.96-0.99 at
/// 8192 x 4096, 0.97-0.99 at 65536 x 256, 0.99 at 4096 x 768; 0.95 and
/// 1.00 at 32768 x 128, 0.985 and 1.04 at 2048 x 65536.
pub(crate) fn partial_rows<A: Element>(
    want: bool,
    len: usize,
    (rpg, d): (usize, usize),
    width: usize,
) -> Buffer<A> {
    if want {
        Buffer::take(len.div_ceil(rpg * d) * width)
    } else {
        Buffer::default()
    }
}

/// Sums the groups' partial rows (`parts`, rows of `width`) in group order,
/// column block by column block (in parallel for wide rows; each column's
/// order is the same).
pub(crate) fn reduce_partials<A: Accum>(parts: &[A], width: usize) -> Vec<A> {
    let mut out = vec![A::zero(); width];
    const COLS: usize = 4096;
    let sum_cols = |(c, o): (usize, &mut [A])| {
        for p in parts.chunks_exact(width.max(1)) {
            for (ov, pv) in o.iter_mut().zip(p.iter().skip(c * COLS)) {
                *ov += *pv;
            }
        }
    };
    if parts.len() <= 1 << 16 {
        out.chunks_mut(COLS).enumerate().for_each(sum_cols);
    } else {
        out.par_chunks_mut(COLS).enumerate().for_each(sum_cols);
    }
    out
}

/// Runs the backward groups (in parallel when there are several), group
/// `k` filling row `k` of `parts` (rows of `2d`) with its partials if `P`.
#[allow(clippy::too_many_arguments)]
fn bwd_launch<T: Element, const DX: bool, const P: bool, const NT: bool>(
    x: &[T],
    dy: &[T],
    mean: &[Acc<T>],
    rstd: &[Acc<T>],
    dx: &mut [T],
    gamma: &[Acc<T>],
    d: usize,
    rpg: usize,
    parts: &mut [Acc<T>],
) {
    let mut dx_groups = dx.chunks_mut(rpg * d);
    let mut part_rows = parts.chunks_mut(2 * d);
    let jobs: Vec<Bwd<'_, T, DX, P, NT>> = x
        .chunks(rpg * d)
        .zip(dy.chunks(rpg * d))
        .zip(mean.chunks(rpg).zip(rstd.chunks(rpg)))
        .map(|((x, dy), (mean, rstd))| Bwd {
            x,
            dy,
            mean,
            rstd,
            dx: if DX {
                dx_groups.next().unwrap_or_default()
            } else {
                Default::default()
            },
            gamma,
            d,
            part: part_rows.next().unwrap_or_default(),
        })
        .collect();
    dispatch_all(jobs);
}

/// LayerNorm backward. `gamma` of `None` means the identity scale.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Element>(
    x: &[T],
    dy: &[T],
    d: usize,
    gamma: Option<&[T]>,
    mean: &[Acc<T>],
    rstd: &[Acc<T>],
    want_dx: bool,
    want_dgamma: bool,
    want_dbeta: bool,
) -> Backward<T>
where
    Acc<T>: Element,
{
    let n = x.len() / d;
    let want_p = want_dgamma || want_dbeta;
    let g = match gamma {
        Some(_) => widen(gamma),
        None => vec![<Acc<T> as One>::one(); d],
    };
    let rpg = rows_per_group(n, d);
    let mut dx = if want_dx {
        Tensor::<T>::scratch(n * d)
    } else {
        Buffer::default()
    };
    let run = match (want_dx, want_p, should_stream::<T>(n * d)) {
        (true, true, false) => bwd_launch::<T, true, true, false>,
        (true, false, false) => bwd_launch::<T, true, false, false>,
        (true, true, true) => bwd_launch::<T, true, true, true>,
        (true, false, true) => bwd_launch::<T, true, false, true>,
        (false, true, _) => bwd_launch::<T, false, true, false>,
        (false, false, _) => bwd_launch::<T, false, false, false>,
    };
    let mut parts = partial_rows(want_p, x.len(), (rpg, d), 2 * d);
    run(x, dy, mean, rstd, &mut dx, &g, d, rpg, &mut parts);
    let (dgamma, dbeta) = if want_p {
        let sums = reduce_partials(&parts, 2 * d);
        let (sg, sb) = sums.split_at(d);
        (
            want_dgamma.then(|| Buffer::from_vec(sg.iter().map(|&v| T::from_acc(v)).collect())),
            want_dbeta.then(|| Buffer::from_vec(sb.iter().map(|&v| T::from_acc(v)).collect())),
        )
    } else {
        (None, None)
    };
    Backward {
        dx: want_dx.then_some(dx),
        dgamma,
        dbeta,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cpu::{
        best_simd, set_simd_limit, set_stream_threshold, stream_threshold, Simd,
    };
    use crate::ops::rms_norm::cpu as rms;
    use crate::rng::Rng;

    /// Every output of LayerNorm and RMSNorm, forward and backward, as bits.
    fn outputs(x: &[f32], dy: &[f32], g: &[f32], b: &[f32], d: usize) -> Vec<Vec<u32>> {
        let bits = |v: &[f32]| v.iter().map(|a| a.to_bits()).collect::<Vec<u32>>();
        let f = forward(x, d, Some(g), Some(b), 1e-5);
        let bw = backward(x, dy, d, Some(g), &f.mean, &f.rstd, true, true, true);
        let (ry, rr) = rms::forward(x, d, Some(g), 1e-5);
        let (rdx, rdg) = rms::backward(x, dy, d, Some(g), &rr, true, true);
        let mut out = vec![
            bits(&f.y),
            bits(&f.mean),
            bits(&f.rstd),
            bits(&ry),
            bits(&rr),
        ];
        for v in [bw.dx, bw.dgamma, bw.dbeta, rdx, rdg] {
            out.push(bits(&v.unwrap_or_default()));
        }
        out
    }

    /// `x`, `dy`, `gamma`, `beta`.
    type Case = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

    /// Random `x`, `dy` (`n * d` each), `gamma` and `beta` (`d` each), in
    /// that order: normals times `a` plus `b`.
    fn case(rng: &mut Rng, n: usize, d: usize, a: f64, b: f64) -> Case {
        let mut v =
            |k: usize| -> Vec<f32> { (0..k).map(|_| (rng.normal() * a + b) as f32).collect() };
        (v(n * d), v(n * d), v(d), v(d))
    }

    /// Asserts that every output is the same, streamed and not, with a
    /// speed switch `set` off and on (left on).
    fn same_bits_either_way(set: fn(bool), case: &Case, d: usize) {
        let (x, dy, g, b) = case;
        let old = stream_threshold();
        for stream in [usize::MAX, 0] {
            set_stream_threshold(stream);
            set(false);
            let want = outputs(x, dy, g, b, d);
            set(true);
            let got = outputs(x, dy, g, b, d);
            assert!(got == want, "n={} d={d} stream={stream}", x.len() / d);
        }
        set_stream_threshold(old);
    }

    /// Held by the tests that flip [`set_segmented`] or depend on it
    /// staying put (it changes the bits of long rows; the other switches
    /// do not).
    static SEGMENTED: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn every_build_and_store_kind_gives_the_same_bits() {
        let _hold = SEGMENTED.lock();
        let mut rng = Rng::new(5);
        // Row lengths around the lane and unroll boundaries, and rows that
        // start at every alignment.
        for (n, d) in [
            (3usize, 1usize),
            (5, 15),
            (4, 16),
            (7, 17),
            (3, 63),
            (2, 64),
            (9, 100),
            (6, 1000),
            (3, 4099),
            (2, 16_400),
            (2, 20_003),
        ] {
            let (x, dy, g, b) = case(&mut rng, n, d, 3.0, 1.0);
            set_simd_limit(Simd::Portable);
            let want = outputs(&x, &dy, &g, &b, d);
            for limit in [Simd::Avx2, Simd::Avx512] {
                if limit <= best_simd() {
                    set_simd_limit(limit);
                    assert!(outputs(&x, &dy, &g, &b, d) == want, "{limit} n={n} d={d}");
                }
            }
            let old = stream_threshold();
            set_stream_threshold(0);
            assert!(outputs(&x, &dy, &g, &b, d) == want, "streamed n={n} d={d}");
            set_stream_threshold(old);
            set_simd_limit(Simd::Avx512);
        }
    }

    #[test]
    fn lockstep_rows_give_the_same_bits_as_one_at_a_time() {
        let _hold = SEGMENTED.lock();
        use crate::device::cpu::{rows_in_step, set_lockstep};
        let mut rng = Rng::new(11);
        // Rows inside the lockstep range: whole steps plus a remainder, a
        // row length that is not a multiple of the lanes (unequal
        // alignment, so the write falls back to one row at a time) and one
        // whose rows all share an alignment.
        for (n, d) in [(9usize, 4096usize), (7, 4100), (6, 16384)] {
            assert_eq!(rows_in_step(d * 4), ROWS_IN_STEP, "d={d}");
            same_bits_either_way(set_lockstep, &case(&mut rng, n, d, 2.0, -0.5), d);
        }
    }

    #[test]
    fn long_forward_tasks_change_no_bits() {
        let _hold = SEGMENTED.lock();
        use crate::device::cpu::set_long_fwd_tasks;
        let mut rng = Rng::new(23);
        // Several tasks either way, the last one short.
        for (n, d) in [(150usize, 4096usize), (70, 16384)] {
            let rpc = rows_per_chunk(d);
            set_long_fwd_tasks(false);
            assert_eq!(fwd_rows_per_task(d * 4, rpc), rpc, "d={d}");
            set_long_fwd_tasks(true);
            let rows = fwd_rows_per_task(d * 4, rpc);
            assert_eq!(rows, FWD_TASK_STEPS * ROWS_IN_STEP, "d={d}");
            assert!(n > rows && n % rows != 0, "n={n} d={d}");
            same_bits_either_way(set_long_fwd_tasks, &case(&mut rng, n, d, 1.5, 3.0), d);
        }
    }

    #[test]
    fn recycled_partial_rows_start_from_zero() {
        // 64 groups of 4096-wide f32 partials (two rows each for LayerNorm,
        // one for RMSNorm): at least 1 MiB, so the partial rows come from
        // the pool, and each call gets the one before's.
        let (n, d) = (4096usize, 4096usize);
        assert!(groups(n, d) * d * 4 >= crate::device::pool::MIN_POOLED_BYTES);
        let mut rng = Rng::new(29);
        let (x, dy, g, b) = case(&mut rng, n, d, 1.0, 0.5);
        let f = forward(&x, d, Some(&g), Some(&b), 1e-5);
        let ones = vec![1.0f32; n * d];
        for dy in [&ones, &dy, &dy] {
            let bw = backward(&x, dy, d, Some(&g), &f.mean, &f.rstd, false, true, true);
            let (dg, db) = (bw.dgamma.unwrap_or_default(), bw.dbeta.unwrap_or_default());
            let (_, rdg) = rms::backward(&x, dy, d, Some(&g), &f.rstd, false, true);
            let rdg = rdg.unwrap_or_default();
            for j in (0..d).step_by(193) {
                let (mut wg, mut wb, mut wr) = (0f64, 0f64, 0f64);
                for i in 0..n {
                    let (xv, dv) = (x[i * d + j] as f64, dy[i * d + j] as f64);
                    wg += dv * (xv - f.mean[i] as f64) * f.rstd[i] as f64;
                    wb += dv;
                    wr += dv * xv * f.rstd[i] as f64;
                }
                let close =
                    |got: f32, want: f64| (got as f64 - want).abs() <= 1e-3 * (1.0 + want.abs());
                assert!(close(dg[j], wg), "dgamma[{j}] {} vs {wg}", dg[j]);
                assert!(close(db[j], wb), "dbeta[{j}] {} vs {wb}", db[j]);
                assert!(close(rdg[j], wr), "rms dgamma[{j}] {} vs {wr}", rdg[j]);
            }
        }
    }

    #[test]
    fn statistics_first_changes_no_bits() {
        let _hold = SEGMENTED.lock();
        use crate::device::cpu::{set_stats_first, STATS_FIRST_ROW_BYTES};
        let mut rng = Rng::new(31);
        // Whole batches plus a remainder; rows of whole lanes, and rows
        // that are not (so their alignment varies and they have tails).
        for (n, d) in [
            (8 * 9 + 5, 128usize),
            (8 * 3 + 1, 256),
            (8 * 7 + 3, 100),
            (8 * 5, 64),
            (19, 7),
        ] {
            assert!(d * 4 <= STATS_FIRST_ROW_BYTES);
            same_bits_either_way(set_stats_first, &case(&mut rng, n, d, 3.0, 1.0), d);
        }
    }

    #[test]
    fn outputs_start_on_a_cache_line() {
        let mut rng = Rng::new(3);
        for (n, d) in [(3usize, 5usize), (600, 128)] {
            let (x, dy, g, b) = case(&mut rng, n, d, 1.0, 0.0);
            // `x` starts where the allocator put it, not on a line.
            let x = [vec![0.0f32; 3], x].concat();
            let x = &x[3..];
            let f = forward(x, d, Some(&g), Some(&b), 1e-5);
            let bw = backward(x, &dy, d, Some(&g), &f.mean, &f.rstd, true, false, false);
            let dx = bw.dx.unwrap_or_default();
            let (ry, _) = rms::forward(x, d, Some(&g), 1e-5);
            for (name, p) in [
                ("y", f.y.as_ptr()),
                ("dx", dx.as_ptr()),
                ("rms y", ry.as_ptr()),
            ] {
                assert_eq!(p as usize % 64, 0, "{name} at n={n} d={d}");
            }
        }
    }

    #[test]
    fn overlapped_passes_give_the_same_bits_as_separate_ones() {
        let _hold = SEGMENTED.lock();
        use crate::device::cpu::{overlap, set_overlap};
        let mut rng = Rng::new(17);
        // Streamed (the overlap needs it): short rows one at a time, rows
        // in lockstep with a remainder (two steps, and four, so that a
        // step carries both the next step's variance pass and the mean pass
        // of the one after), rows of unequal alignment (the joined loop
        // falls back to one pass after the other), long rows (the forward
        // keeps its runs apart; the backward overlaps), and rows too short
        // to overlap. Rows past 64 KiB pair their partials in the backward
        // (see `PassA`): odd and even row counts end on an unpaired row and
        // on a pair, aligned (16_400) and not (20_003).
        for (n, d) in [
            (5usize, 1000usize),
            (4, 777),
            (9, 4096),
            (17, 4096),
            (7, 4100),
            (3, 20_003),
            (4, 20_003),
            (2, 16_400),
            (5, 16_400),
            (6, 256),
        ] {
            assert_eq!(overlap(d * 4), d * 4 >= 2048, "d={d}");
            let (x, dy, g, b) = case(&mut rng, n, d, 1.5, 3.0);
            let old = stream_threshold();
            set_stream_threshold(0);
            set_overlap(false);
            let want = outputs(&x, &dy, &g, &b, d);
            set_overlap(true);
            let got = outputs(&x, &dy, &g, &b, d);
            set_stream_threshold(old);
            assert!(got == want, "n={n} d={d}");
        }
    }

    #[test]
    fn long_rows_in_runs_match_the_f64_statistics() {
        use crate::device::cpu::{segmented, set_segmented};
        let _hold = SEGMENTED.lock();
        let mut rng = Rng::new(13);
        for d in [16_400usize, 20_003, 65_536] {
            assert!(segmented(d * 4), "d={d}");
            let x: Vec<f32> = (0..2 * d)
                .map(|_| (rng.normal() * 3.0 + 100.0) as f32)
                .collect();
            let dy: Vec<f32> = (0..2 * d).map(|_| rng.normal() as f32).collect();
            let g: Vec<f32> = (0..d).map(|_| rng.normal() as f32).collect();
            let run = |seg: bool| {
                set_segmented(seg);
                let f = forward(&x, d, Some(&g), None, 1e-5);
                let b = backward(&x, &dy, d, Some(&g), &f.mean, &f.rstd, true, true, true);
                set_segmented(true);
                (f, b.dx.unwrap_or_default())
            };
            let ((on, dx_on), (off, dx_off)) = (run(true), run(false));
            for (i, row) in x.chunks(d).enumerate() {
                let m = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
                let var = row.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / d as f64;
                let r = 1.0 / (var + 1e-5).sqrt();
                for f in [&on, &off] {
                    assert!((f.mean[i] as f64 - m).abs() <= 1e-6 * m.abs(), "d={d} mean");
                    assert!((f.rstd[i] as f64 - r).abs() <= 1e-5 * r, "d={d} rstd");
                }
            }
            let close = |a: &[f32], b: &[f32]| {
                a.len() == b.len()
                    && a.iter()
                        .zip(b)
                        .all(|(p, q)| (p - q).abs() <= 1e-4 * (1.0 + q.abs()))
            };
            assert!(close(&on.y, &off.y), "d={d} y");
            assert!(close(&dx_on, &dx_off), "d={d} dx");
        }
    }

    #[test]
    fn groups_are_bounded_and_whole_chunks() {
        for (n, d) in [
            (1usize, 1usize),
            (2048, 65536),
            (32768, 128),
            (512, 2048),
            (1 << 20, 8),
            (7, 100_000),
        ] {
            let rpg = rows_per_group(n, d);
            assert_eq!(rpg % rows_per_chunk(d), 0, "n={n} d={d}");
            let g = groups(n, d);
            assert!((1..=MAX_GROUPS).contains(&g), "n={n} d={d}: {g} groups");
            assert!(g == 1 || rpg >= MIN_GROUP_ROWS.min(n), "n={n} d={d}");
        }
    }
}
