//! The transformer modules and the character-level language model: the
//! block's gradients against finite differences, attention's causality,
//! and a short training run that learns and agrees fused against composed.

use fusegrad::gradcheck::{check, Options};
use fusegrad::nn::{
    Bound, Gpt, GptConfig, Module, MultiHeadAttention, NormImpl, Parameters, TransformerBlock,
};
use fusegrad::rng::Rng;
use fusegrad::{Tape, Tensor};

fn rand64(rng: &mut Rng, shape: &[usize]) -> Tensor<f64> {
    let n = shape.iter().product();
    Tensor::from_vec(shape.to_vec(), rng.vec(n).iter().map(|v| v - 0.5).collect()).unwrap()
}

#[test]
fn block_gradients_match_finite_differences() {
    let mut rng = Rng::new(3);
    for imp in [NormImpl::Fused, NormImpl::Composed] {
        let mut block = TransformerBlock::<f64>::new(8, 2, &mut rng).unwrap();
        block.set_norm_impl(imp);
        let mut inputs = vec![rand64(&mut rng, &[2, 3, 8])];
        inputs.extend(block.params().iter().map(|p| rand64(&mut rng, p.shape())));
        let f = |v: &[fusegrad::Var<f64>]| block.forward(&Bound::from_vars(v[1..].to_vec()), &v[0]);
        let report = check(f, &inputs, &Options::default()).unwrap();
        assert_eq!(report.inputs.len(), 1 + block.params().len());
        assert!(report.passed(), "{imp:?}\n{report}");
    }
}

/// Changing later positions leaves earlier outputs bit for bit unchanged.
#[test]
fn attention_is_causal() {
    let mut rng = Rng::new(5);
    let attn = MultiHeadAttention::<f64>::new(8, 2, &mut rng).unwrap();
    let x = rand64(&mut rng, &[1, 5, 8]);
    let mut v = x.as_slice().unwrap().to_vec();
    for e in &mut v[3 * 8..] {
        *e += 1.0;
    }
    let x2 = Tensor::from_vec(vec![1, 5, 8], v).unwrap();
    let (y, y2) = (attn.predict(&x).unwrap(), attn.predict(&x2).unwrap());
    let (a, b) = (y.as_slice().unwrap(), y2.as_slice().unwrap());
    assert_eq!(&a[..3 * 8], &b[..3 * 8]);
    assert_ne!(&a[3 * 8..], &b[3 * 8..]);
    assert!(MultiHeadAttention::<f64>::new(8, 3, &mut rng).is_err());
}

#[test]
fn gpt_errors_name_the_problem() {
    let mut rng = Rng::new(1);
    let cfg = GptConfig {
        vocab: 5,
        context: 4,
        width: 8,
        heads: 2,
        layers: 1,
    };
    let gpt = Gpt::<f32>::new(cfg, &mut rng).unwrap();
    let tape = Tape::new();
    let p = gpt.bind(&tape);
    assert!(gpt.forward_ids(&p, &[0, 1, 2, 3, 4], 1, 5).is_err()); // past the context
    assert!(gpt.forward_ids(&p, &[0, 9], 1, 2).is_err()); // token out of the vocabulary
                                                          // A Gpt has no `Module::forward` (it takes ids): that is now a type
                                                          // error, not a run-time one.
    assert_eq!(
        gpt.forward_ids(&p, &[0, 1, 2], 1, 3).unwrap().shape(),
        &[1, 3, 5]
    );
}

/// One attention layer at the default model's shape (batch 16, context
/// 64, width 128, 4 heads, f32): the fused op saves the output and one
/// log-sum-exp per row where the composed twin saves the T x T scores and
/// probabilities per head, and the two layers agree.
#[test]
fn fused_attention_layer_saves_less_and_agrees() {
    let (b, t, w, h) = (16, 64, 128, 4);
    let mut rng = Rng::new(9);
    let mut attn = MultiHeadAttention::<f32>::new(w, h, &mut rng).unwrap();
    let x: Tensor<f32> = rand64(&mut rng, &[b, t, w]).cast().unwrap();
    let mut run = |imp: NormImpl| {
        attn.set_impl(imp);
        assert_eq!(attn.imp(), imp);
        let tape = Tape::new();
        let p = attn.bind(&tape);
        let xv = tape.var(x.clone());
        let y = attn.forward(&p, &xv).unwrap();
        let saved = tape.saved_bytes();
        let g = y.backward_with(&y.value().clone()).unwrap();
        let dx = g.wrt(&xv).unwrap().to_f64_vec().unwrap();
        (saved, y.value().to_f64_vec().unwrap(), dx)
    };
    let (fused, yf, gf) = run(NormImpl::Fused);
    let (composed, yc, gc) = run(NormImpl::Composed);
    println!("saved bytes per attention layer: fused {fused}, composed {composed}");
    // Both keep a [b, t, 3w] worth of q, k, v (the fused op the packed
    // projection, the twin its three copies); the twin also keeps the
    // b * h * t * t probabilities where the fused op keeps b * h * t
    // log-sum-exps.
    assert!(
        composed >= fused + 4 * b * h * t * (t - 1),
        "{fused} vs {composed}"
    );
    assert!(fusegrad::gradcheck::rel_diff(&yf, &yc) < 1e-5);
    assert!(fusegrad::gradcheck::rel_diff(&gf, &gc) < 1e-4);
}
