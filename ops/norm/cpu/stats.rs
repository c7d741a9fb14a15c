//! The forward's statistics passes: the mean, then `sum((x - m)^2)`.

use super::*;

/// A statistics pass over `R` rows of `len()` elements, chunk by chunk:
/// [`RowPass::chunk`] adds one chunk (as [`each_chunk_in`] hands them out),
/// [`RowPass::finish`] folds and adds the elements past the last whole
/// chunk, in order. A joined loop calls `chunk` itself.
pub(super) trait RowPass<A, const R: usize>: Sized {
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
pub(super) struct MeanPass<'a, T: Element, V: Lanes<T>, const R: usize> {
    x: [&'a [T]; R],
    x0: [Acc<T>; R],
    v0: [V; R],
    acc: [[V; UNROLL]; R],
    /// Elements per row (every row is at least this long).
    pub(super) n: usize,
}

impl<'a, T: Element, V: Lanes<T>, const R: usize> MeanPass<'a, T, V, R> {
    #[inline(always)]
    pub(super) fn new(x: [&'a [T]; R]) -> Self {
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
/// of the two passes (a [`RowPass`]); RMSNorm's only pass, with `m = 0`
/// and `first` set (it then prefetches as the mean pass does).
pub(super) struct VarPass<'a, T: Element, V: Lanes<T>, const R: usize> {
    x: [&'a [T]; R],
    m: [Acc<T>; R],
    mv: [V; R],
    acc: [[V; UNROLL]; R],
    first: bool,
    /// Elements per row (every row is at least this long).
    pub(super) n: usize,
}

impl<'a, T: Element, V: Lanes<T>, const R: usize> VarPass<'a, T, V, R> {
    #[inline(always)]
    pub(super) fn new(x: [&'a [T]; R], m: [Acc<T>; R], first: bool) -> Self {
        let n = x.iter().map(|r| r.len()).min().unwrap_or(0);
        VarPass {
            x: x.map(|r| head(r, n)),
            m,
            mv: splats::<T, V, R>(m),
            acc: [[V::splat(Acc::<T>::zero()); UNROLL]; R],
            first,
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
            if self.first {
                prefetch::<T, R>(self.x[s], i);
            }
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
