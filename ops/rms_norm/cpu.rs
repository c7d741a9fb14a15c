//! CPU kernels for the fused RMSNorm. Same work split as LayerNorm's (see
//! `ops/layer_norm/cpu.rs`): forward tasks are chunks of
//! `rows_per_chunk(d)` rows, backward tasks are groups of chunks with one
//! dgamma partial row each, summed in group order, so results are bitwise
//! identical for any thread count. Sums run in 8 lanes, in `T::Acc`.

use crate::device::cpu::rows_per_chunk;
use crate::dtype::Element;
use crate::ops::layer_norm::cpu::{count, fold, reduce_partials, rows_per_group, widen, LANES};
use crate::tensor::Tensor;
use num_traits::{Float, One, Zero};
use rayon::prelude::*;

type Acc<T> = <T as Element>::Acc;

/// `sum(x^2)` over a row.
#[inline(always)]
fn row_sq<T: Element>(x: &[T]) -> Acc<T> {
    let (chunks, rest) = x.as_chunks::<LANES>();
    let mut acc = [Acc::<T>::zero(); LANES];
    for c in chunks {
        for l in 0..LANES {
            let v = c[l].to_acc();
            acc[l] += v * v;
        }
    }
    let mut s = fold(acc);
    for v in rest {
        let v = v.to_acc();
        s += v * v;
    }
    s
}

/// Forward over whole rows: `rstd = 1/sqrt(sum(x^2)/d + eps)`,
/// `y = x * rstd * gamma`. `G` says whether gamma is present.
fn fwd_rows<T: Element, const G: bool>(
    x: &[T],
    y: &mut [T],
    rstd: &mut [Acc<T>],
    gamma: &[Acc<T>],
    d: usize,
    eps: Acc<T>,
) {
    let rows = x.chunks_exact(d).zip(y.chunks_exact_mut(d));
    for ((xr, yr), r_out) in rows.zip(rstd.iter_mut()) {
        let ms = row_sq(xr) / count(d);
        let r = Acc::<T>::one() / (ms + eps).sqrt();
        *r_out = r;
        if G {
            for ((xv, yv), gv) in xr.iter().zip(yr.iter_mut()).zip(gamma) {
                *yv = T::from_acc(xv.to_acc() * r * *gv);
            }
        } else {
            for (xv, yv) in xr.iter().zip(yr.iter_mut()) {
                *yv = T::from_acc(xv.to_acc() * r);
            }
        }
    }
}

/// RMSNorm forward over `x.len() / d` rows: `(y, rstd)`.
pub(crate) fn forward<T: Element>(
    x: &[T],
    d: usize,
    gamma: Option<&[T]>,
    eps: Acc<T>,
) -> (Vec<T>, Vec<Acc<T>>) {
    let n = x.len() / d;
    let g = widen(gamma);
    let mut y = Tensor::<T>::scratch(n * d);
    let mut rstd = vec![Acc::<T>::zero(); n];
    let run = if gamma.is_some() {
        fwd_rows::<T, true>
    } else {
        fwd_rows::<T, false>
    };
    let rpc = rows_per_chunk(d);
    if n <= rpc {
        run(x, &mut y, &mut rstd, &g, d, eps);
    } else {
        x.par_chunks(rpc * d)
            .zip(y.par_chunks_mut(rpc * d))
            .zip(rstd.par_chunks_mut(rpc))
            .for_each(|((xc, yc), rc)| run(xc, yc, rc, &g, d, eps));
    }
    (y, rstd)
}

/// One backward row. Pass A: `xhat = x * r`, `g = dy * gamma`, lane sums of
/// `g * xhat` and (if `P`) the partial `pg += dy * xhat`. Pass B (if `DX`):
/// `dx = r * (g - xhat * mean(g * xhat))`.
#[inline(always)]
fn bwd_row<T: Element, const DX: bool, const P: bool>(
    x: &[T],
    dy: &[T],
    gamma: &[Acc<T>],
    r: Acc<T>,
    dx: &mut [T],
    pg: &mut [Acc<T>],
) {
    let mut s = [Acc::<T>::zero(); LANES];
    let (xc, xt) = x.as_chunks::<LANES>();
    let (dc, dt) = dy.as_chunks::<LANES>();
    let (gc, gt) = gamma.as_chunks::<LANES>();
    if P {
        let (pc, pt) = pg.as_chunks_mut::<LANES>();
        for (((xv, dv), gv), pv) in xc.iter().zip(dc).zip(gc).zip(pc) {
            for l in 0..LANES {
                let xh = xv[l].to_acc() * r;
                let dyv = dv[l].to_acc();
                if DX {
                    s[l] += dyv * gv[l] * xh;
                }
                pv[l] += dyv * xh;
            }
        }
        for (((xv, dv), gv), pv) in xt.iter().zip(dt).zip(gt).zip(pt) {
            let xh = xv.to_acc() * r;
            let dyv = dv.to_acc();
            if DX {
                s[0] += dyv * *gv * xh;
            }
            *pv += dyv * xh;
        }
    } else if DX {
        for ((xv, dv), gv) in xc.iter().zip(dc).zip(gc) {
            for l in 0..LANES {
                s[l] += dv[l].to_acc() * gv[l] * (xv[l].to_acc() * r);
            }
        }
        for ((xv, dv), gv) in xt.iter().zip(dt).zip(gt) {
            s[0] += dv.to_acc() * *gv * (xv.to_acc() * r);
        }
    }
    if DX {
        let mgx = fold(s) / count(x.len());
        let body = x.iter().zip(dy).zip(gamma).zip(dx.iter_mut());
        for (((xv, dv), gv), dxv) in body {
            let xh = xv.to_acc() * r;
            let g = dv.to_acc() * *gv;
            *dxv = T::from_acc(r * (g - xh * mgx));
        }
    }
}

struct Job<'a, T: Element> {
    x: &'a [T],
    dy: &'a [T],
    rstd: &'a [Acc<T>],
    dx: Option<&'a mut [T]>,
    part: Option<&'a mut [Acc<T>]>,
}

fn run_job<T: Element, const DX: bool, const P: bool>(job: Job<'_, T>, gamma: &[Acc<T>], d: usize) {
    let mut empty_dx: [T; 0] = [];
    let dx_all = job.dx.unwrap_or(&mut empty_dx);
    let mut no_part: [Acc<T>; 0] = [];
    let pg = job.part.unwrap_or(&mut no_part);
    let rows = job.x.chunks_exact(d).zip(job.dy.chunks_exact(d));
    for (i, ((xr, dyr), &r)) in rows.zip(job.rstd).enumerate() {
        let dxr = if DX {
            dx_all.get_mut(i * d..(i + 1) * d).unwrap_or(&mut [])
        } else {
            &mut []
        };
        bwd_row::<T, DX, P>(xr, dyr, gamma, r, dxr, pg);
    }
}

/// RMSNorm backward: `(dx, dgamma)`, `None` where not asked for.
pub(crate) fn backward<T: Element>(
    x: &[T],
    dy: &[T],
    d: usize,
    gamma: Option<&[T]>,
    rstd: &[Acc<T>],
    want_dx: bool,
    want_dgamma: bool,
) -> (Option<Vec<T>>, Option<Vec<T>>) {
    let n = x.len() / d;
    let g = match gamma {
        Some(_) => widen(gamma),
        None => vec![Acc::<T>::one(); d],
    };
    let rpg = rows_per_group(n, d);
    let ngroups = n.div_ceil(rpg);
    let mut dx = want_dx.then(|| Tensor::<T>::scratch(n * d));
    let mut parts = vec![Acc::<T>::zero(); if want_dgamma { ngroups * d } else { 0 }];
    {
        let mut dx_it = dx.as_deref_mut().map(|v| v.chunks_mut(rpg * d));
        let mut part_it = parts.chunks_mut(d);
        let mut jobs: Vec<Job<'_, T>> = Vec::with_capacity(ngroups);
        let rows = x.chunks(rpg * d).zip(dy.chunks(rpg * d));
        for ((xg, dyg), rg) in rows.zip(rstd.chunks(rpg)) {
            jobs.push(Job {
                x: xg,
                dy: dyg,
                rstd: rg,
                dx: dx_it.as_mut().and_then(|it| it.next()),
                part: if want_dgamma { part_it.next() } else { None },
            });
        }
        let run = match (want_dx, want_dgamma) {
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
    let dgamma = want_dgamma.then(|| {
        reduce_partials(&parts, d)
            .into_iter()
            .map(T::from_acc)
            .collect()
    });
    (dx, dgamma)
}
