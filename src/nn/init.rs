//! Deterministic parameter initialisation from a seeded [`Rng`].

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::layout::checked_numel;
use crate::rng::Rng;
use crate::tensor::Tensor;

/// How to fill a parameter tensor. The fan-based schemes use the fans the
/// caller passes (for [`crate::nn::Linear`]: `fan_in = in`, `fan_out = out`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
    /// Every element `c`.
    Constant(f64),
    /// Uniform in `[lo, hi)`.
    Uniform {
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
    },
    /// Normal with this mean and standard deviation.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
    /// Kaiming (He) uniform: `U(-a, a)` with `a = gain * sqrt(3 / fan_in)`,
    /// so the variance is `gain^2 / fan_in` (gain `sqrt(2)` for ReLU-like
    /// activations keeps the forward variance constant).
    KaimingUniform {
        /// Gain.
        gain: f64,
    },
    /// Xavier (Glorot) uniform: `U(-a, a)` with
    /// `a = gain * sqrt(6 / (fan_in + fan_out))`, variance
    /// `2 gain^2 / (fan_in + fan_out)`.
    XavierUniform {
        /// Gain.
        gain: f64,
    },
}

impl Init {
    /// Kaiming uniform with the ReLU gain `sqrt(2)`.
    pub fn kaiming_relu() -> Self {
        Init::KaimingUniform {
            gain: std::f64::consts::SQRT_2,
        }
    }

    /// Xavier uniform with gain 1.
    pub fn xavier() -> Self {
        Init::XavierUniform { gain: 1.0 }
    }

    /// A tensor of `shape` filled by this scheme, drawing from `rng` in
    /// row-major order (so a seed fixes the values).
    ///
    /// Errors (`InvalidArgument`): a non-finite parameter, `lo > hi`, a
    /// negative std, or a fan-based scheme with a zero fan sum.
    pub fn tensor<T: Element>(
        &self,
        shape: &[usize],
        fan_in: usize,
        fan_out: usize,
        rng: &mut Rng,
    ) -> Result<Tensor<T>> {
        let bad = |msg: String| Error::InvalidArgument { op: "Init", msg };
        let n = checked_numel("Init", shape, std::mem::size_of::<T>())?;
        let fill = |v: f64| Tensor::full(shape, T::from_f64(v));
        let uniform = |a: f64, rng: &mut Rng| -> Result<Tensor<T>> {
            let data = (0..n).map(|_| T::from_f64(rng.range(-a, a))).collect();
            Tensor::from_vec(shape.to_vec(), data)
        };
        let finite = |name: &str, v: f64| {
            if v.is_finite() {
                Ok(v)
            } else {
                Err(bad(format!("{name} must be finite, got {v}")))
            }
        };
        match *self {
            Init::Zeros => fill(0.0),
            Init::Ones => fill(1.0),
            Init::Constant(c) => fill(finite("constant", c)?),
            Init::Uniform { lo, hi } => {
                let (lo, hi) = (finite("lo", lo)?, finite("hi", hi)?);
                if lo > hi {
                    return Err(bad(format!("uniform bounds lo {lo} > hi {hi}")));
                }
                let data = (0..n).map(|_| T::from_f64(rng.range(lo, hi))).collect();
                Tensor::from_vec(shape.to_vec(), data)
            }
            Init::Normal { mean, std } => {
                let (mean, std) = (finite("mean", mean)?, finite("std", std)?);
                if std < 0.0 {
                    return Err(bad(format!("std must be >= 0, got {std}")));
                }
                let data = (0..n)
                    .map(|_| T::from_f64(mean + std * rng.normal()))
                    .collect();
                Tensor::from_vec(shape.to_vec(), data)
            }
            Init::KaimingUniform { gain } => {
                let gain = finite("gain", gain)?;
                if fan_in == 0 {
                    return Err(bad(format!(
                        "Kaiming init of shape {shape:?} with fan_in 0"
                    )));
                }
                uniform(gain.abs() * (3.0 / fan_in as f64).sqrt(), rng)
            }
            Init::XavierUniform { gain } => {
                let gain = finite("gain", gain)?;
                let fans = fan_in as f64 + fan_out as f64;
                if fans == 0.0 {
                    return Err(bad(format!(
                        "Xavier init of shape {shape:?} with fans 0 + 0"
                    )));
                }
                uniform(gain.abs() * (6.0 / fans).sqrt(), rng)
            }
        }
    }
}
