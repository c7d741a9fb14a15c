//! The first section of the `fusegrad` report: a finite-difference check of
//! every primitive op, in f64, against a random cotangent.

use fusegrad::error::Result;
use fusegrad::gradcheck::{check, Options, Report};
use fusegrad::ops;
use fusegrad::rng::Rng;
use fusegrad::tape::Var;
use fusegrad::tensor::Tensor;
use fusegrad::tolerance::F64_VS_FD;

type F = Box<dyn Fn(&[Var<f64>]) -> Result<Var<f64>>>;

fn t(rng: &mut Rng, shape: &[usize], lo: f64, hi: f64) -> Result<Tensor<f64>> {
    let n = shape.iter().product();
    Tensor::from_vec(shape.to_vec(), (0..n).map(|_| rng.range(lo, hi)).collect())
}

/// Checks every primitive op on small random inputs (shapes chosen to
/// exercise broadcasting) and returns one report per op.
pub fn primitive_gradchecks() -> Result<Vec<Report>> {
    let mut r = Rng::new(2024);
    let g = &mut r;
    let cases: Vec<(&str, F, Vec<Tensor<f64>>)> = vec![
        (
            "add (bcast)",
            Box::new(|v| ops::add(&v[0], &v[1])),
            vec![t(g, &[3, 4], -2., 2.)?, t(g, &[4], -2., 2.)?],
        ),
        (
            "sub (bcast)",
            Box::new(|v| ops::sub(&v[0], &v[1])),
            vec![t(g, &[3, 1], -2., 2.)?, t(g, &[1, 4], -2., 2.)?],
        ),
        (
            "mul (bcast)",
            Box::new(|v| ops::mul(&v[0], &v[1])),
            vec![t(g, &[2, 3, 4], -2., 2.)?, t(g, &[3, 1], -2., 2.)?],
        ),
        (
            "div (bcast)",
            Box::new(|v| ops::div(&v[0], &v[1])),
            vec![t(g, &[3, 4], -2., 2.)?, t(g, &[4], 0.5, 2.)?],
        ),
        (
            "neg",
            Box::new(|v| ops::neg(&v[0])),
            vec![t(g, &[5], -2., 2.)?],
        ),
        (
            "scalar_add",
            Box::new(|v| ops::scalar_add(&v[0], 1.5)),
            vec![t(g, &[5], -2., 2.)?],
        ),
        (
            "scalar_mul",
            Box::new(|v| ops::scalar_mul(&v[0], -0.7)),
            vec![t(g, &[5], -2., 2.)?],
        ),
        (
            "powi(3)",
            Box::new(|v| ops::powi(&v[0], 3)),
            vec![t(g, &[6], -2., 2.)?],
        ),
        (
            "sqrt",
            Box::new(|v| ops::sqrt(&v[0])),
            vec![t(g, &[6], 0.2, 3.)?],
        ),
        (
            "rsqrt",
            Box::new(|v| ops::rsqrt(&v[0])),
            vec![t(g, &[6], 0.2, 3.)?],
        ),
        (
            "exp",
            Box::new(|v| ops::exp(&v[0])),
            vec![t(g, &[6], -2., 2.)?],
        ),
        (
            "log",
            Box::new(|v| ops::log(&v[0])),
            vec![t(g, &[6], 0.2, 3.)?],
        ),
        (
            "tanh",
            Box::new(|v| ops::tanh(&v[0])),
            vec![t(g, &[6], -2., 2.)?],
        ),
        (
            "sigmoid",
            Box::new(|v| ops::sigmoid(&v[0])),
            vec![t(g, &[6], -3., 3.)?],
        ),
        (
            "relu",
            Box::new(|v| ops::relu(&v[0])),
            vec![Tensor::from_vec(vec![4], vec![-1.5, -0.3, 0.4, 2.0])?],
        ),
        (
            "gelu",
            Box::new(|v| ops::gelu(&v[0])),
            vec![t(g, &[6], -3., 3.)?],
        ),
        (
            "gelu_tanh",
            Box::new(|v| ops::gelu_tanh(&v[0])),
            vec![t(g, &[6], -3., 3.)?],
        ),
        (
            "reshape",
            Box::new(|v| ops::reshape(&v[0], &[4, 3])),
            vec![t(g, &[2, 6], -2., 2.)?],
        ),
        (
            "transpose",
            Box::new(|v| ops::transpose(&v[0], 0, -1)),
            vec![t(g, &[2, 3, 4], -2., 2.)?],
        ),
        (
            "permute",
            Box::new(|v| ops::permute(&v[0], &[2, 0, 1])),
            vec![t(g, &[2, 3, 4], -2., 2.)?],
        ),
        (
            "broadcast_to",
            Box::new(|v| ops::broadcast_to(&v[0], &[2, 3, 4])),
            vec![t(g, &[3, 1], -2., 2.)?],
        ),
        (
            "sum",
            Box::new(|v| ops::sum(&v[0])),
            vec![t(g, &[3, 4], -2., 2.)?],
        ),
        (
            "mean",
            Box::new(|v| ops::mean(&v[0])),
            vec![t(g, &[3, 4], -2., 2.)?],
        ),
        (
            "sum_axes([0,2])",
            Box::new(|v| ops::sum_axes(&v[0], &[0, 2], false)),
            vec![t(g, &[2, 3, 4], -2., 2.)?],
        ),
        (
            "mean_axes([-1],keep)",
            Box::new(|v| ops::mean_axes(&v[0], &[-1], true)),
            vec![t(g, &[2, 3, 4], -2., 2.)?],
        ),
        (
            "matmul 2-D",
            Box::new(|v| ops::matmul(&v[0], &v[1])),
            vec![t(g, &[3, 4], -2., 2.)?, t(g, &[4, 5], -2., 2.)?],
        ),
        (
            "matmul batched",
            Box::new(|v| ops::matmul(&v[0], &v[1])),
            vec![t(g, &[2, 3, 4], -2., 2.)?, t(g, &[4, 2], -2., 2.)?],
        ),
        (
            "softmax",
            Box::new(|v| ops::softmax(&v[0], -1)),
            vec![t(g, &[3, 5], -3., 3.)?],
        ),
        (
            "log_softmax",
            Box::new(|v| ops::log_softmax(&v[0], 0)),
            vec![t(g, &[3, 5], -3., 3.)?],
        ),
        (
            "mse",
            Box::new(|v| ops::mse(&v[0], &v[1])),
            vec![t(g, &[3, 4], -2., 2.)?, t(g, &[3, 4], -2., 2.)?],
        ),
        (
            "cross_entropy",
            Box::new(|v| ops::cross_entropy(&v[0], &[2, 0, 4])),
            vec![t(g, &[3, 5], -3., 3.)?],
        ),
    ];
    let opts = Options {
        atol: F64_VS_FD.atol,
        rtol: F64_VS_FD.rtol,
        ..Options::default()
    };
    cases
        .into_iter()
        .map(|(name, f, inputs)| {
            let mut rep = check(f, &inputs, &opts)?;
            rep.name = name.to_string();
            Ok(rep)
        })
        .collect()
}
