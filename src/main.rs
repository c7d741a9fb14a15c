//! The `fusegrad` command: checks, demonstrates and benchmarks.
//!
//! `fusegrad` runs the whole report; `fusegrad check`, `fusegrad stability
//! [SVG]` and `fusegrad bench [--json]` run one part.

use fusegrad::{analysis, bench, gradcheck, nn, report, stability, Result};
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

fn training() -> Result<()> {
    section(
        "Training: MLP with LayerNorm on 3-arm spirals, fused vs composed LayerNorm (f32, Adam)",
    );
    let a = nn::demo::compare_spirals(300)?;
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
    Ok(())
}

fn stability_demo(svg: PathBuf) -> Result<()> {
    section("Stability: variance in f32 over growing row offsets (naive vs two-pass vs Welford)");
    let rep = stability::run_demo(&svg)?;
    print!("{rep}");
    println!("\nplot written to {}", svg.display());
    Ok(())
}

/// The default report benchmarks three shapes briefly; `fusegrad bench`
/// runs every shape of the targets.
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

fn run() -> Result<bool> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let svg = || {
        args.get(1)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("target/stability.svg"))
    };
    match args.first().map(String::as_str) {
        None => {
            let ok = primitives()?;
            norms()?;
            stability_demo(svg())?;
            training()?;
            benchmark(false, false)?;
            Ok(ok)
        }
        Some("check") => {
            let ok = primitives()?;
            norms()?;
            Ok(ok)
        }
        Some("stability") => stability_demo(svg()).map(|_| true),
        Some("bench") if args.iter().any(|a| a == "--prims") => prims_only().map(|_| true),
        Some("bench") => benchmark(true, args.iter().any(|a| a == "--json")).map(|_| true),
        Some(other) => {
            eprintln!("unknown command {other:?}; use: fusegrad [check | stability [SVG] | bench [--json | --prims]]");
            Ok(false)
        }
    }
}

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("fusegrad: {e}");
            std::process::exit(2);
        }
    }
}
