//! Catastrophic cancellation in LayerNorm's variance, measured in f32.
//!
//! `cargo run --release --example stability -- [PLOT_PATH] [LANES]`
//! prints the table and writes the plot (default `target/stability.svg`;
//! a `.png` path writes a PNG). LANES (default 8) is the number of partial
//! sums per row; 1 = sequential.

use fusegrad_cli::stability::{run, Config};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(args.next().unwrap_or_else(|| "target/stability.svg".into()));
    let mut config = Config::default();
    if let Some(lanes) = args.next() {
        config.lanes = lanes.parse()?;
    }
    let report = run(&config)?;
    print!("{report}");
    report.write_plot(&path)?;
    println!("plot written to {}", path.display());
    Ok(())
}
