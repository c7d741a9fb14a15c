//! The `fusegrad` command: checks, demonstrates and benchmarks.
//!
//! `fusegrad` runs the whole report; `fusegrad check`, `fusegrad stability
//! [SVG]` and `fusegrad bench [--json]` run one part.

use fusegrad::{gradcheck, report, stability, Result};
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

fn stability_demo(svg: PathBuf) -> Result<()> {
    section("Stability: variance in f32 over growing row offsets (naive vs two-pass vs Welford)");
    let rep = stability::run_demo(&svg)?;
    print!("{rep}");
    println!("\nplot written to {}", svg.display());
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
            stability_demo(svg())?;
            Ok(ok)
        }
        Some("check") => primitives(),
        Some("stability") => stability_demo(svg()).map(|_| true),
        Some(other) => {
            eprintln!("unknown command {other:?}; use: fusegrad [check | stability [SVG] | bench [--json]]");
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
