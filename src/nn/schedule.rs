//! Learning-rate schedules.

use crate::error::{Error, Result};

/// Linear warmup from 0 to `peak` over `warmup` steps, then a cosine decay
/// to `min` at step `total`, flat at `min` after it (as nanoGPT's and
/// Hugging Face's `get_cosine_schedule_with_warmup` with a floor):
///
/// `lr(s) = peak (s + 1) / warmup` for `s < warmup`;
/// `lr(s) = min + (peak - min) (1 + cos(pi q)) / 2`, `q = (s - warmup) /
/// (total - warmup)`, up to `total`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupCosine {
    peak: f64,
    min: f64,
    warmup: u64,
    total: u64,
}

impl WarmupCosine {
    /// A schedule. Errors (`InvalidArgument`) unless `0 <= min <= peak`,
    /// both finite, and `warmup <= total`, `total > 0`.
    pub fn new(peak: f64, min: f64, warmup: u64, total: u64) -> Result<Self> {
        let bad = |msg: String| {
            Err(Error::InvalidArgument {
                op: "WarmupCosine",
                msg,
            })
        };
        if !(peak.is_finite() && min.is_finite() && 0.0 <= min && min <= peak) {
            return bad(format!(
                "need finite 0 <= min <= peak, got min {min}, peak {peak}"
            ));
        }
        if total == 0 || warmup > total {
            return bad(format!(
                "need 0 < total and warmup <= total, got warmup {warmup}, total {total}"
            ));
        }
        Ok(WarmupCosine {
            peak,
            min,
            warmup,
            total,
        })
    }

    /// The learning rate for step `s` (from 0).
    pub fn lr(&self, s: u64) -> f64 {
        if s < self.warmup {
            return self.peak * (s + 1) as f64 / self.warmup as f64;
        }
        if s >= self.total {
            return self.min;
        }
        let q = (s - self.warmup) as f64 / (self.total - self.warmup).max(1) as f64;
        self.min + (self.peak - self.min) * 0.5 * (1.0 + (std::f64::consts::PI * q).cos())
    }
}

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    // The tests, run by `tests/unit.rs`.
    unit_tests![warms_up_linearly_then_decays_to_the_floor];

    fn warms_up_linearly_then_decays_to_the_floor() {
        let s = WarmupCosine::new(1e-3, 1e-4, 10, 110).unwrap();
        assert!((s.lr(0) - 1e-4).abs() < 1e-18);
        assert!((s.lr(9) - 1e-3).abs() < 1e-18);
        assert!((s.lr(10) - 1e-3).abs() < 1e-15);
        // Half way through the decay: the mean of peak and floor.
        assert!((s.lr(60) - 5.5e-4).abs() < 1e-15);
        assert!((s.lr(110) - 1e-4).abs() < 1e-18);
        assert!((s.lr(10_000) - 1e-4).abs() < 1e-18);
        for k in 10..110 {
            assert!(s.lr(k + 1) <= s.lr(k), "not decreasing at {k}");
        }
        assert!(WarmupCosine::new(1e-3, 2e-3, 0, 10).is_err());
        assert!(WarmupCosine::new(1e-3, 0.0, 11, 10).is_err());
        assert!(WarmupCosine::new(f64::NAN, 0.0, 1, 10).is_err());
    }
}
