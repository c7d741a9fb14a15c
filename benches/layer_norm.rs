//! Fused against composed LayerNorm, forward and backward, f32, on the
//! shapes of `fusegrad bench`. Run: `cargo bench --bench layer_norm`.
//! Large shapes use few samples; composed runs only where it fits in memory
//! and time (N*D <= 16M).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fusegrad::{bench::SHAPES, ops, rng::Rng, Tape, Tensor};
use std::time::Duration;

fn tensor(rng: &mut Rng, shape: &[usize]) -> Tensor<f32> {
    let n = shape.iter().product();
    Tensor::from_vec(
        shape.to_vec(),
        (0..n).map(|_| rng.normal() as f32).collect(),
    )
    .unwrap()
}

fn layer_norm(c: &mut Criterion) {
    let mut g = c.benchmark_group("layer_norm_f32");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    for &(n, d) in SHAPES.iter() {
        let mut rng = Rng::new(1);
        let (x, dy) = (tensor(&mut rng, &[n, d]), tensor(&mut rng, &[n, d]));
        let (gamma, beta) = (tensor(&mut rng, &[d]), tensor(&mut rng, &[d]));
        let id = format!("{n}x{d}");
        g.throughput(Throughput::Bytes((n * d * 4) as u64));
        let tape = Tape::new();
        let (xv, gv, bv) = (
            tape.var(x.clone()),
            tape.var(gamma.clone()),
            tape.var(beta.clone()),
        );
        g.bench_function(BenchmarkId::new("fused_forward", &id), |b| {
            b.iter(|| ops::layer_norm(&xv, Some(&gv), Some(&bv), 1e-5).unwrap())
        });
        let y = ops::layer_norm(&xv, Some(&gv), Some(&bv), 1e-5).unwrap();
        g.bench_function(BenchmarkId::new("fused_backward", &id), |b| {
            b.iter(|| y.backward_with(&dy).unwrap())
        });
        if n * d > 16 << 20 {
            continue;
        }
        g.bench_function(BenchmarkId::new("composed_forward", &id), |b| {
            b.iter(|| ops::layer_norm_composed(&xv, Some(&gv), Some(&bv), 1e-5).unwrap())
        });
        let yc = ops::layer_norm_composed(&xv, Some(&gv), Some(&bv), 1e-5).unwrap();
        g.bench_function(BenchmarkId::new("composed_backward", &id), |b| {
            b.iter(|| yc.backward_with(&dy).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, layer_norm);
criterion_main!(benches);
