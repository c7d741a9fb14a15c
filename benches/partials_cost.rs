//! What the dgamma/dbeta partials cost the fused LayerNorm backward:
//! through the tape, as a user calls it, the backward with `gamma` and
//! `beta` as variables (it must sum their gradients) and as constants
//! (`dx` only, no partials), interleaved rep by rep, 2 threads.
//!
//! `cargo bench --features probes --bench partials_cost -- [--reps K] [N D ...]`
//! Default shapes: the bench's three widest, 8192 x 4096, 1024 x 16384
//! and 2048 x 65536.

mod common;

use fusegrad::{ops, rng::Rng, Tape, Tensor};
use std::time::Instant;

/// Seconds for one backward of a fresh LayerNorm, its scale and shift
/// variables (`params`) or constants.
fn backward(x: &Tensor<f32>, p: [&Tensor<f32>; 3], params: bool) -> fusegrad::Result<f64> {
    let [gamma, beta, dy] = p;
    let tape = Tape::new();
    let xv = tape.var(x.clone());
    let (g, b) = if params {
        (tape.var(gamma.clone()), tape.var(beta.clone()))
    } else {
        (tape.constant(gamma.clone()), tape.constant(beta.clone()))
    };
    let y = ops::layer_norm(&xv, Some(&g), Some(&b), 1e-5)?;
    let t = Instant::now();
    y.backward_with(dy)?;
    Ok(t.elapsed().as_secs_f64())
}

fn main() -> fusegrad::Result<()> {
    let (reps, shapes) = common::reps_and_shapes(&[(8192, 4096), (1024, 16384), (2048, 65536)]);
    println!("shape            with partials ms  dx only ms  dx only / with");
    for (n, d) in shapes {
        let mut rng = Rng::new(7);
        let mut draw = |k: usize| -> Vec<f32> { (0..k).map(|_| rng.normal() as f32).collect() };
        let x = Tensor::from_slice(&[n, d], &draw(n * d))?;
        let dy = Tensor::from_slice(&[n, d], &draw(n * d))?;
        let (g, b) = (
            Tensor::from_slice(&[d], &draw(d))?,
            Tensor::from_slice(&[d], &draw(d))?,
        );
        // One warm-up of each fills the buffer pool.
        backward(&x, [&g, &b, &dy], true)?;
        backward(&x, [&g, &b, &dy], false)?;
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            with.push(backward(&x, [&g, &b, &dy], true)?);
            without.push(backward(&x, [&g, &b, &dy], false)?);
        }
        let (w, o) = (common::median(&with), common::median(&without));
        println!(
            "{n:>6} x {d:<6} {:>16.3} {:>11.3} {:>15.3}",
            w * 1e3,
            o * 1e3,
            o / w
        );
    }
    Ok(())
}
