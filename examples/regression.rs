//! Fits `sin(3 x0) cos(2 x1) + 0.5 x2 x3 + 0.3 x0` on 512 points of
//! `[-1, 1)^4` with `4 -> 32 -> RMSNorm -> GELU -> 32 -> RMSNorm -> GELU -> 1`,
//! mean squared error and full-batch Adam, once with the fused RMSNorm and
//! once with its composed twin.
//!
//! `cargo run --release --example regression -- [STEPS] [LOG_EVERY]`

use fusegrad::nn::NormImpl;
use fusegrad_cli::demo::{train_regression, RegressionConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let steps: usize = args.next().map_or(Ok(300), |s| s.parse())?;
    let every: usize = args.next().map_or(Ok(25), |s| s.parse())?;
    let config = RegressionConfig {
        steps,
        ..RegressionConfig::default()
    };
    let fused = train_regression::<f32>(&config)?;
    let composed = train_regression::<f32>(&RegressionConfig {
        norm_impl: NormImpl::Composed,
        ..config
    })?;
    println!(
        "{:>6} {:>12} {:>12} {:>10}",
        "step", "mse fused", "composed", "|diff|"
    );
    let mut max_diff = 0.0f64;
    for (t, (f, c)) in fused.losses.iter().zip(&composed.losses).enumerate() {
        max_diff = max_diff.max((f - c).abs());
        if t % every.max(1) == 0 {
            println!("{t:>6} {f:>12.6} {c:>12.6} {:>10.2e}", (f - c).abs());
        }
    }
    for (name, r) in [("fused", &fused), ("composed", &composed)] {
        println!(
            "{name:<9} {} params, train mse {:.5} -> {:.5} ({:.0}x), held-out R^2 {:.4}, {:.2} s",
            r.params,
            r.losses.first().copied().unwrap_or(f64::NAN),
            r.final_loss,
            r.reduction(),
            r.test_r2.unwrap_or(f64::NAN),
            r.seconds
        );
    }
    println!("fused vs composed RMSNorm over {steps} steps: max |mse diff| {max_diff:.2e}");
    Ok(())
}
