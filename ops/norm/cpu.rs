//! CPU kernels for the fused norms: one kernel set for both. RMSNorm runs
//! LayerNorm's arithmetic with a mean of 0 and a shift of -0 (exact: `x -
//! 0` is `x`, `v + -0` is `v`, `g - 0` is `g`, so the bits are those of
//! leaving them out), and a run-time `centre` flag skips, row by row, what
//! it does not need: the mean pass and the dbeta partials. A flag, not a
//! const parameter: each SIMD build of these kernels is compiled once, not
//! once per norm.
//!
//! Work split: rows are cut into chunks of [`rows_per_chunk`]`(d)` rows (a
//! function of the row length only). The forward runs one rayon task per
//! chunk (for rows in lockstep, at least [`forward::FWD_TASK_STEPS`] steps
//! of rows). The backward runs one task per *group* of consecutive chunks (see
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
//! are taken [`ROWS_IN_STEP`] at a time in lockstep ([`rows_in_step`]; the
//! backward takes rows past 16 KiB two at a time, [`bwd_rows_in_step`]),
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
//! written with non-temporal stores
//! ([`write_row`](crate::device::cpu::write_row)).
//!
//! Files: this one holds the row helpers, [`rows`] the backward's groups,
//! partial rows and parameter widening; [`stats`] the forward's
//! mean and variance passes, [`forward`](mod@forward) and
//! [`backward`](mod@backward) the two kernels,
//! and `tests` the checks that each speed switch changes no bits.

use crate::device::cpu::{
    dispatch_all, each_chunk, each_chunk_in, fence, fold_all, prefetch, prefetch_next,
    prefetch_next_on, rows_per_chunk, should_stream, write_rows_ahead, write_rows_with, Kernel,
    Lanes, UNROLL,
};
use crate::device::pool::Buffer;
use crate::dtype::Element;
use crate::tensor::Tensor;
use num_traits::{Float, One, Zero};
use rows::{
    at, count, head, partial_rows, reduce_partials, rows_per_group, wide, widen, widen_or, LANES,
};
pub(crate) use tuning::*;

type Acc<T> = <T as Element>::Acc;

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

/// `xhat = (x - m) * r` for the lanes at `x[i..]` (RMSNorm's `m` is 0,
/// and `x - 0` is `x` exactly).
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

mod backward;
mod forward;
pub(crate) mod rows;
mod stats;
#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests;
pub(crate) mod tuning;
pub(crate) mod typed;

pub(crate) use backward::{backward, Backward};
pub(crate) use forward::forward;

use super::scaled;
use crate::dtype::Accum;

/// Per-row statistics in the accumulation type.
type Stats<T> = Buffer<Acc<T>>;

/// The forward with the scaled fallback applied to the rows the kernel
/// flagged; `scaled` says whether any row took it. Rows are looked for
/// only when the kernel flagged one, so the common path reads the
/// statistics no second time. `mean` is empty unless `centre`.
pub(crate) fn forward_checked<T: Element>(
    xs: &[T],
    d: usize,
    gs: Option<&[T]>,
    bs: Option<&[T]>,
    eps: Acc<T>,
    centre: bool,
) -> Checked<T> {
    let mut out = forward(xs, d, gs, bs, eps, centre);
    let mean = centre.then_some(&out.mean[..]);
    let rows = if out.suspect {
        scaled::suspect_rows(xs, d, mean, &out.rstd)
    } else {
        Vec::new()
    };
    let mean = centre.then_some(&mut out.mean[..]);
    let (eps, y, rstd) = (eps.f64(), &mut out.y, &mut out.rstd);
    scaled::forward_rows(xs, d, gs, bs, eps, centre, &rows, y, mean, rstd);
    Checked {
        y: out.y,
        mean: out.mean,
        rstd: out.rstd,
        scaled: !rows.is_empty(),
    }
}

/// A forward with the fallback applied: `y`, the statistics (`mean` empty
/// for RMSNorm), and whether any row took the fallback.
pub(crate) struct Checked<T: Element> {
    pub y: Buffer<T>,
    pub mean: Stats<T>,
    pub rstd: Stats<T>,
    pub scaled: bool,
}

/// The backward of a node whose forward took the scaled path (`scaled`)
/// or not; `mean` is `None` for RMSNorm, `want` is `(dx, dgamma, dbeta)`.
/// No rows give zero parameter gradients.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_checked<T: Element>(
    xs: &[T],
    dy: &[T],
    d: usize,
    gs: Option<&[T]>,
    (mean, rstd): (Option<&[Acc<T>]>, &[Acc<T>]),
    scaled: bool,
    eps: Acc<T>,
    want: (bool, bool, bool),
) -> Backward<T> {
    let centre = mean.is_some();
    let want = (want.0, want.1, want.2 && centre);
    let (dx, dg, db) = want;
    if xs.is_empty() {
        // `d` is small when a parameter gradient is wanted.
        let zeros = |w: bool| w.then(|| Buffer::from_vec(vec![T::ZERO; d]));
        Backward {
            dx: dx.then(Buffer::default),
            dgamma: zeros(dg),
            dbeta: zeros(db),
        }
    } else if scaled {
        let g = scaled::backward(xs, dy, d, gs, eps.f64(), centre, want);
        Backward {
            dx: g.dx.map(Buffer::from_vec),
            dgamma: g.dgamma.map(Buffer::from_vec),
            dbeta: g.dbeta.map(Buffer::from_vec),
        }
    } else {
        backward(xs, dy, d, gs, (mean, rstd), want)
    }
}
