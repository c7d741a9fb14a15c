//! `fusegrad bench --train`: the default character transformer's training
//! step, timed whole and taken apart by op family.
//!
//! The step is [`Stepper::step`], the one [`train_observed`] runs (forward,
//! backward, `clip_grad_norm`, AdamW with the warmup-cosine schedule), on
//! the crate's own text, so the figures are those of `fusegrad train
//! transformer` without its evaluations.
//!
//! - **Speed**: after `warmup` untimed steps, `steps` steps each timed
//!   whole with the per-op timers off; the median and tokens per second
//!   (`batch * context` over it).
//! - **Memory**: the resident set's peak (`VmHWM`), and how far it rose
//!   above the resident set just before the model was built (the peak is
//!   reset there through `/proc/self/clear_refs`, so the text's loading
//!   does not count).
//! - **Breakdown**: after every `profile_every`-th timed step, one more
//!   step with the timers on (`fusegrad::profile`). Each op's forward and
//!   backward, the sweep's broadcast sums and accumulations, the clip and
//!   the update are timed, each less the buffer pool's time inside it,
//!   which is a row of its own. The rest of the step's wall time is the
//!   tape's bookkeeping and the model code around the ops: the rows add
//!   up to the profiled step's wall time by construction.
//!
//! [`train_observed`]: crate::char_lm::train_observed

use crate::app::transformer::own_text;
use crate::char_lm::{new_model, CharData, CharLmConfig, StepPart, Stepper};
use fusegrad::error::{Error, Result};
use fusegrad::nn::NormImpl;
use fusegrad::probes::profile::{self, Key, Phase, Tally};
use std::fmt;
use std::time::Instant;

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainBenchConfig {
    /// The model, batch and optimizer settings (`CharLmConfig::default()`:
    /// 4 layers, 4 heads, width 128, context 64, batch 16).
    pub run: CharLmConfig,
    /// Untimed steps first.
    pub warmup: usize,
    /// Timed steps (timers off).
    pub steps: usize,
    /// One profiled step after every this many timed steps; 0: none.
    pub profile_every: usize,
}

impl Default for TrainBenchConfig {
    /// The default transformer; 5 warm-up steps, 80 timed ones (20-30 s
    /// on 2 cores), a profiled step after every 4th.
    fn default() -> Self {
        TrainBenchConfig {
            run: CharLmConfig::default(),
            warmup: 5,
            steps: 80,
            profile_every: 4,
        }
    }
}

/// Resident memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Memory {
    /// The resident set just before the model was built.
    pub baseline: u64,
    /// The process's peak resident set (`VmHWM`), from its start.
    pub peak: u64,
    /// Peak resident set during the bench less `baseline`.
    pub peak_increase: u64,
    /// Whether the peak could be reset at `baseline`; if not,
    /// `peak_increase` is `peak - baseline`, which may count the text's
    /// loading.
    pub reset: bool,
}

/// One op family's share of a profiled step.
#[derive(Debug, Clone, PartialEq)]
pub struct FamilyRow {
    /// The family (see [`FAMILIES`]).
    pub family: &'static str,
    /// Milliseconds per step, averaged over the profiled steps.
    pub ms: f64,
    /// Whether the row is timed directly (false: a remainder of a part of
    /// the step's wall time).
    pub timed: bool,
}

/// One op, phase and output rank, averaged over the profiled steps.
#[derive(Debug, Clone, PartialEq)]
pub struct OpRow {
    /// `Op::name`.
    pub op: &'static str,
    /// `forward`, `backward`, `sum_to_shape` or `accumulate`.
    pub phase: &'static str,
    /// Rank of the op's output (of the input, for the sweep's sums).
    pub rank: usize,
    /// The family it is counted in.
    pub family: &'static str,
    /// Calls per step.
    pub calls: f64,
    /// Milliseconds per step, allocation excluded.
    pub ms: f64,
}

/// The profiled steps, per step.
#[derive(Debug, Clone, PartialEq)]
pub struct Breakdown {
    /// Profiled steps.
    pub steps: usize,
    /// Mean wall time of a profiled step, milliseconds.
    pub wall_ms: f64,
    /// The families, in [`FAMILIES`] order; they add up to `wall_ms`.
    pub families: Vec<FamilyRow>,
    /// Every op tallied, slowest first.
    pub ops: Vec<OpRow>,
    /// Buffer-pool takes and gives per step, on the stepping thread.
    pub allocations: f64,
    /// Minor page faults per step (`None` where the OS does not say).
    pub faults: Option<f64>,
}

/// What [`run_train`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainBench {
    /// The settings.
    pub config: TrainBenchConfig,
    /// The text's alphabet size (the model's vocabulary).
    pub vocab: usize,
    /// Characters of the text.
    pub text_chars: usize,
    /// Threads the kernels run on.
    pub threads: usize,
    /// Each timed step, seconds.
    pub step_s: Vec<f64>,
    /// Their median.
    pub median_s: f64,
    /// `batch * context / median_s`.
    pub tokens_per_s: f64,
    /// Resident memory.
    pub memory: Memory,
    /// The 1-minute load average at the end (`/proc/loadavg`): on a
    /// shared machine, above the thread count means the figures are not
    /// the machine's own.
    pub load_avg: Option<f64>,
    /// The profiled steps, if any.
    pub breakdown: Option<Breakdown>,
}

/// The families of the breakdown, in its order. A Linear's matmul has
/// output rank 2 or 3, an attention head's rank 4. The last three rows
/// are remainders of the wall time, not timed.
pub const FAMILIES: [&str; 21] = [
    MATMUL,
    WEIGHT_SUMS,
    ATT_MATMUL,
    ATT_FUSED,
    ATT_MASK,
    SOFTMAX,
    NORMS,
    GELU,
    ELEMENTWISE,
    BIAS_SUMS,
    ACCUM,
    SHAPE,
    LOSS,
    EMBEDDING,
    OTHER_OPS,
    OPTIMIZER,
    CLIP,
    ALLOC,
    TAPE_FWD,
    TAPE_BWD,
    OTHER,
];

const MATMUL: &str = "matmul (Linear layers, with their bias)";
const WEIGHT_SUMS: &str = "matmul: per-batch weight gradients summed";
const ATT_MATMUL: &str = "attention: q k^T and att v matmuls";
const ATT_FUSED: &str = "attention: fused op";
const ATT_MASK: &str = "attention: scale and causal mask";
const SOFTMAX: &str = "softmax";
const NORMS: &str = "norms (LayerNorm)";
const GELU: &str = "GELU";
const ELEMENTWISE: &str = "elementwise: residual adds, other";
const BIAS_SUMS: &str = "broadcast sums (bias and norm gradients)";
const ACCUM: &str = "gradient accumulation (sweep)";
const SHAPE: &str = "shape copies (permute, transpose, narrow)";
const LOSS: &str = "loss (cross-entropy)";
const EMBEDDING: &str = "embedding";
const OTHER_OPS: &str = "other ops";
const OPTIMIZER: &str = "optimizer (AdamW)";
const CLIP: &str = "gradient clipping";
const ALLOC: &str = "allocation (buffer pool, stepping thread)";
const TAPE_FWD: &str = "tape and model code, forward (untimed rest)";
const TAPE_BWD: &str = "tape sweep bookkeeping (untimed rest)";
const OTHER: &str = "other: gradient read-out, freeing the tape (rest)";

/// The family an op's tally counts in.
fn family(k: &Key) -> &'static str {
    match (k.phase, k.op) {
        (Phase::SumToShape, "matmul") => WEIGHT_SUMS,
        (Phase::SumToShape, _) => BIAS_SUMS,
        (Phase::Accumulate, _) => ACCUM,
        (Phase::Step, _) => CLIP,
        (_, "matmul") if k.rank == 4 => ATT_MATMUL,
        (_, "matmul" | "linear") => MATMUL,
        (_, "attention" | "attention_qkv") => ATT_FUSED,
        (_, "scalar_mul") if k.rank == 4 => ATT_MASK,
        (_, "masked_fill") => ATT_MASK,
        (_, "softmax" | "log_softmax") => SOFTMAX,
        (_, "layer_norm" | "rms_norm") => NORMS,
        (_, "gelu" | "gelu_tanh") => GELU,
        (
            _,
            "add" | "sub" | "mul" | "div" | "neg" | "scalar_add" | "scalar_mul" | "powi" | "sqrt"
            | "rsqrt" | "exp" | "log" | "tanh" | "sigmoid" | "relu" | "dropout",
        ) => ELEMENTWISE,
        (_, "permute" | "transpose" | "reshape" | "narrow" | "concat" | "broadcast_to") => SHAPE,
        (_, "cross_entropy" | "mse") => LOSS,
        (_, "embedding") => EMBEDDING,
        _ => OTHER_OPS,
    }
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Forward => "forward",
        Phase::Backward => "backward",
        Phase::SumToShape => "sum_to_shape",
        Phase::Accumulate => "accumulate",
        Phase::Step => "step",
    }
}

/// A field of `/proc/self/status` in bytes (`VmHWM`, `VmRSS`), or `None`
/// where there is no such file.
fn status_bytes(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line[field.len()..]
        .trim_start_matches(':')
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Resets the peak resident set to the current one (Linux 4.0+).
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The running sums of the profiled steps.
#[derive(Default)]
struct Profiled {
    steps: usize,
    wall_ns: u64,
    /// Per [`StepPart`], nanoseconds less allocation.
    parts: [u64; 4],
    alloc_ns: u64,
    alloc_calls: u64,
    faults: Option<u64>,
    ops: Vec<(Key, Tally)>,
}

fn part_index(p: StepPart) -> usize {
    match p {
        StepPart::Forward => 0,
        StepPart::Backward => 1,
        StepPart::Grads => 2,
        StepPart::Update => 3,
    }
}

/// Runs the bench (see the module's docs). Errors if the crate's text
/// cannot be read or `steps` is 0.
pub fn run_train(config: &TrainBenchConfig) -> Result<TrainBench> {
    if config.steps == 0 {
        return Err(Error::InvalidArgument {
            op: "bench --train",
            msg: "need at least one timed step".into(),
        });
    }
    let run = &config.run;
    let text = own_text()?;
    let data = CharData::new(&text, run.model.context)?;
    let prior_peak = status_bytes("VmHWM").unwrap_or(0);
    let baseline = status_bytes("VmRSS").unwrap_or(0);
    let reset = reset_peak();
    let mut model = new_model::<f32>(&data, run, NormImpl::Fused)?;
    let mut stepper = Stepper::new(run, model.config())?;
    let mut s = 0;
    for _ in 0..config.warmup {
        stepper.step(&mut model, &data, s, None, &mut |_| {})?;
        s += 1;
    }
    let mut step_s = Vec::with_capacity(config.steps);
    let mut prof = Profiled {
        faults: Some(0),
        ..Profiled::default()
    };
    for i in 0..config.steps {
        let t = Instant::now();
        stepper.step(&mut model, &data, s, None, &mut |_| {})?;
        step_s.push(t.elapsed().as_secs_f64());
        s += 1;
        if config.profile_every > 0 && (i + 1) % config.profile_every == 0 {
            profiled_step(&mut stepper, &mut model, &data, s, &mut prof)?;
            s += 1;
        }
    }
    let peak_now = status_bytes("VmHWM").unwrap_or(0);
    let memory = Memory {
        baseline,
        peak: if reset {
            peak_now.max(prior_peak)
        } else {
            peak_now
        },
        peak_increase: peak_now.saturating_sub(baseline),
        reset,
    };
    let mut sorted = step_s.clone();
    sorted.sort_by(f64::total_cmp);
    let median_s = sorted[sorted.len() / 2];
    let tokens = (run.batch * run.model.context) as f64;
    Ok(TrainBench {
        config: config.clone(),
        vocab: data.vocab(),
        text_chars: data.train.len() + data.val.len(),
        threads: rayon::current_num_threads(),
        tokens_per_s: tokens / median_s,
        median_s,
        step_s,
        memory,
        load_avg: std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok()),
        breakdown: (prof.steps > 0).then(|| breakdown(&prof)),
    })
}

/// One step with the timers on, added to `prof`.
fn profiled_step(
    stepper: &mut Stepper,
    model: &mut fusegrad::nn::Gpt<f32>,
    data: &CharData,
    s: usize,
    prof: &mut Profiled,
) -> Result<()> {
    profile::set_enabled(true);
    profile::take_ops();
    let faults0 = super::minor_faults();
    let (a0, c0) = profile::alloc_so_far();
    let start = Instant::now();
    let (mut last, mut last_alloc) = (start, a0);
    let mut parts = [0u64; 5];
    let r = stepper.step(model, data, s, None, &mut |part| {
        let now = Instant::now();
        let a = profile::alloc_so_far().0;
        let ns = (now - last).as_nanos() as u64;
        parts[part_index(part)] += ns.saturating_sub(a - last_alloc);
        (last, last_alloc) = (now, a);
    });
    let wall = start.elapsed().as_nanos() as u64;
    let (a1, c1) = profile::alloc_so_far();
    let faults1 = super::minor_faults();
    profile::set_enabled(false);
    let ops = profile::take_ops();
    r?;
    prof.steps += 1;
    prof.wall_ns += wall;
    for (sum, p) in prof.parts.iter_mut().zip(parts) {
        *sum += p;
    }
    prof.alloc_ns += a1 - a0;
    prof.alloc_calls += c1 - c0;
    // A step whose faults cannot be read leaves the count unknown.
    prof.faults = match (prof.faults, faults0, faults1) {
        (Some(f), Some(x), Some(y)) => Some(f + y.saturating_sub(x)),
        _ => None,
    };
    for (k, t) in ops {
        match prof.ops.iter_mut().find(|(q, _)| *q == k) {
            Some((_, u)) => {
                u.calls += t.calls;
                u.ns += t.ns;
            }
            None => prof.ops.push((k, t)),
        }
    }
    Ok(())
}

fn breakdown(p: &Profiled) -> Breakdown {
    let n = p.steps as f64;
    let ms = |ns: u64| ns as f64 / 1e6 / n;
    let mut ops: Vec<OpRow> = p
        .ops
        .iter()
        .map(|(k, t)| OpRow {
            op: k.op,
            phase: phase_name(k.phase),
            rank: k.rank,
            family: family(k),
            calls: t.calls as f64 / n,
            ms: ms(t.ns),
        })
        .collect();
    ops.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    let op_ns = |pred: &dyn Fn(&Key) -> bool| -> u64 {
        p.ops
            .iter()
            .filter(|(k, _)| pred(k))
            .map(|(_, t)| t.ns)
            .sum()
    };
    let fwd_ops = op_ns(&|k| k.phase == Phase::Forward);
    let bwd_ops = op_ns(&|k| !matches!(k.phase, Phase::Forward | Phase::Step));
    // Clipping is timed inside the update part.
    let clip = op_ns(&|k| k.phase == Phase::Step);
    // Remainders: a part's time less the ops timed inside it (both net of
    // allocation); the rest of the wall time less every part and the pool.
    let tape_fwd = p.parts[0].saturating_sub(fwd_ops);
    let tape_bwd = p.parts[1].saturating_sub(bwd_ops);
    let parts: u64 = p.parts.iter().sum();
    let other = p.wall_ns.saturating_sub(parts + p.alloc_ns) + p.parts[2];
    let mut families: Vec<FamilyRow> = FAMILIES
        .iter()
        .map(|&f| {
            let ns = match f {
                OPTIMIZER => p.parts[3].saturating_sub(clip),
                CLIP => clip,
                ALLOC => p.alloc_ns,
                TAPE_FWD => tape_fwd,
                TAPE_BWD => tape_bwd,
                OTHER => other,
                _ => op_ns(&|k| family(k) == f),
            };
            FamilyRow {
                family: f,
                ms: ms(ns),
                timed: !matches!(f, TAPE_FWD | TAPE_BWD | OTHER),
            }
        })
        .collect();
    // Families no op of this model falls in are left out.
    families.retain(|r| r.ms > 0.0 || !matches!(r.family, ATT_FUSED | OTHER_OPS));
    Breakdown {
        steps: p.steps,
        wall_ms: ms(p.wall_ns),
        families,
        ops,
        allocations: p.alloc_calls as f64 / n,
        faults: p.faults.map(|f| f as f64 / n),
    }
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// A JSON number: non-finite values (which JSON cannot hold) as null.
fn num(x: f64, digits: usize) -> String {
    if x.is_finite() {
        format!("{x:.digits$}")
    } else {
        "null".into()
    }
}

impl TrainBench {
    /// Milliseconds of the median step.
    pub fn median_ms(&self) -> f64 {
        self.median_s * 1e3
    }

    /// One JSON object: the settings, `step_ms_median`, `tokens_per_s`,
    /// `peak_rss_mb`, `peak_rss_increase_mb`, and the breakdown's
    /// `families` and `ops` (milliseconds per step).
    pub fn json(&self) -> String {
        let c = &self.config;
        let m = &c.run.model;
        let mut sorted = self.step_s.clone();
        sorted.sort_by(f64::total_cmp);
        let mut s = format!(
            "{{\"bench\":\"train\",\"framework\":\"fusegrad\",\"layers\":{},\"heads\":{},\"width\":{},\
             \"context\":{},\"batch\":{},\"vocab\":{},\"threads\":{},\"warmup\":{},\"steps\":{},\
             \"step_ms_median\":{},\"step_ms_min\":{},\"step_ms_max\":{},\"tokens_per_s\":{},\
             \"peak_rss_mb\":{},\"peak_rss_increase_mb\":{},\"baseline_rss_mb\":{},\"peak_reset\":{},\
             \"load_avg\":{}",
            m.layers,
            m.heads,
            m.width,
            m.context,
            c.run.batch,
            self.vocab,
            self.threads,
            c.warmup,
            c.steps,
            num(self.median_ms(), 3),
            num(sorted[0] * 1e3, 3),
            num(sorted[sorted.len() - 1] * 1e3, 3),
            num(self.tokens_per_s, 1),
            num(mb(self.memory.peak), 1),
            num(mb(self.memory.peak_increase), 1),
            num(mb(self.memory.baseline), 1),
            self.memory.reset,
            self.load_avg.map_or("null".into(), |l| num(l, 2)),
        );
        if let Some(b) = &self.breakdown {
            let fams: Vec<String> = b
                .families
                .iter()
                .map(|r| {
                    format!(
                        "{{\"family\":\"{}\",\"ms\":{},\"timed\":{}}}",
                        r.family,
                        num(r.ms, 4),
                        r.timed
                    )
                })
                .collect();
            let ops: Vec<String> = b
                .ops
                .iter()
                .map(|r| {
                    format!(
                        "{{\"op\":\"{}\",\"phase\":\"{}\",\"rank\":{},\"family\":\"{}\",\"calls\":{},\"ms\":{}}}",
                        r.op, r.phase, r.rank, r.family, num(r.calls, 2), num(r.ms, 4)
                    )
                })
                .collect();
            s += &format!(
                ",\"breakdown\":{{\"steps\":{},\"wall_ms\":{},\"allocations\":{},\"faults\":{},\
                 \"families\":[{}],\"ops\":[{}]}}",
                b.steps,
                num(b.wall_ms, 3),
                num(b.allocations, 1),
                b.faults.map_or("null".into(), |f| num(f, 1)),
                fams.join(","),
                ops.join(",")
            );
        }
        s + "}"
    }
}

impl fmt::Display for TrainBench {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        let m = &c.run.model;
        writeln!(
            f,
            "model: {} layers, {} heads, width {}, context {}, vocabulary {}; batch {}; f32, fused \
             LayerNorm, AdamW, clip {:.1}; {} threads",
            m.layers,
            m.heads,
            m.width,
            m.context,
            self.vocab,
            c.run.batch,
            c.run.clip,
            self.threads
        )?;
        writeln!(
            f,
            "text: fusegrad's own sources and docs ({} characters)",
            self.text_chars
        )?;
        let mut sorted = self.step_s.clone();
        sorted.sort_by(f64::total_cmp);
        writeln!(
            f,
            "{} timed steps after {} warm-up: median {:.1} ms (fastest {:.1}, slowest {:.1}), \
             {:.0} tokens/s",
            c.steps,
            c.warmup,
            self.median_ms(),
            sorted[0] * 1e3,
            sorted[sorted.len() - 1] * 1e3,
            self.tokens_per_s
        )?;
        if let Some(l) = self.load_avg {
            writeln!(f, "load average (1 min) at the end: {l:.2}")?;
        }
        let mem = &self.memory;
        writeln!(
            f,
            "memory: peak resident {:.0} MB; during the bench {:.0} MB above the {:.0} MB \
             before the model was built{}",
            mb(mem.peak),
            mb(mem.peak_increase),
            mb(mem.baseline),
            if mem.reset {
                ""
            } else {
                " (the peak could not be reset: may count the text's loading)"
            }
        )?;
        let Some(b) = &self.breakdown else {
            return Ok(());
        };
        writeln!(
            f,
            "\nbreakdown: {} profiled steps (one after every {} timed), {:.1} ms each on average, \
             {:+.1}% against the median unprofiled step; {:.0} pool takes and gives{} per step",
            b.steps,
            c.profile_every,
            b.wall_ms,
            (b.wall_ms / self.median_ms() - 1.0) * 100.0,
            b.allocations,
            b.faults
                .map_or(String::new(), |x| format!(", {x:.0} page faults"))
        )?;
        writeln!(f, "{:<52} {:>9} {:>7}", "family", "ms/step", "share")?;
        let row = |f: &mut fmt::Formatter<'_>, name: &str, ms: f64| {
            writeln!(
                f,
                "{name:<52} {ms:>9.2} {:>6.1}%",
                ms / b.wall_ms.max(1e-12) * 100.0
            )
        };
        let timed: f64 = b.families.iter().filter(|r| r.timed).map(|r| r.ms).sum();
        for r in b.families.iter().filter(|r| r.timed) {
            row(f, r.family, r.ms)?;
        }
        row(f, "= timed directly", timed)?;
        for r in b.families.iter().filter(|r| !r.timed) {
            row(f, r.family, r.ms)?;
        }
        row(f, "= profiled step, wall", b.wall_ms)?;
        writeln!(
            f,
            "\n{:<14} {:<13} {:>4} {:>7} {:>9}  family",
            "op", "phase", "rank", "calls", "ms/step"
        )?;
        for r in &b.ops {
            writeln!(
                f,
                "{:<14} {:<13} {:>4} {:>7.1} {:>9.3}  {}",
                r.op, r.phase, r.rank, r.calls, r.ms, r.family
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_split_matmuls_by_rank_and_sums_by_phase() {
        let k = |op, phase, rank| Key { op, phase, rank };
        assert_eq!(family(&k("matmul", Phase::Forward, 3)), MATMUL);
        assert_eq!(family(&k("linear", Phase::Backward, 3)), MATMUL);
        assert_eq!(family(&k("linear", Phase::SumToShape, 1)), BIAS_SUMS);
        assert_eq!(family(&k("matmul", Phase::Backward, 4)), ATT_MATMUL);
        assert_eq!(family(&k("add", Phase::SumToShape, 1)), BIAS_SUMS);
        assert_eq!(family(&k("matmul", Phase::SumToShape, 2)), WEIGHT_SUMS);
        assert_eq!(family(&k("scalar_mul", Phase::Forward, 4)), ATT_MASK);
        assert_eq!(family(&k("scalar_mul", Phase::Forward, 2)), ELEMENTWISE);
        assert_eq!(family(&k("gelu", Phase::Backward, 3)), GELU);
        assert_eq!(family(&k("no_such_op", Phase::Forward, 1)), OTHER_OPS);
    }

    #[test]
    fn status_fields_parse_where_linux_has_them() {
        let (Some(rss), Some(hwm)) = (status_bytes("VmRSS"), status_bytes("VmHWM")) else {
            eprintln!("skipped: no /proc/self/status");
            return;
        };
        assert!(rss > 0 && hwm >= rss, "rss {rss}, peak {hwm}");
    }
}

/// The shadow check's cost on the training step: blocks of `every` steps
/// unwatched and blocks with their first step checked (every fused norm
/// against its twin), alternating `pairs` times after `warmup` steps.
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowCost {
    pub every: usize,
    pub pairs: usize,
    /// Mean step time of the unwatched and of the watched blocks, seconds.
    pub plain_s: f64,
    pub watched_s: f64,
    /// Every layer was within tolerance.
    pub passed: bool,
}

impl ShadowCost {
    /// `watched / plain - 1`.
    pub fn overhead(&self) -> f64 {
        self.watched_s / self.plain_s - 1.0
    }
}

impl fmt::Display for ShadowCost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "shadow check every {} steps: {:+.2}% on the mean step ({:.1} ms watched vs {:.1} ms plain, {} alternating pairs of {}-step blocks); every layer within tolerance: {}",
            self.every,
            100.0 * self.overhead(),
            1e3 * self.watched_s,
            1e3 * self.plain_s,
            self.pairs,
            self.every,
            self.passed
        )
    }
}

/// Measures [`ShadowCost`] on the default transformer of `config.run`.
pub fn run_shadow_cost(
    config: &TrainBenchConfig,
    every: usize,
    pairs: usize,
) -> Result<ShadowCost> {
    let (every, pairs) = (every.max(1), pairs.max(1));
    let run = &config.run;
    let data = CharData::new(&own_text()?, run.model.context)?;
    let mut model = new_model::<f32>(&data, run, NormImpl::Fused)?;
    let mut stepper = Stepper::new(run, model.config())?;
    // Handed to the first step of a watched block only, so it checks each
    // step it sees.
    let shadow = fusegrad::Shadow::new(fusegrad::ShadowConfig::every(1));
    let mut s = 0;
    for _ in 0..config.warmup {
        stepper.step(&mut model, &data, s, None, &mut |_| {})?;
        s += 1;
    }
    let (mut plain, mut watched) = (0.0, 0.0);
    for pair in 0..pairs {
        // Which block goes first alternates, so that drift cancels.
        for block in 0..2 {
            let watch = (pair + block) % 2 == 1;
            let t = Instant::now();
            for i in 0..every {
                let sh = (watch && i == 0).then_some(&shadow);
                stepper.step(&mut model, &data, s, sh, &mut |_| {})?;
                s += 1;
            }
            let secs = t.elapsed().as_secs_f64();
            if watch {
                watched += secs;
            } else {
                plain += secs;
            }
        }
    }
    let n = (every * pairs) as f64;
    Ok(ShadowCost {
        every,
        pairs,
        plain_s: plain / n,
        watched_s: watched / n,
        passed: shadow.all_passed() && !shadow.sites().is_empty(),
    })
}
