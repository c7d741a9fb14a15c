//! CPU loops for the embedding: a row gather, and its adjoint, a
//! scatter-add in which each weight row sums its own gradient rows in
//! position order (so the bits depend on the ids only, never on threads).

use crate::device::cpu::run_each;
use crate::dtype::Element;
use crate::ops::elementwise::cpu::CHUNK;
use num_traits::Zero;

/// Appends to `out` the rows `ids[i]` of the `[vocab, dim]` table `w`, in
/// order. The caller has checked every id.
pub(crate) fn gather<T: Element>(w: &[T], dim: usize, ids: &[usize], mut out: Vec<T>) -> Vec<T> {
    for &id in ids {
        out.extend_from_slice(&w[id * dim..(id + 1) * dim]);
    }
    out
}

/// The `[vocab, dim]` gradient of a gather: row `v` is the sum, in
/// increasing position, of the rows of `g` (`[ids.len(), dim]`) at the
/// positions whose id is `v`; 0 for ids that never occur. Sums run in the
/// accumulation type.
/// A stable counting sort of positions by id: the positions whose id is
/// `v` are `pos[start[v]..start[v + 1]]`, ascending (every id `< vocab`).
pub(crate) fn positions_by_id(ids: &[usize], vocab: usize) -> (Vec<usize>, Vec<usize>) {
    let mut start = vec![0usize; vocab + 1];
    for &id in ids {
        start[id + 1] += 1;
    }
    for v in 0..vocab {
        start[v + 1] += start[v];
    }
    let mut next = start.clone();
    let mut pos = vec![0usize; ids.len()];
    for (i, &id) in ids.iter().enumerate() {
        pos[next[id]] = i;
        next[id] += 1;
    }
    (start, pos)
}

pub(crate) fn scatter_add<T: Element>(g: &[T], dim: usize, ids: &[usize], vocab: usize) -> Vec<T> {
    let mut out = vec![T::ZERO; vocab * dim];
    if dim == 0 || ids.is_empty() {
        return out;
    }
    let (start, pos) = positions_by_id(ids, vocab);
    let rows = (CHUNK / dim).max(1);
    let jobs: Vec<_> = out.chunks_mut(rows * dim).enumerate().collect();
    run_each(jobs, |(t, o)| {
        let mut acc = vec![T::Acc::zero(); dim];
        for (r, orow) in o.chunks_exact_mut(dim).enumerate() {
            let v = t * rows + r;
            let mine = &pos[start[v]..start[v + 1]];
            if mine.is_empty() {
                continue;
            }
            acc.fill(T::Acc::zero());
            for &p in mine {
                for (a, &gv) in acc.iter_mut().zip(&g[p * dim..(p + 1) * dim]) {
                    *a += gv.to_acc();
                }
            }
            for (y, &a) in orow.iter_mut().zip(&acc) {
                *y = T::from_acc(a);
            }
        }
    });
    out
}
