//! Checkpointing for the training loops of `fusegrad train`: resume from
//! a checkpoint, save every few steps and at the end, keep the newest few.
//! The loops call [`Persist::start`] once, [`Persist::step`] after each
//! step and [`Persist::finish`] at the end; [`Persist::none`] does nothing.

use fusegrad::dtype::Element;
use fusegrad::error::{Error, Result};
use fusegrad::nn::{load_checkpoint, Checkpoints, Optimizer, Parameters, TrainState};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where a run's checkpoints come from and go to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Persist {
    /// Save here (`--checkpoint DIR`, `--keep K`); `None` saves nothing.
    pub to: Option<Checkpoints>,
    /// Save after every this many steps, and always at the end.
    pub every: Option<usize>,
    /// Start from this checkpoint (`--resume`): a `step-N` folder, or a
    /// checkpoints folder whose newest is taken.
    pub from: Option<PathBuf>,
    /// The step of the last save, so the end does not save it twice.
    saved: Cell<Option<u64>>,
}

impl Persist {
    /// No checkpoints: the run starts fresh and saves none.
    pub fn none() -> Self {
        Persist::default()
    }

    /// Saves to `to` every `every` steps and at the end; resumes from `from`.
    pub fn new(to: Option<Checkpoints>, every: Option<usize>, from: Option<PathBuf>) -> Self {
        Persist {
            to,
            every,
            from,
            saved: Cell::new(None),
        }
    }

    /// The state to start from, with `config` as its settings: fresh, or
    /// loaded from [`Persist::from`] into `model` and `opt`. Errors, before
    /// any step, if the save folder holds checkpoints a save would clash
    /// with: any at all for a fresh run, or newer ones than the resumed.
    pub fn start<T, M, O>(
        &self,
        model: &mut M,
        opt: &mut O,
        config: &BTreeMap<String, String>,
    ) -> Result<TrainState>
    where
        T: Element,
        M: Parameters<T> + ?Sized,
        O: Optimizer<T> + ?Sized,
    {
        let state = match &self.from {
            Some(from) => {
                let s = load_checkpoint(from, model, opt, config)?;
                println!("resumed from {} at step {}", from.display(), s.step);
                s
            }
            None => TrainState {
                config: config.clone(),
                ..TrainState::new()
            },
        };
        if let Some(to) = &self.to {
            if let Some((step, newest)) = to.list()?.pop() {
                let clash = self.from.is_none() || step > state.step;
                if clash {
                    return Err(Error::Checkpoint {
                        path: to.dir().display().to_string(),
                        msg: format!(
                            "already holds {} (step {step}), which this run would not continue from; \
                             resume from it with --resume {}, or save to another folder",
                            newest.display(),
                            to.dir().display()
                        ),
                    });
                }
            }
        }
        self.saved.set(self.from.as_ref().map(|_| state.step));
        Ok(state)
    }

    /// Saves after `state.step` steps if that is a multiple of
    /// [`Persist::every`].
    pub fn step<T, M, O>(&self, model: &M, opt: &O, state: &TrainState) -> Result<()>
    where
        T: Element,
        M: Parameters<T> + ?Sized,
        O: Optimizer<T> + ?Sized,
    {
        match self.every {
            Some(e) if e > 0 && state.step.is_multiple_of(e as u64) => self.save(model, opt, state),
            _ => Ok(()),
        }
    }

    /// Saves the final state unless it was just saved (or nothing is saved).
    pub fn finish<T, M, O>(&self, model: &M, opt: &O, state: &TrainState) -> Result<()>
    where
        T: Element,
        M: Parameters<T> + ?Sized,
        O: Optimizer<T> + ?Sized,
    {
        if self.saved.get() == Some(state.step) {
            return Ok(());
        }
        self.save(model, opt, state)
    }

    fn save<T, M, O>(&self, model: &M, opt: &O, state: &TrainState) -> Result<()>
    where
        T: Element,
        M: Parameters<T> + ?Sized,
        O: Optimizer<T> + ?Sized,
    {
        let Some(to) = &self.to else {
            return Ok(());
        };
        let at = to.save(model, opt, state)?;
        self.saved.set(Some(state.step));
        let loss = state.losses.last().copied().unwrap_or(f64::NAN);
        println!(
            "checkpoint: {} (step {}, training loss {loss})",
            at.display(),
            state.step
        );
        Ok(())
    }
}

/// The checkpoints folder a resumed checkpoint `from` belongs to: `from`
/// itself, or its parent when `from` is one `step-N` folder.
pub fn home_of(from: &Path) -> PathBuf {
    let is_step = from
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("step-"))
        && from.join("state.json").exists();
    match (is_step, from.parent()) {
        (true, Some(p)) => p.to_path_buf(),
        _ => from.to_path_buf(),
    }
}
