//! GFLOP/s of the CPU f32 matrix product (the kernel `ops::matmul` runs,
//! banded over the thread team) on the products of the default
//! transformer's training step: each Linear layer's forward
//! `[1024, in] @ [in, out]`, input gradient `[1024, out] @ [out, in]` and
//! weight gradient `[in, 1024] @ [1024, out]`, at 16 x 64 rows. These are
//! most of the step (`fusegrad bench --train`), so this is where the step's
//! speed is bounded. Operands are stored as in the step: the input
//! gradient reads the weight `[in, out]` transposed, the weight gradient
//! the input `[1024, in]` transposed.
//!
//! `cargo bench --features probes --bench matmul -- [--reps K] [--rows M]`

use fusegrad::probes::matmul_kernel;
use std::time::Instant;

/// `(in, out)` of the model's Linear layers, once each: a block's q/k/v,
/// output projection and MLP, and the head.
const LAYERS: [(usize, usize); 5] = [(128, 384), (128, 128), (128, 512), (512, 128), (128, 108)];
/// How many times each appears in one step (4 blocks, one head).
const COUNT: [usize; 5] = [4, 4, 4, 4, 1];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds of `[m, k] @ [k, n]` over `reps`, after one untimed run,
/// with the operands stored transposed as `t` says.
fn time([m, k, n]: [usize; 3], transposed: [bool; 2], reps: usize) -> f64 {
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1)
        .collect();
    let mut o = vec![0f32; m * n];
    let mut t = Vec::new();
    for r in 0..=reps {
        let start = Instant::now();
        matmul_kernel(&a, &b, &mut o, [m, k, n], transposed);
        if r > 0 {
            t.push(start.elapsed().as_secs_f64());
        }
    }
    std::hint::black_box(&o);
    median(t)
}

fn main() {
    let (mut reps, mut rows) = (20usize, 1024usize);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut num = |d: usize| it.next().and_then(|v| v.parse().ok()).unwrap_or(d);
        match a.as_str() {
            "--reps" => reps = num(reps),
            "--rows" => rows = num(rows),
            "--bench" => {}
            s => {
                eprintln!("unknown argument {s:?}");
                std::process::exit(2);
            }
        }
    }
    println!("threads: {}, rows: {rows}", rayon::current_num_threads());
    println!(
        "{:>22} {:>10} {:>9}",
        "product [m, k] @ [k, n]", "ms", "GFLOP/s"
    );
    let (mut total_s, mut total_flop) = (0.0, 0.0);
    for (&(i, o), &count) in LAYERS.iter().zip(&COUNT) {
        for (what, [m, k, n], t) in [
            ("forward", [rows, i, o], [false, false]),
            ("input grad", [rows, o, i], [false, true]),
            ("weight grad", [i, rows, o], [true, false]),
        ] {
            let s = time([m, k, n], t, reps);
            let flop = 2.0 * (m * k * n) as f64;
            total_s += s * count as f64;
            total_flop += flop * count as f64;
            println!(
                "{:>22} {:>10.3} {:>9.1}  {what}",
                format!("[{m}, {k}] @ [{k}, {n}]"),
                s * 1e3,
                flop / s / 1e9
            );
        }
    }
    println!(
        "one step's products: {:.2} ms, {:.2} GFLOP, {:.1} GFLOP/s",
        total_s * 1e3,
        total_flop / 1e9,
        total_flop / total_s / 1e9
    );
}
