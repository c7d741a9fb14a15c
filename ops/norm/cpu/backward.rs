//! The fused norms' backward kernel: pass A (row sums and the
//! dgamma/dbeta partials), then pass B (`dx`). Without `centre` (RMSNorm)
//! the mean is 0, the `<g>` term 0 and no dbeta partial is added.

use super::*;

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

    /// Row `s`'s chunk at `i`: `(xhat, dy)`; with
    /// `pf`, prefetches ahead of it (rows read from memory, not the cached
    /// `prev`).
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
            let xh = xhat_at(self.x[s], i, self.mv[s], self.rv[s]);
            (xh, V::load_at(self.dy[s], i))
        }
    }

    /// Adds the rows' terms at `k` past the last whole chunk to the
    /// partials, row after row (dbeta's only if `centre`).
    #[inline(always)]
    fn add_tail(&self, part: &mut [Acc<T>], (lay, centre): (Layout, bool), t: usize, n: usize) {
        for s in 0..R {
            for k in t..n {
                let xh = xhat_one(self.x[s], k, self.m[s], self.r[s]);
                let dyv = wide(self.dy[s], k);
                if let Some(v) = part.get_mut(lay.g(k)) {
                    *v += dyv * xh;
                }
                if let (true, Some(v)) = (centre, part.get_mut(lay.b(k))) {
                    *v += dyv;
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
    /// LayerNorm: add the dbeta partials too.
    centre: bool,
    cur: Rows<'a, T, V, R>,
    prev: Option<Rows<'a, T, V, R>>,
    /// Whether this pass adds its own rows' partials.
    own: bool,
    gamma: &'a [Acc<T>],
    lay: Layout,
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
        (part_len, lay, centre): (usize, Layout, bool),
    ) -> Self {
        let zero = V::splat(Acc::<T>::zero());
        let n = cur.len().min(gamma.len());
        let n = prev.as_ref().map_or(n, |p| n.min(p.len()));
        let n = match (P, part_len >= lay.len()) {
            (true, true) => n.min(lay.d),
            (true, false) => 0,
            (false, _) => n,
        };
        PassA {
            centre,
            cur: cur.head(n),
            prev: prev.map(|p| p.head(n)),
            own: P && own,
            gamma,
            lay,
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
    /// `i` a multiple of `LANES`, `i + LANES <= self.n`, and `part` (if
    /// `P`) at least `self.lay.len()` long.
    #[inline(always)]
    unsafe fn chunk<const OWN: bool, const PREV: bool>(
        &mut self,
        part: &mut [Acc<T>],
        j: usize,
        i: usize,
    ) {
        let zero = V::splat(Acc::<T>::zero());
        let rmw = P && (OWN || PREV);
        // SAFETY: the caller's contract; every row slice is at least `n`
        // long, and the chunk's slots lie below `lay.len()` (`i < n <= d`).
        unsafe {
            let gam = V::load_acc_at(self.gamma, i);
            let (gi, bi) = self.lay.chunk(i);
            let (mut pgv, mut pbv) = (zero, zero);
            let c = self.centre;
            if rmw {
                pgv = V::load_acc_at(part, gi);
                if c {
                    pbv = V::load_acc_at(part, bi);
                }
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
            if rmw {
                pgv.store_acc_at(part, gi);
                if c {
                    pbv.store_acc_at(part, bi);
                }
            }
        }
    }

    /// Per row, the sums of `g` and `g * xhat` (zero unless `DX`).
    #[inline(always)]
    fn finish(self, part: &mut [Acc<T>]) -> [(Acc<T>, Acc<T>); R] {
        let (n, gamma, lay) = (self.n, self.gamma, self.lay);
        let t = n / LANES * LANES;
        if let (true, Some(p)) = (P, &self.prev) {
            p.add_tail(part, (lay, self.centre), t, n);
        }
        if self.own {
            self.cur.add_tail(part, (lay, self.centre), t, n);
        }
        let mut out = [(Acc::<T>::zero(), Acc::<T>::zero()); R];
        if !DX {
            return out;
        }
        for (s, o) in out.iter_mut().enumerate() {
            let (mut a1, mut a2) = (fold_all(self.s1[s]), fold_all(self.s2[s]));
            let c = &self.cur;
            for k in t..n {
                let xh = xhat_one(c.x[s], k, c.m[s], c.r[s]);
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
        if !P {
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
    fn run(mut self, part: &mut [Acc<T>]) -> [(Acc<T>, Acc<T>); R] {
        // SAFETY (each closure): `each_chunk` passes multiples of `LANES`
        // with `i + LANES <= n`; `new` checked `part`'s length when `P`.
        match self.mode() {
            0 => each_chunk(
                self.n,
                #[inline(always)]
                |j, i| unsafe { self.chunk::<true, false>(part, j, i) },
            ),
            1 => each_chunk(
                self.n,
                #[inline(always)]
                |j, i| unsafe { self.chunk::<false, false>(part, j, i) },
            ),
            _ => each_chunk(
                self.n,
                #[inline(always)]
                |j, i| unsafe { self.chunk::<true, true>(part, j, i) },
            ),
        }
        self.finish(part)
    }
}

/// Where a partial row of `2d` keeps column `k`'s dgamma and dbeta terms:
/// as two halves (`k` and `d + k`), or interleaved chunk by chunk (the
/// chunk at `i` at `2i`, its dbeta terms [`LANES`] after; the columns past
/// the last whole chunk `t` after all chunks, dgamma at `t + k`, dbeta at
/// `d + k`), so that pass A reads and writes the partials as one stream of
/// lines, not two. Only the places differ: each term is added in the same
/// order either way.
#[derive(Clone, Copy)]
pub(crate) struct Layout {
    d: usize,
    t: usize,
    il: bool,
}

impl Layout {
    pub(crate) fn new(d: usize, il: bool) -> Self {
        Layout {
            d,
            t: d / LANES * LANES,
            il,
        }
    }

    /// The partial row's length.
    #[inline(always)]
    fn len(self) -> usize {
        2 * self.d
    }

    /// The slots of the chunk at `i` (a multiple of [`LANES`] below `t`).
    #[inline(always)]
    pub(crate) fn chunk(self, i: usize) -> (usize, usize) {
        if self.il {
            (2 * i, 2 * i + LANES)
        } else {
            (i, self.d + i)
        }
    }

    /// Column `k`'s dgamma slot.
    #[inline(always)]
    pub(crate) fn g(self, k: usize) -> usize {
        match (self.il, k < self.t) {
            (true, true) => k + k / LANES * LANES,
            (true, false) => self.t + k,
            (false, _) => k,
        }
    }

    /// Column `k`'s dbeta slot.
    #[inline(always)]
    pub(crate) fn b(self, k: usize) -> usize {
        match (self.il, k < self.t) {
            (true, true) => k + k / LANES * LANES + LANES,
            _ => self.d + k,
        }
    }
}

/// Row sums from pass A, `(sum g, sum g * xhat)` per row.
type Sums<T, const R: usize> = [(Acc<T>, Acc<T>); R];

/// One backward task: a group of consecutive rows, their `dx` (empty unless
/// `DX`) and, if `P`, its partial row `[pg | pb]` of `2d` (its contents on
/// entry do not matter: the task zeroes it). `NT` streams `dx` past the
/// cache.
struct Bwd<'a, T: Element, const DX: bool, const P: bool, const NT: bool> {
    /// LayerNorm (else `mean` is empty: RMSNorm's mean is 0).
    centre: bool,
    x: &'a [T],
    dy: &'a [T],
    mean: &'a [Acc<T>],
    rstd: &'a [Acc<T>],
    dx: &'a mut [T],
    gamma: &'a [Acc<T>],
    d: usize,
    part: &'a mut [Acc<T>],
    /// Whether the rows pair their partials ([`paired_partials`]), and
    /// whether pass B may [`prefetch_next`]: the switch is on and rows are
    /// at most 64 KiB, since longer rows' next `x` and `dy` would not fit
    /// in L2 beside this row's, `gamma` and the partials. Both are set once
    /// per task, not per row.
    pair: bool,
    pf_next: bool,
    /// Where the partial row keeps each column's terms.
    lay: Layout,
}

impl<T: Element, const DX: bool, const P: bool, const NT: bool> Kernel<T>
    for Bwd<'_, T, DX, P, NT>
{
    type Output = ();

    /// Per row: pass A ([`PassA`]), then, with the row still in cache,
    /// pass B: `dx = r * (g - mean(g) - xhat * mean(g * xhat))`; the rows go
    /// [`bwd_rows_in_step`] at a time, the last few one by one. Where the next
    /// rows exist, their pass A runs inside this rows' pass B
    /// ([`write_rows_with`]), so `x` and `dy` stream in while `dx` streams
    /// out.
    #[inline(always)]
    fn run<V: Lanes<T>>(mut self) {
        let d = self.d;
        let part = std::mem::take(&mut self.part);
        part.fill(Acc::<T>::zero());
        let n = if self.centre {
            self.mean.len().min(self.rstd.len())
        } else {
            self.rstd.len()
        };
        let n = n.min(self.x.len().min(self.dy.len()) / d.max(1));
        let fuse = DX && NT && overlap_backward(d * std::mem::size_of::<T>());
        let mut i = 0;
        match bwd_rows_in_step(d * std::mem::size_of::<T>()) {
            ROWS_IN_STEP => self.steps::<V, ROWS_IN_STEP>(&mut i, n, fuse, part),
            2 => self.steps::<V, 2>(&mut i, n, fuse, part),
            _ => {}
        }
        self.steps::<V, 1>(&mut i, n, fuse, part);
        fence::<NT>();
    }

    /// Rows past 64 KiB run in 256-bit lanes ([`narrow_lanes`]).
    fn narrow(&self) -> bool {
        narrow_lanes(self.d * std::mem::size_of::<T>())
    }
}

impl<'a, T: Element, const DX: bool, const P: bool, const NT: bool> Bwd<'a, T, DX, P, NT> {
    /// Rows from `*i` on, `R` at a time ([`Bwd::rows`]), while `R` of the
    /// `n` are left; `*i` ends at the first row not done.
    #[inline(always)]
    fn steps<V: Lanes<T>, const R: usize>(
        &mut self,
        i: &mut usize,
        n: usize,
        fuse: bool,
        part: &mut [Acc<T>],
    ) {
        let mut sums = None;
        while *i + R <= n {
            let (next, after) = (fuse && *i + 2 * R <= n, fuse && *i + 3 * R <= n);
            sums = self.rows::<V, R>(*i, part, sums, (next, after));
            *i += R;
        }
    }

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
        part_len: usize,
    ) -> PassA<'a, T, V, DX, P, R> {
        let prev = prev.map(|k| self.rows_a::<V, R>(k));
        let cur = self.rows_a::<V, R>(i);
        PassA::new(
            cur,
            prev,
            !defer,
            self.gamma,
            (part_len, self.lay, self.centre),
        )
    }

    /// Rows `i..i + R`, in lockstep: pass A (unless `sums` has it already),
    /// then pass B; with `next`, pass A of rows `i + R..i + 2R` runs inside
    /// pass B, and its sums are returned. The flag beside the sums says
    /// that pass A left its rows' partials to the next pass A (paired
    /// partials, see [`PassA`]): only where that next pass A exists
    /// (`next` here, `after` for rows `i + R..`).
    #[inline(always)]
    fn rows<V: Lanes<T>, const R: usize>(
        &mut self,
        i: usize,
        part: &mut [Acc<T>],
        sums: Option<(Sums<T, R>, bool)>,
        (next, after): (bool, bool),
    ) -> Option<(Sums<T, R>, bool)> {
        let d = self.d;
        let pair = P && self.pair;
        let (sums, deferred) = match sums {
            Some(s) => s,
            None => {
                let defer = pair && next;
                let sums = self.pass_a::<V, R>(i, None, defer, part.len()).run(part);
                (sums, defer)
            }
        };
        if !DX {
            return None;
        }
        let (m, r) = self.stats::<R>(i);
        let inv_d = Acc::<T>::one() / count(d);
        // RMSNorm's mean does not move with `x`: no `<g>` term (and `g - 0`
        // is `g` exactly).
        let centre = self.centre;
        let mg = sums.map(|(s1, _)| if centre { s1 * inv_d } else { Acc::<T>::zero() });
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
        let pl = part.len();
        let a = next.then(|| self.pass_a::<V, R>(i + R, deferred.then_some(i), defer, pl));
        let dxr = rows_at_mut::<T, R>(&mut *self.dx, i, d).map(|v| {
            let k = n.min(v.len());
            &mut v[..k]
        });
        // The next rows' `x` and `dy` are fetched a row ahead only for
        // outputs large enough to stream (smaller data is in cache anyway,
        // and the prefetches only cost time there), where `pf_next`
        // allows it, and not when the next rows' pass A runs alongside (it
        // reads them).
        let ahead = !next && NT && self.pf_next;
        // SAFETY (both closures' loads): the writers pass `k + LANES <= n`;
        // `xr[s]`, `dyr[s]` and `g` have length `n`.
        let (vp, sc) = (
            #[inline(always)]
            |s: usize, k: usize, pf: bool| unsafe {
                if pf {
                    prefetch_next(xr[s], R * d, k);
                    prefetch_next(dyr[s], R * d, k);
                }
                let xh = xhat_at(xr[s], k, mv[s], rv[s]);
                let g = V::load_at(dyr[s], k).mul(V::load_acc_at(g, k));
                rv[s].mul(g.sub(mgv[s]).sub(xh.mul(mgxv[s])))
            },
            #[inline(always)]
            |s: usize, k: usize| {
                let xh = xhat_one(xr[s], k, m[s], r[s]);
                let g = wide(dyr[s], k) * at(g, k);
                r[s] * (g - mg[s] - xh * mgx[s])
            },
        );
        let (v,) = (
            #[inline(always)]
            |s: usize, k: usize| vp(s, k, false),
        );
        let Some(mut a) = a else {
            write_rows_ahead::<T, V, NT, R>(dxr, false, ahead, vp, sc);
            if deferred {
                // Not reached (rows defer only when `next`), but never lose
                // the partials.
                self.pass_a::<V, R>(i, None, false, part.len()).run(part);
            }
            return None;
        };
        // SAFETY (each closure): `write_rows_with` calls it as
        // `each_chunk(a.n, ..)` would, so `k` is a multiple of `LANES` and
        // `k + LANES <= a.n`; `new` checked `part`'s length.
        let n = a.n;
        match a.mode() {
            0 => write_rows_with::<T, V, NT, R>(
                dxr,
                v,
                sc,
                n,
                #[inline(always)]
                |j, k| unsafe { a.chunk::<true, false>(part, j, k) },
            ),
            1 => write_rows_with::<T, V, NT, R>(
                dxr,
                v,
                sc,
                n,
                #[inline(always)]
                |j, k| unsafe { a.chunk::<false, false>(part, j, k) },
            ),
            _ => write_rows_with::<T, V, NT, R>(
                dxr,
                v,
                sc,
                n,
                #[inline(always)]
                |j, k| unsafe { a.chunk::<true, true>(part, j, k) },
            ),
        }
        Some((a.finish(part), defer))
    }
}

/// The backward's outputs; `None` where not asked for.
pub(crate) struct Backward<T: Element> {
    pub dx: Option<Buffer<T>>,
    pub dgamma: Option<Buffer<T>>,
    pub dbeta: Option<Buffer<T>>,
}

/// Runs the backward groups (in parallel when there are several), group
/// `k` filling row `k` of `parts` (rows of `2d`) with its partials if `P`.
#[allow(clippy::too_many_arguments)]
fn bwd_launch<T: Element, const DX: bool, const P: bool, const NT: bool>(
    centre: bool,
    x: &[T],
    dy: &[T],
    mean: &[Acc<T>],
    rstd: &[Acc<T>],
    dx: &mut [T],
    gamma: &[Acc<T>],
    d: usize,
    rpg: usize,
    parts: &mut [Acc<T>],
    lay: Layout,
) {
    let mut dx_groups = dx.chunks_mut(rpg * d);
    let mut part_rows = parts.chunks_mut(2 * d);
    let row_bytes = d * std::mem::size_of::<T>();
    let (pair, pf_next) = (
        paired_partials(row_bytes),
        prefetch_next_on() && row_bytes <= *STEP_ROW_BYTES.end(),
    );
    // Without `centre`, `mean` is empty: every group gets an empty slice.
    let means = mean.chunks(rpg).chain(std::iter::repeat(&[][..]));
    let jobs: Vec<Bwd<'_, T, DX, P, NT>> = x
        .chunks(rpg * d)
        .zip(dy.chunks(rpg * d))
        .zip(means.zip(rstd.chunks(rpg)))
        .map(|((x, dy), (mean, rstd))| Bwd {
            centre,
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
            pair,
            pf_next,
            lay,
        })
        .collect();
    dispatch_all(jobs);
}

/// The backward: LayerNorm's with `mean`, RMSNorm's without (then no
/// dbeta). `gamma` of `None` means the identity scale; `want` is `(dx,
/// dgamma, dbeta)`.
pub(crate) fn backward<T: Element>(
    x: &[T],
    dy: &[T],
    d: usize,
    gamma: Option<&[T]>,
    (mean, rstd): (Option<&[Acc<T>]>, &[Acc<T>]),
    (want_dx, want_dgamma, want_dbeta): (bool, bool, bool),
) -> Backward<T> {
    let centre = mean.is_some();
    let (mean, want_dbeta) = (mean.unwrap_or_default(), want_dbeta && centre);
    let n = x.len() / d;
    let want_p = want_dgamma || want_dbeta;
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
    // As in the forward: streaming builds for f32 only. The partials are
    // always summed (a few adds per element into a row that stays in
    // cache, dropped when not wanted), so only two builds exist per `NT`.
    let stream = want_dx && <T as crate::device::cpu::CpuBuilds>::SIMD && should_stream::<T>(n * d);
    let run = match (want_dx, stream) {
        (true, true) => bwd_launch::<T, true, true, true>,
        (true, false) => bwd_launch::<T, true, true, false>,
        (false, _) => bwd_launch::<T, false, true, false>,
    };
    let mut parts = partial_rows(true, x.len(), (rpg, d), 2 * d);
    let lay = Layout::new(d, interleaved_partials());
    run(
        centre, x, dy, mean, rstd, &mut dx, &g, d, rpg, &mut parts, lay,
    );
    let (dgamma, dbeta) = if want_p {
        let sums = reduce_partials(&parts, 2 * d);
        let out = |slot: fn(Layout, usize) -> usize| {
            Buffer::collect(d, (0..d).map(|k| T::from_acc(at(&sums, slot(lay, k)))))
        };
        (
            want_dgamma.then(|| out(Layout::g)),
            want_dbeta.then(|| out(Layout::b)),
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
