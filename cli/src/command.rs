//! The `fusegrad` command: checks, demonstrates and benchmarks.
//!
//! `fusegrad` runs the whole report; `fusegrad check`, `fusegrad stability
//! [--plot FILE]`, `fusegrad bench [--json] [--prims] [--device cpu|cuda]
//! [--shapes NxD,...] [--reps N]` and `fusegrad bench --train [--json]
//! [--steps N] [--warmup N] [--profile-every K]` run one part; `fusegrad train
//! spirals|transformer [OPTIONS]` trains with a progress bar and writes loss
//! plots; `fusegrad replay FILE` reruns a shadow check's replay file. `fusegrad --help` says the same.
//! Exit status: 0 done, 1 a failed check or an error, 2 a usage error.

use crate::app::{matches_or_exit, spirals, transformer};
use crate::{analysis, bench, report, stability};
use clap::{value_parser, Arg, ArgAction, Command};
use fusegrad::{gradcheck, Device, Result};
use std::path::PathBuf;

fn section(title: &str) {
    println!("\n== {title} ==\n");
}

fn primitives() -> Result<bool> {
    section("Primitive ops: analytic gradient vs central differences (f64, random cotangent)");
    println!("{}", gradcheck::Report::header());
    let mut ok = true;
    for r in report::primitive_gradchecks()? {
        print!("{r}");
        ok &= r.passed();
    }
    Ok(ok)
}

fn norms() -> Result<()> {
    section(
        "LayerNorm and RMSNorm: fused vs composed vs finite differences (f64, random cotangent)",
    );
    println!(
        "columns: y f-c and grad f-c = fused vs composed; vs FD = fused vs central differences;"
    );
    println!(
        "each is max|diff| over the size of the terms forming the result (see docs/layernorm.md)\n"
    );
    print!("{}", analysis::three_way_table()?);
    section("Memory, FLOPs and bytes moved: fused vs composed (measured on the tape and kernels)");
    print!("{}", analysis::default_report()?);
    Ok(())
}

fn training() -> Result<bool> {
    section(
        "Training: MLP with LayerNorm on 3-arm spirals, fused vs composed LayerNorm (f32, Adam)",
    );
    let a = crate::demo::compare_spirals(300)?;
    for (name, r) in [("fused", &a.fused), ("composed", &a.composed)] {
        println!(
            "{name:<9} loss {:.4} -> {:.6}  train acc {:.3}  held-out acc {:.3}  ({:.2} s)",
            r.losses.first().copied().unwrap_or(f64::NAN),
            r.final_loss,
            r.train_accuracy.unwrap_or(f64::NAN),
            r.test_accuracy.unwrap_or(f64::NAN),
            r.seconds
        );
    }
    println!(
        "per-step loss difference, fused vs composed: max abs {:.2e}, max rel {:.2e}",
        a.max_abs_diff, a.max_rel_diff
    );
    section("Shadow check: the spirals run again, each fused LayerNorm checked against its twin every 10th step");
    crate::app::shadow::spirals_report(300, 10)
}

fn stability_demo(plot: PathBuf) -> Result<()> {
    section("Stability: variance in f32 over growing row offsets (naive vs two-pass vs Welford)");
    let rep = stability::run_demo(&plot)?;
    print!("{rep}");
    println!("\nplot written to {}", plot.display());
    Ok(())
}

/// The default report benchmarks three shapes briefly; `fusegrad bench`
/// runs all eight of [`bench::SHAPES`].
const QUICK_SHAPES: [(usize, usize); 3] = [(4096, 768), (16384, 1024), (1024, 16384)];

fn benchmark(all: bool, json: bool) -> Result<()> {
    let (shapes, budget): (&[(usize, usize)], f64) = if all {
        (&bench::SHAPES, 1.0)
    } else {
        (&QUICK_SHAPES, 0.3)
    };
    if json {
        // The LayerNorm report's object, with the primitives' rows added.
        let ln = bench::run(shapes, budget, true)?.json();
        let prims: Vec<String> = bench::run_prims(budget)?.iter().map(|r| r.json()).collect();
        let body = ln.strip_suffix('}').unwrap_or(&ln);
        println!("{body},\"primitives\":[{}]}}", prims.join(","));
        return Ok(());
    }
    section("Benchmark: fused LayerNorm fwd+bwd vs same-run copy and composed twin (f32)");
    println!("{}", bench::run(shapes, budget, true)?);
    section("Benchmark: primitive ops vs a same-run copy or read of their bytes (f32)");
    println!("{}", bench::PRIM_HEADER);
    for r in bench::run_prims(budget)? {
        println!("{r}");
    }
    if !all {
        println!("(`cargo run --release -- bench` runs all eight shapes; see docs/performance.md)");
    }
    Ok(())
}

fn prims_only() -> Result<()> {
    section("Benchmark: primitive ops vs a same-run copy or read of their bytes (f32)");
    println!("{}", bench::PRIM_HEADER);
    for r in bench::run_prims(1.0)? {
        println!("{r}");
    }
    Ok(())
}

/// `bench --train`: the training step's speed, memory and breakdown.
fn train_bench(a: &clap::ArgMatches) -> Result<()> {
    let d = bench::TrainBenchConfig::default();
    let get = |id: &str, default: usize| a.get_one::<u32>(id).map_or(default, |&v| v as usize);
    let config = bench::TrainBenchConfig {
        steps: get("steps", d.steps),
        warmup: get("warmup", d.warmup),
        profile_every: get("profile-every", d.profile_every),
        ..d
    };
    if let Some(&every) = a.get_one::<u32>("shadow") {
        let pairs = a.get_one::<u32>("pairs").map_or(3, |&p| p as usize);
        print!(
            "{}",
            bench::run_shadow_cost(&config, every as usize, pairs)?
        );
        return Ok(());
    }
    let r = bench::run_train(&config)?;
    if a.get_flag("json") {
        println!("{}", r.json());
    } else {
        section("Benchmark: the default transformer's training step (f32, CPU)");
        print!("{r}");
    }
    Ok(())
}

/// Every kernel compiled for `archs` (or read from the kernel cache:
/// `cache`, else the process's), as a table; false on any spill.
#[cfg(feature = "cuda")]
fn kernels(archs: &[u32], cache: Option<&std::path::Path>) -> Result<bool> {
    use fusegrad::device;
    // Without NVRTC the table is the cache's, as its entries' compiler made it.
    match device::nvrtc_info() {
        Ok(n) => println!("{n}"),
        Err(e) => println!("NVRTC: none here, the table is read from the kernel cache ({e})"),
    }
    let rows = fusegrad::kernel_table(archs, cache)?;
    println!(
        "{:<14} {:<30} {:>6} {:>5} {:>6} {:>6}",
        "family", "kernel", "arch", "regs", "smem", "spill"
    );
    for r in &rows {
        println!(
            "{:<14} {:<30} {:>6} {:>5} {:>6} {:>6}",
            r.family,
            r.kernel,
            format!("sm_{}", r.arch),
            r.registers,
            r.shared_bytes,
            r.spill_bytes
        );
    }
    let spills = rows.iter().filter(|r| r.spill_bytes > 0).count();
    println!("\n{} kernels, {spills} with spills", rows.len());
    let st = device::kernel_stats();
    let dir = cache.map(|d| d.to_path_buf()).or(st.dir);
    println!(
        "kernel cache {}: {} families compiled now ({:.1} s), {} read from it",
        dir.map_or("off".into(), |d| d.display().to_string()),
        st.compiled,
        st.compile_seconds,
        st.loaded
    );
    Ok(spills == 0)
}

/// `fusegrad devices`: the CUDA report; false when no GPU can be used
/// (or, with `load`, a family cannot load).
#[cfg(feature = "cuda")]
fn devices(load: bool) -> Result<bool> {
    let r = fusegrad::cuda_report(load);
    print!("{r}");
    Ok(r.usable)
}

#[cfg(not(feature = "cuda"))]
fn devices(_load: bool) -> Result<bool> {
    println!("GPU: none usable (built without the `cuda` feature)");
    Ok(false)
}

/// The fused norms on the GPU against a same-run copy and the composed
/// twin (CUDA events, median of `reps`), one line per row as soon as it is
/// measured: a table line, or with `json` one JSON object per line after a
/// header object.
#[cfg(feature = "cuda")]
fn bench_cuda(
    json: bool,
    first: &FirstResult,
    shapes: Option<&[(usize, usize)]>,
    reps: Option<usize>,
) -> Result<bool> {
    use std::io::Write;
    let shapes = shapes.unwrap_or(&bench::CUDA_SHAPES);
    let reps = reps.unwrap_or(bench::CUDA_REPS);
    let mut out = std::io::stdout();
    // Each line is flushed before the next row is measured, so a run cut
    // short leaves every finished row in the file.
    let mut line = |s: &str| -> Result<()> {
        writeln!(out, "{s}")
            .and_then(|()| out.flush())
            .map_err(|e| fusegrad::Error::InvalidArgument {
                op: "bench: writing stdout",
                msg: e.to_string(),
            })
    };
    if json {
        line(&bench::cuda_json_header(reps)?)?;
        line(&first.json())?;
        bench::run_cuda(shapes, reps, |r| line(&r.json()))?;
    } else {
        section(&format!(
            "Benchmark on cuda:0 ({}): fused norms vs same-run device copy and composed twin",
            bench::cuda_device_name()?
        ));
        line(&format!(
            "median of {reps} reps timed with CUDA events; a window holds {}",
            bench::CUDA_WINDOW
        ))?;
        line(&first.to_string())?;
        line(bench::CUDA_HEADER)?;
        bench::run_cuda(shapes, reps, |r| line(&r.to_string()))?;
    }
    Ok(true)
}

/// A process's first use of the GPU: the time from asking for the
/// device to a fused LayerNorm forward's values on the host, and what the
/// kernel cache did meanwhile.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct FirstResult {
    ms: f64,
    #[cfg(feature = "cuda")]
    stats: fusegrad::device::KernelStats,
}

#[cfg(feature = "cuda")]
fn first_result() -> Result<FirstResult> {
    use fusegrad::{ops, Tape, Tensor};
    let t = std::time::Instant::now();
    let dev = Device::Cuda(0);
    dev.ensure_available()?;
    let tape = Tape::<f32>::new();
    let x = Tensor::from_vec(vec![8, 64], (0..512).map(|i| (i % 7) as f32).collect())?;
    let y = ops::layer_norm(&tape.var_on(x, dev)?, None, None, 1e-5)?;
    y.value().to_vec()?;
    Ok(FirstResult {
        ms: t.elapsed().as_secs_f64() * 1e3,
        stats: fusegrad::device::kernel_stats(),
    })
}

#[cfg(feature = "cuda")]
impl FirstResult {
    fn json(&self) -> String {
        format!(
            "{{\"first_result_ms\":{:.1},\"compiled\":{},\"compile_s\":{:.2},\"loaded\":{}}}",
            self.ms, self.stats.compiled, self.stats.compile_seconds, self.stats.loaded
        )
    }
}

#[cfg(feature = "cuda")]
impl std::fmt::Display for FirstResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.stats;
        write!(
            f,
            "first result: a LayerNorm forward's values on the host {:.0} ms after the device \
             was first asked for; kernels: {} compiled ({:.1} s), {} read from the cache ({})",
            self.ms,
            s.compiled,
            s.compile_seconds,
            s.loaded,
            s.dir
                .as_ref()
                .map_or("off".into(), |d| d.display().to_string())
        )
    }
}

#[cfg(not(feature = "cuda"))]
fn first_result() -> Result<FirstResult> {
    Device::Cuda(0).ensure_available()?;
    Ok(FirstResult { ms: 0.0 })
}

#[cfg(not(feature = "cuda"))]
fn bench_cuda(
    _json: bool,
    _first: &FirstResult,
    _shapes: Option<&[(usize, usize)]>,
    _reps: Option<usize>,
) -> Result<bool> {
    Device::Cuda(0).ensure_available().map(|_| false)
}

/// `--shapes NxD,NxD,...`: at least one shape, every N and D at least 1.
fn parse_shapes(s: &str) -> std::result::Result<Vec<(usize, usize)>, String> {
    s.split(',')
        .map(|t| {
            let (n, d) = t
                .trim()
                .split_once(['x', 'X'])
                .ok_or_else(|| format!("{t:?} is not NxD"))?;
            let dim = |v: &str| match v.trim().parse::<usize>() {
                Ok(k) if k > 0 => Ok(k),
                _ => Err(format!("{t:?}: {v:?} is not a positive integer")),
            };
            let (n, d) = (dim(n)?, dim(d)?);
            n.checked_mul(d)
                .ok_or_else(|| format!("{t:?} has too many elements"))?;
            Ok((n, d))
        })
        .collect()
}

#[cfg(not(feature = "cuda"))]
fn kernels(_archs: &[u32], _cache: Option<&std::path::Path>) -> Result<bool> {
    Device::Cuda(0).ensure_available().map(|_| false)
}

/// `sm_90` (or `90`) as 90.
fn parse_arch(s: &str) -> std::result::Result<u32, String> {
    s.strip_prefix("sm_")
        .unwrap_or(s)
        .parse::<u32>()
        .ok()
        .filter(|a| (30..=200).contains(a))
        .ok_or_else(|| format!("{s:?} is not an architecture like sm_90"))
}

/// The command line: subcommands and their flags. Unknown flags and stray
/// arguments are errors that show the usage.
fn cli() -> Command {
    Command::new("fusegrad")
        .about("Reverse-mode autodiff with a fused, gradient-checked LayerNorm.\n\nWith no command: the whole report (checks, stability, training, a short benchmark).")
        .subcommand(Command::new("check").about("Gradient checks of every primitive op and the fused/composed norms"))
        .subcommand(
            Command::new("stability")
                .about("Variance in f32 over growing row offsets: naive vs two-pass vs Welford")
                .arg(
                    Arg::new("plot")
                        .long("plot")
                        .value_name("FILE")
                        .value_parser(value_parser!(PathBuf))
                        .default_value("target/stability.svg")
                        .help("Where to write the plot; a name ending in .svg writes SVG, in .png a PNG"),
                ),
        )
        .subcommand(
            Command::new("devices")
                .about("What fusegrad finds of CUDA here: the GPU, the driver, NVRTC, cuBLAS and the kernel cache (exit status 1 if no GPU can be used)")
                .arg(Arg::new("load").long("load").action(ArgAction::SetTrue).help("Also load every kernel family on cuda:0 (from the cache, from PTX where the driver refuses a CUBIN, compiled where missing); exit status 1 if one cannot load")),
        )
        .subcommand(
            Command::new("kernels")
                .about("Compile every CUDA kernel with NVRTC (no GPU needed) into the kernel cache and show registers, shared memory and spills")
                .arg(
                    Arg::new("arch")
                        .long("arch")
                        .value_name("sm_XY")
                        .action(ArgAction::Append)
                        .value_parser(parse_arch)
                        .help("An architecture to compile for (repeatable; default sm_80 and sm_90)"),
                )
                .arg(
                    Arg::new("cache")
                        .long("cache")
                        .value_name("DIR")
                        .value_parser(value_parser!(PathBuf))
                        .help("The kernel cache to fill (default: $FUSEGRAD_CACHE_DIR, else ~/.cache/fusegrad)"),
                ),
        )
        .subcommand(
            Command::new("bench")
                .about("Fused LayerNorm fwd+bwd against a same-run copy and the composed twin, all eight shapes; then the primitive ops")
                .arg(Arg::new("json").long("json").action(ArgAction::SetTrue).help("JSON instead of tables; with --device cuda, JSON Lines: a header object, then one object per row as it is measured"))
                .arg(Arg::new("prims").long("prims").action(ArgAction::SetTrue).help("Only the primitive ops"))
                .arg(Arg::new("train").long("train").action(ArgAction::SetTrue).conflicts_with("prims").help("Instead: the default transformer's training step (forward, backward, clip, AdamW): tokens/s, peak memory and a breakdown by op family"))
                .arg(
                    Arg::new("steps")
                        .long("steps")
                        .value_name("N")
                        .requires("train")
                        .value_parser(value_parser!(u32).range(1..=1_000_000))
                        .help("With --train: timed steps, median reported (default 80)"),
                )
                .arg(
                    Arg::new("warmup")
                        .long("warmup")
                        .value_name("N")
                        .requires("train")
                        .value_parser(value_parser!(u32).range(0..=1_000_000))
                        .help("With --train: untimed steps first (default 5)"),
                )
                .arg(
                    Arg::new("shadow")
                        .long("shadow")
                        .value_name("EVERY")
                        .requires("train")
                        .value_parser(value_parser!(u32).range(1..=1_000_000))
                        .help("With --train: instead, the shadow check's cost: blocks of EVERY steps, plain and with their first step checked, alternating; the mean step's overhead"),
                )
                .arg(
                    Arg::new("pairs")
                        .long("pairs")
                        .value_name("N")
                        .requires("shadow")
                        .value_parser(value_parser!(u32).range(1..=1_000))
                        .help("With --shadow: alternating pairs of blocks (default 3)"),
                )
                .arg(
                    Arg::new("profile-every")
                        .long("profile-every")
                        .value_name("K")
                        .requires("train")
                        .value_parser(value_parser!(u32).range(0..=1_000_000))
                        .help("With --train: a profiled step after every K timed ones, for the breakdown; 0: no breakdown (default 4)"),
                )
                .arg(
                    Arg::new("device")
                        .long("device")
                        .value_parser(["cpu", "cuda"])
                        .default_value("cpu")
                        .help("Where to run"),
                )
                .arg(
                    Arg::new("shapes")
                        .long("shapes")
                        .value_name("NxD,...")
                        .value_parser(parse_shapes)
                        .help("With --device cuda: the shapes to time (default: the five GPU targets)"),
                )
                .arg(
                    Arg::new("reps")
                        .long("reps")
                        .value_name("N")
                        .value_parser(value_parser!(u32).range(1..=100_000))
                        .help("With --device cuda: timed reps per figure, median reported (default 20)"),
                ),
        )
        .subcommand(
            Command::new("replay")
                .about("Rerun a shadow check's replay file fused and composed, and print both (exit status 1 if they still differ past tolerance)")
                .arg(Arg::new("file").value_name("FILE").required(true).value_parser(value_parser!(PathBuf)))
                .arg(
                    Arg::new("device")
                        .long("device")
                        .value_parser(["cpu", "cuda"])
                        .default_value("cpu")
                        .help("Where to rerun it"),
                ),
        )
        .subcommand(
            Command::new("train")
                .about("Train a small network with a progress bar; writes its loss plot to target/plots/")
                .subcommand_required(true)
                .subcommand(spirals::command("spirals"))
                .subcommand(transformer::command("transformer")),
        )
}

fn run() -> Result<bool> {
    // --help prints and succeeds; anything else unparsable is a usage error.
    let m = matches_or_exit(cli());
    match m.subcommand() {
        None => {
            section("Devices");
            match Device::cuda_status() {
                Ok(gpu) => println!(
                    "GPU: {gpu} (`fusegrad bench --device cuda` times the fused norms there)"
                ),
                Err(why) => {
                    println!("GPU: none usable, so everything below runs on the CPU ({why})")
                }
            }
            #[cfg(feature = "cuda")]
            match fusegrad::device::nvrtc_info() {
                Ok(n) => println!("kernel compiler: {n}"),
                Err(e) => println!("kernel compiler: none ({e})"),
            }
            println!("(`fusegrad devices` says more: the driver, cuBLAS, the kernel cache)");
            let ok = primitives()?;
            norms()?;
            stability_demo(PathBuf::from("target/stability.svg"))?;
            let trained = training()?;
            benchmark(false, false)?;
            Ok(ok && trained)
        }
        Some(("check", _)) => {
            let ok = primitives()?;
            norms()?;
            Ok(ok)
        }
        Some(("stability", a)) => {
            let plot = a.get_one::<PathBuf>("plot").cloned().unwrap_or_default();
            // A bad extension fails before the measurement, not after it.
            crate::plot::Format::from_path(&plot)?;
            stability_demo(plot).map(|_| true)
        }
        Some(("devices", a)) => devices(a.get_flag("load")),
        Some(("kernels", a)) => {
            let archs: Vec<u32> = match a.get_many::<u32>("arch") {
                Some(v) => v.copied().collect(),
                None => vec![80, 90],
            };
            kernels(&archs, a.get_one::<PathBuf>("cache").map(PathBuf::as_path))
        }
        Some(("bench", a)) => {
            let shapes = a.get_one::<Vec<(usize, usize)>>("shapes");
            let reps = a.get_one::<u32>("reps").map(|&r| r as usize);
            let cuda = a.get_one::<String>("device").map(String::as_str) == Some("cuda");
            if cuda && a.get_flag("train") {
                cli()
                    .error(
                        clap::error::ErrorKind::ArgumentConflict,
                        "`bench --train` runs on the CPU only",
                    )
                    .exit();
            }
            if cuda {
                let first = first_result()?;
                return bench_cuda(a.get_flag("json"), &first, shapes.map(Vec::as_slice), reps);
            }
            if shapes.is_some() || reps.is_some() {
                cli()
                    .error(
                        clap::error::ErrorKind::ArgumentConflict,
                        "--shapes and --reps apply to `bench --device cuda` only",
                    )
                    .exit();
            }
            if a.get_flag("train") {
                train_bench(a).map(|_| true)
            } else if a.get_flag("prims") {
                prims_only().map(|_| true)
            } else {
                benchmark(true, a.get_flag("json")).map(|_| true)
            }
        }
        Some(("replay", a)) => {
            let file = a.get_one::<PathBuf>("file").cloned().unwrap_or_default();
            let device = match a.get_one::<String>("device").map(String::as_str) {
                Some("cuda") => {
                    Device::Cuda(0).ensure_available()?;
                    Device::Cuda(0)
                }
                _ => Device::Cpu,
            };
            let r = fusegrad::shadow::replay(&file, device, fusegrad::ShadowConfig::every(1))?;
            print!("{r}");
            Ok(r.checks.iter().all(|c| c.passed()))
        }
        Some(("train", t)) => match t.subcommand() {
            Some(("spirals", a)) => spirals::run(&spirals::Options::from_matches(a)?).map(|_| true),
            Some(("transformer", a)) => {
                transformer::run_any(&transformer::Options::from_matches(a)?).map(|_| true)
            }
            _ => Ok(false),
        },
        Some((other, _)) => {
            eprintln!("unknown command {other:?}");
            Ok(false)
        }
    }
}

/// Runs the command line and exits with its status.
pub fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("fusegrad: {e}");
            std::process::exit(1);
        }
    }
}
