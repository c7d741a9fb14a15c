//! Two tapes on two threads at once give bitwise the same results as the
//! same work done one after the other. (A `Tape` and its `Var`s are `!Send`,
//! which the compiler checks: see the `compile_fail` doctests in
//! `src/tape.rs`. `Tensor` is `Send + Sync`: a static assertion in
//! `src/tensor.rs`, and used across threads below.)

use fusegrad::rng::Rng;
use fusegrad::{ops, Tape, Tensor};
use std::sync::{Arc, Barrier};

/// Everything one training-like step produces, as bits.
type Bits = Vec<Vec<u64>>;

/// LayerNorm -> matmul -> gelu -> RMSNorm -> softmax cross-entropy, with
/// gradients for every parameter, on a fresh tape. Sizes large enough for the
/// kernels' parallel paths (rayon is shared by both threads).
fn work(seed: u64, x: &Tensor<f32>) -> Bits {
    let mut rng = Rng::new(seed);
    let mut t = |shape: &[usize]| {
        let n = shape.iter().product();
        Tensor::from_vec(
            shape.to_vec(),
            (0..n).map(|_| rng.range(-1.0, 1.0) as f32).collect(),
        )
        .unwrap()
    };
    let (n, d, h) = (x.shape()[0], x.shape()[1], 96);
    let tape = Tape::new();
    let xv = tape.var(x.clone());
    let gamma = tape.var(t(&[d]));
    let beta = tape.var(t(&[d]));
    let w = tape.var(t(&[d, h]));
    let g2 = tape.var(t(&[h]));
    let y = ops::layer_norm(&xv, Some(&gamma), Some(&beta), 1e-5).unwrap();
    let y = ops::gelu(&ops::matmul(&y, &w).unwrap()).unwrap();
    let y = ops::rms_norm(&y, Some(&g2), 1e-6).unwrap();
    let targets: Vec<usize> = (0..n).map(|i| (i * 7 + seed as usize) % h).collect();
    let loss = ops::cross_entropy(&y, &targets).unwrap();
    // The loss is a scalar: a random scalar cotangent.
    let c = Tensor::from_vec(vec![], vec![t(&[1]).as_slice().unwrap()[0]]).unwrap();
    let grads = loss.backward_with(&c).unwrap();
    let bits = |v: &Tensor<f32>| {
        v.as_slice()
            .unwrap()
            .iter()
            .map(|a| a.to_bits() as u64)
            .collect()
    };
    let mut out = vec![bits(loss.value())];
    for v in [&xv, &gamma, &beta, &w, &g2] {
        out.push(bits(&grads.wrt(v).unwrap()));
    }
    out
}

#[test]
fn two_tapes_on_two_threads_match_sequential_runs() {
    let mut rng = Rng::new(1);
    let (n, d) = (512, 256);
    let x = Tensor::from_vec(
        vec![n, d],
        (0..n * d).map(|_| rng.normal() as f32).collect(),
    )
    .unwrap();
    let sequential = [work(1, &x), work(2, &x)];
    for _ in 0..3 {
        let barrier = Arc::new(Barrier::new(2));
        let handles: Vec<_> = [1u64, 2]
            .into_iter()
            .map(|seed| {
                // The input tensor is shared across threads (Send + Sync).
                let (x, b) = (x.clone(), barrier.clone());
                std::thread::spawn(move || {
                    b.wait();
                    work(seed, &x)
                })
            })
            .collect();
        let parallel: Vec<Bits> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(parallel[0] == sequential[0], "thread 1 differs");
        assert!(parallel[1] == sequential[1], "thread 2 differs");
    }
}

#[test]
fn tensors_and_gradients_cross_threads() {
    fn send_sync<S: Send + Sync>(_: &S) {}
    let tape = Tape::new();
    let x = tape.var(Tensor::from_vec(vec![2, 3], vec![1.0f64, 2., 3., 4., 5., 6.]).unwrap());
    let y = ops::layer_norm(&x, None, None, 1e-5).unwrap();
    let seed = Tensor::from_vec(vec![2, 3], vec![0.1, -0.2, 0.3, 0.5, 0.0, -0.4]).unwrap();
    let g = y.backward_with(&seed).unwrap().wrt(&x).unwrap();
    send_sync(&g);
    // A gradient computed here is read on another thread.
    let want = g.to_f64_vec().unwrap();
    let got = std::thread::spawn(move || g.to_f64_vec().unwrap())
        .join()
        .unwrap();
    assert_eq!(got, want);
}
