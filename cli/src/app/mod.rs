//! The training front ends: `fusegrad train spirals`, `fusegrad train
//! transformer` and `examples/tiny_transformer.rs`. Each run has its
//! options (a plain struct, built from the command line by `clap`), prints
//! its figures as plain lines, shows a progress bar when asked, and writes
//! its loss plot as PNG and SVG. The command and the example call the same
//! code, so they accept the same options.

/// `println!` on rank 0 only: the other ranks of a data-parallel run
/// print nothing.
macro_rules! say {
    ($($t:tt)*) => {
        if !$crate::app::quiet() {
            println!($($t)*)
        }
    };
}

pub mod shadow;
pub mod spirals;
pub mod transformer;

use crate::checkpoint::{home_of, Persist};
use clap::{value_parser, Arg, ArgAction, ArgMatches, Command};
use fusegrad::dist::{launcher_world, Collective, DataParallel, Single};
use fusegrad::error::{Error, Result};
use fusegrad::nn::Checkpoints;
use fusegrad::Device;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::char_lm::Dp;

static QUIET: AtomicBool = AtomicBool::new(false);

/// Whether this process is a data-parallel rank other than 0.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// How a run is spread over ranks (`--data-parallel`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Parallel {
    /// Gradient bucket size in MB (`--bucket-mb`).
    pub bucket_mb: f64,
    /// Time limit of each collective (`--collective-timeout`).
    pub timeout: Duration,
}

/// `--data-parallel`, `--bucket-mb M` and `--collective-timeout S`.
fn parallel_args() -> [Arg; 3] {
    [
        Arg::new("data-parallel")
            .long("data-parallel")
            .action(ArgAction::SetTrue)
            .help("Train as one rank of the MPI job that launched this process (mpirun -np N ...), each rank on its share of an N times larger batch; without a launcher, a world of one"),
        Arg::new("bucket-mb")
            .long("bucket-mb")
            .value_name("M")
            .value_parser(value_parser!(f64))
            .default_value("25")
            .help("With --data-parallel: gradients are summed over ranks in buckets of about M MB, each as soon as its gradients are final"),
        Arg::new("collective-timeout")
            .long("collective-timeout")
            .value_name("S")
            .value_parser(value_parser!(f64))
            .default_value("60")
            .help("With --data-parallel: a collective that waits more than S seconds on another rank ends the run with an error naming it"),
    ]
}

/// What `--data-parallel` and its settings ask for. Being launched as one
/// of several ranks without `--data-parallel` is an error: each rank would
/// train alone and write the same files.
fn parallel_of(m: &ArgMatches) -> Result<Option<Parallel>> {
    let on = m.get_flag("data-parallel");
    if !on {
        if let Some(n) = launcher_world().filter(|&n| n > 1) {
            return Err(Error::InvalidArgument {
                op: "--data-parallel",
                msg: format!(
                    "this process is one of {n} ranks of an MPI launcher; add --data-parallel \
                     (else every rank trains alone and writes the same files)"
                ),
            });
        }
        return Ok(None);
    }
    let timeout: f64 = get(m, "collective-timeout", 60.0);
    let timeout = Duration::try_from_secs_f64(timeout)
        .ok()
        .filter(|t| !t.is_zero())
        .ok_or_else(|| Error::InvalidArgument {
            op: "--collective-timeout",
            msg: format!("{timeout} is not a time limit (want seconds > 0)"),
        })?;
    Ok(Some(Parallel {
        bucket_mb: get(m, "bucket-mb", 25.0),
        timeout,
    }))
}

/// The data parallelism of this process and the device it trains on:
/// over MPI when a launcher started it (in a build with the `mpi`
/// feature), else a world of one. Ranks asked to train on CUDA take GPU
/// `rank % count` and sum over NCCL, bootstrapped over MPI. Ranks other
/// than 0 go quiet.
pub fn engine(p: &Parallel, device: Device) -> Result<(Dp, Device)> {
    let comm: Box<dyn Collective> = match launcher_world() {
        #[cfg(feature = "mpi")]
        Some(_) => Box::new(fusegrad_mpi::Mpi::init(p.timeout)?),
        #[cfg(not(feature = "mpi"))]
        Some(n) if n > 1 => {
            return Err(Error::InvalidArgument {
                op: "--data-parallel",
                msg: format!(
                    "this process is one of {n} ranks of an MPI launcher, but this fusegrad \
                     was built without MPI: build it with `cargo build --release --features mpi` \
                     (needs an MPI such as Debian's libopenmpi-dev)"
                ),
            })
        }
        _ => Box::new(Single::new()),
    };
    let (comm, device) = match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(_) if comm.world() > 1 => {
            let gpu = Device::Cuda(comm.rank() % Device::cuda_count()?.max(1));
            let nccl = fusegrad::dist::Nccl::over(comm, gpu, p.timeout)?;
            (Box::new(nccl) as Box<dyn Collective>, gpu)
        }
        d => (comm, d),
    };
    let dp = DataParallel::new(comm).bucket_mb(p.bucket_mb)?;
    QUIET.store(dp.rank() != 0, Ordering::Relaxed);
    Ok((dp, device))
}

/// Runs `f` on the data parallelism `p` asks for (if any) and this rank's
/// device (`device`, or with CUDA its GPU of the node); an error on any
/// rank is printed with its rank and ends every rank.
pub fn with_engine<R>(
    p: Option<&Parallel>,
    device: Device,
    f: impl FnOnce(Option<&mut Dp>, Device) -> Result<R>,
) -> Result<R> {
    let Some(p) = p else {
        return f(None, device);
    };
    let (mut dp, device) = engine(p, device)?;
    let r = f(Some(&mut dp), device);
    match &r {
        Err(e) if dp.world() > 1 => {
            eprintln!("fusegrad: rank {}: {e}", dp.rank());
            dp.comm().abort_all(1);
        }
        Ok(_) => {
            let s = dp.stats();
            let per = |d: Duration| d.as_secs_f64() * 1e3 / s.steps.max(1) as f64;
            say!(
                "data parallel: {} ranks, {} buckets of <= {} MB a step, {:.2} ms a step in sums during the backward, {:.2} ms waiting after it",
                dp.world(),
                s.buckets / s.steps.max(1),
                p.bucket_mb,
                per(s.overlapped),
                per(s.waiting)
            );
        }
        _ => {}
    }
    r
}

/// The element type a run trains in (`--dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// `f32` weights, moments and arithmetic.
    #[default]
    F32,
    /// `bf16` weights and activations; f32 moments and accumulation.
    Bf16,
    /// `f64` throughout (for checks of exactness).
    F64,
}

impl Precision {
    /// Its name on the command line and in checkpoints.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F64 => "f64",
        }
    }
}

/// `--dtype`, `--checkpoint DIR`, `--checkpoint-every N`, `--keep K` and
/// `--resume DIR`, shared by both runs.
fn state_args() -> [Arg; 5] {
    let dir = |id: &'static str, help: &'static str| {
        Arg::new(id)
            .long(id)
            .value_name("DIR")
            .value_parser(value_parser!(PathBuf))
            .help(help)
    };
    let count = |id: &'static str, name: &'static str, help: &'static str| {
        Arg::new(id)
            .long(id)
            .value_name(name)
            .value_parser(value_parser!(usize))
            .help(help)
    };
    [
        Arg::new("dtype")
            .long("dtype")
            .value_name("TYPE")
            .value_parser(["f32", "bf16", "f64"])
            .default_value("f32")
            .help("Element type of the weights and activations (the optimizer's moments stay f32)"),
        dir(
            "checkpoint",
            "Save checkpoints (model, optimizer, step, random state) to DIR/step-N, at the end and every --checkpoint-every steps",
        ),
        count("checkpoint-every", "N", "With --checkpoint: also save after every N steps"),
        count("keep", "K", "With --checkpoint: keep only the newest K checkpoints"),
        dir(
            "resume",
            "Continue the run saved in DIR (its newest checkpoint) or DIR/step-N, exactly; checkpoints go on into the same folder unless --checkpoint says otherwise",
        ),
    ]
}

/// The precision named by `--dtype`.
fn precision_of(m: &ArgMatches) -> Precision {
    match m.get_one::<String>("dtype").map(String::as_str) {
        Some("bf16") => Precision::Bf16,
        Some("f64") => Precision::F64,
        _ => Precision::F32,
    }
}

/// The checkpointing that `--checkpoint`, `--checkpoint-every`, `--keep`
/// and `--resume` ask for; `--keep 0`, `--checkpoint-every 0`, or either
/// without a folder, is an error.
fn persist_of(m: &ArgMatches) -> Result<Persist> {
    let from = m.get_one::<PathBuf>("resume").cloned();
    let to = m
        .get_one::<PathBuf>("checkpoint")
        .cloned()
        .or_else(|| from.as_deref().map(home_of));
    let every = m.get_one::<usize>("checkpoint-every").copied();
    let keep = m.get_one::<usize>("keep").copied();
    let bad = |op, msg: &str| {
        Err(Error::InvalidArgument {
            op,
            msg: msg.into(),
        })
    };
    if to.is_none() && (every.is_some() || keep.is_some()) {
        return bad(
            "--checkpoint",
            "--checkpoint-every and --keep need --checkpoint DIR (or --resume DIR)",
        );
    }
    if every == Some(0) {
        return bad(
            "--checkpoint-every",
            "0 is not a number of steps (want >= 1)",
        );
    }
    let to = match (to, keep) {
        (Some(d), Some(k)) => Some(Checkpoints::new(d).keep(k)?),
        (Some(d), None) => Some(Checkpoints::new(d)),
        (None, _) => None,
    };
    Ok(Persist::new(to, every, from))
}

/// Where loss plots go unless `--plots DIR` says otherwise (relative to the
/// working folder, like cargo's `target/`).
pub const PLOTS_DIR: &str = "target/plots";

/// Parses the process's arguments with `cmd`. `--help` prints and exits 0;
/// a usage error (an unknown flag, a bad value) prints the usage and exits
/// 2. Meant for `main` functions only.
pub fn matches_or_exit(cmd: Command) -> ArgMatches {
    match cmd.try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            let _ = e.print();
            std::process::exit(if e.use_stderr() { 2 } else { 0 });
        }
    }
}

/// `--device cpu|cuda`, `--plots DIR` and `--composed`, shared by both runs.
fn common_args(composed_help: &'static str) -> [Arg; 3] {
    [
        Arg::new("composed")
            .long("composed")
            .action(ArgAction::SetTrue)
            .help(composed_help),
        Arg::new("device")
            .long("device")
            .value_name("DEVICE")
            .value_parser(["cpu", "cuda"])
            .default_value("cpu")
            .help("Where to train; cuda stops with an error when this build or machine has no GPU backend"),
        Arg::new("plots")
            .long("plots")
            .value_name("DIR")
            .value_parser(value_parser!(PathBuf))
            .default_value(PLOTS_DIR)
            .help("Folder for the loss plot (PNG and SVG)"),
    ]
}

/// The device named by `--device`, checked: CUDA is an error (naming what
/// is missing) where no GPU can be used.
fn device_of(m: &ArgMatches) -> Result<Device> {
    match m.get_one::<String>("device").map(String::as_str) {
        Some("cuda") => {
            Device::Cuda(0).ensure_available()?;
            Ok(Device::Cuda(0))
        }
        _ => Ok(Device::Cpu),
    }
}

/// The value of a flag that has a default (clap fills it in).
fn get<T: Clone + Send + Sync + 'static>(m: &ArgMatches, id: &str, fallback: T) -> T {
    m.get_one::<T>(id).cloned().unwrap_or(fallback)
}
