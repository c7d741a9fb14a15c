//! The threaded elementwise and reduction kernels at sizes that span many
//! work chunks: every broadcast layout and reduced-axis set against a plain
//! reference loop, and the same bits on one thread as on two.

use fusegrad::rng::Rng;
use fusegrad::{ops, Element, Result, Tape, Tensor};
use half::bf16;

fn rand<T: Element>(rng: &mut Rng, shape: &[usize]) -> Result<Tensor<T>> {
    let n: usize = shape.iter().product();
    let v: Vec<T> = (0..n).map(|_| T::from_f64(rng.normal())).collect();
    Tensor::from_vec(shape.to_vec(), v)
}

/// Offset into a tensor of `shape` (right-aligned to `out`) of the output
/// multi-index `idx`, with broadcast dims read at 0.
fn offset(shape: &[usize], out: &[usize], idx: &[usize]) -> usize {
    let lead = out.len() - shape.len();
    let mut o = 0;
    for (d, &n) in shape.iter().enumerate() {
        let i = if n == 1 { 0 } else { idx[lead + d] };
        o = o * n + i;
    }
    o
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

/// Broadcast layouts whose outputs span several 32768-element chunks:
/// same shape, a row vector, a column, an outer product, a middle axis,
/// a scalar, and missing leading dims.
const LAYOUTS: [(&[usize], &[usize]); 8] = [
    (&[300, 257], &[300, 257]),
    (&[300, 257], &[257]),
    (&[300, 257], &[300, 1]),
    (&[300, 1], &[1, 257]),
    (&[6, 50, 257], &[6, 1, 257]),
    (&[6, 50, 257], &[50, 1]),
    (&[], &[300, 257]),
    (&[1, 300, 1], &[7, 1, 257]),
];

fn binary_matches_reference<T: Element>() -> Result<()> {
    let mut rng = Rng::new(11);
    for (sa, sb) in LAYOUTS {
        let (a, b) = (rand::<T>(&mut rng, sa)?, rand::<T>(&mut rng, sb)?);
        let tape = Tape::new();
        let (va, vb) = (tape.constant(a.clone()), tape.constant(b.clone()));
        let out_shape = ops::add(&va, &vb)?.shape().to_vec();
        let (av, bv) = (a.as_slice()?, b.as_slice()?);
        type F<T> = fn(<T as Element>::Acc, <T as Element>::Acc) -> <T as Element>::Acc;
        let cases: [(&str, F<T>); 4] = [
            ("add", |p, q| p + q),
            ("sub", |p, q| p - q),
            ("mul", |p, q| p * q),
            ("div", |p, q| p / q),
        ];
        for (name, f) in cases {
            let y = match name {
                "add" => ops::add(&va, &vb)?,
                "sub" => ops::sub(&va, &vb)?,
                "mul" => ops::mul(&va, &vb)?,
                _ => ops::div(&va, &vb)?,
            };
            assert_eq!(y.shape(), &out_shape[..]);
            let ys = y.value().as_slice()?;
            for (i, &got) in ys.iter().enumerate() {
                let idx = unravel(i, &out_shape);
                let p = av[offset(sa, &out_shape, &idx)].to_acc();
                let q = bv[offset(sb, &out_shape, &idx)].to_acc();
                let want = T::from_acc(f(p, q));
                assert!(
                    got == want || (got.to_f64().is_nan() && want.to_f64().is_nan()),
                    "{name} {sa:?} {sb:?} {} at {i}: {got:?} vs {want:?}",
                    T::NAME
                );
            }
        }
    }
    Ok(())
}

#[test]
fn binary_ops_match_a_reference_loop_in_every_layout() -> Result<()> {
    binary_matches_reference::<f32>()?;
    binary_matches_reference::<f64>()?;
    binary_matches_reference::<bf16>()
}

/// Sums over axis sets that take each path: trailing rows, leading
/// columns, a middle block, everything, and a split set.
const SUMS: [(&[usize], &[isize]); 7] = [
    (&[300, 257], &[1]),
    (&[300, 257], &[0]),
    (&[6, 50, 257], &[1]),
    (&[6, 50, 257], &[0, 1]),
    (&[6, 50, 257], &[]),
    (&[6, 50, 257], &[0, 2]),
    (&[1, 70_000], &[1]),
];

#[test]
fn sums_over_axes_match_an_f64_reference() -> Result<()> {
    let mut rng = Rng::new(5);
    for (shape, axes) in SUMS {
        let x = rand::<f32>(&mut rng, shape)?;
        let tape = Tape::new();
        let y = ops::sum_axes(&tape.constant(x.clone()), axes, true)?;
        let keep = y.shape().to_vec();
        let mut want = vec![0f64; keep.iter().product()];
        let mut mag = vec![0f64; want.len()];
        for (i, &v) in x.as_slice()?.iter().enumerate() {
            let o = offset(&keep, shape, &unravel(i, shape));
            want[o] += v as f64;
            mag[o] += (v as f64).abs();
        }
        for (k, &got) in y.value().as_slice()?.iter().enumerate() {
            let err = (got as f64 - want[k]).abs();
            assert!(
                err <= 1e-6 * mag[k].max(1.0),
                "{shape:?} over {axes:?} at {k}: {got} vs {}",
                want[k]
            );
        }
    }
    Ok(())
}

/// Every output of a training-like step: broadcast ops and reductions
/// forward, their gradients (fan-out and sums back to broadcast shapes).
fn step_bits(threads: usize) -> Result<Vec<Vec<u32>>> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| fusegrad::Error::InvalidArgument {
            op: "test",
            msg: e.to_string(),
        })?;
    pool.install(|| {
        let mut rng = Rng::new(3);
        let tape = Tape::new();
        let x = tape.var(rand::<f32>(&mut rng, &[512, 300])?);
        let b = tape.var(rand::<f32>(&mut rng, &[300])?);
        let c = tape.var(rand::<f32>(&mut rng, &[512, 1])?);
        let h = ops::mul(&ops::add(&x, &b)?, &c)?;
        let h = ops::add(&ops::tanh(&h)?, &x)?;
        let s = ops::sum_axes(&h, &[0], false)?;
        let loss = ops::sum(&ops::mul(&s, &b)?)?;
        let g = loss.backward()?;
        let mut out = vec![h.value().clone(), s.value().clone(), loss.value().clone()];
        for v in [&x, &b, &c] {
            out.push(g.wrt(v)?);
        }
        out.iter()
            .map(|t| Ok(t.as_slice()?.iter().map(|v| v.to_bits()).collect()))
            .collect()
    })
}

#[test]
fn one_thread_and_two_give_the_same_bits() -> Result<()> {
    let one = step_bits(1)?;
    assert_eq!(one, step_bits(2)?);
    assert_eq!(one, step_bits(2)?, "two runs on two threads differ");
    Ok(())
}
