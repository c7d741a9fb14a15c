//! The fused norms' forward kernel: statistics, then the output pass.

use super::stats::{MeanPass, RowPass, VarPass};
use super::*;
use crate::ops::norm::scaled::{rstd_limit, trusted};

/// One forward task: whole rows of `x` and the matching `y`, `mean`, `rstd`.
/// `gamma` and `beta` are always there (ones and negative zeros stand in
/// for absent ones: `v * 1` and `v + -0` are exact, so the bits are those
/// of leaving them out, with one build instead of four); `centre` says
/// LayerNorm (else `mean` is empty and no mean pass runs); `NT` streams `y`
/// past the cache.
struct Fwd<'a, T: Element, const NT: bool> {
    centre: bool,
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
    /// Whether rows are [`segmented`], and whether the output pass may
    /// [`prefetch_next`] (both read once per task, not per row).
    seg: bool,
    pf_next: bool,
    /// Largest trusted `rstd` ([`rstd_limit`]), and whether some row's
    /// statistics fell outside the trusted range ([`trusted`]).
    limit: Acc<T>,
    suspect: bool,
}

impl<T: Element, const NT: bool> Kernel<T> for Fwd<'_, T, NT> {
    /// Whether some row's statistics are out of the trusted range.
    type Output = bool;

    /// Per row: statistics, then `y = (x - m) * rstd * g + b`; the rows go
    /// [`rows_in_step`] at a time, the last few one by one. Where the next
    /// rows exist (and rows are not [`segmented`]), later rows' statistics
    /// passes run inside this rows' output pass ([`write_rows_with`]), so
    /// `x` streams in while `y` streams out: for rows taken one at a time,
    /// the next row's variance pass and the mean pass of the row after it
    /// (no pass then runs on its own); for rows in lockstep, the next rows'
    /// mean pass. Rows too short for that may go [`stats_first`]. Without
    /// `centre` there is no mean pass, and the variance pass (`sum(x^2)`)
    /// takes its place in what runs alongside.
    #[inline(always)]
    fn run<V: Lanes<T>>(mut self) -> bool {
        let n = if self.centre {
            self.mean.len().min(self.rstd.len())
        } else {
            self.rstd.len()
        };
        let n = n.min(self.x.len() / self.d.max(1));
        let row_bytes = self.d * std::mem::size_of::<T>();
        let fuse = NT && overlap(row_bytes) && !self.seg;
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
        self.suspect
    }

    /// Rows past 64 KiB run in 256-bit lanes ([`narrow_lanes`]).
    fn narrow(&self) -> bool {
        narrow_lanes(self.d * std::mem::size_of::<T>())
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

impl<T: Element, const NT: bool> Fwd<'_, T, NT> {
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
            let [m] = self.mean_pass::<V, 1>(xr, false);
            let [sq] = VarPass::<T, V, 1>::new(xr, [m], !self.centre).run(false);
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

    /// The means of rows `xr` (`seg` as in [`each_chunk_in`]); zeros
    /// without `centre`, for which no pass runs.
    #[inline(always)]
    fn mean_pass<V: Lanes<T>, const R: usize>(&self, xr: [&[T]; R], seg: bool) -> [Acc<T>; R] {
        if self.centre {
            MeanPass::<T, V, R>::new(xr).run(seg)
        } else {
            [Acc::<T>::zero(); R]
        }
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
        let seg = R == 1 && self.seg;
        // `match`, not `unwrap_or_else`: the passes must inline into the
        // SIMD build (see [`Kernel`]), and a closure is not sure to.
        let m = match have.m {
            Some(m) => m,
            None => self.mean_pass::<V, R>(xr, seg),
        };
        let sq = match have.sq {
            Some(sq) => sq,
            None => VarPass::<T, V, R>::new(xr, m, !self.centre).run(seg),
        };
        let r = sq.map(|q| Acc::<T>::one() / (q / count(d) + eps).sqrt());
        for s in 0..R {
            if let Some(ro) = self.rstd.get_mut(i + s) {
                *ro = r[s];
                self.suspect |= !trusted(m[s], r[s], self.limit);
            }
            if let (true, Some(mo)) = (self.centre, self.mean.get_mut(i + s)) {
                *mo = m[s];
            }
        }
        let n = d.min(self.gamma.len()).min(self.beta.len());
        let xr = xr.map(|x| head(x, n));
        let yr = rows_at_mut::<T, R>(&mut *self.y, i, d).map(|y| {
            let k = n.min(y.len());
            &mut y[..k]
        });
        let (g, b) = (head(self.gamma, n), head(self.beta, n));
        let (mv, rv) = (splats::<T, V, R>(m), splats::<T, V, R>(r));
        // In the order `xhat * g + b`. The next rows are fetched a row ahead
        // only where `y` is streamed, and not when their mean pass runs
        // alongside (it reads them).
        let (ahead, stride) = (NT && !next && self.pf_next, R.max(self.ahead_rows) * d);
        let (vp, sc) = (
            // SAFETY: the writers pass `i + LANES <= n`, and `xr[k]`, `g`,
            // `b` have length `n`.
            #[inline(always)]
            |k: usize, i: usize, pf: bool| unsafe {
                if pf {
                    prefetch_next(xr[k], stride, i);
                }
                xhat_at(xr[k], i, mv[k], rv[k])
                    .mul(V::load_acc_at(g, i))
                    .add(V::load_acc_at(b, i))
            },
            #[inline(always)]
            |k: usize, i: usize| xhat_one(xr[k], i, m[k], r[k]) * at(g, i) + at(b, i),
        );
        let (v,) = (
            #[inline(always)]
            |k: usize, i: usize| vp(k, i, false),
        );
        if !next {
            write_rows_ahead::<T, V, NT, R>(yr, seg, ahead, vp, sc);
            return Ahead::default();
        }
        let xn = rows_at::<T, R>(self.x, i + R, d);
        if !self.centre {
            // No mean pass: the next rows' `sum(x^2)` runs alongside.
            let zero = [Acc::<T>::zero(); R];
            let var = VarPass::<T, V, R>::new(xn, zero, true);
            return Ahead {
                m: Some(zero),
                sq: Some(beside::<T, V, NT, R, _>(yr, v, sc, var)),
                m_after: None,
            };
        }
        if R > 1 {
            // Rows in lockstep carry the next rows' mean pass only: their
            // variance pass too (three rows' worth of accumulators per row
            // in step) is slower.
            let mean = MeanPass::<T, V, R>::new(xn);
            return Ahead {
                m: Some(beside::<T, V, NT, R, _>(yr, v, sc, mean)),
                ..Ahead::default()
            };
        }
        let m_next = match have.m_after {
            Some(m) => m,
            None => MeanPass::<T, V, R>::new(xn).run(false),
        };
        let mut var = VarPass::<T, V, R>::new(xn, m_next, false);
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

/// The output pass over rows `yr` (`v`, `sc` as [`write_rows_with`] takes
/// them) with the statistics pass `p` run alongside; `p`'s results.
#[inline(always)]
fn beside<T: Element, V: Lanes<T>, const NT: bool, const R: usize, P: RowPass<Acc<T>, R>>(
    yr: [&mut [T]; R],
    v: impl Fn(usize, usize) -> V,
    sc: impl Fn(usize, usize) -> Acc<T>,
    mut p: P,
) -> [Acc<T>; R] {
    let n = p.len();
    write_rows_with::<T, V, NT, R>(
        yr,
        v,
        sc,
        n,
        // SAFETY: `write_rows_with` calls this as `each_chunk(n, ..)`
        // would, so `k + LANES <= n = p.len()`.
        #[inline(always)]
        |j, k| unsafe { p.chunk(j, k) },
    );
    p.finish()
}

/// The forward's outputs: `y`, the per-row statistics backward needs
/// (`mean` empty for RMSNorm), and whether some row's statistics are out
/// of the trusted range (then, and only then, the caller looks for rows to
/// recompute: see `ops/norm/scaled.rs`).
pub(crate) struct Forward<T: Element> {
    pub y: Buffer<T>,
    pub mean: Buffer<Acc<T>>,
    pub rstd: Buffer<Acc<T>>,
    pub suspect: bool,
}

/// Steps of [`ROWS_IN_STEP`] rows a forward task over rows in lockstep
/// takes at least (see [`fwd_rows_per_task`]).
pub(crate) const FWD_TASK_STEPS: usize = 16;

/// Rows per forward task: `rpc` ([`rows_per_chunk`]), but for rows taken
/// [`ROWS_IN_STEP`] at a time at least [`FWD_TASK_STEPS`] steps (unless
/// [`long_fwd_tasks`] is off). Only a step with a next step in its task
/// carries that step's mean pass, and a chunk of 16384-wide f32 rows is
/// one step.
pub(super) fn fwd_rows_per_task(row_bytes: usize, rpc: usize) -> usize {
    if long_fwd_tasks() && rows_in_step(row_bytes) == ROWS_IN_STEP {
        rpc.max(FWD_TASK_STEPS * ROWS_IN_STEP)
    } else {
        rpc
    }
}

/// Runs the forward tasks: one per chunk of rows, in parallel when there
/// is more than one ([`dispatch_all`]); whether any row is suspect.
#[allow(clippy::too_many_arguments)]
fn fwd_launch<T: Element, const NT: bool>(
    centre: bool,
    x: &[T],
    y: &mut [T],
    mean: &mut [Acc<T>],
    rstd: &mut [Acc<T>],
    gamma: &[Acc<T>],
    beta: &[Acc<T>],
    d: usize,
    eps: Acc<T>,
) -> bool {
    let row_bytes = d * std::mem::size_of::<T>();
    let limit = rstd_limit::<Acc<T>>();
    let (seg, pf_next) = (segmented(row_bytes), prefetch_next_on());
    let rpc = fwd_rows_per_task(row_bytes, rows_per_chunk(d));
    // Without `centre`, `mean` is empty: every task gets an empty slice of it.
    let means = mean
        .chunks_mut(rpc)
        .chain(std::iter::repeat_with(Default::default));
    let jobs: Vec<Fwd<'_, T, NT>> = x
        .chunks(rpc * d)
        .zip(y.chunks_mut(rpc * d))
        .zip(means.zip(rstd.chunks_mut(rpc)))
        .map(|((x, y), (mean, rstd))| Fwd {
            centre,
            x,
            y,
            mean,
            rstd,
            gamma,
            beta,
            d,
            eps,
            ahead_rows: 1,
            seg,
            pf_next,
            limit,
            suspect: false,
        })
        .collect();
    dispatch_all(jobs).contains(&true)
}

/// The forward over `x.len() / d` rows of `d` (`d > 0`; a parameter, when
/// given, has `d` elements): LayerNorm if `centre`, else RMSNorm (then
/// `beta` must be `None`; `mean` comes back empty).
pub(crate) fn forward<T: Element>(
    x: &[T],
    d: usize,
    gamma: Option<&[T]>,
    beta: Option<&[T]>,
    eps: Acc<T>,
    centre: bool,
) -> Forward<T> {
    let n = x.len() / d;
    let g = widen_or(gamma, d, <Acc<T> as One>::one());
    let b = widen_or(beta, d, -<Acc<T> as Zero>::zero());
    let mut y = Tensor::<T>::scratch(n * d);
    let mut mean = Buffer::from_vec(vec![<Acc<T> as Zero>::zero(); if centre { n } else { 0 }]);
    let mut rstd = Buffer::from_vec(vec![<Acc<T> as Zero>::zero(); n]);
    // Streaming builds exist for f32 only; `CpuBuilds::SIMD` first keeps them
    // from being compiled for other types.
    let stream = <T as crate::device::cpu::CpuBuilds>::SIMD && should_stream::<T>(n * d);
    let run = if stream {
        fwd_launch::<T, true>
    } else {
        fwd_launch::<T, false>
    };
    let suspect = run(
        centre,
        &x[..n * d],
        &mut y,
        &mut mean,
        &mut rstd,
        &g,
        &b,
        d,
        eps,
    );
    Forward {
        y,
        mean,
        rstd,
        suspect,
    }
}
