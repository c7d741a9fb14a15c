//! The fused norms' shadow twins: the composed graph to run beside a
//! checked call, and the judge that sizes their differences.

use super::NormSpec;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::ops::{layer_norm_composed_nd, layer_norm_nd, rms_norm_composed_nd, rms_norm_nd};
use crate::shadow::{meta_text, meta_value, Judge, Twin};
use crate::tape::Var;
use std::collections::HashMap;
use std::rc::Rc;

/// A norm's settings, as its node was built.
pub(crate) struct NormJudge {
    /// LayerNorm (centred) or RMSNorm.
    centre: bool,
    normalized: Vec<usize>,
    d: usize,
    eps: f64,
    has_gamma: bool,
    has_beta: bool,
    names: Vec<&'static str>,
}

impl NormJudge {
    fn new(spec: &NormSpec) -> Self {
        let mut names = vec!["x"];
        names.extend(spec.has_gamma.then_some("gamma"));
        names.extend(spec.has_beta.then_some("beta"));
        NormJudge {
            centre: spec.centre,
            normalized: spec.normalized.clone(),
            d: spec.d,
            eps: spec.eps,
            has_gamma: spec.has_gamma,
            has_beta: spec.has_beta,
            names,
        }
    }

    /// Per row of `x`: its centre (0 for RMSNorm) and `1 / sqrt(spread +
    /// eps)`, in f64.
    fn rows(&self, x: &[f64]) -> Vec<(f64, f64)> {
        let d = self.d.max(1);
        x.chunks(d)
            .map(|r| {
                let n = r.len() as f64;
                let m = if self.centre {
                    r.iter().sum::<f64>() / n
                } else {
                    0.0
                };
                let spread = r.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / n;
                (m, 1.0 / (spread + self.eps).sqrt())
            })
            .collect()
    }

    fn param<'a>(&self, inputs: &'a [Vec<f64>], which: usize) -> Option<&'a [f64]> {
        inputs.get(which).map(Vec::as_slice)
    }
}

impl Judge for NormJudge {
    fn inputs(&self) -> &[&'static str] {
        &self.names
    }

    fn row_len(&self) -> usize {
        self.d
    }

    /// With `xh = max(1, |xhat|)` (an absolute rounding error of about
    /// `cond u` in `xhat`, however small `xhat` is) and `g = c gamma`:
    /// `y`: `max (|gamma| xh + |beta|)`; `dx`: `max over rows of rstd max
    /// |g| max xh` (the terms its formula subtracts); `dgamma`: `max over
    /// columns of sum over rows |c| xh`; `dbeta`: the same of `|c|`. Zero
    /// or non-finite scales become 1.
    fn scales(&self, inputs: &[Vec<f64>], cot: Option<&[f64]>) -> Vec<f64> {
        let d = self.d.max(1);
        let x = &inputs[0];
        let gamma = self.has_gamma.then(|| self.param(inputs, 1)).flatten();
        let beta = self
            .has_beta
            .then(|| self.param(inputs, 1 + self.has_gamma as usize))
            .flatten();
        let at =
            |p: Option<&[f64]>, j: usize, or: f64| p.and_then(|p| p.get(j)).copied().unwrap_or(or);
        let (mut sy, mut sx) = (0.0f64, 0.0f64);
        let (mut sg, mut sb) = (vec![0.0f64; d], vec![0.0f64; d]);
        for (r, (m, rstd)) in self.rows(x).into_iter().enumerate() {
            let (mut gmax, mut xmax) = (0.0f64, 1.0f64);
            for j in 0..d {
                let Some(v) = x.get(r * d + j) else { break };
                let xh = ((v - m) * rstd).abs().max(1.0);
                sy = sy.max(at(gamma, j, 1.0).abs() * xh + at(beta, j, 0.0).abs());
                if let Some(c) = cot.and_then(|c| c.get(r * d + j)) {
                    gmax = gmax.max((c * at(gamma, j, 1.0)).abs());
                    xmax = xmax.max(xh);
                    sg[j] += (c * xh).abs();
                    sb[j] += c.abs();
                }
            }
            sx = sx.max(rstd * gmax * xmax);
        }
        let fold = |v: &[f64]| v.iter().fold(0.0f64, |a, b| a.max(*b));
        let mut out = vec![sy];
        if cot.is_some() {
            out.push(sx);
            if self.has_gamma {
                out.push(fold(&sg));
            }
            if self.has_beta {
                out.push(fold(&sb));
            }
        }
        out.into_iter()
            .map(|s| if s > 0.0 && s.is_finite() { s } else { 1.0 })
            .collect()
    }

    /// `max |x| / sqrt(spread + eps)` per row, at least 1.
    fn row_condition(&self, inputs: &[Vec<f64>]) -> Vec<f64> {
        let d = self.d.max(1);
        inputs[0]
            .chunks(d)
            .zip(self.rows(&inputs[0]))
            .map(|(r, (_, rstd))| {
                let big = r.iter().fold(0.0f64, |a, v| a.max(v.abs()));
                (big * rstd).max(1.0)
            })
            .collect()
    }

    fn tolerance(&self, dtype: &str, inputs: &[Vec<f64>]) -> f64 {
        let cond = self.row_condition(inputs).into_iter().fold(1.0, f64::max);
        crate::tolerance::norm_shadow(dtype, cond).rtol
    }

    fn settings(&self) -> Vec<(String, String)> {
        let dims: Vec<String> = self.normalized.iter().map(|d| d.to_string()).collect();
        vec![
            ("eps".into(), format!("{:e}", self.eps)),
            ("normalized".into(), dims.join(",")),
        ]
    }
}

/// The twin of the fused norm node of `spec`.
pub(crate) fn twin<T: Element>(spec: &NormSpec) -> Twin<'_, T> {
    let (g, b, centre) = (spec.has_gamma, spec.has_beta, spec.centre);
    Twin {
        composed: Box::new(move |v: &[Var<T>]| {
            let gamma = g.then(|| &v[1]);
            let beta = b.then(|| &v[1 + g as usize]);
            if centre {
                layer_norm_composed_nd(&v[0], &spec.normalized, gamma, beta, spec.eps)
            } else {
                rms_norm_composed_nd(&v[0], &spec.normalized, gamma, spec.eps)
            }
        }),
        judge: Rc::new(NormJudge::new(spec)),
    }
}

/// Reruns a replay file's fused norm (`op` with the file's `meta`) on
/// `inputs` (`x` as `[rows, d]`, then gamma and beta as named there).
pub(crate) fn rerun<T: Element>(
    op: &str,
    meta: &HashMap<String, String>,
    inputs: &[Var<T>],
) -> Result<Var<T>> {
    let bad = |msg: String| Error::InvalidArgument { op: "replay", msg };
    let eps: f64 = meta_value(meta, "eps")?;
    let normalized = meta_text(meta, "normalized")?
        .split(',')
        .map(|s| {
            s.parse::<usize>()
                .map_err(|e| bad(format!("normalized: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let names: Vec<&str> = meta_text(meta, "inputs")?.split(',').collect();
    let find = |n: &str| {
        names
            .iter()
            .position(|m| *m == n)
            .and_then(|i| inputs.get(i))
    };
    let x = inputs.first().ok_or_else(|| bad("no inputs".into()))?;
    let mut shape = vec![x.shape().first().copied().unwrap_or(0)];
    shape.extend(&normalized);
    let x = crate::ops::reshape(x, &shape)?;
    match op {
        "layer_norm" => layer_norm_nd(&x, &normalized, find("gamma"), find("beta"), eps),
        "rms_norm" => rms_norm_nd(&x, &normalized, find("gamma"), eps),
        other => Err(bad(format!("no fused op {other:?} to replay"))),
    }
}
