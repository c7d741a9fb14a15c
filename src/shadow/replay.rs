//! Replay files: the inputs of a shadow check that failed (its worst rows,
//! the parameters whole and the output gradient's rows; everything whole
//! for an op whose rows depend on each other), in a safetensors
//! file with the op, its settings and the check in the metadata. Values are
//! stored as f64, exactly (every element type widens to f64 without
//! rounding), and rounded back to the recorded dtype to rerun.

use super::watch::Judge;
use super::{Check, Shadow, ShadowConfig};
use crate::device::Device;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tape::{Tape, Var};
use crate::tensor::Tensor;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A replay file's metadata `key` as text, or an error naming it.
pub(crate) fn meta_text<'m>(meta: &'m HashMap<String, String>, key: &str) -> Result<&'m str> {
    meta.get(key)
        .map(String::as_str)
        .ok_or_else(|| Error::InvalidArgument {
            op: "replay",
            msg: format!("no {key:?} in the file"),
        })
}

/// A replay file's metadata `key` parsed, or an error naming it.
pub(crate) fn meta_value<V: std::str::FromStr>(
    meta: &HashMap<String, String>,
    key: &str,
) -> Result<V>
where
    V::Err: std::fmt::Display,
{
    meta_text(meta, key)?
        .parse()
        .map_err(|e: V::Err| Error::InvalidArgument {
            op: "replay",
            msg: format!("{key}: {e}"),
        })
}

/// Rows kept from a large input: the worst ones.
const KEEP_ROWS: usize = 8;

fn err(path: &Path, msg: impl Into<String>) -> Error {
    Error::Replay {
        path: path.display().to_string(),
        msg: msg.into(),
    }
}

/// The indices of the (at most [`KEEP_ROWS`]) largest `badness` values,
/// in row order; every row when there are few.
fn keep_rows(badness: &[f64]) -> Vec<usize> {
    let mut rows: Vec<usize> = (0..badness.len()).collect();
    if rows.len() > KEEP_ROWS {
        let key = |i: &usize| {
            let b = badness[*i];
            if b.is_nan() {
                f64::INFINITY
            } else {
                b
            }
        };
        rows.sort_by(|a, b| key(b).total_cmp(&key(a)));
        rows.truncate(KEEP_ROWS);
        rows.sort_unstable();
    }
    rows
}

fn bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes the replay file of `check` into `dir` (made if missing) and
/// returns its path: `shadow-<site>-step<N>-<result>.safetensors`.
pub(crate) fn write(
    dir: &Path,
    check: &Check,
    judge: &dyn Judge,
    inputs: &[Vec<f64>],
    shapes: &[Vec<usize>],
    cot: Option<(&[f64], &[usize])>,
    badness: &[f64],
) -> Result<PathBuf> {
    let safe: String = check
        .site
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let path = dir.join(format!(
        "shadow-{safe}-step{}-{}.safetensors",
        check.step, check.result
    ));
    std::fs::create_dir_all(dir).map_err(|e| err(&path, e.to_string()))?;
    let d = judge.row_len().max(1);
    let names = judge.inputs();
    let mut blobs: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let row_list = if judge.whole() {
        for (i, v) in inputs.iter().enumerate() {
            let name = names.get(i).copied().unwrap_or("input").to_string();
            blobs.push((name, shapes[i].clone(), bytes(v)));
        }
        if let Some((c, shape)) = cot {
            blobs.push(("dy".into(), shape.to_vec(), bytes(c)));
        }
        "all".to_string()
    } else {
        let rows = keep_rows(badness);
        let take = |v: &[f64]| -> Vec<f64> {
            rows.iter()
                .flat_map(|&r| v.get(r * d..(r + 1) * d).unwrap_or(&[]).iter().copied())
                .collect()
        };
        for (i, v) in inputs.iter().enumerate() {
            let name = names.get(i).copied().unwrap_or("input").to_string();
            if i == 0 {
                blobs.push((name, vec![rows.len(), d], bytes(&take(v))));
            } else {
                blobs.push((name, shapes[i].clone(), bytes(v)));
            }
        }
        if let Some((c, _)) = cot {
            blobs.push(("dy".into(), vec![rows.len(), d], bytes(&take(c))));
        }
        let row_list: Vec<String> = rows.iter().map(|r| r.to_string()).collect();
        row_list.join(",")
    };
    let mut meta: HashMap<String, String> = judge.settings().into_iter().collect();
    for (k, v) in [
        ("op", check.op.to_string()),
        ("dtype", check.dtype.to_string()),
        ("site", check.site.clone()),
        ("step", check.step.to_string()),
        ("call", check.call.to_string()),
        ("result", check.result.clone()),
        ("diff", format!("{:e}", check.diff)),
        ("tol", format!("{:e}", check.tol)),
        ("rows", row_list),
        ("inputs", names.join(",")),
    ] {
        meta.insert(k.to_string(), v);
    }
    let views = blobs
        .iter()
        .map(|(n, s, b)| {
            safetensors::tensor::TensorView::new(Dtype::F64, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| err(&path, e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let out = safetensors::serialize(views, Some(meta)).map_err(|e| err(&path, e.to_string()))?;
    // A reader (or a crash) never sees half a file.
    crate::file::write_atomic(&path, &out).map_err(|e| err(&path, e.to_string()))?;
    Ok(path)
}

/// A replay file rerun: what was recorded and what the rerun found.
#[derive(Debug, Clone)]
pub struct Replay {
    /// The file's metadata (op, dtype, site, step, call, result, diff,
    /// tol, rows, inputs and the op's settings).
    pub meta: HashMap<String, String>,
    /// The rerun's checks: the output, then each gradient (when the file
    /// holds an output gradient).
    pub checks: Vec<Check>,
}

impl Replay {
    /// The rerun's check of the result the file was written for.
    pub fn recorded_result(&self) -> Option<&Check> {
        let r = self.meta.get("result")?;
        self.checks.iter().find(|c| &c.result == r)
    }
}

impl std::fmt::Display for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = |k: &str| self.meta.get(k).map_or("?", |s| s.as_str());
        writeln!(
            f,
            "{} ({}) at {}, step {}, call {}: {} differed by {} (tolerance {}); rows {}",
            m("op"),
            m("dtype"),
            m("site"),
            m("step"),
            m("call"),
            m("result"),
            m("diff"),
            m("tol"),
            m("rows")
        )?;
        writeln!(
            f,
            "{:<8} {:>12} {:>12} {:>10} {:>24} {:>24}",
            "result", "difference", "tolerance", "verdict", "fused", "composed"
        )?;
        for c in &self.checks {
            writeln!(
                f,
                "{:<8} {:>12.3e} {:>12.3e} {:>10} {:>24e} {:>24e}",
                c.result,
                c.diff,
                c.tol,
                if c.passed() { "within" } else { "PAST" },
                c.fused,
                c.twin
            )?;
        }
        Ok(())
    }
}

/// Reruns the replay file at `path` fused and composed on `device`, in the
/// dtype it was recorded in, under a shadow with `config` (its `every` and
/// `fraction` are set to check the one call).
pub fn replay(path: impl AsRef<Path>, device: Device, config: ShadowConfig) -> Result<Replay> {
    let path = path.as_ref();
    let raw = std::fs::read(path).map_err(|e| err(path, e.to_string()))?;
    let (_, header) = SafeTensors::read_metadata(&raw).map_err(|e| err(path, e.to_string()))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let file = SafeTensors::deserialize(&raw).map_err(|e| err(path, e.to_string()))?;
    let get = |k: &str| {
        meta.get(k)
            .cloned()
            .ok_or_else(|| err(path, format!("no {k:?} in the metadata")))
    };
    let names: Vec<String> = get("inputs")?.split(',').map(String::from).collect();
    let mut tensors = Vec::new();
    for n in names.iter().map(String::as_str).chain(["dy"]) {
        let view = match file.tensor(n) {
            Ok(v) => v,
            Err(_) if n == "dy" => break,
            Err(_) => return Err(err(path, format!("no tensor {n:?}"))),
        };
        if view.dtype() != Dtype::F64 {
            return Err(err(path, format!("{n:?} is {:?}, not F64", view.dtype())));
        }
        let v: Vec<f64> = view
            .data()
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect();
        tensors.push((view.shape().to_vec(), v));
    }
    let op = get("op")?;
    let config = ShadowConfig {
        every: 1,
        fraction: 1.0,
        ops: vec![op.clone()],
        ..config
    };
    let checks = match get("dtype")?.as_str() {
        "f64" => rerun::<f64>(&op, &meta, &tensors, names.len(), device, config),
        "f32" => rerun::<f32>(&op, &meta, &tensors, names.len(), device, config),
        "f16" => rerun::<half::f16>(&op, &meta, &tensors, names.len(), device, config),
        "bf16" => rerun::<half::bf16>(&op, &meta, &tensors, names.len(), device, config),
        other => Err(err(path, format!("unknown dtype {other:?}"))),
    }?;
    Ok(Replay { meta, checks })
}

fn rerun<T: Element>(
    op: &str,
    meta: &HashMap<String, String>,
    tensors: &[(Vec<usize>, Vec<f64>)],
    inputs: usize,
    device: Device,
    config: ShadowConfig,
) -> Result<Vec<Check>> {
    let shadow = Shadow::new(config);
    let checks = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let sink = checks.clone();
    shadow.on_check(move |c| sink.borrow_mut().push(c.clone()));
    let tape = Tape::<T>::new();
    shadow.watch(&tape, 0);
    let tensor = |(shape, v): &(Vec<usize>, Vec<f64>)| -> Result<Tensor<T>> {
        Tensor::from_vec(shape.clone(), v.iter().map(|x| T::from_f64(*x)).collect())?
            .to_device(device)
    };
    let has_dy = tensors.len() > inputs;
    let vars: Vec<Var<T>> = tensors[..inputs]
        .iter()
        .map(|t| {
            Ok(if has_dy {
                tape.var(tensor(t)?)
            } else {
                tape.constant(tensor(t)?)
            })
        })
        .collect::<Result<_>>()?;
    let y = match op {
        "attention" | "attention_qkv" => crate::ops::attention::twin::rerun(op, meta, &vars)?,
        _ => crate::ops::norm::twin::rerun(op, meta, &vars)?,
    };
    if let Some(dy) = tensors.get(inputs) {
        y.backward_with(&tensor(dy)?.reshape(y.shape())?)?;
    }
    let out = checks.borrow().clone();
    Ok(out)
}
