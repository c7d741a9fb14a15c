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
//! The kernels compute in [`Lanes`] of [`LANES`] values; a row sum runs in
//! [`UNROLL`] accumulators (chunk `k` of the row into accumulator
//! `k % UNROLL`), added lane-wise and folded pairwise at the end of the row
//! ([`fold_all`]); elements past the last whole chunk are added after the
//! fold, in order. Each task runs through [`dispatch`], which picks an
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
    dispatch, each_chunk, fence, fold_all, prefetch, rows_per_chunk, should_stream, write_row,
    Kernel, Lanes, UNROLL,
};
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

/// Mean of a row, shifted by its first element:
/// `mean = x0 + sum(x - x0) / d`.
///
/// The shift makes a constant row's mean exact (so its variance is exactly
/// 0) and, for rows with a large common offset, keeps the summands as small
/// as the spread instead of the offset.
#[inline(always)]
fn row_mean<T: Element, V: Lanes<T>>(x: &[T]) -> Acc<T> {
    let Some(first) = x.first() else {
        return Acc::<T>::zero();
    };
    let x0 = first.to_acc();
    let (v0, mut acc) = (V::splat(x0), [V::splat(Acc::<T>::zero()); UNROLL]);
    each_chunk(
        x.len(),
        #[inline(always)]
        |j, i| {
            prefetch(x, i);
            // SAFETY: `each_chunk` passes `i + LANES <= x.len()`.
            acc[j] = acc[j].add(unsafe { V::load_at(x, i) }.sub(v0));
        },
    );
    let mut s = fold_all(acc);
    for v in x.as_chunks::<LANES>().1 {
        s += v.to_acc() - x0;
    }
    x0 + s / count(x.len())
}

/// `sum((x - m)^2)` over a row: the second of the two passes.
#[inline(always)]
fn row_sq_dev<T: Element, V: Lanes<T>>(x: &[T], m: Acc<T>) -> Acc<T> {
    let (mv, mut acc) = (V::splat(m), [V::splat(Acc::<T>::zero()); UNROLL]);
    each_chunk(
        x.len(),
        #[inline(always)]
        |j, i| {
            // SAFETY: `each_chunk` passes `i + LANES <= x.len()`.
            let e = unsafe { V::load_at(x, i) }.sub(mv);
            acc[j] = acc[j].add(e.mul(e));
        },
    );
    let mut s = fold_all(acc);
    for v in x.as_chunks::<LANES>().1 {
        let e = v.to_acc() - m;
        s += e * e;
    }
    s
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
}

impl<T: Element, const G: bool, const B: bool, const NT: bool> Kernel<T> for Fwd<'_, T, G, B, NT> {
    type Output = ();

    /// Per row: statistics, then `y = (x - m) * rstd * g + b`.
    #[inline(always)]
    fn run<V: Lanes<T>>(self) {
        let Fwd {
            x,
            y,
            mean,
            rstd,
            gamma,
            beta,
            d,
            eps,
        } = self;
        let rows = x.chunks_exact(d).zip(y.chunks_exact_mut(d));
        for ((xr, yr), (m_out, r_out)) in rows.zip(mean.iter_mut().zip(rstd.iter_mut())) {
            let m = row_mean::<T, V>(xr);
            let var = row_sq_dev::<T, V>(xr, m) / count(d);
            let r = Acc::<T>::one() / (var + eps).sqrt();
            *m_out = m;
            *r_out = r;
            let n = d.min(if G { gamma.len() } else { d });
            let n = n.min(if B { beta.len() } else { d });
            let (xr, yr, g, b) = (head(xr, n), &mut yr[..n], head(gamma, n), head(beta, n));
            let (mv, rv) = (V::splat(m), V::splat(r));
            // SAFETY (the unchecked loads below): `write_row` passes
            // `i + LANES <= n`, and `xr`, `g`, `b` have length `n` (when
            // present).
            if G && B {
                write_row::<T, V, NT>(
                    yr,
                    #[inline(always)]
                    |i| unsafe {
                        xhat_at(xr, i, mv, rv)
                            .mul(V::load_acc_at(g, i))
                            .add(V::load_acc_at(b, i))
                    },
                    #[inline(always)]
                    |i| xhat_one(xr, i, m, r) * at(g, i) + at(b, i),
                );
            } else if G {
                write_row::<T, V, NT>(
                    yr,
                    #[inline(always)]
                    |i| unsafe { xhat_at(xr, i, mv, rv).mul(V::load_acc_at(g, i)) },
                    #[inline(always)]
                    |i| xhat_one(xr, i, m, r) * at(g, i),
                );
            } else if B {
                write_row::<T, V, NT>(
                    yr,
                    #[inline(always)]
                    |i| unsafe { xhat_at(xr, i, mv, rv).add(V::load_acc_at(b, i)) },
                    #[inline(always)]
                    |i| xhat_one(xr, i, m, r) + at(b, i),
                );
            } else {
                write_row::<T, V, NT>(
                    yr,
                    #[inline(always)]
                    |i| unsafe { xhat_at(xr, i, mv, rv) },
                    #[inline(always)]
                    |i| xhat_one(xr, i, m, r),
                );
            }
        }
        fence::<NT>();
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
        })
    };
    let rpc = rows_per_chunk(d);
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

/// Pass A of one backward row (reads `x`, `dy` from memory):
/// `xhat = (x - m) * r`, `g = dy * gamma`, and returns the sums of `g` and
/// `g * xhat` (if `DX`); adds the partials `pg += dy * xhat`, `pb += dy`
/// (if `P`). Elements past the last whole group of lanes are added, in
/// order, after the fold.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn bwd_sums<T: Element, V: Lanes<T>, const DX: bool, const P: bool>(
    x: &[T],
    dy: &[T],
    gamma: &[Acc<T>],
    m: Acc<T>,
    r: Acc<T>,
    pg: &mut [Acc<T>],
    pb: &mut [Acc<T>],
) -> (Acc<T>, Acc<T>) {
    let zero = V::splat(Acc::<T>::zero());
    let (mv, rv) = (V::splat(m), V::splat(r));
    let (mut s1, mut s2) = ([zero; UNROLL], [zero; UNROLL]);
    let n = x.len().min(dy.len()).min(gamma.len());
    let n = if P { n.min(pg.len()).min(pb.len()) } else { n };
    each_chunk(
        n,
        #[inline(always)]
        |j, i| {
            prefetch(x, i);
            prefetch(dy, i);
            // SAFETY: `each_chunk` passes `i + LANES <= n`, and every slice
            // read or written here is at least `n` long.
            unsafe {
                let xh = V::load_at(x, i).sub(mv).mul(rv);
                let dyv = V::load_at(dy, i);
                let g = dyv.mul(V::load_acc_at(gamma, i));
                if DX {
                    s1[j] = s1[j].add(g);
                    s2[j] = s2[j].add(g.mul(xh));
                }
                if P {
                    V::load_acc_at(pg, i).add(dyv.mul(xh)).store_acc_at(pg, i);
                    V::load_acc_at(pb, i).add(dyv).store_acc_at(pb, i);
                }
            }
        },
    );
    let t = n / LANES * LANES;
    let (xt, dt, gt) = (&x[t..n], &dy[t..n], &gamma[t..n]);
    let (pgt, pbt) = if P {
        (&mut pg[t..n], &mut pb[t..n])
    } else {
        (&mut [][..], &mut [][..])
    };
    let (mut a1, mut a2) = (fold_all(s1), fold_all(s2));
    let tail = xt.iter().zip(dt).zip(gt).enumerate();
    for (k, ((xv, dv), gv)) in tail {
        let xh = (xv.to_acc() - m) * r;
        let dyv = dv.to_acc();
        let g = dyv * *gv;
        if DX {
            a1 += g;
            a2 += g * xh;
        }
        if P {
            if let (Some(pgv), Some(pbv)) = (pgt.get_mut(k), pbt.get_mut(k)) {
                *pgv += dyv * xh;
                *pbv += dyv;
            }
        }
    }
    (a1, a2)
}

/// One backward task: a group of consecutive rows, their `dx` (empty unless
/// `DX`) and, if `P`, a fresh partial row `[pg | pb]` of `2d` that it
/// returns. `NT` streams `dx` past the cache.
struct Bwd<'a, T: Element, const DX: bool, const P: bool, const NT: bool> {
    x: &'a [T],
    dy: &'a [T],
    mean: &'a [Acc<T>],
    rstd: &'a [Acc<T>],
    dx: &'a mut [T],
    gamma: &'a [Acc<T>],
    d: usize,
}

impl<T: Element, const DX: bool, const P: bool, const NT: bool> Kernel<T>
    for Bwd<'_, T, DX, P, NT>
{
    type Output = Vec<Acc<T>>;

    /// Per row: pass A ([`bwd_sums`]), then, with the row still in cache,
    /// pass B: `dx = r * (g - mean(g) - xhat * mean(g * xhat))`.
    #[inline(always)]
    fn run<V: Lanes<T>>(self) -> Vec<Acc<T>> {
        let Bwd {
            x,
            dy,
            mean,
            rstd,
            dx,
            gamma,
            d,
        } = self;
        let mut part = vec![Acc::<T>::zero(); if P { 2 * d } else { 0 }];
        let (pg, pb) = part.split_at_mut(if P { d } else { 0 });
        let inv_d = Acc::<T>::one() / count(d);
        let rows = x.chunks_exact(d).zip(dy.chunks_exact(d));
        let stats = mean.iter().zip(rstd);
        for (i, ((xr, dyr), (&m, &r))) in rows.zip(stats).enumerate() {
            let (s1, s2) = bwd_sums::<T, V, DX, P>(xr, dyr, gamma, m, r, pg, pb);
            if DX {
                let Some(dxr) = dx.get_mut(i * d..(i + 1) * d) else {
                    continue;
                };
                let (mg, mgx) = (s1 * inv_d, s2 * inv_d);
                let n = d.min(gamma.len());
                let (xr, dyr, g) = (head(xr, n), head(dyr, n), head(gamma, n));
                let (mv, rv, mgv, mgxv) = (V::splat(m), V::splat(r), V::splat(mg), V::splat(mgx));
                write_row::<T, V, NT>(
                    &mut dxr[..n],
                    // SAFETY: `write_row` passes `k + LANES <= n`; `xr`,
                    // `dyr` and `g` have length `n`.
                    #[inline(always)]
                    |k| unsafe {
                        let xh = V::load_at(xr, k).sub(mv).mul(rv);
                        let g = V::load_at(dyr, k).mul(V::load_acc_at(g, k));
                        rv.mul(g.sub(mgv).sub(xh.mul(mgxv)))
                    },
                    #[inline(always)]
                    |k| {
                        let xh = (wide(xr, k) - m) * r;
                        let g = wide(dyr, k) * at(g, k);
                        r * (g - mg - xh * mgx)
                    },
                );
            }
        }
        fence::<NT>();
        part
    }
}

/// The backward's outputs; `None` where not asked for.
pub(crate) struct Backward<T: Element> {
    pub dx: Option<Vec<T>>,
    pub dgamma: Option<Vec<T>>,
    pub dbeta: Option<Vec<T>>,
}

/// Sums the groups' partial rows in group order, column block by column
/// block (in parallel for wide rows; each column's order is the same).
pub(crate) fn reduce_partials<A: Accum>(parts: &[Vec<A>], width: usize) -> Vec<A> {
    let mut out = vec![A::zero(); width];
    const COLS: usize = 4096;
    let sum_cols = |(c, o): (usize, &mut [A])| {
        for p in parts {
            for (ov, pv) in o.iter_mut().zip(p.iter().skip(c * COLS)) {
                *ov += *pv;
            }
        }
    };
    if parts.len() * width <= 1 << 16 {
        out.chunks_mut(COLS).enumerate().for_each(sum_cols);
    } else {
        out.par_chunks_mut(COLS).enumerate().for_each(sum_cols);
    }
    out
}

/// Runs the backward groups (in parallel when there are several) and
/// returns their partial rows in group order.
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
) -> Vec<Vec<Acc<T>>> {
    let mut dx_groups = dx.chunks_mut(rpg * d);
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
        })
        .collect();
    if jobs.len() <= 1 {
        jobs.into_iter().map(dispatch).collect()
    } else {
        jobs.into_par_iter().map(dispatch).collect()
    }
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
    let mut dx = if want_dx {
        Tensor::<T>::scratch(n * d)
    } else {
        Vec::new()
    };
    let run = match (want_dx, want_p, should_stream::<T>(n * d)) {
        (true, true, false) => bwd_launch::<T, true, true, false>,
        (true, false, false) => bwd_launch::<T, true, false, false>,
        (true, true, true) => bwd_launch::<T, true, true, true>,
        (true, false, true) => bwd_launch::<T, true, false, true>,
        (false, true, _) => bwd_launch::<T, false, true, false>,
        (false, false, _) => bwd_launch::<T, false, false, false>,
    };
    let parts = run(x, dy, mean, rstd, &mut dx, &g, d, rpg);
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

    #[test]
    fn every_build_and_store_kind_gives_the_same_bits() {
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
        ] {
            let v = |k: usize, rng: &mut Rng| -> Vec<f32> {
                (0..k).map(|_| (rng.normal() * 3.0 + 1.0) as f32).collect()
            };
            let (x, dy, g, b) = (
                v(n * d, &mut rng),
                v(n * d, &mut rng),
                v(d, &mut rng),
                v(d, &mut rng),
            );
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
