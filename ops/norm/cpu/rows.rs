//! The kernels' row helpers: the backward's group split and partial rows,
//! parameter widening and bounds-free reads.

pub(crate) use crate::device::cpu::LANES;
use crate::device::cpu::{rows_per_chunk, run_each};
use crate::device::pool::Buffer;
use crate::dtype::{Accum, Element};
use num_traits::Zero;

type Acc<T> = <T as Element>::Acc;

/// Upper bound on the number of backward groups (and so on partial rows for
/// dgamma/dbeta). A constant, so the partition depends on the shape only.
pub(crate) const MAX_GROUPS: usize = 64;

/// A backward group aims at this many rows at least, so the partial rows
/// (written and read once each) stay within about 2% of the traffic.
pub(crate) const MIN_GROUP_ROWS: usize = 64;

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
#[cfg_attr(not(feature = "probes"), allow(dead_code))] // read by `probes`
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

/// The first `n` elements of `s`, or all of it if shorter (callers pass
/// slices of one length; this lets LLVM drop the bounds checks).
#[inline(always)]
pub(crate) fn head<A>(s: &[A], n: usize) -> &[A] {
    &s[..n.min(s.len())]
}

/// Widens an optional parameter row to the accumulation type.
pub(crate) fn widen<T: Element>(p: Option<&[T]>) -> Buffer<Acc<T>> {
    p.map(|p| Buffer::collect(p.len(), p.iter().map(|v| v.to_acc())))
        .unwrap_or_default()
}

/// `p` widened to the accumulation type, or `d` copies of `fill` where
/// there is no `p` (an identity parameter: 1 for a scale, -0 for a shift).
pub(crate) fn widen_or<T: Element>(p: Option<&[T]>, d: usize, fill: Acc<T>) -> Buffer<Acc<T>> {
    match p {
        Some(p) => widen(Some(p)),
        None => Buffer::from_vec(vec![fill; d]),
    }
}

/// The backward groups' partial rows, if `want`: one row of `width` per
/// group of `rpg` rows of `d` in `len` elements, in one buffer from the
/// pool (each task zeroes its own row), so that large partial rows do not
/// fault in fresh pages on every backward call; else none.
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
/// column block by column block (in parallel for wide rows, on the kernels'
/// team like their tasks; each column's order is the same).
pub(crate) fn reduce_partials<A: Accum + Element>(parts: &[A], width: usize) -> Buffer<A> {
    let mut out = Buffer::<A>::take(width);
    out.fill(<A as Zero>::zero());
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
        run_each(out.chunks_mut(COLS).enumerate().collect(), sum_cols);
    }
    out
}

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    // The tests, run by `tests/unit.rs`.
    unit_tests![groups_are_bounded_and_whole_chunks];

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
