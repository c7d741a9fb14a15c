//! Trains `2 -> 32 -> LN -> GELU -> 32 -> LN -> GELU -> 3` on three
//! interleaved spirals (cross-entropy, full-batch Adam, seed 42), then trains
//! the same network with the composed LayerNorm and compares the loss curves
//! step by step.
//!
//! `cargo run --release --example train_mlp -- [STEPS] [LOG_EVERY]`

use fusegrad_cli::demo::{compare_spirals_with, SpiralConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let steps: usize = args.next().map_or(Ok(300), |s| s.parse())?;
    let every: usize = args.next().map_or(Ok(25), |s| s.parse())?;
    let config = SpiralConfig {
        steps,
        ..SpiralConfig::default()
    };
    println!(
        "spirals: {} classes x {} points, noise {}; MLP 2 -> {h} -> LN -> GELU -> {h} -> LN -> GELU -> {}; Adam lr {}, f32",
        config.classes,
        config.per_class,
        config.noise,
        config.classes,
        config.lr,
        h = config.hidden,
    );
    let a = compare_spirals_with::<f32>(&config)?;
    println!(
        "{:>6} {:>12} {:>12} {:>10}",
        "step", "fused", "composed", "|diff|"
    );
    for (t, (f, c)) in a.fused.losses.iter().zip(&a.composed.losses).enumerate() {
        if t % every.max(1) == 0 {
            println!("{t:>6} {f:>12.6} {c:>12.6} {:>10.2e}", (f - c).abs());
        }
    }
    let (f, c) = (&a.fused, &a.composed);
    println!(
        "{:>6} {:>12.6} {:>12.6} {:>10.2e}",
        "final",
        f.final_loss,
        c.final_loss,
        (f.final_loss - c.final_loss).abs()
    );
    let pct = |v: Option<f64>| v.map_or(f64::NAN, |v| 100.0 * v);
    println!(
        "fused:    {} params, loss {:.4} -> {:.4} ({:.0}x), train acc {:.1}%, held-out acc {:.1}%, {:.2} s",
        f.params,
        f.losses.first().copied().unwrap_or(f64::NAN),
        f.final_loss,
        f.reduction(),
        pct(f.train_accuracy),
        pct(f.test_accuracy),
        f.seconds
    );
    println!(
        "composed: {} params, loss {:.4} -> {:.4} ({:.0}x), train acc {:.1}%, held-out acc {:.1}%, {:.2} s",
        c.params,
        c.losses.first().copied().unwrap_or(f64::NAN),
        c.final_loss,
        c.reduction(),
        pct(c.train_accuracy),
        pct(c.test_accuracy),
        c.seconds
    );
    println!(
        "fused vs composed over {} steps: max |loss diff| {:.2e}, max relative {:.2e}",
        steps, a.max_abs_diff, a.max_rel_diff
    );
    Ok(())
}
