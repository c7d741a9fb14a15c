//! What LayerNorm and RMSNorm share, checked for each: an independent
//! chain-rule derivation, NaN rows, saved memory, thread-count determinism,
//! 16-bit accuracy and agreement with the composed twin. RMSNorm is
//! LayerNorm without the centring (no mean subtracted) and without beta;
//! `family_tests!(NORM)` writes these checks as tests of one norm.

use crate::common::{normal, tensor};
use fusegrad::gradcheck::rel_diff;
use fusegrad::rng::Rng;
use fusegrad::{ops, tolerance, Element, Tape, Tensor, Var};
use half::{bf16, f16};

/// Which norm: LayerNorm centres the rows and has a beta; RMSNorm does not.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Norm {
    Layer,
    Rms,
}

impl Norm {
    pub fn centre(self) -> bool {
        self == Norm::Layer
    }

    /// Row statistics the fused op saves: mean and rstd, or rstd.
    pub fn stats(self) -> usize {
        if self.centre() {
            2
        } else {
            1
        }
    }

    /// The op's name on the tape.
    pub fn name(self) -> &'static str {
        if self.centre() {
            "layer_norm"
        } else {
            "rms_norm"
        }
    }

    /// The fused op over the trailing `norm` dims (beta dropped for RMSNorm).
    pub fn fused<T: Element>(
        self,
        x: &Var<T>,
        norm: &[usize],
        g: Option<&Var<T>>,
        b: Option<&Var<T>>,
        eps: f64,
    ) -> fusegrad::Result<Var<T>> {
        match self {
            Norm::Layer => ops::layer_norm_nd(x, norm, g, b, eps),
            Norm::Rms => ops::rms_norm_nd(x, norm, g, eps),
        }
    }

    /// The composed twin, the same way.
    pub fn composed<T: Element>(
        self,
        x: &Var<T>,
        norm: &[usize],
        g: Option<&Var<T>>,
        b: Option<&Var<T>>,
        eps: f64,
    ) -> fusegrad::Result<Var<T>> {
        match self {
            Norm::Layer => ops::layer_norm_composed_nd(x, norm, g, b, eps),
            Norm::Rms => ops::rms_norm_composed_nd(x, norm, g, eps),
        }
    }
}

/// `(y, dx, dgamma, dbeta)` in f64; `dbeta` is empty for RMSNorm.
pub type Grads = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);

/// The fused norm forward and backward under cotangent `dy`, with x, gamma
/// and (LayerNorm) beta all leaves.
#[allow(clippy::too_many_arguments)]
pub fn fused<T: Element>(
    norm: Norm,
    shape: &[usize],
    normalized: &[usize],
    x: &[f64],
    gamma: &[f64],
    beta: &[f64],
    dy: &[f64],
    eps: f64,
) -> Grads {
    let tape = Tape::<T>::new();
    let xv = tape.var(tensor::<T>(shape, x));
    let gv = tape.var(tensor::<T>(normalized, gamma));
    let bv = norm
        .centre()
        .then(|| tape.var(tensor::<T>(normalized, beta)));
    let y = norm
        .fused(&xv, normalized, Some(&gv), bv.as_ref(), eps)
        .unwrap();
    let g = y.backward_with(&tensor::<T>(shape, dy)).unwrap();
    let f = |t: Tensor<T>| t.to_f64_vec().unwrap();
    (
        f(y.value().clone()),
        f(g.wrt(&xv).unwrap()),
        f(g.wrt(&gv).unwrap()),
        bv.map_or(vec![], |b| f(g.wrt(&b).unwrap())),
    )
}

/// The norm in f64, differentiated step by step through the graph
/// `mu -> c = x - mu -> var -> rstd -> xhat -> y` (RMSNorm: `mu = 0`, no
/// beta), with no algebraic simplification: every intermediate gets its
/// own adjoint.
fn chain_rule(
    norm: Norm,
    x: &[f64],
    gamma: &[f64],
    beta: &[f64],
    dy: &[f64],
    d: usize,
    eps: f64,
) -> Grads {
    let (mut y, mut dx) = (vec![], vec![]);
    let (mut dgamma, mut dbeta) = (vec![0.0; d], vec![0.0; d]);
    for (xr, dyr) in x.chunks(d).zip(dy.chunks(d)) {
        let df = d as f64;
        // Forward.
        let mu = if norm.centre() {
            xr.iter().sum::<f64>() / df
        } else {
            0.0
        };
        let c: Vec<f64> = xr.iter().map(|v| v - mu).collect();
        let var = c.iter().map(|v| v * v).sum::<f64>() / df;
        let rstd = 1.0 / (var + eps).sqrt();
        let xhat: Vec<f64> = c.iter().map(|v| v * rstd).collect();
        let shift = |j: usize| if norm.centre() { beta[j] } else { 0.0 };
        y.extend((0..d).map(|j| xhat[j] * gamma[j] + shift(j)));
        // Backward, node by node.
        let dxhat: Vec<f64> = (0..d).map(|j| dyr[j] * gamma[j]).collect();
        for j in 0..d {
            dgamma[j] += dyr[j] * xhat[j];
            dbeta[j] += dyr[j];
        }
        // xhat_j = c_j * rstd
        let mut dc: Vec<f64> = (0..d).map(|j| dxhat[j] * rstd).collect();
        let drstd: f64 = (0..d).map(|j| dxhat[j] * c[j]).sum();
        // rstd = (var + eps)^(-1/2)
        let dvar = drstd * -0.5 * (var + eps).powf(-1.5);
        // var = sum(c_j^2) / d
        for j in 0..d {
            dc[j] += dvar * 2.0 * c[j] / df;
        }
        // c_j = x_j - mu, mu = sum(x) / d (RMSNorm: c = x)
        let dmu: f64 = if norm.centre() {
            -dc.iter().sum::<f64>()
        } else {
            0.0
        };
        dx.extend((0..d).map(|j| dc[j] + dmu / df));
    }
    if !norm.centre() {
        dbeta.clear();
    }
    (y, dx, dgamma, dbeta)
}

/// The four outputs side by side, named.
fn named<'a>(a: &'a Grads, b: &'a Grads) -> [(&'static str, &'a [f64], &'a [f64]); 4] {
    [
        ("y", &a.0, &b.0),
        ("dx", &a.1, &b.1),
        ("dgamma", &a.2, &b.2),
        ("dbeta", &a.3, &b.3),
    ]
}

pub fn consolidated_backward_matches_step_by_step_chain_rule(norm: Norm) {
    let mut rng = Rng::new(11);
    for &(n, d, eps) in &[
        (5usize, 7usize, 1e-5),
        (3, 64, 1e-5),
        (3, 64, 1e-6),
        (4, 1000, 1e-3),
        (6, 3, 1e-12),
        // D = 2 with eps << var is ill-conditioned for LayerNorm (dx is
        // exactly 0 at eps = 0, so only rounding noise is left); a large
        // eps keeps it fair.
        (2, 2, 0.5),
        (7, 129, 1e-2),
    ] {
        let x = normal(&mut rng, n * d, 1.5, 0.3);
        let gamma = normal(&mut rng, d, 1.0, 0.0);
        let beta = normal(&mut rng, d, 1.0, 0.0);
        let dy = rng.vec(n * d);
        let got = fused::<f64>(norm, &[n, d], &[d], &x, &gamma, &beta, &dy, eps);
        let want = chain_rule(norm, &x, &gamma, &beta, &dy, d, eps);
        for (what, a, b) in named(&got, &want) {
            let r = rel_diff(a, b);
            assert!(r <= 1e-12, "{norm:?} n={n} d={d}: {what} rel diff {r:e}");
        }
    }
}

pub fn no_rows_gives_empty_output_and_zero_param_grads(norm: Norm) {
    for shape in [vec![0usize, 5], vec![2, 0, 5]] {
        let (y, dx, dg, db) =
            fused::<f32>(norm, &shape, &[5], &[], &[1.0; 5], &[0.5; 5], &[], 1e-5);
        assert!(y.is_empty() && dx.is_empty());
        assert_eq!(dg, vec![0.0; 5]);
        assert_eq!(db, if norm.centre() { vec![0.0; 5] } else { vec![] });
    }
    // The output keeps the input's shape.
    let tape = Tape::<f64>::new();
    let x = tape.var(Tensor::zeros(&[3, 0, 4]).unwrap());
    let y = norm.fused(&x, &[4], None, None, 1e-5).unwrap();
    assert_eq!(y.shape(), &[3, 0, 4]);
}

pub fn nan_stays_in_its_row(norm: Norm) {
    let mut rng = Rng::new(5);
    let (n, d) = (4, 33);
    let mut x = normal(&mut rng, n * d, 1.0, 0.0);
    x[2 * d + 17] = f64::NAN;
    let gamma = normal(&mut rng, d, 1.0, 0.0);
    let beta = normal(&mut rng, d, 1.0, 0.0);
    let dy = rng.vec(n * d);
    let check = |(y, dx, dg, db): Grads| {
        for i in 0..n {
            for r in [&y[i * d..(i + 1) * d], &dx[i * d..(i + 1) * d]] {
                if i == 2 {
                    assert!(r.iter().all(|v| v.is_nan()), "{norm:?} row {i}");
                } else {
                    assert!(r.iter().all(|v| v.is_finite()), "{norm:?} row {i}");
                }
            }
        }
        // dgamma sums dy * xhat over rows, so NaN; dbeta only sums dy.
        assert!(dg.iter().all(|v| v.is_nan()));
        assert!(db.iter().all(|v| v.is_finite()));
    };
    check(fused::<f64>(
        norm,
        &[n, d],
        &[d],
        &x,
        &gamma,
        &beta,
        &dy,
        1e-5,
    ));
    check(fused::<f32>(
        norm,
        &[n, d],
        &[d],
        &x,
        &gamma,
        &beta,
        &dy,
        1e-5,
    ));
    check(fused::<f16>(
        norm,
        &[n, d],
        &[d],
        &x,
        &gamma,
        &beta,
        &dy,
        1e-5,
    ));
    check(fused::<bf16>(
        norm,
        &[n, d],
        &[d],
        &x,
        &gamma,
        &beta,
        &dy,
        1e-5,
    ));
    if norm.centre() {
        // An infinity behaves the same (x - mean is inf - inf).
        x[2 * d + 17] = f64::INFINITY;
        check(fused::<f64>(
            norm,
            &[n, d],
            &[d],
            &x,
            &gamma,
            &beta,
            &dy,
            1e-5,
        ));
    }
}

pub fn fused_saves_its_row_statistics_only(norm: Norm) {
    fn check<T: Element>(norm: Norm, shape: &[usize], d: usize) {
        let n: usize = shape.iter().product::<usize>() / d;
        let tape = Tape::<T>::new();
        let x = tape.var(Tensor::<T>::zeros(shape).unwrap());
        let g = tape.var(Tensor::<T>::zeros(&[d]).unwrap());
        let b = tape.var(Tensor::<T>::zeros(&[d]).unwrap());
        let before = tape.saved_bytes();
        norm.fused(&x, &[d], Some(&g), Some(&b), 1e-5).unwrap();
        let acc = std::mem::size_of::<T::Acc>();
        assert_eq!(before, 0);
        let want = norm.stats() * n * acc;
        assert_eq!(tape.saved_bytes(), want, "{norm:?} {} {shape:?}", T::NAME);
        let per_node = tape.saved_bytes_per_node();
        assert_eq!(per_node.len(), 1);
        assert_eq!(per_node[0].op, norm.name());
    }
    check::<f32>(norm, &[64, 256], 256);
    check::<f64>(norm, &[3, 5, 7], 7);
    check::<f16>(norm, &[10, 1024], 1024);
    check::<bf16>(norm, &[10, 1024], 1024);
    check::<bf16>(norm, &[0, 8], 8);
}

pub fn composed_twin_saves_at_least_one_value_per_element(norm: Norm) {
    fn check<T: Element>(norm: Norm, n: usize, d: usize) {
        let tape = Tape::<T>::new();
        let x = tape.var(Tensor::<T>::zeros(&[n, d]).unwrap());
        let g = tape.var(Tensor::<T>::zeros(&[d]).unwrap());
        let b = tape.var(Tensor::<T>::zeros(&[d]).unwrap());
        norm.composed(&x, &[d], Some(&g), Some(&b), 1e-5).unwrap();
        let saved = tape.saved_bytes();
        let what = format!("{norm:?} {} {saved}", T::NAME);
        assert!(saved >= n * d * std::mem::size_of::<T>(), "{what}");
        // And the fused op saves far less.
        let tape = Tape::<T>::new();
        let x = tape.var(Tensor::<T>::zeros(&[n, d]).unwrap());
        norm.fused(&x, &[d], None, None, 1e-5).unwrap();
        assert!(tape.saved_bytes() * d / 4 <= saved, "{what}");
    }
    check::<f32>(norm, 64, 256);
    check::<f64>(norm, 3, 7);
    check::<f16>(norm, 10, 1024);
    check::<bf16>(norm, 10, 1024);
}

/// The raw bits of every output of the fused norm's forward and backward,
/// run inside `pool`.
fn bits_in_pool<T: Element>(
    norm: Norm,
    pool: &rayon::ThreadPool,
    n: usize,
    d: usize,
) -> Vec<Vec<u64>> {
    pool.install(|| {
        let mut rng = Rng::new(99);
        let x = normal(&mut rng, n * d, 3.0, 10.0);
        let gamma = normal(&mut rng, d, 1.0, 0.0);
        let beta = normal(&mut rng, d, 1.0, 0.0);
        let dy = rng.vec(n * d);
        let g = fused::<T>(norm, &[n, d], &[d], &x, &gamma, &beta, &dy, 1e-5);
        // Each value is exact in f64, so its f64 bits are its T bits.
        let bits = |v: &[f64]| v.iter().map(|a| a.to_bits()).collect();
        vec![bits(&g.0), bits(&g.1), bits(&g.2), bits(&g.3)]
    })
}

pub fn results_are_bitwise_identical_for_one_and_two_threads(norm: Norm) {
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let two = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    // Several chunks; a few hundred chunks (grouped); a row longer than a chunk.
    for (n, d) in [(300usize, 1000usize), (1100, 4096), (5, 70_000)] {
        for (ty, a, b, again) in [
            (
                "f32",
                bits_in_pool::<f32>(norm, &one, n, d),
                bits_in_pool::<f32>(norm, &two, n, d),
                bits_in_pool::<f32>(norm, &two, n, d),
            ),
            (
                "bf16",
                bits_in_pool::<bf16>(norm, &one, n, d),
                bits_in_pool::<bf16>(norm, &two, n, d),
                bits_in_pool::<bf16>(norm, &two, n, d),
            ),
        ] {
            for (k, (p, q)) in a.iter().zip(&b).enumerate() {
                assert!(
                    p == q,
                    "{norm:?} {ty} n={n} d={d}: output {k} differs between 1 and 2 threads"
                );
            }
            // And run to run.
            assert!(a == again, "{norm:?} {ty} n={n} d={d}: runs differ");
        }
    }
}

fn low_precision_vs_f64<T: Element>(norm: Norm, tol: tolerance::Tolerance) {
    let mut rng = Rng::new(21);
    for &(n, d) in &[(8usize, 64usize), (4, 768), (2, 2048), (3, 13)] {
        let x = normal(&mut rng, n * d, 1.0, 0.5);
        let gamma = normal(&mut rng, d, 0.5, 1.0);
        let beta = normal(&mut rng, d, 0.5, 0.0);
        let dy = rng.vec(n * d);
        // Round the inputs to T first so both runs see the same values.
        let round =
            |v: &[f64]| -> Vec<f64> { v.iter().map(|&a| T::from_f64(a).to_f64()).collect() };
        let (x, gamma, beta, dy) = (round(&x), round(&gamma), round(&beta), round(&dy));
        let lo = fused::<T>(norm, &[n, d], &[d], &x, &gamma, &beta, &dy, 1e-5);
        let hi = fused::<f64>(norm, &[n, d], &[d], &x, &gamma, &beta, &dy, 1e-5);
        for (what, a, b) in named(&lo, &hi) {
            let r = rel_diff(a, b);
            assert!(
                r <= tol.rtol,
                "{norm:?} {} n={n} d={d}: {what} rel diff {r:e} > {:e}",
                T::NAME,
                tol.rtol
            );
        }
    }
}

pub fn f16_and_bf16_follow_f64(norm: Norm) {
    low_precision_vs_f64::<f16>(norm, tolerance::F16_VS_F64);
    low_precision_vs_f64::<bf16>(norm, tolerance::BF16_VS_F64);
    low_precision_vs_f64::<f32>(norm, tolerance::F32_VS_F64);
}

/// Every combination of present parameters and of which inputs want a
/// gradient (the kernel has a specialized path for each) matches the
/// composed twin.
pub fn optional_params_and_partial_gradients_match_composed(norm: Norm) {
    let mut rng = Rng::new(31);
    let (n, d) = (5, 19);
    let x = normal(&mut rng, n * d, 2.0, 1.0);
    let gamma = normal(&mut rng, d, 1.0, 1.0);
    let beta = normal(&mut rng, d, 1.0, 0.0);
    let dy = rng.vec(n * d);
    // RMSNorm has no beta: only the masks with beta absent.
    let masks = if norm.centre() { 27 } else { 9 };
    for mask in 0..masks {
        // Each of x, gamma, beta: 0 = absent (x: constant), 1 = constant, 2 = var.
        let (mx, mg, mb) = (mask % 3, (mask / 3) % 3, mask / 9);
        if mx == 0 && mg < 2 && mb < 2 {
            continue; // nothing wants a gradient
        }
        let run = |fused: bool| -> Vec<Vec<f64>> {
            let tape = Tape::<f64>::new();
            let mk = |m: u32, shape: &[usize], v: &[f64]| match m {
                2 => Some(tape.var(tensor::<f64>(shape, v))),
                1 => Some(tape.constant(tensor::<f64>(shape, v))),
                _ => None,
            };
            let xv = mk(mx.max(1), &[n, d], &x).unwrap();
            let gv = mk(mg, &[d], &gamma);
            let bv = mk(mb, &[d], &beta);
            let (g, b) = (gv.as_ref(), bv.as_ref());
            let y = if fused {
                norm.fused(&xv, &[d], g, b, 1e-5)
            } else {
                norm.composed(&xv, &[d], g, b, 1e-5)
            }
            .unwrap();
            let mut out = vec![y.value().to_f64_vec().unwrap()];
            let g = y.backward_with(&tensor::<f64>(&[n, d], &dy)).unwrap();
            for v in [Some(&xv), gv.as_ref(), bv.as_ref()].into_iter().flatten() {
                if v.requires_grad() {
                    out.push(g.wrt(v).unwrap().to_f64_vec().unwrap());
                }
            }
            out
        };
        let (a, b) = (run(true), run(false));
        assert_eq!(a.len(), b.len(), "{norm:?} mask {mask}");
        for (p, q) in a.iter().zip(&b) {
            let r = rel_diff(p, q);
            assert!(r < 1e-13, "{norm:?} mask {mask}: {r:e}");
        }
    }
}

/// A row longer than the kernels' chunk, in f32, against the composed twin.
pub fn long_rows_agree_with_the_composed_twin(norm: Norm) {
    let mut rng = Rng::new(8);
    let d = 16384;
    let x = normal(&mut rng, 2 * d, 1.0, 0.5);
    let gamma = normal(&mut rng, d, 0.5, 1.0);
    let beta = normal(&mut rng, d, 0.5, 0.0);
    let dy = rng.vec(2 * d);
    let f = fused::<f32>(norm, &[2, d], &[d], &x, &gamma, &beta, &dy, 1e-5);
    let tape = Tape::<f32>::new();
    let xv = tape.var(tensor::<f32>(&[2, d], &x));
    let gv = tape.var(tensor::<f32>(&[d], &gamma));
    let bv = norm.centre().then(|| tape.var(tensor::<f32>(&[d], &beta)));
    let y = norm
        .composed(&xv, &[d], Some(&gv), bv.as_ref(), 1e-5)
        .unwrap();
    let g = y.backward_with(&tensor::<f32>(&[2, d], &dy)).unwrap();
    let v = |t: Tensor<f32>| t.to_f64_vec().unwrap();
    let c = (
        v(y.value().clone()),
        v(g.wrt(&xv).unwrap()),
        v(g.wrt(&gv).unwrap()),
        bv.map_or(vec![], |b| v(g.wrt(&b).unwrap())),
    );
    for (what, a, b) in named(&f, &c) {
        let r = rel_diff(a, b);
        assert!(r < 1e-5, "{norm:?} {what}: {r:e}");
    }
}

/// The checks of this module as tests of one norm.
macro_rules! family_tests {
    ($norm:expr) => {
        family_tests!(
            $norm;
            consolidated_backward_matches_step_by_step_chain_rule,
            no_rows_gives_empty_output_and_zero_param_grads,
            nan_stays_in_its_row,
            fused_saves_its_row_statistics_only,
            composed_twin_saves_at_least_one_value_per_element,
            results_are_bitwise_identical_for_one_and_two_threads,
            f16_and_bf16_follow_f64,
            optional_params_and_partial_gradients_match_composed,
            long_rows_agree_with_the_composed_twin,
        );
    };
    ($norm:expr; $($check:ident),* $(,)?) => {
        $(
            #[test]
            fn $check() {
                crate::norms::family::$check($norm)
            }
        )*
    };
}
pub(crate) use family_tests;
