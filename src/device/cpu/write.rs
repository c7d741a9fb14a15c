//! Output rows: one row, rows in lockstep, or rows written alongside the
//! next rows' first pass; non-temporal stores for streamed outputs.

use super::*;

/// Writes one output row: each whole group of [`LANES`] from `v(i)` (the
/// group `dst[i..i + LANES]`), the rest one by one from `s(i)`, which must
/// compute the same formula in scalars, so the bits do not depend on where
/// the groups fall. `v` is only called with `i + LANES <= dst.len()`, and
/// may rely on that to load its inputs unchecked. With `NT` (f32), the
/// groups start at a 64-byte boundary and go out as non-temporal stores;
/// end the task with [`fence`].
#[inline(always)]
pub(crate) fn write_row<T: Element, V: Lanes<T>, const NT: bool>(
    dst: &mut [T],
    v: impl Fn(usize) -> V,
    s: impl Fn(usize) -> Acc<T>,
) {
    let n = dst.len();
    let stream = NT && is_f32::<T>();
    let h = if stream {
        dst.as_ptr().align_offset(64).min(n)
    } else {
        0
    };
    let (first, rest) = dst.split_at_mut(h);
    for (i, d) in first.iter_mut().enumerate() {
        *d = T::from_acc(s(i));
    }
    let (body, tail) = rest.as_chunks_mut::<LANES>();
    let t0 = h + LANES * body.len();
    // `align_offset` may give up (returning more than `n`); then `h == n`
    // and there is no body. Otherwise the body starts 64-byte aligned.
    if stream && (body.as_ptr() as usize).is_multiple_of(64) {
        for (k, d) in body.iter_mut().enumerate() {
            // SAFETY: every group of the body is 64-byte aligned.
            unsafe { v(h + LANES * k).stream(d) }
        }
    } else {
        for (k, d) in body.iter_mut().enumerate() {
            v(h + LANES * k).store(d)
        }
    }
    for (k, d) in tail.iter_mut().enumerate() {
        *d = T::from_acc(s(t0 + k));
    }
}

/// `dst.copy_from_slice(src)` (up to the shorter length) written with
/// non-temporal stores, as glibc's `memcpy` writes blocks past its own
/// threshold (`glibc.cpu.x86_non_temporal_threshold`). The
/// benchmark's copy baseline uses it so that blocks under that threshold
/// are also timed at the streaming rate, the faster one for data that does
/// not fit in the caches.
#[cfg_attr(not(feature = "probes"), allow(dead_code))] // read by `probes`
pub fn stream_copy(dst: &mut [f32], src: &[f32]) {
    struct Copy<'a> {
        dst: &'a mut [f32],
        src: &'a [f32],
    }
    impl Kernel<f32> for Copy<'_> {
        type Output = ();
        #[inline(always)]
        fn run<V: Lanes<f32>>(self) {
            let n = self.dst.len().min(self.src.len());
            let (dst, src) = (&mut self.dst[..n], &self.src[..n]);
            write_row::<f32, V, true>(
                dst,
                // SAFETY: `write_row` keeps `i + LANES <= n = src.len()`.
                #[inline(always)]
                |i| unsafe { V::load_at(src, i) },
                #[inline(always)]
                |i| src.get(i).copied().unwrap_or_default(),
            );
            fence::<true>();
        }
    }
    dispatch(Copy { dst, src })
}

/// Writes `R` output rows of one length in lockstep: group `c` of row 0,
/// then group `c` of row 1, and so on, so that `R` write streams (and the
/// read streams `v` pulls from) are in flight at once rather than one. Each
/// row gets exactly what [`write_row`] would write (`v(k, i)` and `s(k, i)`
/// are row `k`'s formulas); rows of unequal length or, when streaming,
/// unequal alignment are written one after another by [`write_row`]. With
/// `seg`, a single row is written as its [`UNROLL`] runs (see
/// [`each_chunk_in`]) in lockstep.
#[inline(always)]
pub(crate) fn write_rows<T: Element, V: Lanes<T>, const NT: bool, const R: usize>(
    dst: [&mut [T]; R],
    seg: bool,
    v: impl Fn(usize, usize) -> V,
    s: impl Fn(usize, usize) -> Acc<T>,
) {
    let n = dst.first().map_or(0, |r| r.len());
    let run = n / LANES / UNROLL * LANES;
    if R == 1 && seg && run > 0 {
        // One long row: its `UNROLL` runs in lockstep, then the rest.
        let Some(row) = dst.into_iter().next() else {
            return;
        };
        let (runs, rest) = row.split_at_mut(UNROLL * run);
        let mut parts = runs.chunks_exact_mut(run);
        let parts: [&mut [T]; UNROLL] = std::array::from_fn(|_| parts.next().unwrap_or_default());
        write_lockstep::<T, V, NT, UNROLL>(
            parts,
            #[inline(always)]
            |k, i| v(0, k * run + i),
            #[inline(always)]
            |k, i| s(0, k * run + i),
        );
        let t = UNROLL * run;
        return write_row::<T, V, NT>(
            rest,
            #[inline(always)]
            |i| v(0, t + i),
            #[inline(always)]
            |i| s(0, t + i),
        );
    }
    write_lockstep::<T, V, NT, R>(dst, v, s)
}

/// [`write_rows`] with `v(k, i, pf)`, where `pf` says whether `v` should
/// prefetch ahead: `ahead`, passed as a constant into one of two writer
/// calls, so that the loop has no test on it (a test in the loop slows
/// short rows). Pass `v` by value (an `#[inline(always)]` closure): passed
/// as `&closure`, the call to it may not be inlined, and the pass then
/// runs several times slower.
#[inline(always)]
pub(crate) fn write_rows_ahead<T: Element, V: Lanes<T>, const NT: bool, const R: usize>(
    dst: [&mut [T]; R],
    seg: bool,
    ahead: bool,
    v: impl Fn(usize, usize, bool) -> V,
    s: impl Fn(usize, usize) -> Acc<T>,
) {
    if ahead {
        write_rows::<T, V, NT, R>(
            dst,
            seg,
            #[inline(always)]
            |k, i| v(k, i, true),
            s,
        )
    } else {
        write_rows::<T, V, NT, R>(
            dst,
            seg,
            #[inline(always)]
            |k, i| v(k, i, false),
            s,
        )
    }
}

/// [`write_rows`] without runs: [`write_rows_with`] with nothing alongside
/// (one row goes straight to [`write_row`], the tighter loop).
#[inline(always)]
fn write_lockstep<T: Element, V: Lanes<T>, const NT: bool, const R: usize>(
    dst: [&mut [T]; R],
    v: impl Fn(usize, usize) -> V,
    s: impl Fn(usize, usize) -> Acc<T>,
) {
    if R == 1 {
        return write_each::<T, V, NT, R>(dst, v, s);
    }
    write_rows_with::<T, V, NT, R>(dst, v, s, 0, |_, _| {})
}

/// [`write_row`] for each row in turn.
#[inline(always)]
fn write_each<T: Element, V: Lanes<T>, const NT: bool, const R: usize>(
    dst: [&mut [T]; R],
    v: impl Fn(usize, usize) -> V,
    s: impl Fn(usize, usize) -> Acc<T>,
) {
    for (k, row) in dst.into_iter().enumerate() {
        write_row::<T, V, NT>(
            row,
            #[inline(always)]
            |i| v(k, i),
            #[inline(always)]
            |i| s(k, i),
        );
    }
}

/// Writes `R` rows in lockstep (see [`write_rows`]), and meanwhile `also(j, i)` for each
/// chunk of a row of `m` elements, as [`each_chunk`] would call it (same
/// order, same `j`). The two are interleaved chunk by chunk, so a kernel
/// can write one group of rows while it reads the next: the reads then go
/// out to memory alongside the writes instead of in a pass of their own
/// (the statistics pass of the next rows costs no extra time over the
/// data). What is written is what [`write_row`] writes for each row, and
/// the calls to `also` are those of `each_chunk`; for rows of unequal
/// length or alignment the two run one after the other, and the rows are
/// written one by one.
#[inline(always)]
pub(crate) fn write_rows_with<T: Element, V: Lanes<T>, const NT: bool, const R: usize>(
    dst: [&mut [T]; R],
    v: impl Fn(usize, usize) -> V,
    s: impl Fn(usize, usize) -> Acc<T>,
    m: usize,
    mut also: impl FnMut(usize, usize),
) {
    let n = dst.first().map_or(0, |r| r.len());
    let stream = NT && is_f32::<T>();
    let head = |r: &[T]| {
        if stream {
            r.as_ptr().align_offset(64).min(n)
        } else {
            0
        }
    };
    let h = dst.first().map_or(0, |r| head(r));
    let same = dst.iter().all(|r| r.len() == n && head(r) == h);
    if !same {
        each_chunk(m, also);
        return write_each::<T, V, NT, R>(dst, v, s);
    }
    let mut parts = dst.map(|r| r.split_at_mut(h));
    for (k, (first, _)) in parts.iter_mut().enumerate() {
        for (i, e) in first.iter_mut().enumerate() {
            *e = T::from_acc(s(k, i));
        }
    }
    let mut rows = parts.map(|(_, rest)| rest.as_chunks_mut::<LANES>());
    let groups = (n - h) / LANES;
    let nc = m / LANES;
    let nt = stream
        && rows
            .iter()
            .all(|(b, _)| (b.as_ptr() as usize).is_multiple_of(64));
    each_chunk(
        nc.max(groups) * LANES,
        #[inline(always)]
        |j, i| {
            let c = i / LANES;
            if c < nc {
                also(j, i);
            }
            for (k, (body, _)) in rows.iter_mut().enumerate() {
                if let Some(d) = body.get_mut(c) {
                    if nt {
                        // SAFETY: every group of every body is 64-byte
                        // aligned (checked above).
                        unsafe { v(k, h + i).stream(d) }
                    } else {
                        v(k, h + i).store(d)
                    }
                }
            }
        },
    );
    let t0 = h + LANES * groups;
    for (k, (_, tail)) in rows.iter_mut().enumerate() {
        for (i, e) in tail.iter_mut().enumerate() {
            *e = T::from_acc(s(k, t0 + i));
        }
    }
}

/// Default for [`stream_threshold`]: outputs of at least this many bytes
/// are streamed past the cache. Twice a 2 MiB L2 per core: an output this
/// large is not in the writer's L2 when the next op reads it.
pub const DEFAULT_STREAM_BYTES: usize = 4 << 20;

static STREAM_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_STREAM_BYTES);

/// Outputs of at least this many bytes are written with non-temporal stores
/// (f32 only; other types always use ordinary stores).
pub fn stream_threshold() -> usize {
    STREAM_BYTES.load(Ordering::Relaxed)
}

/// Sets [`stream_threshold`]; `usize::MAX` turns streaming stores off. A
/// process-wide setting, for benchmarks that compare the two.
#[cfg_attr(not(feature = "probes"), allow(dead_code))]
pub fn set_stream_threshold(bytes: usize) {
    STREAM_BYTES.store(bytes, Ordering::Relaxed)
}

/// Whether an output of `elems` elements of `T` should be streamed.
#[inline]
pub(crate) fn should_stream<T: Element>(elems: usize) -> bool {
    cfg!(target_arch = "x86_64")
        && <T as crate::device::cpu::CpuBuilds>::SIMD
        && elems.saturating_mul(4) >= stream_threshold()
}
