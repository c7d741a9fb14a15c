//! CPU loops of the update rules: the parameter and its state cut into
//! fixed chunks run by the thread team, each element updated in the
//! accumulation type in the order the rule's formula is written.

use super::Rule;
use crate::device::cpu::run_each;
use crate::device::pool::Buffer;
use crate::dtype::{Accum, Element};
use num_traits::Float;

/// Elements per team task; fixed, so the split never depends on the
/// thread count (not that it matters here: each element stands alone).
const CHUNK: usize = 1 << 15;

/// `rule` applied to `p` with gradient `g` and the previous state `prev`
/// (empty on the first step, read as zeros): the new parameter and the new
/// state.
pub(super) fn update<T: Element>(
    rule: Rule,
    p: &[T],
    g: &[T],
    prev: &[&[T::Acc]],
) -> (Buffer<T>, Vec<Buffer<T::Acc>>) {
    let n = p.len();
    let mut out = Buffer::<T>::take(n);
    let mut state: Vec<Buffer<T::Acc>> = (0..rule.states()).map(|_| Buffer::take(n)).collect();
    let acc = <T::Acc as Accum>::of;
    let zero = T::Acc::ZERO;
    let old = |k: usize, i: usize| prev.get(k).map_or(zero, |s| s[i]);
    match rule {
        Rule::Sgd { lr, wd } => {
            let (lr, wd) = (acc(lr), acc(wd));
            chunks(&mut out, &mut [], |i| {
                let (w, gi) = (p[i].to_acc(), g[i].to_acc());
                (w - lr * (gi + wd * w), [zero; 2])
            });
        }
        Rule::Momentum { lr, mu, wd } => {
            let (lr, mu, wd) = (acc(lr), acc(mu), acc(wd));
            let first = prev.is_empty();
            chunks(&mut out, &mut state, |i| {
                let (w, gi) = (p[i].to_acc(), g[i].to_acc());
                let gi = gi + wd * w;
                let v = if first { gi } else { mu * old(0, i) + gi };
                (w - lr * v, [v, zero])
            });
        }
        Rule::Adam {
            decoupled,
            lr,
            b1,
            b2,
            c1,
            c2,
            eps,
            wd,
        } => {
            let (one_b1, one_b2) = (acc(1.0 - b1), acc(1.0 - b2));
            let (b1, b2, c1, c2) = (acc(b1), acc(b2), acc(c1), acc(c2));
            let (lr, eps, wd) = (acc(lr), acc(eps), acc(wd));
            let rule = |w: T::Acc, gi: T::Acc, m0: T::Acc, v0: T::Acc| {
                let (w, gi) = if decoupled {
                    (w - lr * wd * w, gi)
                } else {
                    (w, gi + wd * w)
                };
                let m = b1 * m0 + one_b1 * gi;
                let v = b2 * v0 + one_b2 * gi * gi;
                (w - lr * (m / c1) / ((v / c2).sqrt() + eps), m, v)
            };
            adam_chunks(&mut out, &mut state, p, g, prev, rule);
        }
    }
    (out, state)
}

/// One chunk's work: its first index, its parameters and its state slices.
type Job<'a, T> = (usize, &'a mut [T], Vec<&'a mut [<T as Element>::Acc]>);

/// Writes `f(i)`'s parameter into `out[i]` and its state values into
/// `state[k][i]`, in parallel over fixed chunks.
fn chunks<T: Element>(
    out: &mut [T],
    state: &mut [Buffer<T::Acc>],
    f: impl Fn(usize) -> (T::Acc, [T::Acc; 2]) + Sync,
) {
    let mut jobs: Vec<Job<T>> = out
        .chunks_mut(CHUNK)
        .enumerate()
        .map(|(c, o)| (c * CHUNK, o, Vec::new()))
        .collect();
    for s in state.iter_mut() {
        for (job, sc) in jobs.iter_mut().zip(s.chunks_mut(CHUNK)) {
            job.2.push(sc);
        }
    }
    run_each(jobs, |(start, o, mut st)| {
        for (j, oj) in o.iter_mut().enumerate() {
            let (w, s) = f(start + j);
            *oj = T::from_acc(w);
            for (sk, v) in st.iter_mut().zip(s) {
                sk[j] = v;
            }
        }
    });
}

/// Adam's loop: `rule(w, g, m, v)` gives the new parameter and moments,
/// over fixed chunks of equal-length slices (no per-element index checks,
/// so the loop vectorizes). `prev` empty reads the moments as zeros.
fn adam_chunks<T: Element>(
    out: &mut [T],
    state: &mut [Buffer<T::Acc>],
    p: &[T],
    g: &[T],
    prev: &[&[T::Acc]],
    rule: impl Fn(T::Acc, T::Acc, T::Acc, T::Acc) -> (T::Acc, T::Acc, T::Acc) + Sync,
) {
    let [ms, vs] = state else {
        unreachable!("Adam keeps two moments")
    };
    let zero = T::Acc::ZERO;
    let jobs: Vec<_> = out
        .chunks_mut(CHUNK)
        .zip(ms.chunks_mut(CHUNK))
        .zip(vs.chunks_mut(CHUNK))
        .enumerate()
        .collect();
    run_each(jobs, |(c, ((o, m), v))| {
        let n = o.len();
        let r = c * CHUNK..c * CHUNK + n;
        let (p, g) = (&p[r.clone()], &g[r.clone()]);
        let (m, v) = (&mut m[..n], &mut v[..n]);
        match prev {
            [m0, v0] => {
                let (m0, v0) = (&m0[r.clone()], &v0[r]);
                for i in 0..o.len() {
                    let (w, mi, vi) = rule(p[i].to_acc(), g[i].to_acc(), m0[i], v0[i]);
                    (o[i], m[i], v[i]) = (T::from_acc(w), mi, vi);
                }
            }
            _ => {
                for i in 0..o.len() {
                    let (w, mi, vi) = rule(p[i].to_acc(), g[i].to_acc(), zero, zero);
                    (o[i], m[i], v[i]) = (T::from_acc(w), mi, vi);
                }
            }
        }
    });
}
