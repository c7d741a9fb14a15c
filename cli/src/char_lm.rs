//! A character-level language model on a text: the data, the two
//! baselines a model must beat (unigram entropy, a smoothed bigram) and a
//! seeded training loop for [`Gpt`]. `examples/tiny_transformer.rs` runs it
//! at full size; the tests run it small.

use crate::checkpoint::Persist;
use fusegrad::dist::{shard, Collective, DataParallel};
use fusegrad::dtype::{Accum, Element};
use fusegrad::error::{Error, Result};
use fusegrad::nn::{AdamW, Gpt, GptConfig, NormImpl, Optimizer, Parameters, WarmupCosine};
use fusegrad::nn::{EvalPoint, Observer, Step};
use fusegrad::rng::Rng;
use fusegrad::tape::Tape;
use fusegrad::tensor::Tensor;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A text as token ids over its own alphabet, split 90/10 into training
/// and validation parts.
#[derive(Debug, Clone)]
pub struct CharData {
    /// The alphabet: token `i` is `chars[i]`.
    pub chars: Vec<char>,
    /// Training tokens.
    pub train: Vec<usize>,
    /// Validation tokens.
    pub val: Vec<usize>,
}

impl CharData {
    /// The text's alphabet and its split. Errors for texts too short to
    /// hold a validation window of `context + 1` characters.
    pub fn new(text: &str, context: usize) -> Result<Self> {
        let chars: Vec<char> = {
            let mut c: Vec<char> = text.chars().collect();
            c.sort_unstable();
            c.dedup();
            c
        };
        let index: BTreeMap<char, usize> = chars.iter().enumerate().map(|(i, &c)| (c, i)).collect();
        let ids: Vec<usize> = text.chars().map(|c| index[&c]).collect();
        let cut = ids.len() * 9 / 10;
        if ids.len() - cut <= context + 1 || cut <= context + 1 {
            return Err(Error::InvalidArgument {
                op: "CharData",
                msg: format!(
                    "a text of {} characters is too short for context {context}",
                    ids.len()
                ),
            });
        }
        Ok(CharData {
            chars,
            val: ids[cut..].to_vec(),
            train: ids[..cut].to_vec(),
        })
    }

    /// Alphabet size.
    pub fn vocab(&self) -> usize {
        self.chars.len()
    }

    /// Entropy of the training part's character frequencies, in bits per
    /// character: the loss of a model that ignores all context.
    pub fn unigram_bits(&self) -> f64 {
        let mut n = vec![0usize; self.vocab()];
        for &t in &self.train {
            n[t] += 1;
        }
        let total = self.train.len() as f64;
        n.iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let p = c as f64 / total;
                -p * p.log2()
            })
            .sum()
    }

    /// Validation cross-entropy, in bits per character, of a bigram model
    /// fitted on the training part with add-one smoothing: the bar for a
    /// model that sees one character back.
    pub fn bigram_bits(&self) -> f64 {
        let v = self.vocab();
        let mut n = vec![1usize; v * v];
        let mut row = vec![v; v];
        for w in self.train.windows(2) {
            n[w[0] * v + w[1]] += 1;
            row[w[0]] += 1;
        }
        let ce: f64 = self
            .val
            .windows(2)
            .map(|w| -(n[w[0] * v + w[1]] as f64 / row[w[0]] as f64).log2())
            .sum();
        ce / (self.val.len() - 1) as f64
    }

    /// `batch` windows of `time` tokens from `src` and their next tokens.
    fn batch(src: &[usize], batch: usize, time: usize, rng: &mut Rng) -> (Vec<usize>, Vec<usize>) {
        let (mut x, mut y) = (
            Vec::with_capacity(batch * time),
            Vec::with_capacity(batch * time),
        );
        for _ in 0..batch {
            let s = rng.below(src.len() - time - 1);
            x.extend_from_slice(&src[s..s + time]);
            y.extend_from_slice(&src[s + 1..s + time + 1]);
        }
        (x, y)
    }
}

/// Data parallelism over whichever engine launched the process.
pub type Dp = DataParallel<Box<dyn Collective>>;

/// Settings of a training run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CharLmConfig {
    /// The model's shape (`vocab` is set from the data).
    pub model: GptConfig,
    /// Sequences per step.
    pub batch: usize,
    /// Steps at most.
    pub steps: usize,
    /// Wall-clock limit; training stops at the first step past it.
    pub time_limit: Duration,
    /// Peak learning rate (AdamW, weight decay 0.01), after a linear
    /// warmup, decayed by a cosine to a tenth of it at `steps`.
    pub lr: f64,
    /// Warmup steps.
    pub warmup: usize,
    /// Global gradient-norm bound.
    pub clip: f64,
    /// Validation every this many steps (and at the end).
    pub eval_every: usize,
    /// Validation batches per evaluation (fixed windows, the same each time).
    pub eval_batches: usize,
    /// Seed of the weights and the batches.
    pub seed: u64,
}

impl Default for CharLmConfig {
    /// 4 layers, 4 heads, width 128, context 64; batch 16; lr 2e-3.
    fn default() -> Self {
        CharLmConfig {
            model: GptConfig {
                vocab: 0,
                context: 64,
                width: 128,
                heads: 4,
                layers: 4,
            },
            batch: 16,
            steps: 2000,
            time_limit: Duration::from_secs(270),
            lr: 2e-3,
            warmup: 50,
            clip: 1.0,
            eval_every: 100,
            eval_batches: 8,
            seed: 0,
        }
    }
}

/// What a run did: the training loss per step (nats), the validation
/// curve and the final model.
#[derive(Debug, Clone)]
pub struct CharLmRun<T: Element = f32> {
    /// Mean training cross-entropy of each step, in nats.
    pub losses: Vec<f64>,
    /// Validation points.
    pub evals: Vec<EvalPoint>,
    /// Training tokens per second.
    pub tokens_per_s: f64,
    /// The trained model.
    pub model: Gpt<T>,
}

/// Builds a model for `data` from `config` and trains it with `imp`
/// LayerNorms; `on_eval` sees each validation point as it is made.
pub fn train_char_lm(
    data: &CharData,
    config: &CharLmConfig,
    imp: NormImpl,
    on_eval: impl FnMut(&EvalPoint),
) -> Result<CharLmRun> {
    train_model(new_model(data, config, imp)?, data, config, on_eval)
}

/// The model [`train_char_lm`] starts from: `config.model` with the data's
/// vocabulary, initialised from `config.seed`, with `imp` LayerNorms.
pub fn new_model<T: Element>(
    data: &CharData,
    config: &CharLmConfig,
    imp: NormImpl,
) -> Result<Gpt<T>> {
    let mut shape = config.model;
    shape.vocab = data.vocab();
    let mut model = Gpt::<T>::new(shape, &mut Rng::new(config.seed))?;
    model.set_norm_impl(imp);
    Ok(model)
}

/// Trains `model` (for example one loaded from a file) on `data`; batches
/// are drawn from `config.seed`. `on_eval` sees each validation point.
pub fn train_model<T: Element>(
    model: Gpt<T>,
    data: &CharData,
    config: &CharLmConfig,
    on_eval: impl FnMut(&EvalPoint),
) -> Result<CharLmRun<T>> {
    train_observed(model, data, config, &mut OnEval(on_eval))
}

/// A closure as an [`Observer`] of validation points only.
struct OnEval<F>(F);

impl<F: FnMut(&EvalPoint)> Observer for OnEval<F> {
    fn on_eval(&mut self, e: &EvalPoint) {
        (self.0)(e)
    }
}

/// [`train_model`] telling `obs` of every step (loss, tokens so far) and
/// every validation point; pass a [`crate::progress::Bar`] for a progress
/// bar.
pub fn train_observed<T: Element>(
    model: Gpt<T>,
    data: &CharData,
    config: &CharLmConfig,
    obs: &mut dyn Observer,
) -> Result<CharLmRun<T>> {
    train_persisted(model, data, config, obs, &Persist::none())
}

/// The settings a resumed run must share with its checkpoint: the model's
/// shape, the text, the batch, the schedule and the seed.
pub fn checkpoint_config(
    data: &CharData,
    config: &CharLmConfig,
    shape: &GptConfig,
) -> BTreeMap<String, String> {
    let text: Vec<u8> = data
        .train
        .iter()
        .chain(&data.val)
        .flat_map(|&t| (t as u32).to_le_bytes())
        .collect();
    let c = config;
    [
        ("model", "transformer".to_string()),
        ("vocab", shape.vocab.to_string()),
        ("context", shape.context.to_string()),
        ("width", shape.width.to_string()),
        ("heads", shape.heads.to_string()),
        ("layers", shape.layers.to_string()),
        (
            "text",
            format!(
                "{} characters, FNV-1a {:016x}",
                text.len() / 4,
                fnv1a64(&text)
            ),
        ),
        ("batch", c.batch.to_string()),
        ("steps", c.steps.to_string()),
        ("lr", format!("{:?}", c.lr)),
        ("warmup", c.warmup.to_string()),
        ("clip", format!("{:?}", c.clip)),
        ("eval_every", c.eval_every.to_string()),
        ("eval_batches", c.eval_batches.to_string()),
        ("seed", c.seed.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// 64-bit FNV-1a of `bytes`: names the text in a checkpoint.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// [`train_observed`] with checkpoints: resumed from and saved to where
/// `persist` says, so that a run stopped and resumed takes exactly the
/// steps of one that was not.
pub fn train_persisted<T: Element>(
    model: Gpt<T>,
    data: &CharData,
    config: &CharLmConfig,
    obs: &mut dyn Observer,
    persist: &Persist,
) -> Result<CharLmRun<T>> {
    train_parallel(model, data, config, obs, persist, None)
}

/// [`train_persisted`] as one rank of a data-parallel run over `dp`: each
/// rank takes its rank-strided share of the batch of `config.batch`
/// sequences per rank (so the world's batch is that times the world
/// size), the gradients and losses are averaged over ranks, and only rank
/// 0 saves checkpoints. A world of one trains exactly as `dp` = `None`.
pub fn train_parallel<T: Element>(
    mut model: Gpt<T>,
    data: &CharData,
    config: &CharLmConfig,
    obs: &mut dyn Observer,
    persist: &Persist,
    mut dp: Option<&mut Dp>,
) -> Result<CharLmRun<T>> {
    let (rank, world) = dp.as_ref().map_or((0, 1), |d| (d.rank(), d.world()));
    let shape = *model.config();
    if shape.vocab != data.vocab() {
        return Err(Error::InvalidArgument {
            op: "train_model",
            msg: format!(
                "the model has {} tokens, the text {}",
                shape.vocab,
                data.vocab()
            ),
        });
    }
    let mut stepper = Stepper::new(config, &shape)?;
    let mut settings = checkpoint_config(data, config, &shape);
    if world > 1 {
        // The batch stream depends on the world size.
        settings.insert("ranks".into(), world.to_string());
    }
    let mut state = persist.start(&mut model, &mut stepper.opt, &settings)?;
    if let Some(d) = dp.as_deref_mut() {
        d.sync_params(&mut model.params_mut())?;
    }
    stepper.rng = state.rng("batches", stepper.rng.clone());
    let (b, t) = (config.batch, shape.context);
    // Fixed validation windows, so that every evaluation sees the same
    // text; each rank takes its share of every batch.
    let mut vrng = Rng::new(config.seed ^ 0x5eed);
    let val: Vec<_> = (0..config.eval_batches)
        .map(|_| {
            let (x, y) = CharData::batch(&data.val, world * b, t, &mut vrng);
            (shard(&x, t, rank, world), shard(&y, t, rank, world))
        })
        .collect();
    let start = Instant::now();
    // The observer is passed in, not captured: the loop tells it of steps too.
    let eval = |model: &Gpt<T>,
                step: usize,
                obs: &mut dyn Observer,
                state: &mut fusegrad::nn::TrainState,
                dp: Option<&mut Dp>|
     -> Result<()> {
        // A resumed run does not repeat the evaluation its checkpoint ends with.
        if state.evals.last().is_some_and(|e| e.step == step) {
            return Ok(());
        }
        let mut sum = 0.0;
        for (x, y) in &val {
            let tape = Tape::new();
            let p = model.bind_frozen(&tape);
            sum += scalar(model.loss(&p, x, y, b, t)?.value())?;
        }
        if let Some(d) = dp {
            sum = d.mean(&[sum])?[0];
        }
        let e = EvalPoint {
            step,
            val_bits: sum / val.len().max(1) as f64 / std::f64::consts::LN_2,
            seconds: start.elapsed().as_secs_f64(),
        };
        obs.on_eval(&e);
        state.evals.push(e);
        Ok(())
    };
    let first = state.step as usize;
    let mut step = first;
    let every = config.eval_every.max(1);
    if step.is_multiple_of(every) {
        eval(&model, step, obs, &mut state, dp.as_deref_mut())?;
    }
    // Every rank must take the same number of steps: rank 0's clock decides.
    let go_on = |step: usize, dp: Option<&mut Dp>| -> Result<bool> {
        let mine = step < config.steps && start.elapsed() < config.time_limit;
        match dp {
            Some(d) if d.world() > 1 => {
                Ok(d.mean(&[if rank == 0 && mine { 1.0 } else { 0.0 }])?[0] > 0.0)
            }
            _ => Ok(mine),
        }
    };
    while go_on(step, dp.as_deref_mut())? {
        let value = stepper.step_on(
            &mut model,
            data,
            step,
            obs.shadow(),
            &mut |_| {},
            dp.as_deref_mut(),
        )?;
        step += 1;
        state.losses.push(value);
        state.step = step as u64;
        state.data_position = (step * b) as u64;
        state.rngs.insert("batches".into(), stepper.rng.state());
        obs.on_step(&Step {
            step,
            steps: config.steps,
            loss: value,
            items: step * world * b * t,
            seconds: start.elapsed().as_secs_f64(),
        });
        // Evaluated before a checkpoint at the same step, so that it holds it.
        if step.is_multiple_of(every) || step == config.steps {
            eval(&model, step, obs, &mut state, dp.as_deref_mut())?;
        }
        if rank == 0 {
            persist.step(&model, &stepper.opt, &state)?;
        }
    }
    eval(&model, step, obs, &mut state, dp)?;
    if rank == 0 {
        persist.finish(&model, &stepper.opt, &state)?;
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(CharLmRun {
        tokens_per_s: ((step - first) * world * b * t) as f64 / secs.max(1e-9),
        losses: state.losses,
        evals: state.evals,
        model,
    })
}

/// The parts of a training step, in the order [`Stepper::step`] ends them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepPart {
    /// Drawing the batch, binding the parameters, the forward to the loss.
    Forward,
    /// The reverse sweep.
    Backward,
    /// Reading each parameter's gradient off the sweep.
    Grads,
    /// The learning-rate schedule, gradient clipping and the AdamW update
    /// (`Optimizer::update_clipped`).
    Update,
}

/// What persists across the steps of [`train_observed`]: the batch stream,
/// AdamW and the schedule. The one definition of a training step, so that
/// `fusegrad bench --train` times exactly the step that training runs.
pub(crate) struct Stepper<T: Element = f32> {
    rng: Rng,
    opt: AdamW<T>,
    schedule: WarmupCosine,
    batch: usize,
    context: usize,
    clip: f64,
}

impl<T: Element> Stepper<T> {
    /// The state before step 0 of a run of `config` on a model of `shape`.
    pub(crate) fn new(config: &CharLmConfig, shape: &GptConfig) -> Result<Self> {
        Ok(Stepper {
            rng: Rng::new(config.seed ^ 0xba7c4),
            opt: AdamW::with_lr(config.lr)?,
            schedule: WarmupCosine::new(
                config.lr,
                config.lr / 10.0,
                config.warmup.min(config.steps) as u64,
                config.steps.max(1) as u64,
            )?,
            batch: config.batch,
            context: shape.context,
            clip: config.clip,
        })
    }

    /// Step `step` (from 0): a batch, forward, backward, gradient clipping
    /// and the AdamW update of `model`; returns the batch's mean loss in
    /// nats. `mark` is told as each [`StepPart`] ends; the tape is dropped
    /// after the last.
    pub(crate) fn step(
        &mut self,
        model: &mut Gpt<T>,
        data: &CharData,
        step: usize,
        shadow: Option<&fusegrad::Shadow>,
        mark: &mut dyn FnMut(StepPart),
    ) -> Result<f64> {
        self.step_on(model, data, step, shadow, mark, None)
    }

    /// [`Stepper::step`] as one rank of `dp`: the world's batch is drawn,
    /// this rank's share trained on, and the gradients and the loss
    /// averaged over ranks.
    pub(crate) fn step_on(
        &mut self,
        model: &mut Gpt<T>,
        data: &CharData,
        step: usize,
        shadow: Option<&fusegrad::Shadow>,
        mark: &mut dyn FnMut(StepPart),
        dp: Option<&mut Dp>,
    ) -> Result<f64> {
        let (b, t) = (self.batch, self.context);
        let (rank, world) = dp.as_ref().map_or((0, 1), |d| (d.rank(), d.world()));
        let (x, y) = CharData::batch(&data.train, world * b, t, &mut self.rng);
        let (x, y) = if world > 1 {
            (shard(&x, t, rank, world), shard(&y, t, rank, world))
        } else {
            (x, y)
        };
        let tape = Tape::new();
        if let Some(s) = shadow {
            s.watch(&tape, step);
        }
        let p = model.bind(&tape);
        let loss = model.loss(&p, &x, &y, b, t)?;
        let mut value = scalar(loss.value())?;
        mark(StepPart::Forward);
        let g = match dp {
            Some(d) => {
                // The sweep's gradients are dropped inside, as below.
                let g = d.backward(&loss, &p)?;
                mark(StepPart::Backward);
                value = d.mean(&[value])?[0];
                g
            }
            None => {
                let swept = loss.backward()?;
                mark(StepPart::Backward);
                let g = p.grads(&swept)?;
                // Every node's gradient goes now, as in a one-line
                // `p.grads(&loss.backward()?)`: the update's peak memory is
                // not inflated by them.
                drop(swept);
                g
            }
        };
        mark(StepPart::Grads);
        self.opt.set_lr(self.schedule.lr(step as u64))?;
        self.opt
            .update_clipped(&mut model.params_mut(), g, self.clip)?;
        mark(StepPart::Update);
        Ok(value)
    }
}

/// `n` characters sampled after `prompt` at `temperature` (characters not
/// in the alphabet are dropped from the prompt).
pub fn sample<T: Element>(
    model: &Gpt<T>,
    data: &CharData,
    prompt: &str,
    n: usize,
    temperature: f64,
    rng: &mut Rng,
) -> Result<String> {
    let mut ids: Vec<usize> = prompt
        .chars()
        .filter_map(|c| data.chars.binary_search(&c).ok())
        .collect();
    if ids.is_empty() {
        ids.push(0);
    }
    let ctx = model.config().context;
    let mut out = String::new();
    for _ in 0..n {
        let window = &ids[ids.len().saturating_sub(ctx)..];
        let tape = Tape::new();
        let p = model.bind_frozen(&tape);
        let logits = model.forward_ids(&p, window, 1, window.len())?;
        let v = data.vocab();
        let all = logits.value().to_vec()?;
        let last = &all[all.len() - v..];
        let last: Vec<f64> = last.iter().map(|l| l.to_acc().f64()).collect();
        let m = last.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        let w: Vec<f64> = last
            .iter()
            .map(|&l| ((l - m) / temperature.max(1e-6)).exp())
            .collect();
        let mut r = rng.uniform() * w.iter().sum::<f64>();
        let mut next = v - 1;
        for (i, wi) in w.iter().enumerate() {
            if r < *wi {
                next = i;
                break;
            }
            r -= wi;
        }
        ids.push(next);
        out.push(data.chars[next]);
    }
    Ok(out)
}

fn scalar<T: Element>(t: &Tensor<T>) -> Result<f64> {
    Ok(t.to_vec()?.first().map_or(f64::NAN, |v| v.to_acc().f64()))
}
