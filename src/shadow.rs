//! The shadow check: while a model trains, each fused op also runs its
//! composed twin on the same inputs, forward and backward, on the same
//! device, and the two are compared at once. Training keeps using the
//! fused result; the twin's is thrown away.
//!
//! ```no_run
//! # use fusegrad::{Shadow, ShadowConfig, Tape};
//! let shadow = Shadow::new(ShadowConfig::every(100));
//! for step in 0..1000 {
//!     let tape = Tape::<f32>::new();
//!     shadow.watch(&tape, step); // nothing happens on unchecked steps
//!     // ... bind the model on `tape`, forward, backward, update ...
//! }
//! for site in shadow.sites() {
//!     println!("{} {}: worst {:e}", site.op, site.site, site.worst_ratio());
//! }
//! ```
//!
//! Off (no [`Shadow::watch`] on a tape) it costs one check per fused call.
//! On a checked step each fused call costs about its composed twin's time
//! and memory as well. Each result is measured as `max |fused - composed|`
//! over the size of the terms it is made of (the op's judge, for the norms
//! `ops/norm/twin.rs`) against the tolerance of its dtype from
//! [`crate::tolerance`]. The first difference past tolerance at a site is
//! written to a small safetensors file, which [`replay`] reruns.

mod replay;
mod watch;

pub(crate) use replay::{meta_text, meta_value};
pub use replay::{replay, Replay};
pub(crate) use watch::{Judge, Side, Twin, Watch};

use crate::error::{Error, Result};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;

/// What to check and what to do about a difference past tolerance.
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowConfig {
    /// Check steps `0, every, 2 every, ...` (at least 1).
    pub every: usize,
    /// The share of a checked step's fused calls that are checked, picked
    /// by a hash of the step and the call (1 checks them all).
    pub fraction: f64,
    /// The fused ops to check, by [`crate::Op::name`] (`"layer_norm"`,
    /// `"rms_norm"`); empty checks every fused op.
    pub ops: Vec<String>,
    /// Where to write the inputs of the first difference past tolerance at
    /// each site, to replay it; `None` writes nothing.
    pub replay_dir: Option<PathBuf>,
    /// Fail the op (`Error::ShadowMismatch`) at the first difference past
    /// tolerance, instead of recording it and going on.
    pub halt: bool,
    /// A fault injected into the fused result, to test the check itself.
    #[doc(hidden)]
    pub fault: Option<Fault>,
}

impl ShadowConfig {
    /// Every fused call of every `every`-th step, recorded, no files.
    pub fn every(every: usize) -> Self {
        ShadowConfig {
            every,
            fraction: 1.0,
            ops: Vec::new(),
            replay_dir: None,
            halt: false,
            fault: None,
        }
    }
}

/// A perturbation of one fused result: `delta` added to the first element
/// of row `row` of `result` (`"y"`, or an input's gradient such as
/// `"dx"`) at the `call`-th call of `op` in step `step`.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub op: String,
    pub step: usize,
    pub call: usize,
    pub result: String,
    pub row: usize,
    pub delta: f64,
}

/// The statistics of one row of an op's first input (the row a difference
/// was worst in).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowStats {
    /// Row index in the input, as `[rows, row_len]`.
    pub row: usize,
    pub mean: f64,
    /// Population variance.
    pub var: f64,
    pub min: f64,
    pub max: f64,
}

/// One comparison of a fused result with its twin's.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// The training step (as given to [`Shadow::watch`]).
    pub step: usize,
    /// The op, e.g. `"layer_norm"`.
    pub op: &'static str,
    /// Where in the model: the name of the op's parameter without its last
    /// part (`"blocks.2.ln1"`), else `"<op>#<call>"`.
    pub site: String,
    /// The op's call number in its step, from 0.
    pub call: usize,
    /// `"y"` for the output, `"d<input>"` for an input's gradient.
    pub result: String,
    /// `max |fused - composed|` over the result's term scale.
    pub diff: f64,
    /// The fused and the twin's value where they differ most.
    pub fused: f64,
    pub twin: f64,
    /// The dtype's tolerance for `diff` at these inputs.
    pub tol: f64,
    /// The element type, e.g. `"f32"`.
    pub dtype: &'static str,
    /// The row of the first input where the difference was largest (for a
    /// parameter's gradient, the row with the largest condition number).
    pub row: Option<RowStats>,
}

impl Check {
    /// Within tolerance (NaN never is, unless both results had it in the
    /// same places: then `diff` is 0).
    pub fn passed(&self) -> bool {
        self.diff <= self.tol
    }
}

/// Everything checked at one site.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteReport {
    pub op: &'static str,
    pub site: String,
    /// Calls checked.
    pub calls: usize,
    /// The output's check with the largest `diff / tol`.
    pub worst_output: Option<Check>,
    /// The gradients' check with the largest `diff / tol`.
    pub worst_grad: Option<Check>,
    /// Checks past tolerance.
    pub failures: usize,
    /// Per checked step: the largest `diff / tol` of any result there.
    pub history: Vec<(usize, f64)>,
    /// The replay file written for this site's first failure.
    pub replay: Option<PathBuf>,
}

impl SiteReport {
    /// The largest `diff / tol` of any check here (NaN if one was NaN).
    pub fn worst_ratio(&self) -> f64 {
        [&self.worst_output, &self.worst_grad]
            .into_iter()
            .flatten()
            .map(|c| c.diff / c.tol)
            .fold(0.0, nan_max)
    }
}

fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Whether `new` is worse than `old` by `diff / tol` (NaN is worst).
fn worse(new: &Check, old: &Option<Check>) -> bool {
    match old {
        None => true,
        Some(o) => {
            let (n, o) = (new.diff / new.tol, o.diff / o.tol);
            !o.is_nan() && (n.is_nan() || n > o)
        }
    }
}

type Observer = Box<dyn FnMut(&Check)>;

struct State {
    config: ShadowConfig,
    /// By (op, site), in first-seen order through `order`.
    sites: BTreeMap<(&'static str, String), SiteReport>,
    order: Vec<(&'static str, String)>,
    observer: Option<Observer>,
}

/// Watches tapes and records fused-vs-composed differences per site.
/// Cheap to clone (shared); single-threaded like [`crate::Tape`].
#[derive(Clone)]
pub struct Shadow {
    state: Rc<RefCell<State>>,
}

impl std::fmt::Debug for Shadow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.borrow();
        write!(f, "Shadow({:?}, {} sites)", s.config, s.sites.len())
    }
}

impl Shadow {
    /// A shadow with `config`; `every` below 1 counts as 1 and `fraction`
    /// is clamped to `0..=1`.
    pub fn new(mut config: ShadowConfig) -> Self {
        config.every = config.every.max(1);
        config.fraction = if config.fraction.is_nan() {
            1.0
        } else {
            config.fraction.clamp(0.0, 1.0)
        };
        Shadow {
            state: Rc::new(RefCell::new(State {
                config,
                sites: BTreeMap::new(),
                order: Vec::new(),
                observer: None,
            })),
        }
    }

    /// Watches `tape` if `step` is one to check (see
    /// [`ShadowConfig::every`]); a tape watched already is watched by this
    /// shadow from now on.
    pub fn watch<T: crate::Element>(&self, tape: &crate::Tape<T>, step: usize) {
        if step.is_multiple_of(self.state.borrow().config.every) {
            tape.set_watch(Watch::new(self.clone(), step));
        }
    }

    /// Calls `f` with each check as it is made.
    pub fn on_check(&self, f: impl FnMut(&Check) + 'static) {
        self.state.borrow_mut().observer = Some(Box::new(f));
    }

    /// The configuration in use.
    pub fn config(&self) -> ShadowConfig {
        self.state.borrow().config.clone()
    }

    /// One report per site, in the order they were first checked.
    pub fn sites(&self) -> Vec<SiteReport> {
        let s = self.state.borrow();
        s.order
            .iter()
            .filter_map(|k| s.sites.get(k).cloned())
            .collect()
    }

    /// Whether every check so far was within tolerance.
    pub fn all_passed(&self) -> bool {
        self.state.borrow().sites.values().all(|s| s.failures == 0)
    }

    /// Whether the `call`-th call of `op` in `step` is to be checked.
    pub(crate) fn selects(&self, op: &str, step: usize, call: usize) -> bool {
        let s = self.state.borrow();
        let c = &s.config;
        if !c.ops.is_empty() && !c.ops.iter().any(|o| o == op) {
            return false;
        }
        if c.fraction >= 1.0 {
            return true;
        }
        // A fixed hash of (step, call): the same calls on every run.
        let mut h = (step as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ call as u64;
        h ^= h >> 31;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 29;
        ((h >> 11) as f64 / (1u64 << 53) as f64) < c.fraction
    }

    /// The fault for this call's `result`, if one is set.
    pub(crate) fn fault(&self, op: &str, step: usize, call: usize) -> Option<Fault> {
        let s = self.state.borrow();
        let f = s.config.fault.as_ref()?;
        (f.op == op && f.step == step && f.call == call).then(|| f.clone())
    }

    /// Records `check`; `write` makes the replay file of a site's first
    /// failure (called only then, and only with a `replay_dir`). Errors
    /// with `ShadowMismatch` past tolerance under `halt`.
    pub(crate) fn record(
        &self,
        check: Check,
        write: &dyn Fn(&std::path::Path) -> Result<PathBuf>,
    ) -> Result<()> {
        let key = (check.op, check.site.clone());
        let mut replay_dir = None;
        let halt = {
            let mut s = self.state.borrow_mut();
            if !s.sites.contains_key(&key) {
                s.order.push(key.clone());
            }
            let dir = s.config.replay_dir.clone();
            let halt = s.config.halt;
            let site = s.sites.entry(key).or_insert_with(|| SiteReport {
                op: check.op,
                site: check.site.clone(),
                calls: 0,
                worst_output: None,
                worst_grad: None,
                failures: 0,
                history: Vec::new(),
                replay: None,
            });
            if check.result == "y" {
                site.calls += 1;
            }
            let ratio = check.diff / check.tol;
            match site.history.last_mut() {
                Some((step, r)) if *step == check.step => *r = nan_max(*r, ratio),
                _ => site.history.push((check.step, ratio)),
            }
            let slot = if check.result == "y" {
                &mut site.worst_output
            } else {
                &mut site.worst_grad
            };
            if worse(&check, slot) {
                *slot = Some(check.clone());
            }
            if !check.passed() {
                site.failures += 1;
                if site.failures == 1 {
                    replay_dir = dir;
                }
            }
            halt
        };
        if let Some(dir) = replay_dir {
            let path = write(&dir)?;
            let mut s = self.state.borrow_mut();
            if let Some(site) = s.sites.get_mut(&(check.op, check.site.clone())) {
                site.replay = Some(path);
            }
        }
        // The observer runs outside the borrow, so it may read the shadow.
        let obs = self.state.borrow_mut().observer.take();
        if let Some(mut f) = obs {
            f(&check);
            let mut s = self.state.borrow_mut();
            if s.observer.is_none() {
                s.observer = Some(f);
            }
        }
        if halt && !check.passed() {
            return Err(Error::ShadowMismatch {
                op: check.op,
                site: check.site,
                result: check.result,
                diff: check.diff,
                tol: check.tol,
            });
        }
        Ok(())
    }
}

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests;
