//! GFLOP/s of the CPU matrix product: the kernel `ops::matmul` runs
//! (`matrixmultiply`, banded over the thread team) against the tiled loop
//! the crate used before, on square f32 products, alternated rep by rep.
//!
//! `cargo bench --features probes --bench matmul -- [--reps K] [N ...]`
//! Default sizes: 512 and 2048 (N x N x N).

use fusegrad::probes::{matmul_kernel, matmul_tiled};
use std::time::Instant;

fn main() {
    let mut reps = 5usize;
    let mut sizes = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--reps" => reps = it.next().and_then(|v| v.parse().ok()).unwrap_or(reps),
            "--bench" => {}
            s => match s.parse() {
                Ok(n) => sizes.push(n),
                Err(_) => {
                    eprintln!("unknown argument {s:?}");
                    std::process::exit(2);
                }
            },
        }
    }
    if sizes.is_empty() {
        sizes = vec![512, 2048];
    }
    println!("threads: {}", rayon::current_num_threads());
    println!(
        "{:>6} {:>14} {:>14} {:>8}",
        "N", "tiled GFLOP/s", "kernel GFLOP/s", "ratio"
    );
    for n in sizes {
        let a: Vec<f32> = (0..n * n)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
            .collect();
        let b: Vec<f32> = (0..n * n)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1)
            .collect();
        let (mut o1, mut o2) = (vec![0f32; n * n], vec![0f32; n * n]);
        let (mut t1, mut t2) = (Vec::new(), Vec::new());
        for r in 0..=reps {
            let t = Instant::now();
            matmul_tiled(&a, &b, &mut o1, n, n);
            let d1 = t.elapsed().as_secs_f64();
            let t = Instant::now();
            matmul_kernel(&a, &b, &mut o2, [n, n, n]);
            let d2 = t.elapsed().as_secs_f64();
            if r > 0 {
                t1.push(d1);
                t2.push(d2);
            }
        }
        let worst = o1
            .iter()
            .zip(&o2)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1e-3 * n as f32, "kernels disagree by {worst}");
        let med = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let flops = 2.0 * (n as f64).powi(3);
        let (g1, g2) = (flops / med(t1) / 1e9, flops / med(t2) / 1e9);
        println!("{n:>6} {g1:>14.1} {g2:>14.1} {:>7.2}x", g2 / g1);
    }
}
