//! The fused LayerNorm and RMSNorm, forward + backward through the tape
//! with a random cotangent, on the report's shapes: one line per norm and
//! shape with the median seconds of `--reps` steps, the two norms
//! alternated step by step. Public API only, so the same file measures any
//! revision (`scripts/ab_bench.py` alternates two builds of it).
//!
//! `cargo bench --bench norms -- [--reps K] [--shapes NxD,...] [--dtype f32|bf16]`

use fusegrad::rng::Rng;
use fusegrad::{ops, Element, Tape, Tensor};
use std::time::Instant;

const SHAPES: [(usize, usize); 8] = [
    (4096, 768),
    (16384, 1024),
    (8192, 4096),
    (65536, 256),
    (1024, 16384),
    (512, 2048),
    (32768, 128),
    (2048, 65536),
];

/// Seconds of one fused forward + backward of `x` against cotangent `c`.
fn step<T: Element>(x: &Tensor<T>, c: &Tensor<T>, p: &[Tensor<T>; 2], centre: bool) -> f64 {
    let start = Instant::now();
    let tape = Tape::new();
    let (v, g, b) = (
        tape.var(x.clone()),
        tape.var(p[0].clone()),
        tape.var(p[1].clone()),
    );
    let y = if centre {
        ops::layer_norm(&v, Some(&g), Some(&b), 1e-5)
    } else {
        ops::rms_norm(&v, Some(&g), 1e-6)
    }
    .expect("norm");
    let grads = y.backward_with(c).expect("backward");
    std::hint::black_box(grads.wrt(&v).expect("grad"));
    start.elapsed().as_secs_f64()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn random<T: Element>(rng: &mut Rng, shape: &[usize]) -> Tensor<T> {
    let n: usize = shape.iter().product();
    let v: Vec<T> = (0..n).map(|_| T::from_f64(rng.normal())).collect();
    Tensor::from_vec(shape.to_vec(), v).expect("tensor")
}

fn run<T: Element>(shapes: &[(usize, usize)], reps: usize) {
    let mut rng = Rng::new(7);
    for &(n, d) in shapes {
        let (x, c) = (
            random::<T>(&mut rng, &[n, d]),
            random::<T>(&mut rng, &[n, d]),
        );
        let p = [random::<T>(&mut rng, &[d]), random::<T>(&mut rng, &[d])];
        // Warm the pool and the caches: two steps of each.
        for _ in 0..2 {
            step(&x, &c, &p, true);
            step(&x, &c, &p, false);
        }
        let (mut ln, mut rms) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            ln.push(step(&x, &c, &p, true));
            rms.push(step(&x, &c, &p, false));
        }
        for (name, t) in [("layer_norm", &mut ln), ("rms_norm", &mut rms)] {
            let ms = median(t) * 1e3;
            println!("{name} {}x{d} {} {ms:.4} ms", n, T::NAME);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let reps = value("--reps").and_then(|v| v.parse().ok()).unwrap_or(15);
    let shapes: Vec<(usize, usize)> = match value("--shapes") {
        Some(s) => s
            .split(',')
            .filter_map(|p| {
                let (n, d) = p.split_once('x')?;
                Some((n.parse().ok()?, d.parse().ok()?))
            })
            .collect(),
        None => SHAPES.to_vec(),
    };
    match value("--dtype").as_deref() {
        Some("bf16") => run::<half::bf16>(&shapes, reps),
        _ => run::<f32>(&shapes, reps),
    }
}
