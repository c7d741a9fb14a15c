//! The fused attention's shadow twin: the composed graph to run beside a
//! checked call, and the judge that sizes their differences.
//!
//! The judge recomputes each head's probabilities in f64 from the host
//! copies of the inputs, so every result is measured against the size of
//! the terms it sums (`|p| |v|` for the output, `|p| (|dp| + |D|) |k|` for
//! `dq`, and so on), not against a result that may cancel to zero.

use super::{attention, attention_qkv, Geometry};
use crate::device::cpu::run_each;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::ops::{attention_composed, attention_qkv_composed};
use crate::shadow::{meta_value, Judge, Twin};
use crate::tape::Var;
use std::cell::OnceCell;
use std::collections::HashMap;
use std::rc::Rc;

/// An attention node's settings, as it was built. One judge serves one
/// checked call, so the heads it reads from that call's inputs are kept.
pub(crate) struct AttentionJudge {
    spec: Spec,
    heads: OnceCell<Vec<Head>>,
}

/// The node's geometry and settings (shared by the threads that judge
/// its heads).
#[derive(Clone, Copy)]
struct Spec {
    g: Geometry,
    causal: bool,
    scale: f64,
}

/// One head in f64: `|q|`, `|k|`, `|v|` as contiguous `[T, d]` rows, the
/// probabilities `p` (`T x T`, zero where masked) and each query row's
/// largest `|s_ij|` (the logits' size).
struct Head {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    p: Vec<f64>,
    big: Vec<f64>,
}

/// `acc += w * x`.
fn axpy(acc: &mut [f64], w: f64, x: &[f64]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a += w * b;
    }
}

fn max_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

impl AttentionJudge {
    fn new(g: Geometry, causal: bool, scale: f64) -> Self {
        AttentionJudge {
            spec: Spec { g, causal, scale },
            heads: OnceCell::new(),
        }
    }

    /// Every head, read once per call (one thread team task per head).
    fn heads(&self, inputs: &[Vec<f64>]) -> &[Head] {
        self.heads.get_or_init(|| {
            let spec = self.spec;
            let all: Vec<usize> = (0..spec.g.batch * spec.g.heads).collect();
            run_each(all, |bh| spec.head(inputs, bh))
        })
    }
}

impl Spec {
    /// `t` rows of `d` starting at `off`, `stride` apart, from `src`, as
    /// `|x|` when `abs`, contiguous (NaN past the end of `src`).
    fn gather(&self, src: &[f64], (off, stride): (usize, usize), abs: bool) -> Vec<f64> {
        let (t, d) = (self.g.t, self.g.d);
        let mut out = Vec::with_capacity(t * d);
        for i in 0..t {
            let at = off + i * stride;
            match src.get(at..at + d) {
                Some(r) if abs => out.extend(r.iter().map(|x| x.abs())),
                Some(r) => out.extend_from_slice(r),
                None => out.extend(std::iter::repeat_n(f64::NAN, d)),
            }
        }
        out
    }

    /// Head `bh`'s rows of input `which` (0 q, 1 k, 2 v).
    fn rows(&self, inputs: &[Vec<f64>], which: usize, bh: usize) -> Vec<f64> {
        let src = &inputs[if self.g.packed { 0 } else { which }];
        self.gather(src, self.g.input_rows(which, bh), false)
    }

    /// The keys query row `i` sees: `0..seen(i)`.
    fn seen(&self, i: usize) -> usize {
        if self.causal {
            (i + 1).min(self.g.t)
        } else {
            self.g.t
        }
    }

    fn head(&self, inputs: &[Vec<f64>], bh: usize) -> Head {
        let (t, d) = (self.g.t, self.g.d);
        let (q, k, v) = (
            self.rows(inputs, 0, bh),
            self.rows(inputs, 1, bh),
            self.rows(inputs, 2, bh),
        );
        let (mut p, mut big) = (vec![0.0; t * t], vec![0.0f64; t]);
        for i in 0..t {
            let qi = &q[i * d..(i + 1) * d];
            let s = &mut p[i * t..i * t + self.seen(i)];
            let mut m = f64::NEG_INFINITY;
            for (j, sj) in s.iter_mut().enumerate() {
                let kj = &k[j * d..(j + 1) * d];
                *sj = self.scale * qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>();
                m = m.max(*sj);
                big[i] = big[i].max(sj.abs());
            }
            let mut z = 0.0;
            for sj in s.iter_mut() {
                *sj = (*sj - m).exp();
                z += *sj;
            }
            s.iter_mut().for_each(|v| *v /= z);
        }
        let abs = |v: Vec<f64>| v.into_iter().map(f64::abs).collect();
        Head {
            q: abs(q),
            k: abs(k),
            v: abs(v),
            p,
            big,
        }
    }

    /// Head `bh`'s `[y, dq / |scale|, dk / |scale|, dv]` term sizes (the
    /// gradients' only with `cot`).
    fn head_scales(&self, h: &Head, bh: usize, cot: Option<&[f64]>) -> [f64; 4] {
        let (t, d) = (self.g.t, self.g.d);
        let (mut sy, mut sq) = (0.0f64, 0.0f64);
        let mut acc = vec![0.0; d];
        for i in 0..t {
            acc.fill(0.0);
            for j in 0..self.seen(i) {
                axpy(&mut acc, h.p[i * t + j], &h.v[j * d..(j + 1) * d]);
            }
            sy = sy.max(max_of(&acc));
        }
        let Some(cot) = cot else {
            return [sy, 0.0, 0.0, 0.0];
        };
        let dout = self.gather(cot, self.g.out_rows(bh), true);
        // e_ij, the size of ds_ij.
        let mut e = vec![0.0; t * t];
        for i in 0..t {
            let di = &dout[i * d..(i + 1) * d];
            let row = &mut e[i * t..i * t + self.seen(i)];
            for (j, a) in row.iter_mut().enumerate() {
                let vj = &h.v[j * d..(j + 1) * d];
                *a = di.iter().zip(vj).map(|(x, y)| x * y).sum::<f64>();
            }
            let pi = &h.p[i * t..(i + 1) * t];
            let big_d: f64 = row.iter().zip(pi).map(|(a, p)| a * p).sum();
            for (a, p) in row.iter_mut().zip(pi) {
                *a = p * (*a + big_d);
            }
        }
        let (mut dk, mut dv) = (vec![0.0; t * d], vec![0.0; t * d]);
        for i in 0..t {
            acc.fill(0.0);
            let (qi, di) = (&h.q[i * d..(i + 1) * d], &dout[i * d..(i + 1) * d]);
            for j in 0..self.seen(i) {
                let eij = e[i * t + j];
                axpy(&mut acc, eij, &h.k[j * d..(j + 1) * d]);
                axpy(&mut dk[j * d..(j + 1) * d], eij, qi);
                axpy(&mut dv[j * d..(j + 1) * d], h.p[i * t + j], di);
            }
            sq = sq.max(max_of(&acc));
        }
        [sy, sq, max_of(&dk), max_of(&dv)]
    }
}

impl Judge for AttentionJudge {
    fn inputs(&self) -> &[&'static str] {
        if self.spec.g.packed {
            &["qkv"]
        } else {
            &["q", "k", "v"]
        }
    }

    fn row_len(&self) -> usize {
        if self.spec.g.packed {
            3 * self.spec.g.heads * self.spec.g.d
        } else {
            self.spec.g.d
        }
    }

    fn whole(&self) -> bool {
        true
    }

    /// Per head, from f64 probabilities `p` and with `a_ij = sum_c |dO_ic|
    /// |v_jc|` (the size of `dp_ij`) and `e_ij = p_ij (a_ij + sum_l p_il
    /// a_il)` (of `ds_ij`): `y`: `max sum_j p_ij |v_j|`; `dq`: `|scale| max
    /// sum_j e_ij |k_j|`; `dk`: `|scale| max sum_i e_ij |q_i|`; `dv`: `max
    /// sum_i p_ij |dO_i|`. The packed `dqkv` takes the largest of the
    /// three. Zero or non-finite scales become 1.
    fn scales(&self, inputs: &[Vec<f64>], cot: Option<&[f64]>) -> Vec<f64> {
        let spec = self.spec;
        let heads: Vec<(usize, &Head)> = self.heads(inputs).iter().enumerate().collect();
        let per_head = run_each(heads, |(bh, h)| spec.head_scales(h, bh, cot));
        let [sy, sq, sk, sv] = per_head.into_iter().fold([0.0f64; 4], |a, b| {
            [
                a[0].max(b[0]),
                a[1].max(b[1]),
                a[2].max(b[2]),
                a[3].max(b[3]),
            ]
        });
        let (sq, sk) = (sq * spec.scale.abs(), sk * spec.scale.abs());
        let mut out = vec![sy];
        if cot.is_some() {
            if spec.g.packed {
                out.push(sq.max(sk).max(sv));
            } else {
                out.extend([sq, sk, sv]);
            }
        }
        out.into_iter()
            .map(|s| if s > 0.0 && s.is_finite() { s } else { 1.0 })
            .collect()
    }

    /// Per row of the first input (a query row, or for the packed layout a
    /// position with every head): the largest `|s_ij|`, at least 1. An
    /// input rounded by `u` moves `p_ij` by about `|s| u` relative.
    fn row_condition(&self, inputs: &[Vec<f64>]) -> Vec<f64> {
        let (b, h, t) = (self.spec.g.batch, self.spec.g.heads, self.spec.g.t);
        let mut cond = vec![1.0f64; b * h * t];
        for (bh, head) in self.heads(inputs).iter().enumerate() {
            for (i, &big) in head.big.iter().enumerate() {
                let row = if self.spec.g.packed {
                    (bh / h) * t + i
                } else {
                    bh * t + i
                };
                cond[row] = cond[row].max(big);
            }
        }
        cond.truncate(if self.spec.g.packed { b * t } else { b * h * t });
        cond
    }

    fn tolerance(&self, dtype: &str, inputs: &[Vec<f64>]) -> f64 {
        let cond = self.row_condition(inputs).into_iter().fold(1.0, f64::max);
        crate::tolerance::attention_shadow(dtype, cond).rtol
    }

    fn settings(&self) -> Vec<(String, String)> {
        vec![
            ("causal".into(), self.spec.causal.to_string()),
            // `{:?}` prints the shortest text that parses back exactly.
            ("scale".into(), format!("{:?}", self.spec.scale)),
            ("heads".into(), self.spec.g.heads.to_string()),
        ]
    }
}

/// The twin of a fused attention node.
pub(crate) fn twin<'a, T: Element>(g: Geometry, causal: bool, scale: f64) -> Twin<'a, T> {
    Twin {
        composed: Box::new(move |v: &[Var<T>]| {
            if g.packed {
                attention_qkv_composed(&v[0], g.heads, causal, scale)
            } else {
                attention_composed(&v[0], &v[1], &v[2], causal, scale)
            }
        }),
        judge: Rc::new(AttentionJudge::new(g, causal, scale)),
    }
}

/// Reruns a replay file's fused attention (`op` with the file's `meta`)
/// on `inputs` (`q`, `k`, `v`, or `qkv`, whole).
pub(crate) fn rerun<T: Element>(
    op: &str,
    meta: &HashMap<String, String>,
    inputs: &[Var<T>],
) -> Result<Var<T>> {
    let causal: bool = meta_value(meta, "causal")?;
    let scale: f64 = meta_value(meta, "scale")?;
    let heads: usize = meta_value(meta, "heads")?;
    match (op, inputs) {
        ("attention", [q, k, v]) => attention(q, k, v, causal, scale),
        ("attention_qkv", [qkv]) => attention_qkv(qkv, heads, causal, scale),
        _ => Err(Error::InvalidArgument {
            op: "replay",
            msg: format!("{op} with {} inputs is not a fused attention", inputs.len()),
        }),
    }
}
