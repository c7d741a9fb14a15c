//! Gradient checking.
//!
//! [`check`] compares analytic gradients with central finite differences in
//! f64 against a random cotangent `c` (never a plain sum: under a sum loss
//! LayerNorm's dx is identically zero). The scalar probed is
//! `L(x) = <c, f(x)>`, whose exact gradient is what `backward_with(c)` gives.
//!
//! [`fused_vs_composed`] runs a fused op and its composed twin on the same
//! inputs and cotangent and reports how far apart they are.

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::rng::Rng;
use crate::tape::{Tape, Var};
use crate::tensor::Tensor;
use std::fmt;

/// Settings for [`check`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Relative finite-difference step: `h = step * max(1, |x|)`.
    pub step: f64,
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
    /// Inputs with more elements are spot-checked on this many sampled ones.
    pub max_checks: usize,
    /// Seed for the cotangent and the sampling.
    pub seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            step: 1e-6,
            atol: 1e-6,
            rtol: 1e-5,
            max_checks: 64,
            seed: 0x5eed,
        }
    }
}

/// Errors for one input.
#[derive(Debug, Clone)]
pub struct InputReport {
    /// Input position.
    pub index: usize,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Elements compared.
    pub checked: usize,
    /// max |analytic - numeric|.
    pub max_abs: f64,
    /// max |analytic - numeric| / max(|analytic|, |numeric|, floor), where
    /// floor is 1e-3 of the largest gradient of this input (so that entries
    /// near zero do not dominate).
    pub max_rel: f64,
    /// Every element within `atol + rtol * |numeric|`.
    pub ok: bool,
}

/// The result of [`check`]: one row per input.
#[derive(Debug, Clone)]
pub struct Report {
    /// A label, printed in the table.
    pub name: String,
    /// Per-input results.
    pub inputs: Vec<InputReport>,
}

impl Report {
    /// True when every input passed.
    pub fn passed(&self) -> bool {
        self.inputs.iter().all(|r| r.ok)
    }
    /// Largest relative error over all inputs.
    pub fn max_rel(&self) -> f64 {
        self.inputs.iter().map(|r| r.max_rel).fold(0.0, f64::max)
    }
    /// Largest absolute error over all inputs.
    pub fn max_abs(&self) -> f64 {
        self.inputs.iter().map(|r| r.max_abs).fold(0.0, f64::max)
    }
    /// Header line matching the rows of `Display`.
    pub fn header() -> String {
        format!(
            "{:<22} {:>5} {:<16} {:>7} {:>10} {:>10}  {}",
            "op", "input", "shape", "checked", "max abs", "max rel", "ok"
        )
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.inputs {
            writeln!(
                f,
                "{:<22} {:>5} {:<16} {:>7} {:>10.2e} {:>10.2e}  {}",
                self.name,
                r.index,
                format!("{:?}", r.shape),
                r.checked,
                r.max_abs,
                r.max_rel,
                if r.ok { "yes" } else { "NO" }
            )?;
        }
        Ok(())
    }
}

/// `<c, f(x)>` for one set of inputs, on a fresh tape, without gradients.
fn probe<F>(f: &F, inputs: &[Tensor<f64>], c: &[f64]) -> Result<f64>
where
    F: Fn(&[Var<f64>]) -> Result<Var<f64>>,
{
    let tape = Tape::new();
    let vars: Vec<Var<f64>> = inputs.iter().map(|t| tape.constant(t.clone())).collect();
    let y = f(&vars)?;
    Ok(y.value()
        .as_slice()?
        .iter()
        .zip(c)
        .map(|(a, b)| a * b)
        .sum())
}

/// Checks `f`'s gradients with respect to every input against central
/// finite differences, in f64, with a random cotangent. Never mutates the
/// caller's tensors (perturbations are made on copies).
pub fn check<F>(f: F, inputs: &[Tensor<f64>], opts: &Options) -> Result<Report>
where
    F: Fn(&[Var<f64>]) -> Result<Var<f64>>,
{
    let tape = Tape::new();
    let vars: Vec<Var<f64>> = inputs.iter().map(|t| tape.var(t.clone())).collect();
    let y = f(&vars)?;
    let mut rng = Rng::new(opts.seed);
    let c = rng.vec(y.value().numel());
    let cot = Tensor::from_vec(y.shape().to_vec(), c.clone())?;
    let grads = y.backward_with(&cot)?;

    let mut reports = Vec::with_capacity(inputs.len());
    for (i, (x, v)) in inputs.iter().zip(&vars).enumerate() {
        let analytic = grads.wrt(v)?.to_f64_vec()?;
        let n = x.numel();
        let idx: Vec<usize> = if n <= opts.max_checks {
            (0..n).collect()
        } else {
            (0..opts.max_checks).map(|_| rng.below(n)).collect()
        };
        let scale = analytic.iter().fold(0.0f64, |m, a| m.max(a.abs()));
        let floor = (1e-3 * scale).max(f64::MIN_POSITIVE);
        let (mut max_abs, mut max_rel, mut ok) = (0.0f64, 0.0f64, true);
        let mut work: Vec<Tensor<f64>> = inputs.to_vec();
        for &k in &idx {
            let base = x.as_slice()?[k];
            let h = opts.step * base.abs().max(1.0);
            let mut at = |delta: f64| -> Result<f64> {
                let mut data = x.as_slice()?.to_vec();
                data[k] = base + delta;
                work[i] = Tensor::from_vec(x.shape().to_vec(), data)?;
                probe(&f, &work, &c)
            };
            let numeric = (at(h)? - at(-h)?) / (2.0 * h);
            let a = analytic[k];
            let abs = (a - numeric).abs();
            let rel = abs / a.abs().max(numeric.abs()).max(floor);
            // NaN errors count as failures.
            if abs.is_nan() || abs > opts.atol + opts.rtol * numeric.abs() {
                ok = false;
            }
            max_abs = max_abs.max(abs);
            max_rel = max_rel.max(rel);
            if abs.is_nan() {
                max_abs = f64::NAN;
                max_rel = f64::NAN;
            }
        }
        reports.push(InputReport {
            index: i,
            shape: x.shape().to_vec(),
            checked: idx.len(),
            max_abs,
            max_rel,
            ok,
        });
    }
    Ok(Report {
        name: String::new(),
        inputs: reports,
    })
}

/// How far a fused op and its composed twin are apart.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Normwise relative difference of the outputs:
    /// `max|fused - composed| / max|composed|`.
    pub output: f64,
    /// The same for each input's gradient.
    pub grads: Vec<f64>,
}

impl Comparison {
    /// The largest of all differences (NaN if any is NaN).
    pub fn max(&self) -> f64 {
        std::iter::once(self.output)
            .chain(self.grads.iter().copied())
            .fold(0.0, |m, v| {
                if v.is_nan() || m.is_nan() {
                    f64::NAN
                } else {
                    m.max(v)
                }
            })
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "output {:.2e}", self.output)?;
        for (i, g) in self.grads.iter().enumerate() {
            write!(f, ", d{i} {g:.2e}")?;
        }
        Ok(())
    }
}

/// Normwise relative difference `max|a-b| / max|b|` (absolute when b is 0).
pub fn rel_diff(a: &[f64], b: &[f64]) -> f64 {
    let mut num = 0.0f64;
    let mut den = 0.0f64;
    for (x, y) in a.iter().zip(b) {
        let d = (x - y).abs();
        if d.is_nan() {
            return f64::NAN;
        }
        num = num.max(d);
        den = den.max(y.abs());
    }
    if den > 0.0 {
        num / den
    } else {
        num
    }
}

/// Runs `fused` and `composed` on the same inputs with one random cotangent
/// and compares outputs and every input gradient.
pub fn fused_vs_composed<T, F, C>(
    fused: F,
    composed: C,
    inputs: &[Tensor<T>],
    seed: u64,
) -> Result<Comparison>
where
    T: Element,
    F: Fn(&[Var<T>]) -> Result<Var<T>>,
    C: Fn(&[Var<T>]) -> Result<Var<T>>,
{
    type Outcome = (Vec<f64>, Vec<Vec<f64>>);
    type Graph<'a, T> = &'a dyn Fn(&[Var<T>]) -> Result<Var<T>>;
    let run = |g: Graph<'_, T>| -> Result<Outcome> {
        let tape = Tape::new();
        let vars: Vec<Var<T>> = inputs.iter().map(|t| tape.var(t.clone())).collect();
        let y = g(&vars)?;
        let mut rng = Rng::new(seed);
        let c: Vec<T> = (0..y.value().numel())
            .map(|_| T::from_f64(rng.range(-1.0, 1.0)))
            .collect();
        let grads = y.backward_with(&Tensor::from_vec(y.shape().to_vec(), c)?)?;
        let gs = vars
            .iter()
            .map(|v| grads.wrt(v)?.to_f64_vec())
            .collect::<Result<Vec<_>>>()?;
        Ok((y.value().to_f64_vec()?, gs))
    };
    let (yf, gf) = run(&fused)?;
    let (yc, gc) = run(&composed)?;
    if yf.len() != yc.len() {
        return Err(Error::ShapeMismatch {
            op: "fused_vs_composed",
            lhs: vec![yf.len()],
            rhs: vec![yc.len()],
        });
    }
    Ok(Comparison {
        output: rel_diff(&yf, &yc),
        grads: gf.iter().zip(&gc).map(|(a, b)| rel_diff(a, b)).collect(),
    })
}
