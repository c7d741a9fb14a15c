//! The fused attention's shadow twin: the composed graph to run beside a
//! checked call, and the judge that sizes their differences.
//!
//! The judge recomputes each head's probabilities in f64 from the host
//! copies of the inputs, so every result is measured against the size of
//! the terms it sums (`|p| |v|` for the output, `|p| (|dp| + |D|) |k|` for
//! `dq`, and so on), not against a result that may cancel to zero.

use super::{attention, attention_qkv, Geometry};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::ops::{attention_composed, attention_qkv_composed};
use crate::shadow::{Judge, Twin};
use crate::tape::Var;
use std::collections::HashMap;
use std::rc::Rc;

/// An attention node's settings, as it was built.
pub(crate) struct AttentionJudge {
    g: Geometry,
    causal: bool,
    scale: f64,
}

/// One head's probabilities `p` (`T x T`, zero where masked) and each
/// query row's largest `|s_ij|` (the logits' size).
struct Head {
    p: Vec<f64>,
    big: Vec<f64>,
}

impl AttentionJudge {
    /// Row `i` of input `which` (0 q, 1 k, 2 v) of head `bh`.
    fn row<'a>(&self, inputs: &'a [Vec<f64>], which: usize, bh: usize, i: usize) -> &'a [f64] {
        let src = &inputs[if self.g.packed { 0 } else { which }];
        let (off, stride) = self.g.input_rows(which, bh);
        let at = off + i * stride;
        src.get(at..at + self.g.d).unwrap_or(&[])
    }

    fn sees(&self, i: usize, j: usize) -> bool {
        !self.causal || j <= i
    }

    fn head(&self, inputs: &[Vec<f64>], bh: usize) -> Head {
        let t = self.g.t;
        let (mut p, mut big) = (vec![0.0; t * t], vec![0.0f64; t]);
        for i in 0..t {
            let q = self.row(inputs, 0, bh, i);
            let s = &mut p[i * t..(i + 1) * t];
            let mut m = f64::NEG_INFINITY;
            for (j, sj) in s.iter_mut().enumerate().filter(|(j, _)| self.sees(i, *j)) {
                let k = self.row(inputs, 1, bh, j);
                *sj = self.scale * q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>();
                m = m.max(*sj);
                big[i] = big[i].max(sj.abs());
            }
            let mut z = 0.0;
            for (j, sj) in s.iter_mut().enumerate() {
                *sj = if self.sees(i, j) {
                    (*sj - m).exp()
                } else {
                    0.0
                };
                z += *sj;
            }
            s.iter_mut().for_each(|v| *v /= z);
        }
        Head { p, big }
    }

    /// Row `i` of head `bh` of the output gradient.
    fn cot_row<'a>(&self, cot: &'a [f64], bh: usize, i: usize) -> &'a [f64] {
        let (off, stride) = self.g.out_rows(bh);
        let at = off + i * stride;
        cot.get(at..at + self.g.d).unwrap_or(&[])
    }
}

/// `max over c of sum_j w_j |rows_j[c]|`, the size of a weighted row sum.
fn weighted<'a>(
    w: impl Iterator<Item = (f64, usize)>,
    row: impl Fn(usize) -> &'a [f64],
    d: usize,
) -> f64 {
    let mut acc = vec![0.0f64; d];
    for (wj, j) in w {
        for (a, r) in acc.iter_mut().zip(row(j)) {
            *a += wj * r.abs();
        }
    }
    acc.into_iter().fold(0.0, f64::max)
}

impl Judge for AttentionJudge {
    fn inputs(&self) -> &[&'static str] {
        if self.g.packed {
            &["qkv"]
        } else {
            &["q", "k", "v"]
        }
    }

    fn row_len(&self) -> usize {
        if self.g.packed {
            3 * self.g.heads * self.g.d
        } else {
            self.g.d
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
        let (t, d) = (self.g.t, self.g.d);
        let (mut sy, mut sq, mut sk, mut sv) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for bh in 0..self.g.batch * self.g.heads {
            let h = self.head(inputs, bh);
            let p = |i: usize, j: usize| h.p[i * t + j];
            for i in 0..t {
                let v = |j| self.row(inputs, 2, bh, j);
                sy = sy.max(weighted((0..t).map(|j| (p(i, j), j)), v, d));
            }
            let Some(cot) = cot else { continue };
            let mut e = vec![0.0; t * t];
            for i in 0..t {
                let dout = self.cot_row(cot, bh, i);
                let a: Vec<f64> = (0..t)
                    .map(|j| {
                        let v = self.row(inputs, 2, bh, j);
                        dout.iter().zip(v).map(|(x, y)| (x * y).abs()).sum()
                    })
                    .collect();
                let big_d: f64 = (0..t).map(|j| p(i, j) * a[j]).sum();
                for j in 0..t {
                    e[i * t + j] = p(i, j) * (a[j] + big_d);
                }
            }
            for i in 0..t {
                let k = |j| self.row(inputs, 1, bh, j);
                sq = sq.max(weighted((0..t).map(|j| (e[i * t + j], j)), k, d));
            }
            for j in 0..t {
                let q = |i| self.row(inputs, 0, bh, i);
                sk = sk.max(weighted((0..t).map(|i| (e[i * t + j], i)), q, d));
                let dout = |i| self.cot_row(cot, bh, i);
                sv = sv.max(weighted((0..t).map(|i| (p(i, j), i)), dout, d));
            }
        }
        let (sq, sk) = (sq * self.scale.abs(), sk * self.scale.abs());
        let mut out = vec![sy];
        if cot.is_some() {
            if self.g.packed {
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
        let (b, h, t) = (self.g.batch, self.g.heads, self.g.t);
        let mut cond = vec![1.0f64; b * h * t];
        for bh in 0..b * h {
            for (i, big) in self.head(inputs, bh).big.into_iter().enumerate() {
                let row = if self.g.packed {
                    (bh / h) * t + i
                } else {
                    bh * t + i
                };
                cond[row] = cond[row].max(big);
            }
        }
        cond.truncate(if self.g.packed { b * t } else { b * h * t });
        cond
    }

    fn tolerance(&self, dtype: &str, inputs: &[Vec<f64>]) -> f64 {
        let cond = self.row_condition(inputs).into_iter().fold(1.0, f64::max);
        crate::tolerance::attention_shadow(dtype, cond).rtol
    }

    fn settings(&self) -> Vec<(String, String)> {
        vec![
            ("causal".into(), self.causal.to_string()),
            // `{:?}` prints the shortest text that parses back exactly.
            ("scale".into(), format!("{:?}", self.scale)),
            ("heads".into(), self.g.heads.to_string()),
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
        judge: Rc::new(AttentionJudge { g, causal, scale }),
    }
}

/// Reruns a replay file's fused attention (`op` with the file's `meta`)
/// on `inputs` (`q`, `k`, `v`, or `qkv`, whole).
pub(crate) fn rerun<T: Element>(
    op: &str,
    meta: &HashMap<String, String>,
    inputs: &[Var<T>],
) -> Result<Var<T>> {
    let bad = |msg: String| Error::InvalidArgument { op: "replay", msg };
    let field = |k: &str| {
        meta.get(k)
            .ok_or_else(|| bad(format!("no {k:?} in the file")))
    };
    let causal: bool = field("causal")?
        .parse()
        .map_err(|e| bad(format!("causal: {e}")))?;
    let scale: f64 = field("scale")?
        .parse()
        .map_err(|e| bad(format!("scale: {e}")))?;
    let heads: usize = field("heads")?
        .parse()
        .map_err(|e| bad(format!("heads: {e}")))?;
    match (op, inputs) {
        ("attention", [q, k, v]) => attention(q, k, v, causal, scale),
        ("attention_qkv", [qkv]) => attention_qkv(qkv, heads, causal, scale),
        _ => Err(bad(format!(
            "{op} with {} inputs is not a fused attention",
            inputs.len()
        ))),
    }
}
