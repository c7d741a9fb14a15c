//! `--shadow [EVERY]` for the `train` commands: the observer that hands
//! the training loop a [`Shadow`], the per-layer table and the plot.

use crate::plot::{LinePlot, Series, Style};
use clap::{value_parser, Arg, ArgMatches};
use fusegrad::error::Result;
use fusegrad::nn::EvalPoint;
use fusegrad::nn::{Observer, Step};
use fusegrad::shadow::{Check, Shadow, ShadowConfig, SiteReport};
use std::path::{Path, PathBuf};

/// Steps between checks when `--shadow` is given without a number.
pub const DEFAULT_EVERY: usize = 10;

/// `--shadow [EVERY]`.
pub fn arg() -> Arg {
    Arg::new("shadow")
        .long("shadow")
        .value_name("EVERY")
        .num_args(0..=1)
        .default_missing_value("10")
        .value_parser(value_parser!(usize))
        .help("Check every fused LayerNorm against its composed twin on every EVERY-th step (default 10); print a per-layer table and plot the differences")
}

/// The `EVERY` of `--shadow`, if given.
pub fn every_of(m: &ArgMatches) -> Option<usize> {
    m.get_one::<usize>("shadow").copied()
}

/// A shadow checking every `every`-th step, writing replay files of
/// failures to `dir/shadow` when a plot folder is given.
pub fn shadow(every: usize, dir: Option<&Path>) -> Shadow {
    Shadow::new(ShadowConfig {
        replay_dir: dir.map(|d| d.join("shadow")),
        ..ShadowConfig::every(every)
    })
}

/// Another observer, with a shadow for the training loop to watch with.
pub struct Watching<'a> {
    pub inner: &'a mut dyn Observer,
    pub shadow: &'a Shadow,
}

impl Observer for Watching<'_> {
    fn on_step(&mut self, step: &Step) {
        self.inner.on_step(step)
    }
    fn on_eval(&mut self, eval: &EvalPoint) {
        self.inner.on_eval(eval)
    }
    fn shadow(&self) -> Option<&Shadow> {
        Some(self.shadow)
    }
}

fn stats(c: &Check) -> String {
    match c.row {
        Some(r) => format!(
            "row {} mean {:.3e} var {:.3e} [{:.3e}, {:.3e}]",
            r.row, r.mean, r.var, r.min, r.max
        ),
        None => "-".into(),
    }
}

fn cell(c: &Option<Check>) -> String {
    match c {
        Some(c) => format!("{:.2e} / {:.2e} {:<6}", c.diff, c.tol, c.result),
        None => "-".into(),
    }
}

/// The per-layer table: op, layer, calls checked, the worst output and
/// gradient difference against tolerance, and the worst row's statistics.
pub fn table(sites: &[SiteReport]) -> String {
    // Columns as wide as their longest entry (`attention_qkv`, sites).
    let op_w = sites.iter().map(|s| s.op.len()).fold(11, usize::max);
    let site_w = sites.iter().map(|s| s.site.len()).fold(14, usize::max);
    let mut out = format!(
        "{:<op_w$} {:<site_w$} {:>6} {:>28} {:>28}  {}\n",
        "op", "layer", "calls", "output diff / tol", "gradient diff / tol", "worst row"
    );
    for s in sites {
        let worst = [&s.worst_grad, &s.worst_output]
            .into_iter()
            .flatten()
            .max_by(|a, b| (a.diff / a.tol).total_cmp(&(b.diff / b.tol)));
        out += &format!(
            "{:<op_w$} {:<site_w$} {:>6} {:>28} {:>28}  {}{}\n",
            s.op,
            s.site,
            s.calls,
            cell(&s.worst_output),
            cell(&s.worst_grad),
            worst.map_or("-".into(), stats),
            if s.failures > 0 {
                format!("  PAST TOLERANCE {} times", s.failures)
            } else {
                String::new()
            }
        );
    }
    out
}

/// Prints the table, one line of verdict and the replay files written.
pub fn print(shadow: &Shadow) {
    let sites = shadow.sites();
    println!(
        "shadow check, fused vs composed every {} steps:",
        shadow.config().every
    );
    print!("{}", table(&sites));
    let worst = sites
        .iter()
        .map(SiteReport::worst_ratio)
        .fold(0.0, f64::max);
    if shadow.all_passed() {
        println!(
            "every layer within tolerance (worst at {:.1}% of its tolerance)",
            100.0 * worst
        );
    } else {
        println!("SOME LAYERS PAST TOLERANCE");
    }
    for s in &sites {
        if let Some(f) = &s.replay {
            println!("replay of {}: fusegrad replay {}", s.site, f.display());
        }
    }
}

/// Difference over tolerance per checked step, one line per layer.
pub fn plot(sites: &[SiteReport], title: &str) -> LinePlot {
    let mut series: Vec<Series> = sites
        .iter()
        .map(|s| {
            let pts = s
                .history
                .iter()
                .map(|&(step, r)| (step as f64, r.max(1e-6)))
                .collect();
            Series::new(format!("{} ({})", s.site, s.op), Style::Line, pts)
        })
        .collect();
    let end = sites
        .iter()
        .flat_map(|s| s.history.last())
        .map(|h| h.0 as f64)
        .fold(1.0, f64::max);
    series.push(Series::new(
        "tolerance",
        Style::Dashed,
        vec![(0.0, 1.0), (end, 1.0)],
    ));
    LinePlot {
        title: title.into(),
        x_label: "step".into(),
        y_label: "worst |fused - composed| / tolerance (log scale)".into(),
        log_y: true,
        series,
    }
}

/// With a shadow: prints its table, writes its plot to `dir/<name>.png`
/// and `.svg` (added to `files`) and returns its sites.
pub fn finish(
    shadow: Option<&Shadow>,
    dir: Option<&Path>,
    name: &str,
    title: &str,
    files: &mut Vec<PathBuf>,
) -> Result<Vec<SiteReport>> {
    let Some(shadow) = shadow else {
        return Ok(Vec::new());
    };
    print(shadow);
    let sites = shadow.sites();
    if let Some(dir) = dir {
        let both = plot(&sites, title).write_both(dir, name)?;
        println!(
            "shadow plot: {} and {}",
            both[0].display(),
            both[1].display()
        );
        files.extend(both);
    }
    Ok(sites)
}

/// The report's section: the spiral MLP trained for `steps` with every
/// `every`-th step shadowed; the table, and whether every layer passed.
pub fn spirals_report(steps: usize, every: usize) -> Result<bool> {
    use crate::demo::{train_spirals_observed, SpiralConfig};
    use fusegrad::nn::Silent;
    let shadow = shadow(every, None);
    let mut quiet = Silent;
    let mut w = Watching {
        inner: &mut quiet,
        shadow: &shadow,
    };
    let config = SpiralConfig {
        steps,
        ..SpiralConfig::default()
    };
    train_spirals_observed::<f32>(&config, &mut w)?;
    print(&shadow);
    Ok(shadow.all_passed())
}
