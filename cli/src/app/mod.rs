//! The training front ends: `fusegrad train spirals`, `fusegrad train
//! transformer` and `examples/tiny_transformer.rs`. Each run has its
//! options (a plain struct, built from the command line by `clap`), prints
//! its figures as plain lines, shows a progress bar when asked, and writes
//! its loss plot as PNG and SVG. The command and the example call the same
//! code, so they accept the same options.

pub mod shadow;
pub mod spirals;
pub mod transformer;

use clap::{value_parser, Arg, ArgAction, ArgMatches, Command};
use fusegrad::error::Result;
use fusegrad::Device;
use std::path::PathBuf;

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
