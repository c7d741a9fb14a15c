//! `fusegrad train spirals`: the spiral MLP of [`crate::demo`] with a
//! progress bar, its final figures and a loss plot.

use super::shadow::Watching;
use super::{common_args, device_of, get, persist_of, precision_of, state_args, Precision};
use super::{parallel_args, parallel_of, with_engine, Parallel};
use crate::char_lm::Dp;
use crate::checkpoint::Persist;
use crate::demo::{train_spirals_parallel, Agreement, SpiralConfig, TrainReport};
use crate::plot::{LinePlot, Series, Style};
use crate::progress::Bar;
use clap::{value_parser, Arg, ArgMatches, Command};
use fusegrad::error::Result;
use fusegrad::nn::NormImpl;
use fusegrad::shadow::{Shadow, SiteReport};
use fusegrad::Device;
use std::path::PathBuf;

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Data, network and optimizer settings (`norm_impl` is ignored: the
    /// run is fused, and `composed` adds the composed twin).
    pub config: SpiralConfig,
    /// Also train the composed-LayerNorm twin and compare the curves.
    pub composed: bool,
    /// Where to train (checked by [`Options::from_matches`]).
    pub device: Device,
    /// Folder for `spirals_loss.png` and `.svg`; `None` writes no plot.
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
    /// Data parallelism (`--data-parallel`): the points are shared out
    /// over the ranks.
    pub parallel: Option<Parallel>,
}

impl Default for Options {
    /// [`SpiralConfig::default`], fused only, plots to `target/plots`, no bar.
    fn default() -> Self {
        Options {
            config: SpiralConfig::default(),
            composed: false,
            device: Device::Cpu,
            plots: Some(PathBuf::from(super::PLOTS_DIR)),
            progress: false,
            shadow: None,
            precision: Precision::F32,
            persist: Persist::none(),
            parallel: None,
        }
    }
}

/// The subcommand `name` with its options and help.
/// Defaults are [`SpiralConfig::default`]'s, written out for `--help` (a
/// test checks they agree).
pub fn command(name: &'static str) -> Command {
    Command::new(name)
        .about("Train a small MLP with LayerNorm to tell three interleaved spirals apart")
        .long_about(
            "Train a small MLP with LayerNorm to tell three interleaved spirals apart \
             (2 -> 32 -> LN -> GELU -> 32 -> LN -> GELU -> 3, full-batch Adam, f32 or bf16). \
             Shows a progress bar, prints the loss and accuracies, and writes the loss curve \
             to DIR/spirals_loss.png and .svg. With --checkpoint it saves its whole state; \
             --resume continues it bit for bit.",
        )
        .arg(
            Arg::new("steps")
                .long("steps")
                .value_name("N")
                .value_parser(value_parser!(usize))
                .default_value("300")
                .help("Adam steps"),
        )
        .arg(
            Arg::new("seed")
                .long("seed")
                .value_name("S")
                .value_parser(value_parser!(u64))
                .default_value("42")
                .help("Seed of the data and the weights"),
        )
        .arg(
            Arg::new("hidden")
                .long("hidden")
                .value_name("WIDTH")
                .value_parser(value_parser!(usize))
                .default_value("32")
                .help("Width of the two hidden layers"),
        )
        .args(common_args(
            "Also train with the composed LayerNorm from the same seed and compare the loss curves",
        ))
        .arg(super::shadow::arg())
        .args(state_args())
        .args(parallel_args())
}

impl Options {
    /// The options given on the command line of [`command`]; `--device cuda`
    /// is an error when no CUDA backend can run.
    pub fn from_matches(m: &ArgMatches) -> Result<Options> {
        let d = Options::default();
        Ok(Options {
            config: SpiralConfig {
                steps: get(m, "steps", d.config.steps),
                seed: get(m, "seed", d.config.seed),
                hidden: get(m, "hidden", d.config.hidden),
                ..d.config
            },
            composed: m.get_flag("composed"),
            device: device_of(m)?,
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
pub struct Summary {
    /// The fused run.
    pub fused: TrainReport,
    /// The composed twin and its agreement with the fused run, if asked.
    pub agreement: Option<Agreement>,
    /// The plot files written.
    pub plots: Vec<PathBuf>,
    /// The shadow check's sites, with `--shadow`.
    pub shadow: Vec<SiteReport>,
}

fn train(
    o: &Options,
    imp: NormImpl,
    shadow: Option<&Shadow>,
    persist: &Persist,
    dp: Option<&mut Dp>,
) -> Result<TrainReport> {
    let config = SpiralConfig {
        norm_impl: imp,
        ..o.config
    };
    let mut bar = if o.progress && !super::quiet() {
        Bar::new(config.steps, "samples")
    } else {
        Bar::quiet("samples")
    };
    let mut watched;
    let obs: &mut dyn fusegrad::nn::Observer = match shadow {
        Some(shadow) => {
            watched = Watching {
                inner: &mut bar,
                shadow,
            };
            &mut watched
        }
        None => &mut bar,
    };
    let r = match o.precision {
        Precision::F32 => train_spirals_parallel::<f32>(&config, obs, persist, dp),
        Precision::Bf16 => train_spirals_parallel::<half::bf16>(&config, obs, persist, dp),
        Precision::F64 => train_spirals_parallel::<f64>(&config, obs, persist, dp),
    };
    bar.finish();
    r
}

/// The run's figures on one line; `n` is the number of training points.
fn line(name: &str, r: &TrainReport, n: usize) -> String {
    let pct = |v: Option<f64>| 100.0 * v.unwrap_or(f64::NAN);
    let rate = (r.losses.len() * n) as f64 / r.seconds.max(1e-9);
    format!(
        "{name:<9} {} params, loss {:.4} -> {:.4}, train acc {:.1}%, held-out acc {:.1}%, {:.2} s ({rate:.0} samples/s)",
        r.params,
        r.losses.first().copied().unwrap_or(f64::NAN),
        r.final_loss,
        pct(r.train_accuracy),
        pct(r.test_accuracy),
        r.seconds
    )
}

/// Trains, prints the figures as plain lines and writes the plot; with
/// `--data-parallel`, as one rank of the launcher's world (only rank 0
/// prints and writes).
pub fn run(o: &Options) -> Result<Summary> {
    with_engine(o.parallel.as_ref(), o.device, |dp, device| {
        run_on(
            &Options {
                device,
                ..o.clone()
            },
            dp,
        )
    })
}

fn run_on(o: &Options, mut dp: Option<&mut Dp>) -> Result<Summary> {
    let c = &o.config;
    say!(
        "spirals: {} classes x {} points, noise {}; MLP 2 -> {h} -> LN -> GELU -> {h} -> LN -> GELU -> {}; Adam lr {}, {} steps, {}, {}",
        c.classes, c.per_class, c.noise, c.classes, c.lr, c.steps, o.precision.name(), o.device, h = c.hidden
    );
    let n = c.classes * c.per_class;
    // Only rank 0 writes files.
    let dir = o.plots.as_deref().filter(|_| !super::quiet());
    let shadow = o.shadow.map(|e| super::shadow::shadow(e, dir));
    let fused = train(
        o,
        NormImpl::Fused,
        shadow.as_ref(),
        &o.persist,
        dp.as_deref_mut(),
    )?;
    say!("{}", line("fused:", &fused, n));
    let agreement = if o.composed {
        let twin = train(o, NormImpl::Composed, None, &Persist::none(), dp)?;
        say!("{}", line("composed:", &twin, n));
        let a = Agreement::of(fused.clone(), twin);
        say!(
            "fused vs composed over {} steps: max |loss diff| {:.2e}, max relative {:.2e}",
            c.steps,
            a.max_abs_diff,
            a.max_rel_diff
        );
        Some(a)
    } else {
        None
    };
    let curve = |r: &TrainReport| {
        r.losses
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as f64, l))
            .collect()
    };
    let mut series = vec![Series::new("fused LayerNorm", Style::Line, curve(&fused))];
    if let Some(a) = &agreement {
        series.push(Series::new(
            "composed LayerNorm",
            Style::Dashed,
            curve(&a.composed),
        ));
    }
    let plot = LinePlot {
        title: format!("Spirals MLP: training loss over {} Adam steps", c.steps),
        x_label: "step".into(),
        y_label: "cross-entropy (nats, log scale)".into(),
        log_y: true,
        series,
    };
    let mut plots = match dir {
        Some(dir) => plot.write_both(dir, "spirals_loss")?.to_vec(),
        None => Vec::new(),
    };
    if let [png, svg] = plots.as_slice() {
        say!("loss plot: {} and {}", png.display(), svg.display());
    }
    let title = "Spirals MLP: fused vs composed LayerNorm while training";
    let shadow_sites =
        super::shadow::finish(shadow.as_ref(), dir, "spirals_shadow", title, &mut plots)?;
    Ok(Summary {
        shadow: shadow_sites,
        fused,
        agreement,
        plots,
    })
}
