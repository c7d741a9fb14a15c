//! Small, seeded training runs: synthetic data sets and the loops that fit
//! them. The examples and the `fusegrad` report call these.
//!
//! - [`train_spirals`]: classify points of interleaved 2-D spiral arms with
//!   an MLP `2 -> h -> LN -> GELU -> h -> LN -> GELU -> classes`,
//!   softmax cross-entropy, full-batch Adam.
//! - [`compare_spirals`]: the same run twice, with the fused LayerNorm and
//!   with its composed twin, step by step.
//! - [`train_regression`]: fit a smooth function of 4 inputs with an MLP
//!   using RMSNorm, mean squared error, Adam.

use crate::char_lm::Dp;
use crate::checkpoint::Persist;
use fusegrad::dist::shard;
use fusegrad::dtype::Element;
use fusegrad::error::{Error, Result};
use fusegrad::nn::{
    Adam, AdamConfig, Mlp, MlpConfig, Module, Norm, NormImpl, Optimizer, Parameters,
};
use fusegrad::nn::{Observer, Silent, Step};
use fusegrad::ops;
use fusegrad::probes::checked_numel;
use fusegrad::rng::Rng;
use fusegrad::tape::Tape;
use fusegrad::tensor::Tensor;
use std::collections::BTreeMap;
use std::time::Instant;

/// A labelled data set: `x` of shape `[n, features]`, one class per row.
#[derive(Debug, Clone)]
pub struct Classification<T: Element> {
    /// Inputs `[n, features]`.
    pub x: Tensor<T>,
    /// Class of each row.
    pub labels: Vec<usize>,
}

/// `classes` spiral arms of `per_class` points each in the plane. Point `i`
/// of arm `k` sits at radius `r = (i + 1) / per_class` and angle
/// `2 pi k / classes + 7 r + noise * N(0, 1)` (radians): each arm turns
/// about 400 degrees, so the arms interleave and no linear boundary
/// separates them.
pub fn spirals<T: Element>(
    classes: usize,
    per_class: usize,
    noise: f64,
    seed: u64,
) -> Result<Classification<T>> {
    if classes < 2 || per_class == 0 {
        return Err(Error::InvalidArgument {
            op: "spirals",
            msg: format!("need >= 2 classes and >= 1 point each, got {classes} x {per_class}"),
        });
    }
    let n = classes
        .checked_mul(per_class)
        .filter(|n| n.checked_mul(2 * std::mem::size_of::<T>()).is_some())
        .ok_or_else(|| Error::ShapeTooLarge {
            op: "spirals",
            shape: vec![classes, per_class, 2],
        })?;
    let mut rng = Rng::new(seed);
    let mut x = Vec::with_capacity(2 * n);
    let mut labels = Vec::with_capacity(n);
    for k in 0..classes {
        for i in 0..per_class {
            let r = (i + 1) as f64 / per_class as f64;
            let a =
                std::f64::consts::TAU * k as f64 / classes as f64 + 7.0 * r + noise * rng.normal();
            x.push(T::from_f64(r * a.cos()));
            x.push(T::from_f64(r * a.sin()));
            labels.push(k);
        }
    }
    Ok(Classification {
        x: Tensor::from_vec(vec![n, 2], x)?,
        labels,
    })
}

/// Settings of a spiral-classification run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpiralConfig {
    /// Number of arms (classes).
    pub classes: usize,
    /// Training points per arm.
    pub per_class: usize,
    /// Angular noise (radians, standard deviation).
    pub noise: f64,
    /// Width of the two hidden layers.
    pub hidden: usize,
    /// Full-batch Adam steps.
    pub steps: usize,
    /// Adam learning rate.
    pub lr: f64,
    /// Seed of the data, the held-out data (`seed + 1`) and the init.
    pub seed: u64,
    /// LayerNorm implementation.
    pub norm_impl: NormImpl,
}

impl Default for SpiralConfig {
    /// 3 arms of 100 points, noise 0.2, width 32, 300 steps, lr 0.01.
    fn default() -> Self {
        SpiralConfig {
            classes: 3,
            per_class: 100,
            noise: 0.2,
            hidden: 32,
            steps: 300,
            lr: 0.01,
            seed: 42,
            norm_impl: NormImpl::Fused,
        }
    }
}

/// What a training run did.
#[derive(Debug, Clone)]
pub struct TrainReport {
    /// Training loss at each step, before that step's update.
    pub losses: Vec<f64>,
    /// Training loss after the last update.
    pub final_loss: f64,
    /// Classification: fraction of training points classified right.
    pub train_accuracy: Option<f64>,
    /// Classification: the same on held-out points from another seed.
    pub test_accuracy: Option<f64>,
    /// Regression: coefficient of determination on held-out points.
    pub test_r2: Option<f64>,
    /// Number of scalar parameters.
    pub params: usize,
    /// Wall time of the training loop, seconds.
    pub seconds: f64,
}

impl TrainReport {
    /// First recorded loss divided by the final loss.
    pub fn reduction(&self) -> f64 {
        self.losses
            .first()
            .map_or(f64::NAN, |l0| l0 / self.final_loss)
    }
}

/// Fraction of rows whose largest logit is at the label.
pub fn accuracy<T: Element>(logits: &Tensor<T>, labels: &[usize]) -> Result<f64> {
    let &[n, c] = logits.shape() else {
        return Err(Error::InvalidArgument {
            op: "accuracy",
            msg: format!("logits must be [n, c], got {:?}", logits.shape()),
        });
    };
    if n != labels.len() || c == 0 {
        return Err(Error::InvalidArgument {
            op: "accuracy",
            msg: format!("{} labels for logits {:?}", labels.len(), logits.shape()),
        });
    }
    let v = logits.as_slice()?;
    let right = v
        .chunks_exact(c)
        .zip(labels)
        .filter(|(row, &y)| {
            let best = row
                .iter()
                .enumerate()
                .fold((0, f64::NEG_INFINITY), |(bi, bv), (i, x)| {
                    let x = x.to_f64();
                    if x > bv {
                        (i, x)
                    } else {
                        (bi, bv)
                    }
                });
            best.0 == y
        })
        .count();
    Ok(right as f64 / n.max(1) as f64)
}

/// The network of the spiral demo.
pub fn spiral_model<T: Element>(config: &SpiralConfig) -> Result<Mlp<T>> {
    let mut rng = Rng::new(config.seed.wrapping_add(1000));
    let h = config.hidden;
    let mlp_config = MlpConfig {
        norm: Norm::LayerNorm,
        norm_impl: config.norm_impl,
        ..MlpConfig::default()
    };
    Mlp::new(&[2, h, h, config.classes], &mlp_config, &mut rng)
}

/// Trains the spiral classifier of `config` in precision `T`.
pub fn train_spirals_with<T: Element>(config: &SpiralConfig) -> Result<TrainReport> {
    train_spirals_observed::<T>(config, &mut Silent)
}

/// [`train_spirals_with`] telling `obs` of every step (loss, samples so
/// far); pass a [`crate::progress::Bar`] for a progress bar.
pub fn train_spirals_observed<T: Element>(
    config: &SpiralConfig,
    obs: &mut dyn Observer,
) -> Result<TrainReport> {
    train_spirals_persisted::<T>(config, obs, &Persist::none())
}

/// The settings a resumed spirals run must share with its checkpoint: the
/// data, the network and the optimizer (not the step count: Adam's rate is
/// constant, so a run may be extended).
pub fn spirals_checkpoint_config(config: &SpiralConfig) -> BTreeMap<String, String> {
    let c = config;
    [
        ("model", "spirals".to_string()),
        ("classes", c.classes.to_string()),
        ("per_class", c.per_class.to_string()),
        ("noise", format!("{:?}", c.noise)),
        ("hidden", c.hidden.to_string()),
        ("lr", format!("{:?}", c.lr)),
        ("seed", c.seed.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// [`train_spirals_observed`] with checkpoints: resumed from and saved to
/// where `persist` says; `losses` in the report are the whole run's.
pub fn train_spirals_persisted<T: Element>(
    config: &SpiralConfig,
    obs: &mut dyn Observer,
    persist: &Persist,
) -> Result<TrainReport> {
    train_spirals_parallel::<T>(config, obs, persist, None)
}

/// [`train_spirals_persisted`] as one rank of `dp`: each rank takes its
/// rank-strided share of the points, its loss weighted by its share's size
/// so that the averaged gradient is the full batch's whatever the world
/// size; only rank 0 saves. A world of one trains exactly as `dp` = `None`.
pub fn train_spirals_parallel<T: Element>(
    config: &SpiralConfig,
    obs: &mut dyn Observer,
    persist: &Persist,
    mut dp: Option<&mut Dp>,
) -> Result<TrainReport> {
    let (rank, world) = dp.as_ref().map_or((0, 1), |d| (d.rank(), d.world()));
    let train = spirals::<T>(config.classes, config.per_class, config.noise, config.seed)?;
    let test = spirals::<T>(
        config.classes,
        config.per_class,
        config.noise,
        config.seed.wrapping_add(1),
    )?;
    let mut model = spiral_model::<T>(config)?;
    let mut opt = Adam::new(AdamConfig {
        lr: config.lr,
        ..AdamConfig::default()
    })?;
    let mut settings = spirals_checkpoint_config(config);
    if world > 1 {
        // Each rank's sum runs in another order than one process's.
        settings.insert("ranks".into(), world.to_string());
    }
    let mut state = persist.start(&mut model, &mut opt, &settings)?;
    if let Some(d) = dp.as_deref_mut() {
        d.sync_params(&mut model.params_mut())?;
    }
    let n = train.labels.len();
    let mine = if world > 1 {
        let features = train.x.shape()[1];
        let labels = shard(&train.labels, 1, rank, world);
        let x = shard(&train.x.to_vec()?, features, rank, world);
        let x = Tensor::from_vec(vec![labels.len(), features], x)?.to_device(train.x.device())?;
        Classification { x, labels }
    } else {
        train.clone()
    };
    // Mean over the shard times this: the world's average is the full mean.
    let weight = (mine.labels.len() * world) as f64 / n.max(1) as f64;
    let start = Instant::now();
    for step in state.step as usize + 1..=config.steps {
        let tape = Tape::new();
        if let Some(s) = obs.shadow() {
            s.watch(&tape, step);
        }
        let p = model.bind(&tape);
        let logits = model.forward(&p, &tape.constant(mine.x.clone()))?;
        let mut loss = ops::cross_entropy(&logits, &mine.labels)?;
        if weight != 1.0 {
            loss = ops::scalar_mul(&loss, weight)?;
        }
        let mut value = scalar(loss.value())?;
        match dp.as_deref_mut() {
            Some(d) => {
                let grads = d.backward(&loss, &p)?;
                value = d.mean(&[value])?[0];
                opt.update(&mut model.params_mut(), &grads)?;
            }
            None => opt.step(&mut model, &p, &loss.backward()?)?,
        }
        state.losses.push(value);
        state.step = step as u64;
        state.data_position = (step * n) as u64;
        obs.on_step(&Step {
            step,
            steps: config.steps,
            loss: value,
            items: step * n,
            seconds: start.elapsed().as_secs_f64(),
        });
        if rank == 0 {
            persist.step(&model, &opt, &state)?;
        }
    }
    if rank == 0 {
        persist.finish(&model, &opt, &state)?;
    }
    let losses = state.losses;
    let seconds = start.elapsed().as_secs_f64();
    let final_logits = model.predict(&train.x)?;
    let tape = Tape::new();
    let final_loss =
        scalar(ops::cross_entropy(&tape.constant(final_logits.clone()), &train.labels)?.value())?;
    Ok(TrainReport {
        losses,
        final_loss,
        train_accuracy: Some(accuracy(&final_logits, &train.labels)?),
        test_accuracy: Some(accuracy(&model.predict(&test.x)?, &test.labels)?),
        test_r2: None,
        params: model.num_params(),
        seconds,
    })
}

/// The spiral demo in f32 with default settings, `steps` Adam steps, the
/// fused LayerNorm (`fused`) or its composed twin.
pub fn train_spirals(steps: usize, fused: bool) -> Result<TrainReport> {
    train_spirals_with::<f32>(&SpiralConfig {
        steps,
        norm_impl: if fused {
            NormImpl::Fused
        } else {
            NormImpl::Composed
        },
        ..SpiralConfig::default()
    })
}

/// The same training run with the fused and the composed LayerNorm.
#[derive(Debug, Clone)]
pub struct Agreement {
    /// The run with the fused op.
    pub fused: TrainReport,
    /// The run with the composed twin.
    pub composed: TrainReport,
    /// `max_t |loss_fused(t) - loss_composed(t)|` over all steps and the
    /// final loss.
    pub max_abs_diff: f64,
    /// The same divided by the loss at that step, maximised.
    pub max_rel_diff: f64,
}

/// Runs `config` with both LayerNorm implementations (in precision `T`) and
/// compares the loss curves step by step.
pub fn compare_spirals_with<T: Element>(config: &SpiralConfig) -> Result<Agreement> {
    let run = |imp| {
        train_spirals_with::<T>(&SpiralConfig {
            norm_impl: imp,
            ..*config
        })
    };
    Ok(Agreement::of(
        run(NormImpl::Fused)?,
        run(NormImpl::Composed)?,
    ))
}

impl Agreement {
    /// Compares two runs of the same settings step by step (and at the
    /// final loss); a NaN on either side counts as an infinite difference.
    pub fn of(fused: TrainReport, composed: TrainReport) -> Agreement {
        let pairs = fused
            .losses
            .iter()
            .chain([&fused.final_loss])
            .zip(composed.losses.iter().chain([&composed.final_loss]));
        let (mut max_abs_diff, mut max_rel_diff) = (0.0f64, 0.0f64);
        for (a, b) in pairs {
            let d = (a - b).abs();
            // NaN is a disagreement, not a zero.
            let d = if d.is_nan() { f64::INFINITY } else { d };
            max_abs_diff = max_abs_diff.max(d);
            max_rel_diff = max_rel_diff.max(d / b.abs().max(f64::MIN_POSITIVE));
        }
        Agreement {
            fused,
            composed,
            max_abs_diff,
            max_rel_diff,
        }
    }
}

/// [`compare_spirals_with`] in f32 with default settings and `steps` steps.
pub fn compare_spirals(steps: usize) -> Result<Agreement> {
    compare_spirals_with::<f32>(&SpiralConfig {
        steps,
        ..SpiralConfig::default()
    })
}

/// Settings of the regression demo.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RegressionConfig {
    /// Training points (inputs uniform in `[-1, 1)^4`).
    pub n: usize,
    /// Width of the two hidden layers.
    pub hidden: usize,
    /// Full-batch Adam steps.
    pub steps: usize,
    /// Adam learning rate.
    pub lr: f64,
    /// Seed of the data, the held-out data (`seed + 1`) and the init.
    pub seed: u64,
    /// RMSNorm implementation.
    pub norm_impl: NormImpl,
}

impl Default for RegressionConfig {
    /// 512 points, width 32, 300 steps, lr 0.005.
    fn default() -> Self {
        RegressionConfig {
            n: 512,
            hidden: 32,
            steps: 300,
            lr: 0.005,
            seed: 7,
            norm_impl: NormImpl::Fused,
        }
    }
}

/// The regression target: `sin(3 x0) cos(2 x1) + 0.5 x2 x3 + 0.3 x0`.
pub fn regression_target(x: &[f64]) -> f64 {
    match x {
        [a, b, c, d] => (3.0 * a).sin() * (2.0 * b).cos() + 0.5 * c * d + 0.3 * a,
        _ => f64::NAN,
    }
}

fn regression_data<T: Element>(n: usize, seed: u64) -> Result<(Tensor<T>, Tensor<T>)> {
    checked_numel("train_regression", &[n, 4], std::mem::size_of::<f64>())?;
    let mut rng = Rng::new(seed);
    let x: Vec<f64> = rng.vec(4 * n);
    let y: Vec<f64> = x.chunks_exact(4).map(regression_target).collect();
    let cast = |v: Vec<f64>| v.into_iter().map(T::from_f64).collect();
    Ok((
        Tensor::from_vec(vec![n, 4], cast(x))?,
        Tensor::from_vec(vec![n, 1], cast(y))?,
    ))
}

/// Fits [`regression_target`] with an MLP `4 -> h -> RMSNorm -> GELU -> h
/// -> RMSNorm -> GELU -> 1` and mean squared error; reports held-out R^2.
pub fn train_regression<T: Element>(config: &RegressionConfig) -> Result<TrainReport> {
    if config.n == 0 {
        return Err(Error::InvalidArgument {
            op: "train_regression",
            msg: "need at least one training point".into(),
        });
    }
    let (x, y) = regression_data::<T>(config.n, config.seed)?;
    let (xt, yt) = regression_data::<T>(config.n, config.seed.wrapping_add(1))?;
    let mut rng = Rng::new(config.seed.wrapping_add(1000));
    let h = config.hidden;
    let mlp_config = MlpConfig {
        norm: Norm::RmsNorm,
        norm_impl: config.norm_impl,
        ..MlpConfig::default()
    };
    let mut model = Mlp::<T>::new(&[4, h, h, 1], &mlp_config, &mut rng)?;
    let mut opt = Adam::new(AdamConfig {
        lr: config.lr,
        ..AdamConfig::default()
    })?;
    let start = Instant::now();
    let mut losses = Vec::with_capacity(config.steps);
    for _ in 0..config.steps {
        let tape = Tape::new();
        let p = model.bind(&tape);
        let pred = model.forward(&p, &tape.constant(x.clone()))?;
        let loss = ops::mse(&pred, &tape.constant(y.clone()))?;
        losses.push(scalar(loss.value())?);
        let grads = loss.backward()?;
        opt.step(&mut model, &p, &grads)?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let mse = |pred: &Tensor<T>, want: &Tensor<T>| -> Result<f64> {
        let (p, w) = (pred.to_f64_vec()?, want.to_f64_vec()?);
        Ok(p.iter()
            .zip(&w)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f64>()
            / w.len().max(1) as f64)
    };
    let final_loss = mse(&model.predict(&x)?, &y)?;
    let wt = yt.to_f64_vec()?;
    let mean = wt.iter().sum::<f64>() / wt.len().max(1) as f64;
    let var = wt.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / wt.len().max(1) as f64;
    let test_r2 = 1.0 - mse(&model.predict(&xt)?, &yt)? / var;
    Ok(TrainReport {
        losses,
        final_loss,
        train_accuracy: None,
        test_accuracy: None,
        test_r2: Some(test_r2),
        params: model.num_params(),
        seconds,
    })
}

fn scalar<T: Element>(t: &Tensor<T>) -> Result<f64> {
    t.as_slice()?
        .first()
        .map(|v| v.to_f64())
        .ok_or_else(|| Error::InvalidArgument {
            op: "scalar",
            msg: format!("empty tensor of shape {:?}", t.shape()),
        })
}
