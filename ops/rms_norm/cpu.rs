//! CPU kernels for the fused RMSNorm. Same work split, lanes, dispatch,
//! buffer pool and streaming stores as LayerNorm's (see
//! `ops/layer_norm/cpu.rs`): forward tasks are chunks of `rows_per_chunk(d)`
//! rows, backward tasks are groups of chunks with one dgamma partial row
//! each, summed in group order, so results are bitwise identical for any
//! thread count and instruction set. Sums run in [`LANES`] lanes, in
//! `T::Acc`.

use crate::device::cpu::{
    dispatch_all, each_chunk, fence, fold_all, prefetch, rows_per_chunk, should_stream, write_row,
    Kernel, Lanes, UNROLL,
};
use crate::device::pool::Buffer;
use crate::dtype::Accum;
use crate::dtype::Element;
use crate::ops::layer_norm::scaled::{self, rstd_limit, trusted};
use crate::ops::norm::cpu_rows::{
    at, count, head, partial_rows, reduce_partials, rows_per_group, wide, widen, widen_or, LANES,
};
use crate::tensor::Tensor;
use num_traits::{Float, One, Zero};

type Acc<T> = <T as Element>::Acc;

/// `sum(x^2)` over a row.
#[inline(always)]
fn row_sq<T: Element, V: Lanes<T>>(x: &[T]) -> Acc<T> {
    let mut acc = [V::splat(Acc::<T>::zero()); UNROLL];
    each_chunk(
        x.len(),
        #[inline(always)]
        |j, i| {
            prefetch::<T, 1>(x, i);
            // SAFETY: `each_chunk` passes `i + LANES <= x.len()`.
            let v = unsafe { V::load_at(x, i) };
            acc[j] = acc[j].add(v.mul(v));
        },
    );
    let mut s = fold_all(acc);
    for v in x.as_chunks::<LANES>().1 {
        let v = v.to_acc();
        s += v * v;
    }
    s
}

/// One forward task over whole rows; `G` says whether gamma is present,
/// `NT` streams `y` past the cache.
struct Fwd<'a, T: Element, const G: bool, const NT: bool> {
    x: &'a [T],
    y: &'a mut [T],
    rstd: &'a mut [Acc<T>],
    gamma: &'a [Acc<T>],
    d: usize,
    eps: Acc<T>,
    /// Largest trusted `rstd` ([`rstd_limit`]).
    limit: Acc<T>,
}

impl<T: Element, const G: bool, const NT: bool> Kernel<T> for Fwd<'_, T, G, NT> {
    /// Whether some row's `rstd` is out of the trusted range ([`trusted`]).
    type Output = bool;

    /// Per row: `rstd = 1/sqrt(sum(x^2)/d + eps)`, `y = x * rstd * gamma`.
    #[inline(always)]
    fn run<V: Lanes<T>>(self) -> bool {
        let Fwd {
            x,
            y,
            rstd,
            gamma,
            d,
            eps,
            limit,
        } = self;
        let mut suspect = false;
        let rows = x.chunks_exact(d).zip(y.chunks_exact_mut(d));
        for ((xr, yr), r_out) in rows.zip(rstd.iter_mut()) {
            let ms = row_sq::<T, V>(xr) / count(d);
            let r = Acc::<T>::one() / (ms + eps).sqrt();
            *r_out = r;
            suspect |= !trusted(Acc::<T>::zero(), r, limit);
            let n = d.min(if G { gamma.len() } else { d });
            let (xr, yr, g) = (head(xr, n), &mut yr[..n], head(gamma, n));
            let rv = V::splat(r);
            if G {
                write_row::<T, V, NT>(
                    yr,
                    // SAFETY: `write_row` passes `i + LANES <= n`; `xr` and
                    // `g` have length `n`.
                    #[inline(always)]
                    |i| unsafe { V::load_at(xr, i).mul(rv).mul(V::load_acc_at(g, i)) },
                    #[inline(always)]
                    |i| wide(xr, i) * r * at(g, i),
                );
            } else {
                write_row::<T, V, NT>(
                    yr,
                    // SAFETY: as above.
                    #[inline(always)]
                    |i| unsafe { V::load_at(xr, i) }.mul(rv),
                    #[inline(always)]
                    |i| wide(xr, i) * r,
                );
            }
        }
        fence::<NT>();
        suspect
    }
}

/// Runs the forward tasks, one per chunk of rows ([`dispatch_all`]);
/// whether any row is suspect.
fn fwd_launch<T: Element, const G: bool, const NT: bool>(
    x: &[T],
    y: &mut [T],
    rstd: &mut [Acc<T>],
    gamma: &[Acc<T>],
    d: usize,
    eps: Acc<T>,
) -> bool {
    let rpc = rows_per_chunk(d);
    let limit = rstd_limit::<Acc<T>>();
    let jobs: Vec<Fwd<'_, T, G, NT>> = x
        .chunks(rpc * d)
        .zip(y.chunks_mut(rpc * d))
        .zip(rstd.chunks_mut(rpc))
        .map(|((x, y), rstd)| Fwd {
            x,
            y,
            rstd,
            gamma,
            d,
            eps,
            limit,
        })
        .collect();
    dispatch_all(jobs).contains(&true)
}

/// RMSNorm forward over `x.len() / d` rows: `(y, rstd, suspect)`, where
/// `suspect` says some row's `rstd` is out of the trusted range.
pub(crate) fn forward<T: Element>(
    x: &[T],
    d: usize,
    gamma: Option<&[T]>,
    eps: Acc<T>,
) -> (Buffer<T>, Buffer<Acc<T>>, bool) {
    let n = x.len() / d;
    // Absent gamma is ones (`v * 1` is exact): one build instead of two.
    let g = widen_or(gamma, d, <Acc<T> as One>::one());
    let mut y = Tensor::<T>::scratch(n * d);
    let mut rstd = Buffer::from_vec(vec![<Acc<T> as Zero>::zero(); n]);
    // Streaming builds for f32 only (see the LayerNorm forward).
    let run = if <T as crate::device::cpu::CpuBuilds>::SIMD && should_stream::<T>(n * d) {
        fwd_launch::<T, true, true>
    } else {
        fwd_launch::<T, true, false>
    };
    let suspect = run(&x[..n * d], &mut y, &mut rstd, &g, d, eps);
    (y, rstd, suspect)
}

/// Pass A of one backward row: `xhat = x * r`, returns the sum of
/// `dy * gamma * xhat` (if `DX`) and adds the partial `pg += dy * xhat`
/// (if `P`). Elements past the last whole group of lanes are added, in
/// order, after the fold.
#[inline(always)]
fn bwd_sum<T: Element, V: Lanes<T>, const DX: bool, const P: bool>(
    x: &[T],
    dy: &[T],
    gamma: &[Acc<T>],
    r: Acc<T>,
    pg: &mut [Acc<T>],
) -> Acc<T> {
    let rv = V::splat(r);
    let mut s = [V::splat(Acc::<T>::zero()); UNROLL];
    let n = x.len().min(dy.len()).min(gamma.len());
    let n = if P { n.min(pg.len()) } else { n };
    each_chunk(
        n,
        #[inline(always)]
        |j, i| {
            prefetch::<T, 1>(x, i);
            prefetch::<T, 1>(dy, i);
            // SAFETY: `each_chunk` passes `i + LANES <= n`, and every slice
            // read or written here is at least `n` long.
            unsafe {
                let xh = V::load_at(x, i).mul(rv);
                let dyv = V::load_at(dy, i);
                if DX {
                    s[j] = s[j].add(dyv.mul(V::load_acc_at(gamma, i)).mul(xh));
                }
                if P {
                    V::load_acc_at(pg, i).add(dyv.mul(xh)).store_acc_at(pg, i);
                }
            }
        },
    );
    let t = n / LANES * LANES;
    let (xt, dt, gt) = (&x[t..n], &dy[t..n], &gamma[t..n]);
    let pt = if P { &mut pg[t..n] } else { &mut [][..] };
    let mut a = fold_all(s);
    for (k, ((xv, dv), gv)) in xt.iter().zip(dt).zip(gt).enumerate() {
        let xh = xv.to_acc() * r;
        let dyv = dv.to_acc();
        if DX {
            a += dyv * *gv * xh;
        }
        if P {
            if let Some(pv) = pt.get_mut(k) {
                *pv += dyv * xh;
            }
        }
    }
    a
}

/// One backward task: a group of rows, their `dx` (empty unless `DX`) and,
/// if `P`, its dgamma partial row of `d` (zeroed here).
struct Bwd<'a, T: Element, const DX: bool, const P: bool, const NT: bool> {
    x: &'a [T],
    dy: &'a [T],
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

    /// Per row: pass A ([`bwd_sum`]), then pass B (row in cache):
    /// `dx = r * (g - xhat * mean(g * xhat))`.
    #[inline(always)]
    fn run<V: Lanes<T>>(self) {
        let Bwd {
            x,
            dy,
            rstd,
            dx,
            gamma,
            d,
            part: pg,
        } = self;
        pg.fill(Acc::<T>::zero());
        let rows = x.chunks_exact(d).zip(dy.chunks_exact(d));
        for (i, ((xr, dyr), &r)) in rows.zip(rstd).enumerate() {
            let s = bwd_sum::<T, V, DX, P>(xr, dyr, gamma, r, pg);
            if DX {
                let Some(dxr) = dx.get_mut(i * d..(i + 1) * d) else {
                    continue;
                };
                let mgx = s / count(d);
                let n = d.min(gamma.len());
                let (xr, dyr, g) = (head(xr, n), head(dyr, n), head(gamma, n));
                let (rv, mgxv) = (V::splat(r), V::splat(mgx));
                write_row::<T, V, NT>(
                    &mut dxr[..n],
                    // SAFETY: `write_row` passes `k + LANES <= n`; `xr`,
                    // `dyr` and `g` have length `n`.
                    #[inline(always)]
                    |k| unsafe {
                        let xh = V::load_at(xr, k).mul(rv);
                        let g = V::load_at(dyr, k).mul(V::load_acc_at(g, k));
                        rv.mul(g.sub(xh.mul(mgxv)))
                    },
                    #[inline(always)]
                    |k| {
                        let xh = wide(xr, k) * r;
                        let g = wide(dyr, k) * at(g, k);
                        r * (g - xh * mgx)
                    },
                );
            }
        }
        fence::<NT>();
    }
}

/// Runs the backward groups, group `k` filling row `k` of `parts` (rows of
/// `d`) with its dgamma partials if `P`.
#[allow(clippy::too_many_arguments)]
fn bwd_launch<T: Element, const DX: bool, const P: bool, const NT: bool>(
    x: &[T],
    dy: &[T],
    rstd: &[Acc<T>],
    dx: &mut [T],
    gamma: &[Acc<T>],
    d: usize,
    rpg: usize,
    parts: &mut [Acc<T>],
) {
    let mut dx_groups = dx.chunks_mut(rpg * d);
    let mut part_rows = parts.chunks_mut(d);
    let jobs: Vec<Bwd<'_, T, DX, P, NT>> = x
        .chunks(rpg * d)
        .zip(dy.chunks(rpg * d))
        .zip(rstd.chunks(rpg))
        .map(|((x, dy), rstd)| Bwd {
            x,
            dy,
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

/// RMSNorm backward: `(dx, dgamma)`, `None` where not asked for.
pub(crate) fn backward<T: Element>(
    x: &[T],
    dy: &[T],
    d: usize,
    gamma: Option<&[T]>,
    rstd: &[Acc<T>],
    want_dx: bool,
    want_dgamma: bool,
) -> (Option<Buffer<T>>, Option<Buffer<T>>) {
    let n = x.len() / d;
    let g = match gamma {
        Some(_) => widen(gamma),
        None => Buffer::collect(d, std::iter::repeat(<Acc<T> as One>::one())),
    };
    let rpg = rows_per_group(n, d);
    let mut dx = if want_dx {
        Tensor::<T>::scratch(n * d)
    } else {
        Buffer::default()
    };
    // Streaming builds for f32 only; the partials always summed (see the
    // LayerNorm backward).
    let run = match want_dx {
        true if <T as crate::device::cpu::CpuBuilds>::SIMD && should_stream::<T>(n * d) => {
            bwd_launch::<T, true, true, true>
        }
        true => bwd_launch::<T, true, true, false>,
        false => bwd_launch::<T, false, true, false>,
    };
    let mut parts = partial_rows(true, x.len(), (rpg, d), d);
    run(x, dy, rstd, &mut dx, &g, d, rpg, &mut parts);
    let dgamma = want_dgamma.then(|| {
        let sums = reduce_partials(&parts, d);
        Buffer::collect(d, sums.iter().map(|&v| T::from_acc(v)))
    });
    (want_dx.then_some(dx), dgamma)
}

/// The forward with the scaled fallback applied to the rows the kernel
/// flagged: `(y, rstd, scaled)` (see the LayerNorm forward's twin).
pub(crate) fn forward_checked<T: Element>(
    xs: &[T],
    d: usize,
    gs: Option<&[T]>,
    eps: Acc<T>,
) -> (Buffer<T>, Buffer<Acc<T>>, bool) {
    let (mut y, mut rstd, suspect) = forward(xs, d, gs, eps);
    let rows = if suspect {
        scaled::suspect_rows(xs, d, None, &rstd)
    } else {
        Vec::new()
    };
    scaled::forward_rows(
        xs,
        d,
        gs,
        None,
        eps.f64(),
        false,
        &rows,
        &mut y,
        None,
        &mut rstd,
    );
    (y, rstd, !rows.is_empty())
}

/// The backward of a node whose forward took the scaled path (`scaled`)
/// or not: `(dx, dgamma)` as `want` asks. No rows give a zero dgamma.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_checked<T: Element>(
    xs: &[T],
    dy: &[T],
    d: usize,
    gs: Option<&[T]>,
    rstd: &[Acc<T>],
    scaled: bool,
    eps: Acc<T>,
    (want_dx, want_dg): (bool, bool),
) -> (Option<Buffer<T>>, Option<Buffer<T>>) {
    if xs.is_empty() {
        // `d` is small when dgamma is wanted.
        (
            want_dx.then(Buffer::default),
            want_dg.then(|| Buffer::from_vec(vec![T::ZERO; d])),
        )
    } else if scaled {
        let g = scaled::backward(xs, dy, d, gs, eps.f64(), false, (want_dx, want_dg, false));
        (g.dx.map(Buffer::from_vec), g.dgamma.map(Buffer::from_vec))
    } else {
        backward(xs, dy, d, gs, rstd, want_dx, want_dg)
    }
}
