//! CPU loops for sums over axes. The reduced axes are brought to the form
//! `[outer, r, inner]` (sum over `r`) where they form one block after
//! size-1 dims are dropped; other axis sets take a plain strided loop.
//!
//! Every sum is cut into pieces of fixed size, summed in SIMD lanes with
//! [`UNROLL`] accumulators, and the pieces' partial sums are added in
//! order: the split depends on the shape alone, so results are bitwise the
//! same for any thread count.

use crate::device::cpu::{dispatch, each_chunk, fold_all, run_each, Kernel, Lanes, LANES, UNROLL};
use crate::dtype::Element;
use crate::layout::{broadcast_strides, for_each_offset};
use num_traits::Zero;

type Acc<T> = <T as Element>::Acc;

/// Elements per piece of a sum (and per team task).
const PIECE: usize = 1 << 15;

/// `x` (of `shape`) summed over the axes where `red` is set, each sum
/// divided by `div` when given; the kept axes in row-major order.
pub(crate) fn sum<T: Element>(
    x: &[T],
    shape: &[usize],
    red: &[bool],
    div: Option<Acc<T>>,
) -> Vec<T> {
    if x.is_empty() {
        // Sums over nothing are 0 (an empty output if a kept dim is 0).
        let kept = shape.iter().zip(red).map(|(&n, &r)| if r { 1 } else { n });
        return vec![T::ZERO; kept.product()];
    }
    let sums = match blocks(shape, red) {
        Some((outer, r, 1)) => row_sums(x, outer, r),
        Some((outer, r, inner)) => column_sums(x, outer, r, inner),
        None => strided_sums(x, shape, red),
    };
    match div {
        None => sums.into_iter().map(T::from_acc).collect(),
        Some(n) => sums.into_iter().map(|s| T::from_acc(s / n)).collect(),
    }
}

/// `(outer, r, inner)` when the reduced axes, ignoring size-1 dims, are
/// one contiguous block.
fn blocks(shape: &[usize], red: &[bool]) -> Option<(usize, usize, usize)> {
    let mut groups: Vec<(bool, usize)> = Vec::new();
    for (&n, &r) in shape.iter().zip(red) {
        if n == 1 {
            continue;
        }
        match groups.last_mut() {
            Some((gr, gn)) if *gr == r => *gn *= n,
            _ => groups.push((r, n)),
        }
    }
    match groups.as_slice() {
        [] => Some((1, 1, 1)),
        [(true, r)] => Some((1, *r, 1)),
        [(false, o)] => Some((*o, 1, 1)),
        [(true, r), (false, i)] => Some((1, *r, *i)),
        [(false, o), (true, r)] => Some((*o, *r, 1)),
        [(false, o), (true, r), (false, i)] => Some((*o, *r, *i)),
        _ => None,
    }
}

/// Sums of `outer` contiguous rows of `r`.
fn row_sums<T: Element>(x: &[T], outer: usize, r: usize) -> Vec<Acc<T>> {
    if r >= PIECE {
        // Long rows: each row's pieces run in parallel, then add in order.
        return x
            .chunks_exact(r)
            .map(|row| {
                let parts = run_each(row.chunks(PIECE).collect(), |p| dispatch(SumRun(p)));
                parts.into_iter().fold(Acc::<T>::zero(), |s, p| s + p)
            })
            .collect();
    }
    if r == 0 {
        return vec![Acc::<T>::zero(); outer];
    }
    let rows = (PIECE / r).max(1);
    let jobs: Vec<&[T]> = x.chunks(rows * r).collect();
    let parts = run_each(jobs, |c| {
        c.chunks_exact(r)
            .map(|row| dispatch(SumRun(row)))
            .collect::<Vec<_>>()
    });
    parts.into_iter().flatten().collect()
}

/// `out[o, i] = sum over k of x[o, k, i]`: blocks of rows summed into
/// partial rows, which are then added in block order.
fn column_sums<T: Element>(x: &[T], outer: usize, r: usize, inner: usize) -> Vec<Acc<T>> {
    let rows = (PIECE / inner).max(1);
    let per = r.div_ceil(rows);
    let jobs: Vec<(usize, usize)> = (0..outer)
        .flat_map(|o| (0..per).map(move |b| (o, b)))
        .collect();
    let parts = run_each(jobs, |(o, b)| {
        let mut acc = vec![Acc::<T>::zero(); inner];
        let (k0, k1) = (b * rows, ((b + 1) * rows).min(r));
        for k in k0..k1 {
            let at = (o * r + k) * inner;
            for (a, &v) in acc.iter_mut().zip(&x[at..at + inner]) {
                *a += v.to_acc();
            }
        }
        acc
    });
    let mut out = vec![Acc::<T>::zero(); outer * inner];
    for (j, p) in parts.iter().enumerate() {
        let o = j / per.max(1);
        for (a, &v) in out[o * inner..(o + 1) * inner].iter_mut().zip(p) {
            *a += v;
        }
    }
    out
}

/// Any axis set: one pass in input order.
fn strided_sums<T: Element>(x: &[T], shape: &[usize], red: &[bool]) -> Vec<Acc<T>> {
    let keep: Vec<usize> = shape
        .iter()
        .zip(red)
        .map(|(&n, &r)| if r { 1 } else { n })
        .collect();
    let mut acc = vec![Acc::<T>::zero(); keep.iter().product()];
    let src = broadcast_strides(&keep, shape);
    for_each_offset(shape, &src, |i, o| acc[o] += x[i].to_acc());
    acc
}

/// The sum of one run, in lanes: chunk `k` into accumulator `k % UNROLL`,
/// folded in a fixed order, then the tail in order.
struct SumRun<'a, T: Element>(&'a [T]);

impl<T: Element> Kernel<T> for SumRun<'_, T> {
    type Output = Acc<T>;
    #[inline(always)]
    fn run<V: Lanes<T>>(self) -> Acc<T> {
        let x = self.0;
        let mut acc = [V::splat(Acc::<T>::zero()); UNROLL];
        each_chunk(x.len(), |j, i| {
            // SAFETY: `each_chunk` keeps `i + LANES <= x.len()`.
            acc[j] = acc[j].add(unsafe { V::load_at(x, i) });
        });
        let tail = x.len() / LANES * LANES;
        x[tail..].iter().fold(fold_all(acc), |s, v| s + v.to_acc())
    }
}
