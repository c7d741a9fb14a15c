//! The benchmark behind `fusegrad bench`, with knobs for experiments:
//!
//! ```sh
//! cargo bench --features probes --bench bench -- [--json] [--budget S] [--no-composed]
//!     [--shape NxD]... [--stream-bytes B] [--no-pool] [--one-row] [--no-runs]
//!     [--no-ahead] [--portable | --avx2] [--profile intel|amd] [--no-huge]
//! ```
//!
//! `--stream-bytes` sets the output size from which f32 kernels use
//! non-temporal stores (`max` turns them off); `--no-pool` turns off buffer
//! recycling, `--one-row` runs the LayerNorm kernels a row at a time instead
//! of four rows in lockstep, `--no-runs` walks long rows front to back,
//! `--no-ahead` stops prefetching the next row (see `benches/ab_switches.rs`
//! for the same switches timed side by side), `--portable`/`--avx2` cap the
//! SIMD build, `--profile` picks a CPU profile's speed defaults instead
//! of the detected one, and `--no-huge` stops fresh buffers asking for huge
//! pages, to measure what each is worth.

mod common;

use fusegrad::probes;
use fusegrad_cli::bench;

fn main() -> fusegrad::Result<()> {
    let args = common::args();
    let mut shapes = Vec::new();
    let (mut json, mut budget, mut composed) = (false, 1.0, true);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => json = true,
            "--no-composed" => composed = false,
            "--no-pool" => probes::set_pool_enabled(false),
            "--no-huge" => probes::set_huge_pages(false),
            "--one-row" => probes::set_lockstep(false),
            "--no-runs" => probes::set_segmented(false),
            "--no-ahead" => probes::set_prefetch_next(false),
            "--portable" => probes::set_simd_limit(probes::Simd::Portable),
            "--avx2" => probes::set_simd_limit(probes::Simd::Avx2),
            "--profile" => match it.next().map(String::as_str) {
                Some("intel") => probes::set_profile(probes::Profile::Intel),
                Some("amd") => probes::set_profile(probes::Profile::Amd),
                v => {
                    eprintln!("bad --profile {v:?}, want intel or amd");
                    std::process::exit(2);
                }
            },
            "--budget" => budget = it.next().and_then(|v| v.parse().ok()).unwrap_or(budget),
            "--stream-bytes" => {
                let v = it.next().map(String::as_str).unwrap_or("max");
                probes::set_stream_threshold(v.parse().unwrap_or(usize::MAX));
            }
            "--shape" => {
                let s = it.next().map(String::as_str).unwrap_or("");
                if let Some((n, d)) = s.split_once('x') {
                    if let (Ok(n), Ok(d)) = (n.parse(), d.parse()) {
                        shapes.push((n, d));
                        continue;
                    }
                }
                eprintln!("bad --shape {s:?}, want NxD");
                std::process::exit(2);
            }
            other => {
                eprintln!("unknown argument {other:?}");
                std::process::exit(2);
            }
        }
    }
    if shapes.is_empty() {
        shapes = bench::SHAPES.to_vec();
    }
    let r = bench::run(&shapes, budget, composed)?;
    if json {
        println!("{}", r.json());
    } else {
        println!("{r}");
    }
    Ok(())
}
