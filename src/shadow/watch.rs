//! A watched tape's state, and one checked call: the twin's side graph,
//! built at the fused forward and swept at the fused backward.

use super::{replay, Check, Fault, RowStats, Shadow};
use crate::dtype::Element;
use crate::error::Result;
use crate::ops::reduce::kernel::sum_to_shape;
use crate::tape::{Tape, Var};
use crate::tensor::Tensor;
use std::collections::HashMap;
use std::rc::Rc;

/// How a fused op's results are judged against its twin's, on f64 copies
/// of the inputs (so one judge serves every element type and device).
pub(crate) trait Judge {
    /// The op's input names, in order (`["x", "gamma", "beta"]`).
    fn inputs(&self) -> &[&'static str];
    /// The first input and the output are rows of this length; the other
    /// inputs are parameters, taken whole.
    fn row_len(&self) -> usize;
    /// Whether a row's result depends on other rows (attention): then a
    /// replay file keeps every input and the output gradient whole.
    fn whole(&self) -> bool {
        false
    }
    /// The size of the terms each result is made of: the output's alone
    /// (`cot` None), else the output's and then each input's gradient's.
    fn scales(&self, inputs: &[Vec<f64>], cot: Option<&[f64]>) -> Vec<f64>;
    /// Per row of the first input, how hard it is (its condition number).
    fn row_condition(&self, inputs: &[Vec<f64>]) -> Vec<f64>;
    /// The largest difference allowed for `dtype` at these inputs.
    fn tolerance(&self, dtype: &str, inputs: &[Vec<f64>]) -> f64;
    /// The op's settings, for the replay file (`eps` and the like).
    fn settings(&self) -> Vec<(String, String)>;
}

/// A composed graph on the given leaves.
pub(crate) type Graph<'a, T> = Box<dyn Fn(&[Var<T>]) -> Result<Var<T>> + 'a>;

/// What a fused op hands the tape for a checked call.
pub(crate) struct Twin<'a, T: Element> {
    /// The composed twin, on leaves holding the fused op's inputs.
    pub(crate) composed: Graph<'a, T>,
    pub(crate) judge: Rc<dyn Judge>,
}

/// A watched tape's state: the shadow, the step, parameter names by node
/// id and each op's call count.
pub(crate) struct Watch {
    shadow: Shadow,
    step: usize,
    names: HashMap<usize, String>,
    calls: HashMap<&'static str, usize>,
}

/// One call picked for checking.
pub(crate) struct Probe {
    shadow: Shadow,
    step: usize,
    op: &'static str,
    call: usize,
    site: String,
}

impl Watch {
    pub(crate) fn new(shadow: Shadow, step: usize) -> Self {
        Watch {
            shadow,
            step,
            names: HashMap::new(),
            calls: HashMap::new(),
        }
    }

    pub(crate) fn name(&mut self, id: usize, name: &str) {
        self.names.insert(id, name.to_string());
    }

    pub(crate) fn name_of(&self, id: usize) -> Option<String> {
        self.names.get(&id).cloned()
    }

    /// Counts a call of `op` on inputs `ids`; a probe if it is checked.
    /// The site is the first named parameter's name without its last
    /// part (`blocks.2.ln1.weight` is `blocks.2.ln1`), else `op#call`.
    pub(crate) fn probe(&mut self, op: &'static str, ids: &[usize]) -> Option<Probe> {
        let n = self.calls.entry(op).or_insert(0);
        let call = *n;
        *n += 1;
        if !self.shadow.selects(op, self.step, call) {
            return None;
        }
        let named = ids
            .iter()
            .skip(1)
            .chain(ids.first())
            .find_map(|i| self.names.get(i));
        let site = match named {
            Some(n) => n
                .rsplit_once('.')
                .map_or(n.as_str(), |(a, _)| a)
                .to_string(),
            None => format!("{op}#{call}"),
        };
        Some(Probe {
            shadow: self.shadow.clone(),
            step: self.step,
            op,
            call,
            site,
        })
    }
}

/// `max |a - b|` and where (NaN where exactly one side is NaN; equal
/// infinities and NaNs in the same places differ by 0).
fn max_diff(a: &[f64], b: &[f64]) -> (f64, usize) {
    let mut worst = (0.0f64, 0);
    if a.len() != b.len() {
        return (f64::NAN, 0);
    }
    for (i, (p, q)) in a.iter().zip(b).enumerate() {
        let e = if p == q || (p.is_nan() && q.is_nan()) {
            0.0
        } else {
            (p - q).abs()
        };
        if e.is_nan() {
            return (f64::NAN, i);
        }
        if e > worst.0 {
            worst = (e, i);
        }
    }
    worst
}

fn row_stats(x: &[f64], d: usize, row: usize) -> Option<RowStats> {
    let r = x.get(row * d..(row + 1) * d)?;
    let n = r.len().max(1) as f64;
    let mean = r.iter().sum::<f64>() / n;
    Some(RowStats {
        row,
        mean,
        var: r.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n,
        min: r.iter().copied().fold(f64::INFINITY, f64::min),
        max: r.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    })
}

/// The index of the largest value (NaN counts as largest).
fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if x.is_nan() {
            return i;
        }
        if *x > v[best] {
            best = i;
        }
    }
    best
}

/// `t` with `delta` added to the first element of row `row` (rows of `d`).
fn perturbed<T: Element>(t: &Tensor<T>, d: usize, row: usize, delta: f64) -> Result<Tensor<T>> {
    let mut v = t.to_f64_vec()?;
    if let Some(e) = v.get_mut(row * d.max(1)) {
        *e += delta;
    }
    let data = v.into_iter().map(T::from_f64).collect();
    Tensor::from_vec(t.shape().to_vec(), data)?.to_device(t.device())
}

/// The twin's graph for one checked call, with what the checks need.
pub(crate) struct Side<T: Element> {
    probe: Probe,
    judge: Rc<dyn Judge>,
    inputs: Vec<Var<T>>,
    output: Var<T>,
    /// The inputs in f64, and their shapes.
    host: Vec<Vec<f64>>,
    shapes: Vec<Vec<usize>>,
    /// Per row of the first input, its condition; and the tolerance.
    conds: Vec<f64>,
    tol: f64,
    fault: Option<Fault>,
}

impl<T: Element> Side<T> {
    /// Runs the twin on copies of `inputs` (leaves of a tape of its own)
    /// and checks the fused output `y` against it. Returns the side graph
    /// (for the backward check) and `y` as training is to see it (with an
    /// injected fault, if one is set for this call).
    pub(crate) fn forward(
        probe: Probe,
        inputs: &[&Var<T>],
        y: &Tensor<T>,
        twin: Twin<'_, T>,
    ) -> Result<(Side<T>, Option<Tensor<T>>)> {
        let tape = Tape::new();
        let leaves: Vec<Var<T>> = inputs
            .iter()
            .map(|v| {
                if v.requires_grad() {
                    tape.var(v.value().clone())
                } else {
                    tape.constant(v.value().clone())
                }
            })
            .collect();
        let output = (twin.composed)(&leaves)?;
        let host = inputs
            .iter()
            .map(|v| v.value().to_f64_vec())
            .collect::<Result<Vec<_>>>()?;
        let fault = probe.shadow.fault(probe.op, probe.step, probe.call);
        let judge = twin.judge;
        let (conds, tol) = (judge.row_condition(&host), judge.tolerance(T::NAME, &host));
        let mut side = Side {
            probe,
            judge,
            inputs: leaves,
            output,
            host,
            shapes: inputs.iter().map(|v| v.shape().to_vec()).collect(),
            conds,
            tol,
            fault,
        };
        let d = side.judge.row_len();
        let faulty = match &side.fault {
            Some(f) if f.result == "y" => Some(perturbed(y, d, f.row, f.delta)?),
            _ => None,
        };
        let fused = faulty.as_ref().unwrap_or(y).to_f64_vec()?;
        let twin_y = side.output.value().to_f64_vec()?;
        let scale = side.judge.scales(&side.host, None)[0];
        side.check("y", &fused, &twin_y, None, scale)?;
        side.fault = side.fault.take().filter(|f| f.result != "y");
        Ok((side, faulty))
    }

    /// Checks the fused input gradients `grads` (entries where `needs`)
    /// against the twin's for the output gradient `g`, after adding an
    /// injected fault for this call, if one is set.
    pub(crate) fn backward(
        &self,
        g: &Tensor<T>,
        grads: &mut [Option<Tensor<T>>],
        needs: &[bool],
    ) -> Result<()> {
        let twin = self.output.backward_with(g)?;
        let cot = g.to_f64_vec()?;
        // The output's size first, then each input gradient's.
        let scales = self.judge.scales(&self.host, Some(&cot));
        let names = self.judge.inputs();
        let d = self.judge.row_len();
        for (i, slot) in grads.iter_mut().enumerate() {
            let (Some(fused), true) = (slot.as_mut(), needs.get(i) == Some(&true)) else {
                continue;
            };
            let name = format!("d{}", names.get(i).copied().unwrap_or("input"));
            if let Some(f) = self.fault.as_ref().filter(|f| f.result == name) {
                *fused = perturbed(fused, d, f.row, f.delta)?;
            }
            let fused = sum_to_shape(self.probe.op, fused, &self.shapes[i])?;
            let want = twin.wrt(&self.inputs[i])?.to_f64_vec()?;
            let scale = scales.get(1 + i).copied().unwrap_or(1.0);
            self.check(&name, &fused.to_f64_vec()?, &want, Some((i, &cot)), scale)?;
        }
        Ok(())
    }

    /// Bytes the twin's graph holds until the backward check.
    pub(crate) fn saved_bytes(&self) -> usize {
        self.output.tape().saved_bytes()
    }

    /// Compares one result, of term size `scale`, and records the check.
    /// `grad` is the input's index and the output gradient, for a
    /// gradient.
    fn check(
        &self,
        result: &str,
        fused: &[f64],
        twin: &[f64],
        grad: Option<(usize, &[f64])>,
        scale: f64,
    ) -> Result<()> {
        let p = &self.probe;
        let d = self.judge.row_len().max(1);
        let (m, at) = max_diff(fused, twin);
        let conds = &self.conds;
        // Row-shaped results point at their worst row; a parameter's
        // gradient sums over every row, so the hardest row stands in.
        let row_shaped = fused.len() == self.host[0].len();
        let row = if row_shaped { at / d } else { argmax(conds) };
        let check = Check {
            step: p.step,
            op: p.op,
            site: p.site.clone(),
            call: p.call,
            result: result.to_string(),
            diff: m / scale,
            fused: fused.get(at).copied().unwrap_or(f64::NAN),
            twin: twin.get(at).copied().unwrap_or(f64::NAN),
            tol: self.tol,
            dtype: T::NAME,
            row: row_stats(&self.host[0], d, row),
        };
        let write = |dir: &std::path::Path| {
            // The rows worth keeping: the worst by difference (or by
            // condition, for a parameter's gradient).
            let badness: Vec<f64> = if row_shaped {
                fused
                    .chunks(d)
                    .zip(twin.chunks(d))
                    .map(|(a, b)| max_diff(a, b).0)
                    .collect()
            } else {
                conds.clone()
            };
            replay::write(
                dir,
                &check,
                &*self.judge,
                &self.host,
                &self.shapes,
                grad.map(|(_, c)| (c, self.output.shape())),
                &badness,
            )
        };
        p.shadow.record(check.clone(), &write)
    }
}
