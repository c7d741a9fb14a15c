//! Criterion benches: fused against composed LayerNorm, forward and
//! backward, on `fusegrad_cli::bench::SHAPES` (f32, with gamma and beta), and the
//! 1,000-op tape chain.
//!
//! ```sh
//! cargo bench --bench layer_norm                  # everything (long)
//! cargo bench --bench layer_norm -- 4096x768      # one shape
//! cargo bench --bench layer_norm -- tape          # the tape chain only
//! ```
//!
//! Throughput is reported over the minimal bytes (forward: read x, write y;
//! backward: read x and dy, write dx), as in `fusegrad bench`. The composed
//! twin at the largest shapes takes seconds per iteration: filter it out, or
//! expect a long run.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fusegrad::{ops, Result, Tape, Tensor, Var};
use fusegrad_cli::bench::SHAPES;
use std::hint::black_box;
use std::time::Duration;

struct Inputs {
    x: Tensor<f32>,
    dy: Tensor<f32>,
    gamma: Tensor<f32>,
    beta: Tensor<f32>,
}

fn inputs(n: usize, d: usize) -> Inputs {
    let mut s = 0x2545_f491u32;
    let mut v = |k: usize| -> Vec<f32> {
        (0..k)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    };
    let t = |shape: &[usize], data: Vec<f32>| Tensor::from_slice(shape, &data).expect("shape");
    Inputs {
        x: t(&[n, d], v(n * d)),
        dy: t(&[n, d], v(n * d)),
        gamma: t(&[d], v(d)),
        beta: t(&[d], v(d)),
    }
}

/// Records the forward on a fresh tape.
fn forward(i: &Inputs, fused: bool) -> Result<Var<f32>> {
    let tape = Tape::new();
    let (x, g, b) = (
        tape.var(i.x.clone()),
        tape.var(i.gamma.clone()),
        tape.var(i.beta.clone()),
    );
    if fused {
        ops::layer_norm(&x, Some(&g), Some(&b), 1e-5)
    } else {
        ops::layer_norm_composed(&x, Some(&g), Some(&b), 1e-5)
    }
}

fn layer_norm(c: &mut Criterion) {
    for (pass, bytes) in [("forward", 8u64), ("backward", 12u64)] {
        let mut group = c.benchmark_group(format!("layer_norm_{pass}"));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        for &(n, d) in &SHAPES {
            let i = inputs(n, d);
            group.throughput(Throughput::Bytes(bytes * (n * d) as u64));
            for (name, fused) in [("fused", true), ("composed", false)] {
                let id = BenchmarkId::new(name, format!("{n}x{d}"));
                if pass == "forward" {
                    group.bench_with_input(id, &i, |b, i| {
                        b.iter(|| black_box(forward(i, fused).expect("forward")))
                    });
                } else {
                    let y = forward(&i, fused).expect("forward");
                    group.bench_with_input(id, &i, |b, i| {
                        b.iter(|| black_box(y.backward_with(&i.dy).expect("backward")))
                    });
                }
            }
        }
        group.finish();
    }
}

/// The tape chain: 1,000 tiny ops recorded and swept (per iteration).
fn tape(c: &mut Criterion) {
    let x0 = Tensor::from_vec(vec![4], vec![0.5f32, -0.25, 1.0, 2.0]).expect("shape");
    let seed = Tensor::from_vec(vec![4], vec![1.0f32, -1.0, 0.5, 0.25]).expect("shape");
    let mut group = c.benchmark_group("tape");
    group.throughput(Throughput::Elements(1000));
    group.bench_function("chain_1000_ops_fwd_bwd", |b| {
        b.iter(|| {
            let tape = Tape::new();
            let k = tape.constant(x0.clone());
            let mut v = tape.var(x0.clone());
            for i in 0..1000 {
                v = if i % 2 == 0 {
                    ops::scalar_mul(&v, 0.999).expect("op")
                } else {
                    ops::add(&v, &k).expect("op")
                };
            }
            black_box(v.backward_with(&seed).expect("backward"))
        })
    });
    group.finish();
}

criterion_group!(benches, tape, layer_norm);
criterion_main!(benches);
