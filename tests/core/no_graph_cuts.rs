//! No silent graph cuts.
//!
//! Every public op in `ops/` is applied to variables; its output must
//! require a gradient, be recorded as an op node (not a leaf), and a backward
//! sweep from a random cotangent must give every differentiable input a
//! finite, nonzero gradient that matches central finite differences. A guard
//! reads the `pub fn`s out of `ops/` so a new op without an entry here fails.
//!
//! The tape itself refuses to cut: an op that declares no backward is
//! `Error::NoBackward` as soon as an input requires a gradient, and a
//! backward that returns no gradient for an input that needs one makes the
//! sweep fail with `Error::NoBackward`.

use fusegrad::gradcheck::{self, Options};
use fusegrad::rng::Rng;
use fusegrad::{ops, Error, Op, Tape, Tensor, Var};
use std::collections::BTreeSet;

type F = Box<dyn Fn(&[Var<f64>]) -> fusegrad::Result<Var<f64>>>;

/// One op under test: name, the function on its inputs, the input shapes.
struct Entry {
    name: &'static str,
    f: F,
    shapes: Vec<Vec<usize>>,
}

fn entry(
    name: &'static str,
    shapes: &[&[usize]],
    f: impl Fn(&[Var<f64>]) -> fusegrad::Result<Var<f64>> + 'static,
) -> Entry {
    Entry {
        name,
        f: Box::new(f),
        shapes: shapes.iter().map(|s| s.to_vec()).collect(),
    }
}

/// Every public op, on small inputs that keep it smooth (values in
/// [0.5, 2]: positive for sqrt/rsqrt/log, away from relu's kink).
fn entries() -> Vec<Entry> {
    let m: &[usize] = &[2, 3];
    let v: &[usize] = &[3];
    let qkv4: &[usize] = &[1, 2, 3, 2];
    vec![
        entry("add", &[m, v], |x| ops::add(&x[0], &x[1])),
        entry("sub", &[m, v], |x| ops::sub(&x[0], &x[1])),
        entry("mul", &[m, v], |x| ops::mul(&x[0], &x[1])),
        entry("div", &[m, v], |x| ops::div(&x[0], &x[1])),
        entry("neg", &[m], |x| ops::neg(&x[0])),
        entry("scalar_add", &[m], |x| ops::scalar_add(&x[0], 0.5)),
        entry("scalar_mul", &[m], |x| ops::scalar_mul(&x[0], -1.5)),
        entry("powi", &[m], |x| ops::powi(&x[0], 3)),
        entry("sqrt", &[m], |x| ops::sqrt(&x[0])),
        entry("rsqrt", &[m], |x| ops::rsqrt(&x[0])),
        entry("exp", &[m], |x| ops::exp(&x[0])),
        entry("log", &[m], |x| ops::log(&x[0])),
        entry("tanh", &[m], |x| ops::tanh(&x[0])),
        entry("sigmoid", &[m], |x| ops::sigmoid(&x[0])),
        entry("relu", &[m], |x| ops::relu(&x[0])),
        entry("gelu", &[m], |x| ops::gelu(&x[0])),
        entry("gelu_tanh", &[m], |x| ops::gelu_tanh(&x[0])),
        // Index, mask and generator arguments are fixed inside the closure.
        entry("embedding", &[&[4, 3]], |x| {
            ops::embedding(&x[0], &[2, 0, 2, 3], &[2, 2])
        }),
        entry("narrow", &[&[2, 5]], |x| ops::narrow(&x[0], -1, 1, 3)),
        entry("concat", &[&[2, 3], &[2, 2]], |x| {
            ops::concat(&[&x[0], &x[1]], 1)
        }),
        entry("masked_fill", &[&[2, 3, 3]], |x| {
            ops::masked_fill(&x[0], &ops::causal_mask(3)?, -2.0)
        }),
        entry("dropout", &[m], |x| {
            ops::dropout(&x[0], 0.3, &mut Rng::new(5), true)
        }),
        entry("sum", &[m], |x| ops::sum(&x[0])),
        entry("mean", &[m], |x| ops::mean(&x[0])),
        entry("sum_axes", &[&[2, 3, 2]], |x| {
            ops::sum_axes(&x[0], &[0, 2], false)
        }),
        entry("mean_axes", &[&[2, 3, 2]], |x| {
            ops::mean_axes(&x[0], &[1], true)
        }),
        entry("reshape", &[m], |x| ops::reshape(&x[0], &[3, 2])),
        entry("transpose", &[m], |x| ops::transpose(&x[0], 0, 1)),
        entry("permute", &[&[2, 3, 2]], |x| {
            ops::permute(&x[0], &[2, 0, 1])
        }),
        entry("broadcast_to", &[v], |x| ops::broadcast_to(&x[0], &[2, 3])),
        entry("matmul", &[&[2, 2, 3], &[3, 4]], |x| {
            ops::matmul(&x[0], &x[1])
        }),
        entry("linear", &[&[2, 2, 3], &[3, 4], &[4]], |x| {
            ops::linear(&x[0], &x[1], &x[2])
        }),
        entry("linear_composed", &[&[2, 2, 3], &[3, 4], &[4]], |x| {
            ops::linear_composed(&x[0], &x[1], &x[2])
        }),
        entry("softmax", &[m], |x| ops::softmax(&x[0], -1)),
        entry("log_softmax", &[m], |x| ops::log_softmax(&x[0], 0)),
        entry("mse", &[m, m], |x| ops::mse(&x[0], &x[1])),
        entry("cross_entropy", &[m], |x| {
            ops::cross_entropy(&x[0], &[2, 0])
        }),
        entry("layer_norm", &[&[2, 4], &[4], &[4]], |x| {
            ops::layer_norm(&x[0], Some(&x[1]), Some(&x[2]), 1e-5)
        }),
        entry("layer_norm_nd", &[&[2, 2, 3], &[2, 3], &[2, 3]], |x| {
            ops::layer_norm_nd(&x[0], &[2, 3], Some(&x[1]), Some(&x[2]), 1e-5)
        }),
        entry("layer_norm_composed", &[&[2, 4], &[4], &[4]], |x| {
            ops::layer_norm_composed(&x[0], Some(&x[1]), Some(&x[2]), 1e-5)
        }),
        entry(
            "layer_norm_composed_nd",
            &[&[2, 2, 3], &[2, 3], &[2, 3]],
            |x| ops::layer_norm_composed_nd(&x[0], &[2, 3], Some(&x[1]), Some(&x[2]), 1e-5),
        ),
        entry("rms_norm", &[&[2, 4], &[4]], |x| {
            ops::rms_norm(&x[0], Some(&x[1]), 1e-5)
        }),
        entry("rms_norm_nd", &[&[2, 2, 3], &[2, 3]], |x| {
            ops::rms_norm_nd(&x[0], &[2, 3], Some(&x[1]), 1e-5)
        }),
        entry("rms_norm_composed", &[&[2, 4], &[4]], |x| {
            ops::rms_norm_composed(&x[0], Some(&x[1]), 1e-5)
        }),
        entry("rms_norm_composed_nd", &[&[2, 2, 3], &[2, 3]], |x| {
            ops::rms_norm_composed_nd(&x[0], &[2, 3], Some(&x[1]), 1e-5)
        }),
        // q, k, v of [batch 1, heads 2, T 3, head_dim 2]; causal and not.
        entry("attention", &[qkv4, qkv4, qkv4], |x| {
            ops::attention(&x[0], &x[1], &x[2], true, 0.7)
        }),
        entry("attention_composed", &[qkv4, qkv4, qkv4], |x| {
            ops::attention_composed(&x[0], &x[1], &x[2], false, 0.7)
        }),
        // Packed projection of [batch 1, T 3, 3 * heads 2 * head_dim 2].
        entry("attention_qkv", &[&[1, 3, 12]], |x| {
            ops::attention_qkv(&x[0], 2, false, 0.7)
        }),
        entry("attention_qkv_composed", &[&[1, 3, 12]], |x| {
            ops::attention_qkv_composed(&x[0], 2, true, 0.7)
        }),
    ]
}

fn inputs(shapes: &[Vec<usize>], rng: &mut Rng) -> Vec<Tensor<f64>> {
    shapes
        .iter()
        .map(|s| {
            let n = s.iter().product();
            Tensor::from_vec(s.clone(), (0..n).map(|_| rng.range(0.5, 2.0)).collect()).unwrap()
        })
        .collect()
}

/// The names of the `pub fn`s in `ops/` (the files behind `fusegrad::ops`,
/// and the files of each op family's folder; `util.rs` is private).
fn public_ops() -> BTreeSet<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ops");
    let mut files = vec![];
    for e in std::fs::read_dir(&root).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            // An op family's ops sit in its `mod.rs` or in sibling files
            // (`elementwise/pointwise.rs`); device loops hold no public ops.
            for f in std::fs::read_dir(&p).unwrap() {
                let f = f.unwrap().path();
                if f.extension().is_some_and(|x| x == "rs") {
                    files.push(f);
                }
            }
        } else if p
            .file_name()
            .is_some_and(|n| n != "util.rs" && n != "mod.rs")
        {
            files.push(p);
        }
    }
    let mut names = BTreeSet::new();
    for f in files {
        let Ok(src) = std::fs::read_to_string(&f) else {
            continue;
        };
        for line in src.lines() {
            if let Some(rest) = line.strip_prefix("pub fn ") {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.insert(name);
            }
        }
    }
    names
}

#[test]
fn every_public_op_is_covered() {
    let covered: BTreeSet<String> = entries().iter().map(|e| e.name.to_string()).collect();
    let public = public_ops();
    assert!(public.len() >= 30, "found only {public:?}");
    let missing: Vec<_> = public.difference(&covered).collect();
    assert!(
        missing.is_empty(),
        "ops without a graph-cut test: {missing:?}"
    );
}

#[test]
fn every_op_records_a_backward_that_reaches_every_input() {
    let mut rng = Rng::new(11);
    for e in entries() {
        let xs = inputs(&e.shapes, &mut rng);
        let tape = Tape::new();
        let vars: Vec<Var<f64>> = xs.iter().map(|t| tape.var(t.clone())).collect();
        let y = (e.f)(&vars).unwrap();
        assert!(
            y.requires_grad(),
            "{}: output does not require grad",
            e.name
        );
        let node = &tape.nodes()[y.id()];
        assert_ne!(node.op, "leaf", "{}: output recorded as a leaf", e.name);
        // A random cotangent, never a plain sum.
        let c: Vec<f64> = (0..y.value().numel())
            .map(|_| rng.range(-1.0, 1.0))
            .collect();
        let grads = y
            .backward_with(&Tensor::from_vec(y.shape().to_vec(), c).unwrap())
            .unwrap();
        for (i, v) in vars.iter().enumerate() {
            let g = grads.wrt(v).unwrap().to_f64_vec().unwrap();
            assert!(
                g.iter().all(|a| a.is_finite()) && g.iter().any(|a| *a != 0.0),
                "{} input {i}: gradient {g:?}",
                e.name
            );
        }
        // ... and it is the right gradient.
        let report = gradcheck::check(
            |v| (e.f)(v),
            &xs,
            &Options {
                atol: 1e-7,
                rtol: 1e-5,
                ..Options::default()
            },
        )
        .unwrap();
        assert!(report.passed(), "{}:\n{report}", e.name);
    }
}

#[test]
fn constants_take_no_gradient_and_vars_next_to_them_do() {
    let mut rng = Rng::new(12);
    for e in entries().into_iter().filter(|e| e.shapes.len() > 1) {
        let xs = inputs(&e.shapes, &mut rng);
        for k in 0..xs.len() {
            let tape = Tape::new();
            // Input k is a variable, the others constants.
            let vars: Vec<Var<f64>> = xs
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    if i == k {
                        tape.var(t.clone())
                    } else {
                        tape.constant(t.clone())
                    }
                })
                .collect();
            let y = (e.f)(&vars).unwrap();
            assert!(y.requires_grad(), "{} with var {k}", e.name);
            let c = Tensor::from_vec(
                y.shape().to_vec(),
                (0..y.value().numel())
                    .map(|_| rng.range(-1.0, 1.0))
                    .collect(),
            )
            .unwrap();
            let grads = y.backward_with(&c).unwrap();
            for (i, v) in vars.iter().enumerate() {
                let g = grads.wrt(v);
                if i == k {
                    let g = g.unwrap().to_f64_vec().unwrap();
                    assert!(g.iter().any(|a| *a != 0.0), "{} input {i}", e.name);
                } else {
                    assert!(matches!(g, Err(Error::NoGradient { .. })), "{}", e.name);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Ops that would cut the graph are refused.

/// An op with no backward (say, a rounding op).
struct Round;

impl Op<f64> for Round {
    type State = ();
    fn name(&self) -> &'static str {
        "round"
    }
    fn differentiable(&self) -> bool {
        false
    }
    fn forward(&self, x: &[&Tensor<f64>]) -> fusegrad::Result<(Tensor<f64>, ())> {
        let v = x[0].as_slice()?.iter().map(|a| a.round()).collect();
        Ok((Tensor::from_vec(x[0].shape().to_vec(), v)?, ()))
    }
    fn backward(
        &self,
        _: &(),
        _: &Tensor<f64>,
        _: &[bool],
    ) -> fusegrad::Result<Vec<Option<Tensor<f64>>>> {
        Err(Error::NoBackward { op: "round" })
    }
}

/// An op whose backward forgets its second input.
struct Forgetful;

impl Op<f64> for Forgetful {
    type State = ();
    fn name(&self) -> &'static str {
        "forgetful"
    }
    fn forward(&self, x: &[&Tensor<f64>]) -> fusegrad::Result<(Tensor<f64>, ())> {
        let v = x[0]
            .as_slice()?
            .iter()
            .zip(x[1].as_slice()?)
            .map(|(a, b)| a * b)
            .collect();
        Ok((Tensor::from_vec(x[0].shape().to_vec(), v)?, ()))
    }
    fn backward(
        &self,
        _: &(),
        g: &Tensor<f64>,
        _: &[bool],
    ) -> fusegrad::Result<Vec<Option<Tensor<f64>>>> {
        Ok(vec![Some(g.clone()), None])
    }
}

#[test]
fn an_op_without_backward_is_refused_when_a_gradient_is_needed() {
    let tape = Tape::new();
    let x = tape.var(Tensor::from_vec(vec![2], vec![0.4, 1.6]).unwrap());
    let c = tape.constant(Tensor::from_vec(vec![2], vec![0.4, 1.6]).unwrap());
    let before = tape.len();
    assert_eq!(
        Tape::apply(Round, &[&x]).unwrap_err(),
        Error::NoBackward { op: "round" }
    );
    assert_eq!(tape.len(), before, "nothing recorded");
    // Downstream of a variable, too.
    let y = ops::scalar_mul(&x, 2.0).unwrap();
    assert!(matches!(
        Tape::apply(Round, &[&y]),
        Err(Error::NoBackward { .. })
    ));
    // On constants it simply runs.
    let r = Tape::apply(Round, &[&c]).unwrap();
    assert_eq!(r.value().as_slice().unwrap(), &[0.0, 2.0]);
    assert!(!r.requires_grad());
}

#[test]
fn a_backward_that_drops_a_needed_gradient_fails_the_sweep() {
    let tape = Tape::new();
    let a = tape.var(Tensor::from_vec(vec![2], vec![1.0, 2.0]).unwrap());
    let b = tape.var(Tensor::from_vec(vec![2], vec![3.0, 4.0]).unwrap());
    let y = Tape::apply(Forgetful, &[&a, &b]).unwrap();
    let seed = Tensor::from_vec(vec![2], vec![0.5, -1.0]).unwrap();
    assert_eq!(
        y.backward_with(&seed).err(),
        Some(Error::NoBackward { op: "forgetful" })
    );
    // With b a constant, the missing gradient is not needed: fine.
    let c = tape.constant(Tensor::from_vec(vec![2], vec![3.0, 4.0]).unwrap());
    let y = Tape::apply(Forgetful, &[&a, &c]).unwrap();
    let g = y.backward_with(&seed).unwrap();
    assert_eq!(g.wrt(&a).unwrap().as_slice().unwrap(), &[0.5, -1.0]);
}
