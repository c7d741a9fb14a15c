//! Prints the measurements docs/layernorm.md reports: FLOPs, bytes moved and
//! saved memory for fused vs composed LayerNorm and RMSNorm, and the
//! three-way gradient check (fused vs composed vs finite differences).
//!
//! `cargo run --release --example layernorm_analysis [N D]`
//! `cargo run --release --example layernorm_analysis sweep [CASES [SEED]]`
//! (the random sweep the norm tolerances in src/tolerance.rs rest on)

use fusegrad_cli::analysis;

fn main() -> fusegrad::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let nums: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    if args.first().map(String::as_str) == Some("sweep") {
        let cases = nums.first().copied().unwrap_or(2000) as usize;
        let seed = nums.get(1).copied().unwrap_or(7);
        print!("{}", analysis::sweep(cases, seed)?);
        return Ok(());
    }
    let report = match nums.as_slice() {
        [n, d] => analysis::report(*n as usize, *d as usize)?,
        _ => analysis::default_report()?,
    };
    print!("{report}");
    println!("== three-way check (f64; differences scaled by term size) ==");
    print!("{}", analysis::three_way_table()?);
    Ok(())
}
