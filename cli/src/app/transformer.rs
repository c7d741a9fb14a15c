//! `fusegrad train transformer` and `examples/tiny_transformer.rs`: the
//! character-level model of [`crate::char_lm`] trained on a text, with
//! its bars (unigram entropy, bigram loss), the validation curve, an
//! optional fused-vs-composed comparison, weights in and out, a sampled
//! line and a loss plot.

use super::shadow::Watching;
use super::{common_args, device_of, get, persist_of, precision_of, state_args, Precision};
use super::{parallel_args, parallel_of, with_engine, Parallel};
use crate::char_lm::{new_model, sample, train_parallel, CharData, CharLmConfig, CharLmRun, Dp};
use crate::checkpoint::Persist;
use crate::plot::{LinePlot, Series, Style};
use crate::progress::Bar;
use clap::{value_parser, Arg, ArgMatches, Command};
use fusegrad::dtype::Element;
use fusegrad::error::{Error, Result};
use fusegrad::nn::{load, save, Gpt, NormImpl, Parameters};
use fusegrad::shadow::{Shadow, SiteReport};
use fusegrad::{rng::Rng, Device};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Model and training settings.
    pub config: CharLmConfig,
    /// The text; `None` reads this crate's sources and docs ([`own_text`]).
    pub text: Option<PathBuf>,
    /// Train again with the composed LayerNorm and attention from the same
    /// start and compare the loss curves.
    pub composed: bool,
    /// Where to train (checked by [`Options::from_matches`]).
    pub device: Device,
    /// Write the trained weights here (safetensors).
    pub save: Option<PathBuf>,
    /// Start from these weights (safetensors) instead of fresh ones.
    pub load: Option<PathBuf>,
    /// Folder for `transformer_loss.png` and `.svg`; `None` writes none.
    pub plots: Option<PathBuf>,
    /// Draw a progress bar (it hides itself off a terminal).
    pub progress: bool,
    /// Check the fused LayerNorms against their twins every this many
    /// steps (`--shadow`).
    pub shadow: Option<usize>,
    /// The element type (`--dtype`).
    pub precision: Precision,
    /// Checkpoints of the fused run: resumed from, saved to.
    pub persist: Persist,
    /// Data parallelism (`--data-parallel`).
    pub parallel: Option<Parallel>,
}

impl Default for Options {
    /// [`CharLmConfig::default`] on the crate's own text, plots to
    /// `target/plots`, no bar.
    fn default() -> Self {
        Options {
            config: CharLmConfig::default(),
            text: None,
            composed: false,
            device: Device::Cpu,
            save: None,
            load: None,
            plots: Some(PathBuf::from(super::PLOTS_DIR)),
            progress: false,
            shadow: None,
            precision: Precision::F32,
            persist: Persist::none(),
            parallel: None,
        }
    }
}

fn path_arg(id: &'static str, help: &'static str) -> Arg {
    Arg::new(id)
        .long(id)
        .value_name("FILE")
        .value_parser(value_parser!(PathBuf))
        .help(help)
}

/// The subcommand `name` with its options and help.
/// Defaults are [`CharLmConfig::default`]'s, written out for `--help` (a
/// test checks they agree).
pub fn command(name: &'static str) -> Command {
    Command::new(name)
        .about("Train a character-level transformer (4 layers, 4 heads, width 128, context 64) on a text")
        .long_about(
            "Train a character-level transformer (4 layers, 4 heads, width 128, context 64; \
             AdamW with warmup and cosine decay, gradient clipping) on a text. Prints the \
             text's unigram entropy and a smoothed bigram model's validation loss (the bars \
             to pass), the validation loss as it trains, and a sampled line; writes the loss \
             curve to DIR/transformer_loss.png and .svg. About 4.5 minutes on 2 cores. With \
             --checkpoint it saves its whole state; --resume continues it bit for bit.",
        )
        .arg(path_arg(
            "text",
            "Train on this UTF-8 text (default: fusegrad's own sources and docs, read at run time)",
        ))
        .arg(
            Arg::new("steps")
                .long("steps")
                .value_name("N")
                .value_parser(value_parser!(usize))
                .default_value("2000")
                .help("Stop after N steps"),
        )
        .arg(
            Arg::new("minutes")
                .long("minutes")
                .value_name("M")
                .value_parser(value_parser!(f64))
                .default_value("4.5")
                .help("Stop at the first step after M minutes"),
        )
        .arg(
            Arg::new("seed")
                .long("seed")
                .value_name("S")
                .value_parser(value_parser!(u64))
                .default_value("0")
                .help("Seed of the weights and the batches"),
        )
        .arg(path_arg("save", "Write the trained weights to FILE (safetensors)"))
        .arg(path_arg("load", "Start from the weights in FILE (safetensors) instead of fresh ones"))
        .arg(super::shadow::arg())
        .arg(
            Arg::new("batch")
                .long("batch")
                .value_name("B")
                .value_parser(value_parser!(usize))
                .default_value("16")
                .help("Sequences per step (per rank with --data-parallel)"),
        )
        .args(state_args())
        .args(parallel_args())
        .args(common_args(
            "Train again with the composed LayerNorm and attention from the same start and print both loss curves",
        ))
}

impl Options {
    /// The options given on the command line of [`command`]. A time limit
    /// that is negative or not a number, or `--device cuda` without a CUDA
    /// backend, is an error.
    pub fn from_matches(m: &ArgMatches) -> Result<Options> {
        let d = Options::default();
        if m.contains_id("load")
            && m.get_one::<PathBuf>("load").is_some()
            && m.get_one::<PathBuf>("resume").is_some()
        {
            return Err(Error::InvalidArgument {
                op: "--resume",
                msg: "--load and --resume both set the weights; give one".into(),
            });
        }
        let minutes: f64 = get(m, "minutes", 4.5);
        let time_limit =
            Duration::try_from_secs_f64(minutes * 60.0).map_err(|_| Error::InvalidArgument {
                op: "--minutes",
                msg: format!("{minutes} is not a time limit (want minutes >= 0)"),
            })?;
        Ok(Options {
            config: CharLmConfig {
                steps: get(m, "steps", d.config.steps),
                batch: get(m, "batch", d.config.batch),
                seed: get(m, "seed", d.config.seed),
                time_limit,
                ..d.config
            },
            text: m.get_one::<PathBuf>("text").cloned(),
            composed: m.get_flag("composed"),
            device: device_of(m)?,
            save: m.get_one::<PathBuf>("save").cloned(),
            load: m.get_one::<PathBuf>("load").cloned(),
            plots: m.get_one::<PathBuf>("plots").cloned(),
            progress: true,
            shadow: super::shadow::every_of(m),
            precision: precision_of(m),
            persist: persist_of(m)?,
            parallel: parallel_of(m)?,
        })
    }
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct Summary<T: Element = f32> {
    /// Unigram entropy of the training text, bits per character.
    pub unigram_bits: f64,
    /// Validation loss of the add-one bigram model, bits per character.
    pub bigram_bits: f64,
    /// The fused run.
    pub fused: CharLmRun<T>,
    /// The composed twin, if asked.
    pub composed: Option<CharLmRun<T>>,
    /// Largest relative difference of the training loss, fused vs
    /// composed, if both ran.
    pub max_rel_diff: Option<f64>,
    /// The plot files written.
    pub plots: Vec<PathBuf>,
    /// The shadow check's sites, with `--shadow`.
    pub shadow: Vec<SiteReport>,
}

/// The project's own `.rs` and `.md` files (library and command), read at
/// run time in a fixed order: real text that needs no download.
pub fn own_text() -> Result<String> {
    // This package sits one folder below the workspace root.
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = here.parent().unwrap_or(here);
    let mut files = Vec::new();
    for dir in ["src", "ops", "cli", "docs", "examples", "tests"] {
        collect(&root.join(dir), &mut files).map_err(|e| Error::InvalidArgument {
            op: "own_text",
            msg: format!("cannot read {}: {e}", root.join(dir).display()),
        })?;
    }
    files.push(root.join("README.md"));
    files.sort();
    Ok(files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .collect())
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            // Build output is not the project's text.
            if p.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            collect(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "rs" || x == "md") {
            out.push(p);
        }
    }
    Ok(())
}

fn train<T: Element>(
    o: &Options,
    data: &CharData,
    model: Gpt<T>,
    c: &CharLmConfig,
    shadow: Option<&Shadow>,
    persist: &Persist,
    dp: Option<&mut Dp>,
) -> Result<CharLmRun<T>> {
    if super::quiet() {
        return train_parallel(model, data, c, &mut fusegrad::nn::Silent, persist, dp);
    }
    say!("{:>6} {:>9} {:>14}", "step", "seconds", "val bits/char");
    let mut bar = if o.progress {
        Bar::new(c.steps, "tok")
    } else {
        Bar::quiet("tok")
    };
    let run = match shadow {
        Some(shadow) => {
            let mut w = Watching {
                inner: &mut bar,
                shadow,
            };
            train_parallel(model, data, c, &mut w, persist, dp)
        }
        None => train_parallel(model, data, c, &mut bar, persist, dp),
    };
    bar.finish();
    run
}

/// Runs `o` in the element type it names ([`run_as`]), for the command.
pub fn run_any(o: &Options) -> Result<()> {
    with_engine(o.parallel.as_ref(), o.device, |dp, device| {
        let o = &Options {
            device,
            ..o.clone()
        };
        match o.precision {
            Precision::F32 => run_on::<f32>(o, dp).map(|_| ()),
            Precision::Bf16 => run_on::<half::bf16>(o, dp).map(|_| ()),
            Precision::F64 => run_on::<f64>(o, dp).map(|_| ()),
        }
    })
}

/// [`run_as`] in f32.
pub fn run(o: &Options) -> Result<Summary> {
    run_as::<f32>(o)
}

/// Trains in `T`, prints the figures as plain lines, saves and plots.
/// Errors if `o` names another element type.
pub fn run_as<T: Element>(o: &Options) -> Result<Summary<T>> {
    run_on(o, None)
}

/// [`run_as`] as one rank of `dp`: only rank 0 prints, plots and saves.
pub fn run_on<T: Element>(o: &Options, mut dp: Option<&mut Dp>) -> Result<Summary<T>> {
    if o.precision.name() != T::NAME {
        return Err(Error::InvalidArgument {
            op: "train transformer",
            msg: format!(
                "the options say {}, the run is {}",
                o.precision.name(),
                T::NAME
            ),
        });
    }
    let config = &o.config;
    let text = match &o.text {
        Some(f) => std::fs::read_to_string(f).map_err(|e| Error::InvalidArgument {
            op: "--text",
            msg: format!("cannot read {}: {e}", f.display()),
        })?,
        None => own_text()?,
    };
    let data = CharData::new(&text, config.model.context)?;
    let m = config.model;
    let name = o.text.as_ref().map(|p| p.display().to_string());
    say!(
        "text: {} ({} characters, alphabet {}), train {} / validation {}",
        name.as_deref().unwrap_or("fusegrad's own sources and docs"),
        data.train.len() + data.val.len(),
        data.vocab(),
        data.train.len(),
        data.val.len()
    );
    say!(
        "model: {} layers, {} heads, width {}, context {}; batch {}, AdamW lr {}, at most {} steps or {:.1} min, {}, {}",
        m.layers, m.heads, m.width, m.context, config.batch, config.lr, config.steps,
        config.time_limit.as_secs_f64() / 60.0, o.precision.name(), o.device
    );
    let (uni, bi) = (data.unigram_bits(), data.bigram_bits());
    say!("unigram entropy:           {uni:.3} bits/char");
    say!("bigram validation loss:    {bi:.3} bits/char (add-one smoothing)");
    say!(
        "target: below {bi:.3} and below {:.3} (unigram - 1.5)",
        uni - 1.5
    );
    let mut model = new_model::<T>(&data, config, NormImpl::Fused)?;
    model.to_device(o.device)?;
    if let Some(f) = &o.load {
        load(&mut model, f)?;
        say!("resumed from {}", f.display());
    }
    let start = model.clone();
    let shadow = o
        .shadow
        .map(|e| super::shadow::shadow(e, o.plots.as_deref()));
    let fused = train(
        o,
        &data,
        model,
        config,
        shadow.as_ref(),
        &o.persist,
        dp.as_deref_mut(),
    )?;
    let rank0 = !super::quiet();
    if let (Some(f), true) = (&o.save, rank0) {
        save(&fused.model, f)?;
        say!("weights written to {} (safetensors)", f.display());
    }
    let last = fused.evals.last().map_or(f64::NAN, |e| e.val_bits);
    say!(
        "fused: {} steps, {:.0} tokens/s, final validation {last:.4} bits/char: {} the bigram, {:.2} bits under the unigram",
        fused.losses.len(),
        fused.tokens_per_s,
        if last < bi { "below" } else { "NOT below" },
        uni - last
    );
    let (composed, max_rel_diff) = if o.composed {
        let (twin, worst) = compare(o, &data, start, &fused, dp)?;
        (Some(twin), Some(worst))
    } else {
        (None, None)
    };
    let mut rng = Rng::new(config.seed + 1);
    let line = sample(&fused.model, &data, "pub fn ", 120, 0.8, &mut rng)?;
    say!("sample: pub fn {}", line.lines().next().unwrap_or(""));
    let mut plots = match o.plots.as_ref().filter(|_| rank0) {
        Some(dir) => plot(&fused, composed.as_ref(), uni, bi)
            .write_both(dir, "transformer_loss")?
            .to_vec(),
        None => Vec::new(),
    };
    if let [png, svg] = plots.as_slice() {
        say!("loss plot: {} and {}", png.display(), svg.display());
    }
    let title = "Transformer: fused vs composed LayerNorm while training";
    let shadow_sites = super::shadow::finish(
        shadow.as_ref(),
        o.plots.as_deref(),
        "transformer_shadow",
        title,
        &mut plots,
    )?;
    Ok(Summary {
        shadow: shadow_sites,
        unigram_bits: uni,
        bigram_bits: bi,
        fused,
        composed,
        max_rel_diff,
        plots,
    })
}

/// The composed twin over the fused run's steps, and the table of both.
fn compare<T: Element>(
    o: &Options,
    data: &CharData,
    mut twin: Gpt<T>,
    fused: &CharLmRun<T>,
    dp: Option<&mut Dp>,
) -> Result<(CharLmRun<T>, f64)> {
    let mut c = o.config;
    c.steps = fused.losses.len();
    c.time_limit = Duration::MAX;
    say!(
        "composed LayerNorm and attention, same start, {} steps:",
        c.steps
    );
    twin.set_norm_impl(NormImpl::Composed);
    let twin = train(o, data, twin, &c, None, &Persist::none(), dp)?;
    say!(
        "{:>6} {:>12} {:>12} {:>10}",
        "step",
        "fused",
        "composed",
        "rel diff"
    );
    let every = (c.steps / 10).max(1);
    let mut worst = 0f64;
    for (s, (f, k)) in fused.losses.iter().zip(&twin.losses).enumerate() {
        let rel = (f - k).abs() / f.abs().max(1e-12);
        // NaN is a disagreement, not a zero.
        worst = worst.max(if rel.is_nan() { f64::INFINITY } else { rel });
        if s % every == 0 || s + 1 == c.steps {
            say!("{s:>6} {f:>12.6} {k:>12.6} {rel:>10.2e}");
        }
    }
    say!("largest relative difference of the training loss: {worst:.2e}");
    Ok((twin, worst))
}

/// Training loss per step and validation points in bits per character,
/// with the two bars as flat lines.
fn plot<T: Element>(
    fused: &CharLmRun<T>,
    composed: Option<&CharLmRun<T>>,
    uni: f64,
    bi: f64,
) -> LinePlot {
    let bits = |r: &CharLmRun<T>| -> Vec<(f64, f64)> {
        let ln2 = std::f64::consts::LN_2;
        r.losses
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as f64, l / ln2))
            .collect()
    };
    let end = fused.losses.len().max(1) as f64;
    let mut series = vec![
        Series::new("training loss (fused)", Style::Line, bits(fused)),
        Series::new(
            "validation (fused)",
            Style::Dots,
            fused
                .evals
                .iter()
                .map(|e| (e.step as f64, e.val_bits))
                .collect(),
        ),
    ];
    if let Some(c) = composed {
        series.push(Series::new(
            "training loss (composed)",
            Style::Dashed,
            bits(c),
        ));
    }
    series.push(Series::new(
        "bigram bar",
        Style::Dashed,
        vec![(0.0, bi), (end, bi)],
    ));
    series.push(Series::new(
        "unigram - 1.5",
        Style::Dashed,
        vec![(0.0, uni - 1.5), (end, uni - 1.5)],
    ));
    LinePlot {
        title: "Tiny transformer: loss on the text".into(),
        x_label: "step".into(),
        y_label: "bits per character".into(),
        log_y: false,
        series,
    }
}
