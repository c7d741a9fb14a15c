//! CPU kernels for the fused LayerNorm.
//!
//! Work split: rows are cut into chunks of [`rows_per_chunk`]`(d)` rows (a
//! function of the row length only). The forward runs one rayon task per
//! chunk. The backward runs one task per *group* of consecutive chunks (see
//! [`rows_per_group`]); each group sums its rows' `dy * xhat` and `dy` into
//! its own partial row, in row order, and the partials are then added in
//! group order. Nothing depends on the number of threads, so every output
//! (`y`, `dx`, `dgamma`, `dbeta`) is bitwise identical for any thread count.
//!
//! Row sums run in [`LANES`] independent accumulators (one per position
//! modulo 8), folded pairwise at the end of the row, so LLVM can keep them in
//! SIMD registers. 16-bit elements are widened to `T::Acc` (f32) on load and
//! every sum, statistic and partial is kept in `T::Acc`.

use crate::device::cpu::rows_per_chunk;
use crate::dtype::{Accum, Element};
use num_traits::{Float, One, Zero};
use rayon::prelude::*;

/// Independent accumulators per row sum.
pub(crate) const LANES: usize = 8;

/// Upper bound on the number of backward groups (and so on partial rows for
/// dgamma/dbeta). A constant, so the partition depends on the shape only.
pub(crate) const MAX_GROUPS: usize = 64;

type Acc<T> = <T as Element>::Acc;

/// Folds the lanes in a fixed pairwise order.
#[inline(always)]
pub(crate) fn fold<A: Accum>(a: [A; LANES]) -> A {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// `d` as an accumulator value.
#[inline(always)]
pub(crate) fn count<A: Accum>(d: usize) -> A {
    A::of(d as f64)
}

/// Rows per backward group: a whole number of chunks, chosen so that there
/// are at most [`MAX_GROUPS`] groups. Depends only on `(n, d)`.
pub(crate) fn rows_per_group(n: usize, d: usize) -> usize {
    let rpc = rows_per_chunk(d);
    let chunks = n.div_ceil(rpc);
    rpc * chunks.div_ceil(MAX_GROUPS).max(1)
}

/// Number of backward groups for `n` rows of `d`.
pub(crate) fn groups(n: usize, d: usize) -> usize {
    n.div_ceil(rows_per_group(n, d))
}

/// Mean of a row, shifted by its first element:
/// `mean = x0 + sum(x - x0) / d`.
///
/// The shift makes a constant row's mean exact (so its variance is exactly
/// 0) and, for rows with a large common offset, keeps the summands as small
/// as the spread instead of the offset.
#[inline(always)]
pub(crate) fn row_mean<T: Element>(x: &[T]) -> Acc<T> {
    let Some(first) = x.first() else {
        return Acc::<T>::zero();
    };
    let x0 = first.to_acc();
    let (chunks, rest) = x.as_chunks::<LANES>();
    let mut acc = [Acc::<T>::zero(); LANES];
    for c in chunks {
        for l in 0..LANES {
            acc[l] += c[l].to_acc() - x0;
        }
    }
    let mut s = fold(acc);
    for v in rest {
        s += v.to_acc() - x0;
    }
    x0 + s / count(x.len())
}

/// `sum((x - m)^2)` over a row: the second of the two passes.
#[inline(always)]
fn row_sq_dev<T: Element>(x: &[T], m: Acc<T>) -> Acc<T> {
    let (chunks, rest) = x.as_chunks::<LANES>();
    let mut acc = [Acc::<T>::zero(); LANES];
    for c in chunks {
        for l in 0..LANES {
            let e = c[l].to_acc() - m;
            acc[l] += e * e;
        }
    }
    let mut s = fold(acc);
    for v in rest {
        let e = v.to_acc() - m;
        s += e * e;
    }
    s
}

/// Forward over whole rows: statistics, then `y = (x - m) * rstd * g + b`.
/// `G`/`B` say whether gamma/beta are present (their slices are empty if not).
#[allow(clippy::too_many_arguments)]
fn fwd_rows<T: Element, const G: bool, const B: bool>(
    x: &[T],
    y: &mut [T],
    mean: &mut [Acc<T>],
    rstd: &mut [Acc<T>],
    gamma: &[Acc<T>],
    beta: &[Acc<T>],
    d: usize,
    eps: Acc<T>,
) {
    let rows = x.chunks_exact(d).zip(y.chunks_exact_mut(d));
    for ((xr, yr), (m_out, r_out)) in rows.zip(mean.iter_mut().zip(rstd.iter_mut())) {
        let m = row_mean(xr);
        let var = row_sq_dev(xr, m) / count(d);
        let r = Acc::<T>::one() / (var + eps).sqrt();
        *m_out = m;
        *r_out = r;
        let it = xr.iter().zip(yr.iter_mut());
        if G && B {
            for ((xv, yv), (gv, bv)) in it.zip(gamma.iter().zip(beta)) {
                *yv = T::from_acc((xv.to_acc() - m) * r * *gv + *bv);
            }
        } else if G {
            for ((xv, yv), gv) in it.zip(gamma) {
                *yv = T::from_acc((xv.to_acc() - m) * r * *gv);
            }
        } else if B {
            for ((xv, yv), bv) in it.zip(beta) {
                *yv = T::from_acc((xv.to_acc() - m) * r + *bv);
            }
        } else {
            for (xv, yv) in it {
                *yv = T::from_acc((xv.to_acc() - m) * r);
            }
        }
    }
}

/// The forward's outputs: `y` and the per-row statistics backward needs.
pub(crate) struct Forward<T: Element> {
    pub y: Vec<T>,
    pub mean: Vec<Acc<T>>,
    pub rstd: Vec<Acc<T>>,
}

/// Widens an optional parameter row to the accumulation type.
pub(crate) fn widen<T: Element>(p: Option<&[T]>) -> Vec<Acc<T>> {
    p.map(|p| p.iter().map(|v| v.to_acc()).collect())
        .unwrap_or_default()
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
    let mut y = vec![T::zero(); n * d];
    let mut mean = vec![Acc::<T>::zero(); n];
    let mut rstd = vec![Acc::<T>::zero(); n];
    let run = match (gamma.is_some(), beta.is_some()) {
        (true, true) => fwd_rows::<T, true, true>,
        (true, false) => fwd_rows::<T, true, false>,
        (false, true) => fwd_rows::<T, false, true>,
        (false, false) => fwd_rows::<T, false, false>,
    };
    let rpc = rows_per_chunk(d);
    if n <= rpc {
        run(x, &mut y, &mut mean, &mut rstd, &g, &b, d, eps);
    } else {
        x.par_chunks(rpc * d)
            .zip(y.par_chunks_mut(rpc * d))
            .zip(mean.par_chunks_mut(rpc).zip(rstd.par_chunks_mut(rpc)))
            .for_each(|((xc, yc), (mc, rc))| run(xc, yc, mc, rc, &g, &b, d, eps));
    }
    Forward { y, mean, rstd }
}

/// One backward row.
///
/// Pass A (reads `x`, `dy` from memory): `xhat = (x - m) * r`, `g = dy * gamma`,
/// lane sums of `g` and `g * xhat`, and (if `P`) the group's partials
/// `pg += dy * xhat`, `pb += dy`.
/// Pass B (if `DX`; the row is still in cache):
/// `dx = r * (g - mean(g) - xhat * mean(g * xhat))`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn bwd_row<T: Element, const DX: bool, const P: bool>(
    x: &[T],
    dy: &[T],
    gamma: &[Acc<T>],
    m: Acc<T>,
    r: Acc<T>,
    dx: &mut [T],
    pg: &mut [Acc<T>],
    pb: &mut [Acc<T>],
) {
    let zero = Acc::<T>::zero();
    let (mut s1, mut s2) = ([zero; LANES], [zero; LANES]);
    let (xc, xt) = x.as_chunks::<LANES>();
    let (dc, dt) = dy.as_chunks::<LANES>();
    let (gc, gt) = gamma.as_chunks::<LANES>();
    if P {
        let (pgc, pgt) = pg.as_chunks_mut::<LANES>();
        let (pbc, pbt) = pb.as_chunks_mut::<LANES>();
        let body = xc.iter().zip(dc).zip(gc).zip(pgc.iter_mut().zip(pbc));
        for (((xv, dv), gv), (pgv, pbv)) in body {
            for l in 0..LANES {
                let xh = (xv[l].to_acc() - m) * r;
                let dyv = dv[l].to_acc();
                let g = dyv * gv[l];
                if DX {
                    s1[l] += g;
                    s2[l] += g * xh;
                }
                pgv[l] += dyv * xh;
                pbv[l] += dyv;
            }
        }
        let tail = xt.iter().zip(dt).zip(gt).zip(pgt.iter_mut().zip(pbt));
        for (((xv, dv), gv), (pgv, pbv)) in tail {
            let xh = (xv.to_acc() - m) * r;
            let dyv = dv.to_acc();
            let g = dyv * *gv;
            if DX {
                s1[0] += g;
                s2[0] += g * xh;
            }
            *pgv += dyv * xh;
            *pbv += dyv;
        }
    } else if DX {
        for ((xv, dv), gv) in xc.iter().zip(dc).zip(gc) {
            for l in 0..LANES {
                let xh = (xv[l].to_acc() - m) * r;
                let g = dv[l].to_acc() * gv[l];
                s1[l] += g;
                s2[l] += g * xh;
            }
        }
        for ((xv, dv), gv) in xt.iter().zip(dt).zip(gt) {
            let xh = (xv.to_acc() - m) * r;
            let g = dv.to_acc() * *gv;
            s1[0] += g;
            s2[0] += g * xh;
        }
    }
    if DX {
        let inv_d = Acc::<T>::one() / count(x.len());
        let mg = fold(s1) * inv_d;
        let mgx = fold(s2) * inv_d;
        let body = x.iter().zip(dy).zip(gamma).zip(dx.iter_mut());
        for (((xv, dv), gv), dxv) in body {
            let xh = (xv.to_acc() - m) * r;
            let g = dv.to_acc() * *gv;
            *dxv = T::from_acc(r * (g - mg - xh * mgx));
        }
    }
}

/// One backward group: consecutive rows, their `dx` slice (if wanted) and
/// their partial row `[pg | pb]` (if wanted).
struct Job<'a, T: Element> {
    x: &'a [T],
    dy: &'a [T],
    mean: &'a [Acc<T>],
    rstd: &'a [Acc<T>],
    dx: Option<&'a mut [T]>,
    part: Option<&'a mut [Acc<T>]>,
}

fn run_job<T: Element, const DX: bool, const P: bool>(job: Job<'_, T>, gamma: &[Acc<T>], d: usize) {
    let mut empty_dx: [T; 0] = [];
    let dx_all = job.dx.unwrap_or(&mut empty_dx);
    let mut no_part: [Acc<T>; 0] = [];
    let (pg, pb) = job
        .part
        .unwrap_or(&mut no_part)
        .split_at_mut(if P { d } else { 0 });
    let rows = job.x.chunks_exact(d).zip(job.dy.chunks_exact(d));
    let stats = job.mean.iter().zip(job.rstd);
    for (i, ((xr, dyr), (&m, &r))) in rows.zip(stats).enumerate() {
        let dxr = if DX {
            dx_all.get_mut(i * d..(i + 1) * d).unwrap_or(&mut [])
        } else {
            &mut []
        };
        bwd_row::<T, DX, P>(xr, dyr, gamma, m, r, dxr, pg, pb);
    }
}

/// The backward's outputs; `None` where not asked for.
pub(crate) struct Backward<T: Element> {
    pub dx: Option<Vec<T>>,
    pub dgamma: Option<Vec<T>>,
    pub dbeta: Option<Vec<T>>,
}

/// Sums the groups' partial rows `[pg | pb]` in group order.
pub(crate) fn reduce_partials<A: Accum>(parts: &[A], width: usize) -> Vec<A> {
    let mut out = vec![A::zero(); width];
    if width == 0 {
        return out;
    }
    const COLS: usize = 4096;
    let sum_cols = |(c, o): (usize, &mut [A])| {
        for p in parts.chunks_exact(width) {
            for (ov, pv) in o.iter_mut().zip(&p[c * COLS..]) {
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
) -> Backward<T> {
    let n = x.len() / d;
    let want_p = want_dgamma || want_dbeta;
    let g = match gamma {
        Some(_) => widen(gamma),
        None => vec![Acc::<T>::one(); d],
    };
    let rpg = rows_per_group(n, d);
    let ngroups = n.div_ceil(rpg);
    let mut dx = want_dx.then(|| vec![T::zero(); n * d]);
    let mut parts = vec![Acc::<T>::zero(); if want_p { ngroups * 2 * d } else { 0 }];
    {
        let mut dx_it = dx.as_deref_mut().map(|v| v.chunks_mut(rpg * d));
        let mut part_it = parts.chunks_mut(2 * d);
        let mut jobs: Vec<Job<'_, T>> = Vec::with_capacity(ngroups);
        let rows = x.chunks(rpg * d).zip(dy.chunks(rpg * d));
        let stats = mean.chunks(rpg).zip(rstd.chunks(rpg));
        for ((xg, dyg), (mg, rg)) in rows.zip(stats) {
            jobs.push(Job {
                x: xg,
                dy: dyg,
                mean: mg,
                rstd: rg,
                dx: dx_it.as_mut().and_then(|it| it.next()),
                part: if want_p { part_it.next() } else { None },
            });
        }
        let run = match (want_dx, want_p) {
            (true, true) => run_job::<T, true, true>,
            (true, false) => run_job::<T, true, false>,
            (false, true) => run_job::<T, false, true>,
            (false, false) => |_: Job<'_, T>, _: &[Acc<T>], _: usize| {},
        };
        if jobs.len() <= 1 {
            jobs.into_iter().for_each(|j| run(j, &g, d));
        } else {
            jobs.into_par_iter().for_each(|j| run(j, &g, d));
        }
    }
    let (dgamma, dbeta) = if want_p {
        let sums = reduce_partials(&parts, 2 * d);
        let (sg, sb) = sums.split_at(d);
        (
            want_dgamma.then(|| sg.iter().map(|&v| T::from_acc(v)).collect()),
            want_dbeta.then(|| sb.iter().map(|&v| T::from_acc(v)).collect()),
        )
    } else {
        (None, None)
    };
    Backward { dx, dgamma, dbeta }
}
