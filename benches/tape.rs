//! Tape overhead: record and sweep a chain of 1,000 ops on 4-element
//! tensors. Time per iteration / 1000 = cost per op (forward + backward).
//! Run: `cargo bench --bench tape`.

use criterion::{criterion_group, criterion_main, Criterion};
use fusegrad::{ops, Tape, Tensor};

fn chain(c: &mut Criterion) {
    let x0 = Tensor::from_vec(vec![4], vec![0.5f32, -0.25, 1.0, 2.0]).unwrap();
    let seed = Tensor::from_vec(vec![4], vec![1.0f32, -1.0, 0.5, 0.25]).unwrap();
    c.bench_function("tape_chain_1000_ops", |b| {
        b.iter(|| {
            let tape = Tape::new();
            let k = tape.constant(x0.clone());
            let mut v = tape.var(x0.clone());
            for i in 0..1000 {
                v = if i % 2 == 0 {
                    ops::scalar_mul(&v, 0.999).unwrap()
                } else {
                    ops::add(&v, &k).unwrap()
                };
            }
            v.backward_with(&seed).unwrap()
        })
    });
}

criterion_group!(benches, chain);
criterion_main!(benches);
