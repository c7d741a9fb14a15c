//! Training checkpoints: the model, its optimizer and the loop's own state
//! in one folder, saved whole or not at all, and loaded back so that a
//! resumed run takes exactly the steps the interrupted one would have.
//!
//! A checkpoint after `N` steps is the folder `DIR/step-0000000N` (the
//! Hugging Face Trainer's `checkpoint-N`):
//!
//! - `model.safetensors`: the parameters, as [`super::save`] writes them
//!   (PyTorch's names and layout);
//! - `optimizer.safetensors`: per parameter `NAME.exp_avg` and
//!   `NAME.exp_avg_sq` (Adam, AdamW) or `NAME.momentum_buffer` (SGD), in
//!   the accumulation type, with the kind, step count and hyper-parameters
//!   in the header's metadata;
//! - `state.json`: the [`TrainState`] (step, data position, random
//!   generators, settings, loss history), the element type and the
//!   fusegrad version;
//! - `checksums.txt`: each file's FNV-1a 64 checksum and size.
//!
//! The folder is written under a hidden name, every file flushed to disk,
//! then renamed into place; old ones are renamed out of sight before they
//! are deleted. So a kill or a full disk at any moment leaves every
//! `step-N` folder whole, and the newest one is the last save that
//! finished.
//!
//! ```
//! use fusegrad::nn::{load_checkpoint, AdamW, Checkpoints, Linear, Optimizer, TrainState};
//! use fusegrad::{rng::Rng, Tensor};
//!
//! # fn main() -> fusegrad::Result<()> {
//! let dir = std::env::temp_dir().join(format!("fg-doc-ckpt-{}", std::process::id()));
//! let mut model = Linear::<f32>::new(3, 2, &mut Rng::new(1))?;
//! let opt = AdamW::<f32>::with_lr(1e-3)?;
//! let mut state = TrainState::new();
//! state.step = 10;
//! state.config.insert("width".into(), "3".into());
//! let saved = Checkpoints::new(&dir).keep(2)?.save(&model, &opt, &state)?;
//! assert!(saved.ends_with("step-00000010"));
//!
//! let mut opt2 = AdamW::<f32>::with_lr(1e-3)?;
//! let back = load_checkpoint(&dir, &mut model, &mut opt2, &state.config)?;
//! assert_eq!(back.step, 10);
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(())
//! # }
//! ```

mod folder;
mod json;

use super::weights::{decode, encode, err as weights_err, no_extra, params_bytes, read_params};
use super::{EvalPoint, Optimizer, OptimizerState, Parameters};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::rng::Rng;
use crate::tensor::Tensor;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// The files of a checkpoint, in the order they are written.
const MODEL: &str = "model.safetensors";
const OPTIMIZER: &str = "optimizer.safetensors";
const STATE: &str = "state.json";
/// The header entry of `optimizer.safetensors` with the optimizer's kind,
/// step count, buffer names and hyper-parameters.
const OPTIMIZER_META: &str = "fusegrad.optimizer";

/// What a training loop keeps beside the tensors, to continue where it
/// stopped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrainState {
    /// Optimizer steps taken: also the learning-rate schedule's position.
    pub step: u64,
    /// Where the data stream stands (samples or batches drawn, as the loop
    /// counts them).
    pub data_position: u64,
    /// The loop's random generators by name, as [`Rng::state`].
    pub rngs: BTreeMap<String, u64>,
    /// The settings a resume must share (model shape, batch, schedule,
    /// seed...), as text: [`load_checkpoint`] compares them.
    pub config: BTreeMap<String, String>,
    /// The training loss of each step so far.
    pub losses: Vec<f64>,
    /// Validation points so far.
    pub evals: Vec<EvalPoint>,
}

impl TrainState {
    /// A run before its first step.
    pub fn new() -> Self {
        Self::default()
    }

    /// The generator saved as `name`, or `fresh` when there is none.
    pub fn rng(&self, name: &str, fresh: Rng) -> Rng {
        self.rngs.get(name).map_or(fresh, |&s| Rng::from_state(s))
    }
}

/// A folder of checkpoints, `step-N` each, of which the newest `keep` are
/// kept (all, unless [`Checkpoints::keep`] says otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoints {
    dir: PathBuf,
    keep: Option<usize>,
}

impl Checkpoints {
    /// Checkpoints in `dir` (made on the first save), all kept.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Checkpoints {
            dir: dir.into(),
            keep: None,
        }
    }

    /// Keeps only the newest `keep` after each save. Errors for 0.
    pub fn keep(mut self, keep: usize) -> Result<Self> {
        if keep == 0 {
            return Err(Error::InvalidArgument {
                op: "Checkpoints::keep",
                msg: "keep must be at least 1 (the checkpoint just saved)".into(),
            });
        }
        self.keep = Some(keep);
        Ok(self)
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Saves `model`, `opt` and `state` as `DIR/step-N` (`N` is
    /// `state.step`), whole or not at all, then removes the checkpoints
    /// past the newest `keep`. Returns the new folder. A folder for that
    /// step already there is an error: a checkpoint is never replaced.
    pub fn save<T, M, O>(&self, model: &M, opt: &O, state: &TrainState) -> Result<PathBuf>
    where
        T: Element,
        M: Parameters<T> + ?Sized,
        O: Optimizer<T> + ?Sized,
    {
        let name = folder::name_of(state.step);
        let at = self.dir.join(&name);
        let model_bytes = params_bytes(model, &at.join(MODEL))?;
        let opt_bytes = optimizer_bytes(model, &opt.state_dict()?, &at.join(OPTIMIZER))?;
        let state_bytes = json::encode(state, T::NAME).into_bytes();
        let files = [
            (MODEL, model_bytes),
            (OPTIMIZER, opt_bytes),
            (STATE, state_bytes),
        ];
        let saved = folder::write(&self.dir, &name, &files).map_err(|e| ckpt_err(&at, e))?;
        if let Some(keep) = self.keep {
            folder::prune(&self.dir, keep).map_err(|e| ckpt_err(&self.dir, e))?;
        }
        Ok(saved)
    }

    /// The complete checkpoints, oldest first, with their steps (none when
    /// the folder does not exist yet).
    pub fn list(&self) -> Result<Vec<(u64, PathBuf)>> {
        if !self.dir.exists() {
            return Ok(Vec::new());
        }
        folder::list(&self.dir).map_err(|e| ckpt_err(&self.dir, e))
    }

    /// The newest complete checkpoint, if any.
    pub fn latest(&self) -> Result<Option<PathBuf>> {
        Ok(self.list()?.pop().map(|(_, p)| p))
    }
}

fn ckpt_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Checkpoint {
        path: path.display().to_string(),
        msg: e.to_string(),
    }
}

/// Loads the checkpoint at `path` into `model` and `opt` and returns its
/// [`TrainState`]. `path` is a `step-N` folder, or a [`Checkpoints`]
/// folder, whose newest checkpoint is taken. Everything is read and
/// checked before anything changes: a damaged file, another element type,
/// settings that differ from `config` (the first difference is named),
/// other parameters or another optimizer are errors, and then `model` and
/// `opt` are as they were.
pub fn load_checkpoint<T, M, O>(
    path: impl AsRef<Path>,
    model: &mut M,
    opt: &mut O,
    config: &BTreeMap<String, String>,
) -> Result<TrainState>
where
    T: Element,
    M: Parameters<T> + ?Sized,
    O: Optimizer<T> + ?Sized,
{
    let path = resolve(path.as_ref())?;
    let bytes = folder::read(&path, &[MODEL, OPTIMIZER, STATE]).map_err(|e| ckpt_err(&path, e))?;
    let text =
        std::str::from_utf8(&bytes[2]).map_err(|e| ckpt_err(&path, format!("{STATE}: {e}")))?;
    let (state, dtype) =
        json::decode(text).map_err(|e| ckpt_err(&path, format!("{STATE}: {e}")))?;
    if dtype != T::NAME {
        return Err(ckpt_err(
            &path,
            format!("it holds {dtype} weights, the model is {}", T::NAME),
        ));
    }
    if let Some(d) = first_difference(&state.config, config) {
        return Err(ckpt_err(&path, d));
    }
    let params = read_params(model, &bytes[0], &path.join(MODEL))?;
    let opt_state = read_optimizer(model, &bytes[1], &path.join(OPTIMIZER))?;
    opt.load_state_dict(opt_state)
        .map_err(|e| ckpt_err(&path, format!("{OPTIMIZER}: {e}")))?;
    for (p, t) in model.params_mut().into_iter().zip(params) {
        *p = t;
    }
    Ok(state)
}

/// `path` itself when it is a checkpoint, else the newest one in it.
fn resolve(path: &Path) -> Result<PathBuf> {
    let named_as_one = path
        .file_name()
        .and_then(|n| folder::step_of(&n.to_string_lossy()))
        .is_some();
    if named_as_one || path.join(folder::SUMS).exists() || path.join(STATE).exists() {
        return Ok(path.to_path_buf());
    }
    if !path.is_dir() {
        return Err(ckpt_err(path, "no such checkpoint folder"));
    }
    Checkpoints::new(path)
        .latest()?
        .ok_or_else(|| ckpt_err(path, "holds no checkpoint (no step-N folder)"))
}

/// The first setting that differs between a checkpoint's and a run's.
fn first_difference(
    saved: &BTreeMap<String, String>,
    run: &BTreeMap<String, String>,
) -> Option<String> {
    let keys: BTreeSet<&String> = saved.keys().chain(run.keys()).collect();
    keys.into_iter()
        .find_map(|k| match (saved.get(k), run.get(k)) {
            (Some(a), Some(b)) if a == b => None,
            (Some(a), Some(b)) => Some(format!("it was made with {k} {a}, this run has {k} {b}")),
            (Some(a), None) => Some(format!("it was made with {k} {a}, this run sets no {k}")),
            (None, Some(b)) => Some(format!("it sets no {k}, this run has {k} {b}")),
            (None, None) => None,
        })
}

/// The optimizer's buffers as safetensors, each laid out as its parameter
/// is in `model.safetensors`, with the kind, step and hyper-parameters as
/// metadata.
fn optimizer_bytes<T: Element, M: Parameters<T> + ?Sized>(
    model: &M,
    state: &OptimizerState<T>,
    path: &Path,
) -> Result<Vec<u8>> {
    let (params, names) = (model.params(), model.param_names());
    if !state.buffers.is_empty() && state.buffers.len() != params.len() {
        return Err(weights_err(
            path,
            format!(
                "the optimizer holds state for {} parameters, the model has {}",
                state.buffers.len(),
                params.len()
            ),
        ));
    }
    let mut entries = Vec::new();
    let mut kept = Vec::new();
    for (bufs, (p, n)) in state.buffers.iter().zip(params.iter().zip(&names)) {
        for (b, t) in bufs {
            let (vals, shape) = super::weights::layout(&t.to_vec()?, p.shape(), n.transposed);
            entries.push((format!("{}.{b}", n.name), shape, vals));
        }
        kept.push(
            bufs.iter()
                .map(|(b, _)| b.as_str())
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    // One metadata entry, JSON with sorted keys: the header's own map has
    // no fixed order, and a checkpoint's bytes should not vary run to run.
    let mut info = BTreeMap::new();
    info.insert("kind".to_string(), state.kind.clone());
    info.insert("step".to_string(), state.step.to_string());
    info.insert(
        "buffers".to_string(),
        kept.first().cloned().unwrap_or_default(),
    );
    for (k, v) in &state.hyper {
        // `{:?}` of an f64 reads back to the same bits.
        info.insert(format!("hyper.{k}"), format!("{v:?}"));
    }
    let text = serde_json::to_string(&info).map_err(|e| weights_err(path, e.to_string()))?;
    let meta = HashMap::from([(OPTIMIZER_META.to_string(), text)]);
    encode::<T::Acc>(path, entries, Some(meta))
}

/// The optimizer state in `bytes`, each buffer checked against its
/// parameter's shape and moved to its device.
fn read_optimizer<T: Element, M: Parameters<T> + ?Sized>(
    model: &M,
    bytes: &[u8],
    path: &Path,
) -> Result<OptimizerState<T>> {
    let bad = |m: String| weights_err(path, m);
    let (_, header) =
        safetensors::SafeTensors::read_metadata(bytes).map_err(|e| bad(e.to_string()))?;
    let file = safetensors::SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
    let text = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get(OPTIMIZER_META))
        .ok_or_else(|| bad(format!("no {OPTIMIZER_META:?} in the header")))?;
    let meta: BTreeMap<String, String> =
        serde_json::from_str(text).map_err(|e| bad(format!("{OPTIMIZER_META}: {e}")))?;
    let get = |k: &str| {
        meta.get(k)
            .cloned()
            .ok_or_else(|| bad(format!("no {k:?} in the header")))
    };
    let kind = get("kind")?;
    let step = get("step")?
        .parse::<u64>()
        .map_err(|e| bad(format!("step: {e}")))?;
    let mut hyper = BTreeMap::new();
    for (k, v) in &meta {
        if let Some(h) = k.strip_prefix("hyper.") {
            let x = v
                .parse::<f64>()
                .map_err(|e| bad(format!("{k} {v:?}: {e}")))?;
            hyper.insert(h.to_string(), x);
        }
    }
    let kept = get("buffers")?;
    let kept: Vec<&str> = kept.split(',').filter(|s| !s.is_empty()).collect();
    let (params, names) = (model.params(), model.param_names());
    let mut known = BTreeSet::new();
    let mut buffers = Vec::new();
    if !kept.is_empty() {
        for (p, n) in params.iter().zip(&names) {
            let want = super::weights::stored_shape(n, p.shape());
            let mut bufs = Vec::new();
            for b in &kept {
                let name = format!("{}.{b}", n.name);
                let vals = decode::<T::Acc>(path, &file, &name, &want, "the optimizer's buffer")?;
                let (vals, shape) = super::weights::layout(&vals, &want, n.transposed);
                bufs.push((
                    b.to_string(),
                    Tensor::from_vec(shape, vals)?.to_device(p.device())?,
                ));
                known.insert(name);
            }
            buffers.push(bufs);
        }
    }
    let known: BTreeSet<&str> = known.iter().map(String::as_str).collect();
    no_extra(path, &file, &known, "a buffer of the model's parameters")?;
    Ok(OptimizerState {
        kind,
        step,
        hyper,
        buffers,
    })
}
