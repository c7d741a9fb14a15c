//! The terminal progress bar the `train` commands draw: an [`Observer`]
//! that shows step, loss and items per second.

use fusegrad::nn::{EvalPoint, Observer, Step};
use indicatif::{ProgressBar, ProgressStyle};

/// A terminal progress bar (`indicatif`) with step, loss and items per
/// second, on standard error. Validation points print as plain lines on
/// standard output.
///
/// When standard error is not a terminal the bar hides itself; the lines
/// are still printed (through `suspend`, which runs whether or not the bar
/// is drawn, unlike `ProgressBar::println`).
pub struct Bar {
    bar: ProgressBar,
    unit: &'static str,
}

impl Bar {
    /// A bar for `steps` steps counting `unit`s ("tok", "samples").
    pub fn new(steps: usize, unit: &'static str) -> Bar {
        let bar = ProgressBar::new(steps as u64);
        // The template is a constant: if indicatif ever rejects it, the
        // default style still shows the count.
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} step {pos:>5}/{len} [{bar:28}] {msg} ({elapsed}, eta {eta})",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        Bar { bar, unit }
    }

    /// A bar that is never drawn; [`Bar::line`] and validation points
    /// still print. For tests and runs that want only the figures.
    pub fn quiet(unit: &'static str) -> Bar {
        Bar {
            bar: ProgressBar::hidden(),
            unit,
        }
    }

    /// Prints `line` on standard output without tearing the bar.
    pub fn line(&self, line: &str) {
        self.bar.suspend(|| println!("{line}"));
    }

    /// Removes the bar, so that what follows prints as plain lines.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Observer for Bar {
    fn on_step(&mut self, s: &Step) {
        self.bar.set_length(s.steps as u64);
        self.bar.set_position(s.step as u64);
        self.bar.set_message(format!(
            "loss {:.4}  {:.0} {}/s",
            s.loss,
            s.rate(),
            self.unit
        ));
    }

    fn on_eval(&mut self, e: &EvalPoint) {
        self.line(&format!(
            "{:>6} {:>9.1} {:>14.4}",
            e.step, e.seconds, e.val_bits
        ));
    }
}

impl Drop for Bar {
    /// A bar dropped on an error path is cleared too, so the error message
    /// starts on a clean line.
    fn drop(&mut self) {
        if !self.bar.is_finished() {
            self.bar.finish_and_clear();
        }
    }
}
