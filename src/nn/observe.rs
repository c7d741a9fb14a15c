//! Watching a training loop: an [`Observer`] sees every step and every
//! validation point. A loop takes one and calls nothing else, so what is
//! drawn (a progress bar, a log, nothing) is the caller's choice.

/// One finished training step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// Steps taken so far (1 after the first).
    pub step: usize,
    /// Steps planned (a time limit may stop the run earlier).
    pub steps: usize,
    /// This step's training loss.
    pub loss: f64,
    /// Items (tokens, samples) seen so far.
    pub items: usize,
    /// Seconds since training started.
    pub seconds: f64,
}

impl Step {
    /// Items per second so far (0 before any time has passed).
    pub fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.items as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Told about a training run as it goes; both methods do nothing unless
/// overridden.
pub trait Observer {
    /// After each step.
    fn on_step(&mut self, _step: &Step) {}
    /// After each validation (language models).
    fn on_eval(&mut self, _eval: &EvalPoint) {}
    /// The shadow check to watch each step's tape with, if any (see
    /// [`crate::shadow`]).
    fn shadow(&self) -> Option<&crate::Shadow> {
        None
    }
}

/// Sees nothing: what a caller passes for a quiet run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Observer for Silent {}

/// One validation point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalPoint {
    /// Steps taken.
    pub step: usize,
    /// Validation cross-entropy in bits per item (per character for a
    /// character model).
    pub val_bits: f64,
    /// Seconds since training started.
    pub seconds: f64,
}
