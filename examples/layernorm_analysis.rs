//! Prints the measurements docs/layernorm.md reports: FLOPs, bytes moved and
//! saved memory for fused vs composed LayerNorm and RMSNorm, and the
//! three-way gradient check (fused vs composed vs finite differences).
//!
//! `cargo run --release --example layernorm_analysis [N D]`

fn main() -> fusegrad::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let report = match args.as_slice() {
        [n, d] => fusegrad::analysis::report(*n, *d)?,
        _ => fusegrad::analysis::default_report()?,
    };
    print!("{report}");
    println!("== three-way check (f64; normwise relative differences) ==");
    print!("{}", fusegrad::analysis::three_way_table()?);
    Ok(())
}
