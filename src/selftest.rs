//! The library's unit tests, run by `tests/unit.rs`. They sit beside the
//! code they test (a `tests` module reaching its parent's private items)
//! and are compiled into the library itself, only with the `selftest`
//! feature, which the library's tests turn on. A `#[cfg(test)]` module
//! would need a second, test-only build of the whole library, the
//! longest unit of `cargo test --release`; this way the library is built
//! once for its tests, the command and the examples.
//!
//! The runner prints what libtest prints (`test NAME ... ok`, `test
//! result: ...`) and takes its usual arguments: name filters (substrings,
//! or whole names with `--exact`), `--skip FILTER`, `--list`; it runs the
//! tests one at a time.

use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Instant;

/// The panic messages of the test running now (from any thread), printed
/// only if it fails: a test that expects a panic stays quiet, as under
/// libtest.
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Every unit test, by its path in the crate (as libtest would name it).
fn all() -> Vec<(&'static str, fn())> {
    use crate::{device, file, layout, nn, ops, profile, shadow, special, tensor};
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
    let mut tables = vec![
        device::cpu::tests::TESTS,
        device::pool::tests::TESTS,
        file::tests::TESTS,
        layout::tests::TESTS,
        nn::clip::tests::TESTS,
        nn::schedule::tests::TESTS,
        ops::attention::tests::TESTS,
        ops::elementwise::cpu::tests::TESTS,
        ops::elementwise::vmath::tests::TESTS,
        ops::matmul::cpu::tests::TESTS,
        ops::norm::cpu::tests::TESTS,
        ops::norm::cpu::rows::tests::TESTS,
        ops::norm::scaled::tests::TESTS,
        ops::reduce::kernel::tests::TESTS,
        profile::tests::TESTS,
        shadow::tests::TESTS,
        special::tests::TESTS,
        tensor::tests::TESTS,
    ];
    #[cfg(feature = "cuda")]
    tables.extend([
        device::cuda::tests::TESTS,
        device::kernel_cache::tests::TESTS,
        device::nvrtc::tests::TESTS,
        ops::norm::cuda::tests::TESTS,
    ]);
    let strip = |p: &'static str| p.strip_prefix("fusegrad::").unwrap_or(p);
    let mut tests: Vec<_> = tables
        .into_iter()
        .flatten()
        .map(|&(p, f)| (strip(p), f))
        .collect();
    tests.sort_by_key(|t| t.0);
    tests
}

/// What the command line asks for.
#[derive(Default)]
struct Args {
    filters: Vec<String>,
    skip: Vec<String>,
    exact: bool,
    list: bool,
    ignored: bool,
}

impl Args {
    /// libtest's arguments; those that change nothing here (`--nocapture`,
    /// `--test-threads N`, `--quiet`, ...) are accepted and ignored.
    fn parse(mut it: impl Iterator<Item = String>) -> Args {
        let mut a = Args::default();
        while let Some(s) = it.next() {
            match s.as_str() {
                "--exact" => a.exact = true,
                "--list" => a.list = true,
                "--ignored" => a.ignored = true,
                "--skip" => a.skip.extend(it.next()),
                "--test-threads" | "--format" | "--color" | "-Z" => {
                    it.next();
                }
                f if f.starts_with('-') => {}
                f => a.filters.push(f.to_string()),
            }
        }
        a
    }

    fn wants(&self, name: &str) -> bool {
        let hit = |f: &String| {
            if self.exact {
                name == f
            } else {
                name.contains(f.as_str())
            }
        };
        (self.filters.is_empty() || self.filters.iter().any(hit))
            && !self.skip.iter().any(|s| name.contains(s.as_str()))
    }
}

/// Runs the unit tests the command line selects; failure if any fails.
pub fn main() -> ExitCode {
    let args = Args::parse(std::env::args().skip(1));
    let all = all();
    let total = all.len();
    // No unit test is ignored: `--ignored` selects none.
    let chosen: Vec<_> = all
        .into_iter()
        .filter(|(n, _)| !args.ignored && args.wants(n))
        .collect();
    if args.list {
        for (n, _) in &chosen {
            println!("{n}: test");
        }
        return ExitCode::SUCCESS;
    }
    let out = std::io::stdout();
    std::panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!(" at {l}"))
            .unwrap_or_default();
        let mut p = PANICS.lock().unwrap_or_else(|e| e.into_inner());
        p.push(format!(
            "panicked{at}:\n{}",
            info.payload_as_str().unwrap_or("")
        ));
    }));
    println!("\nrunning {} tests", chosen.len());
    let start = Instant::now();
    let mut failed = Vec::new();
    for (name, test) in &chosen {
        print!("test {name} ... ");
        let _ = out.lock().flush();
        PANICS.lock().unwrap_or_else(|e| e.into_inner()).clear();
        match catch_unwind(AssertUnwindSafe(test)) {
            Ok(()) => println!("ok"),
            Err(_) => {
                println!("FAILED");
                let why = std::mem::take(&mut *PANICS.lock().unwrap_or_else(|e| e.into_inner()));
                failed.push((*name, why.join("\n")));
            }
        }
    }
    let _ = std::panic::take_hook();
    if !failed.is_empty() {
        println!("\nfailures:\n");
        for (n, why) in &failed {
            println!("---- {n} ----\n{why}\n");
        }
        println!("failures:");
        for (n, _) in &failed {
            println!("    {n}");
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed; 0 ignored; 0 measured; {} filtered out; finished in {:.2}s\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        chosen.len() - failed.len(),
        failed.len(),
        total - chosen.len(),
        start.elapsed().as_secs_f64()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
