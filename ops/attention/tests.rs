//! The f32 attention's two CPU paths, the AVX-512 kernels and the portable
//! one, each against the f64 reference on the same inputs.

use crate::device::cpu::{best_simd, set_simd_limit, Simd, SIMD_TESTS};
use crate::gradcheck::rel_diff;
use crate::rng::Rng;
use crate::{ops, Element, Tape, Tensor};

// The tests, run by `tests/unit.rs`.
unit_tests![f32_paths_follow_f64];

/// The fused op's output and gradients (random cotangent) on `xs`, as f64:
/// `q`, `k`, `v` of `shape` (`[b, h, t, d]`), or with `packed` the one
/// `[b, t, 3 h d]` projection.
fn run<T: Element>(
    xs: &[Vec<f64>],
    shape: [usize; 4],
    causal: bool,
    packed: bool,
) -> Vec<Vec<f64>> {
    let [b, h, t, d] = shape;
    let tape = Tape::<T>::new();
    let var = |s: &[usize], v: &[f64]| {
        let data = v.iter().map(|&x| T::from_f64(x)).collect();
        tape.var(Tensor::from_vec(s.to_vec(), data).unwrap())
    };
    let scale = 0.7 / (d as f64).sqrt();
    let (vars, y) = if packed {
        let x = var(&[b, t, 3 * h * d], &xs[0]);
        let y = ops::attention_qkv(&x, h, causal, scale).unwrap();
        (vec![x], y)
    } else {
        let v: Vec<_> = xs.iter().map(|x| var(&shape, x)).collect();
        let y = ops::attention(&v[0], &v[1], &v[2], causal, scale).unwrap();
        (v, y)
    };
    let c: Vec<T> = Rng::new(9)
        .vec(y.value().numel())
        .into_iter()
        .map(T::from_f64)
        .collect();
    let g = y
        .backward_with(&Tensor::from_vec(y.shape().to_vec(), c).unwrap())
        .unwrap();
    let mut out = vec![y.value().to_f64_vec().unwrap()];
    out.extend(vars.iter().map(|v| g.wrt(v).unwrap().to_f64_vec().unwrap()));
    out
}

/// Shapes past one row tile (64) and past two 16-lane registers, odd
/// sizes, both masks and both layouts.
fn f32_paths_follow_f64() {
    let _hold = SIMD_TESTS.lock();
    for (shape, causal, packed) in [
        ([2, 3, 70, 20], true, false),
        ([1, 2, 130, 33], false, false),
        ([2, 2, 64, 32], true, true),
        ([1, 1, 5, 40], true, true),
        ([1, 1, 1, 1], false, false),
    ] {
        let [b, h, t, d] = shape;
        let mut rng = Rng::new(5);
        let n = b * h * t * d;
        let xs: Vec<Vec<f64>> = if packed {
            vec![(0..3 * n).map(|_| rng.range(-1.5, 1.5)).collect()]
        } else {
            (0..3)
                .map(|_| (0..n).map(|_| rng.range(-1.5, 1.5)).collect())
                .collect()
        };
        let want = run::<f64>(&xs, shape, causal, packed);
        for limit in [Simd::Avx512, Simd::Portable] {
            if limit > best_simd() {
                continue;
            }
            set_simd_limit(limit);
            let got = run::<f32>(&xs, shape, causal, packed);
            for (w, (g, r)) in got.iter().zip(&want).enumerate() {
                let diff = rel_diff(g, r);
                assert!(
                    diff < 1e-5,
                    "{shape:?} causal {causal} ({limit}), part {w}: {diff:e}"
                );
            }
        }
        set_simd_limit(Simd::Avx512);
    }
}
