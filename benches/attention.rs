//! Fused attention against its composed twin at the default transformer's
//! shape: forward + backward time and the bytes each saves for backward,
//! alternated rep by rep in one process.
//!
//! `cargo bench --bench attention -- [--reps K] [--shape B,H,T,D] [--dtype f32|f64]`
//! Default: 30 reps at 16,4,64,32 (batch, heads, T, head_dim), causal, f32,
//! through the packed projection `[B, T, 3 H D]` as `MultiHeadAttention`
//! calls it.

use fusegrad::rng::Rng;
use fusegrad::{ops, Element, Tape, Tensor};
use std::time::Instant;

/// Seconds of one forward + backward, and the bytes the tape saved.
fn step<T: Element>(
    x: &Tensor<T>,
    c: &Tensor<T>,
    h: usize,
    scale: f64,
    fused: bool,
) -> (f64, usize) {
    let start = Instant::now();
    let tape = Tape::new();
    let v = tape.var(x.clone());
    let y = if fused {
        ops::attention_qkv(&v, h, true, scale)
    } else {
        ops::attention_qkv_composed(&v, h, true, scale)
    }
    .expect("attention");
    let saved = tape.saved_bytes();
    let g = y.backward_with(c).expect("backward");
    std::hint::black_box(g.wrt(&v).expect("grad"));
    (start.elapsed().as_secs_f64(), saved)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run<T: Element>(reps: usize, [b, h, t, d]: [usize; 4]) {
    let mut rng = Rng::new(1);
    let n = b * t * 3 * h * d;
    let x = Tensor::from_vec(
        vec![b, t, 3 * h * d],
        (0..n).map(|_| T::from_f64(rng.range(-1.0, 1.0))).collect(),
    )
    .expect("input");
    let m = b * t * h * d;
    let c = Tensor::from_vec(
        vec![b, t, h * d],
        (0..m).map(|_| T::from_f64(rng.range(-1.0, 1.0))).collect(),
    )
    .expect("cotangent");
    let scale = 1.0 / (d as f64).sqrt();
    let (mut tf, mut tc) = (Vec::new(), Vec::new());
    let (mut sf, mut sc) = (0, 0);
    for r in 0..=reps {
        let (a, s1) = step(&x, &c, h, scale, true);
        let (bb, s2) = step(&x, &c, h, scale, false);
        if r > 0 {
            tf.push(a);
            tc.push(bb);
        }
        (sf, sc) = (s1, s2);
    }
    let (mf, mc) = (median(&mut tf), median(&mut tc));
    println!(
        "{} [{b}, {h}, {t}, {d}] causal, threads {}, {reps} reps (median)",
        T::NAME,
        rayon::current_num_threads()
    );
    println!("{:>10} {:>14} {:>14}", "", "fwd+bwd ms", "saved bytes");
    println!("{:>10} {:>14.3} {:>14}", "fused", mf * 1e3, sf);
    println!("{:>10} {:>14.3} {:>14}", "composed", mc * 1e3, sc);
    println!(
        "composed / fused: time {:.2}x, saved bytes {:.1}x",
        mc / mf,
        sc as f64 / sf as f64
    );
}

fn main() {
    let mut reps = 30usize;
    let mut shape = [16, 4, 64, 32];
    let mut dtype = String::from("f32");
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--reps" => reps = it.next().and_then(|v| v.parse().ok()).unwrap_or(reps),
            "--shape" => {
                let v: Vec<usize> = it
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|s| s.parse().ok())
                    .collect();
                match v[..] {
                    [b, h, t, d] => shape = [b, h, t, d],
                    _ => {
                        eprintln!("--shape wants B,H,T,D");
                        std::process::exit(2);
                    }
                }
            }
            "--dtype" => dtype = it.next().unwrap_or_default(),
            "--bench" => {}
            s => {
                eprintln!("unknown argument {s:?}");
                std::process::exit(2);
            }
        }
    }
    match dtype.as_str() {
        "f32" => run::<f32>(reps.max(1), shape),
        "f64" => run::<f64>(reps.max(1), shape),
        other => {
            eprintln!("--dtype f32 or f64, got {other:?}");
            std::process::exit(2);
        }
    }
}
