//! CPU loops for the elementwise kinds: the output cut into fixed chunks run
//! by the thread team, each chunk walked in pieces that lie in one row of
//! the collapsed broadcast layout. Add, sub and mul over contiguous pieces
//! run in SIMD lanes with non-temporal stores for large f32 outputs; exp,
//! log, tanh, sigmoid and the exact GELU (forward and slope) of f32, f16
//! and bf16 run the vectorizable f32 functions of [`super::vmath`]; every
//! other kind, and every kind of f64, is a scalar loop in the accumulation
//! type.

use super::vmath::{self, map_row, via_f32, zip_row};
use super::{Binary, Unary};
use crate::device::cpu::{
    dispatch, fence, is_f32, run_each, should_stream, write_row, Kernel, Lanes,
};
use crate::device::pool::Buffer;
use crate::dtype::{Accum, Element};
use crate::special::{normal_cdf, normal_pdf};
use crate::tensor::Dims;
use num_traits::{Float, Zero};

type Acc<T> = <T as Element>::Acc;

/// Output elements per team task. Fixed, so the work split never depends on
/// the thread count.
pub(crate) const CHUNK: usize = 1 << 15;

/// A broadcast layout with size-1 dims dropped and adjacent dims merged
/// where every operand steps through them as one: the last dim is the row
/// each piece lies in.
pub(crate) struct Layout<const K: usize> {
    shape: Dims,
    strides: [Dims; K],
}

impl<const K: usize> Layout<K> {
    /// The layout of `out` with operand `k` of shape `shapes[k]`
    /// broadcast to it. Inline up to [`Dims::INLINE`] dims: most ops of a
    /// training step are small, and this costs them no allocation.
    pub(crate) fn new(out: &[usize], shapes: [&[usize]; K]) -> Self {
        let strides: [Dims; K] = std::array::from_fn(|k| broadcast_dims(shapes[k], out));
        let mut shape = Dims::new();
        let mut st: [Dims; K] = std::array::from_fn(|_| Dims::new());
        for (d, &n) in out.iter().enumerate() {
            if n == 1 {
                continue;
            }
            let merge = shape
                .last()
                .is_some_and(|_| (0..K).all(|k| st[k].last().copied() == Some(strides[k][d] * n)));
            if merge {
                if let Some(l) = shape.last_mut() {
                    *l *= n;
                }
                for k in 0..K {
                    if let Some(l) = st[k].last_mut() {
                        *l = strides[k][d];
                    }
                }
            } else {
                shape.push(n);
                for k in 0..K {
                    st[k].push(strides[k][d]);
                }
            }
        }
        Layout { shape, strides: st }
    }

    /// `n` contiguous elements in every operand: one row, no broadcast.
    #[inline]
    pub(crate) fn flat(n: usize) -> Self {
        let one = |v| Dims::Inline(1, [v, 0, 0, 0]);
        Layout {
            shape: one(n),
            strides: [(); K].map(|_| one(1)),
        }
    }

    /// The layout of `out` for operands of shapes `shapes`: flat when all
    /// are `out` (the common case, with nothing to work out).
    #[inline]
    pub(crate) fn of(out: &[usize], shapes: [&[usize]; K]) -> Self {
        if shapes.iter().all(|s| *s == out) {
            Self::flat(out.iter().product())
        } else {
            Self::new(out, shapes)
        }
    }

    /// Elements per row.
    fn row_len(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Each operand's step along a row.
    fn row_steps(&self) -> [usize; K] {
        std::array::from_fn(|k| self.strides[k].last().copied().unwrap_or(0))
    }

    /// Each operand's offset of output element `i`.
    fn offsets(&self, i: usize) -> [usize; K] {
        let mut o = [0; K];
        let mut rest = i;
        for d in (0..self.shape.len()).rev() {
            let (q, r) = (rest / self.shape[d], rest % self.shape[d]);
            for (k, ok) in o.iter_mut().enumerate() {
                *ok += r * self.strides[k][d];
            }
            rest = q;
        }
        o
    }

    /// Calls `f(dst piece, operand offsets, operand steps)` for the pieces
    /// of `dst` (output elements `start..`) that each lie in one row.
    #[inline(always)]
    pub(crate) fn walk<T>(
        &self,
        start: usize,
        dst: &mut [T],
        mut f: impl FnMut(&mut [T], [usize; K], [usize; K]),
    ) {
        let (l, steps) = (self.row_len(), self.row_steps());
        let mut i = 0;
        while i < dst.len() {
            let at = start + i;
            let len = (l - at % l).min(dst.len() - i);
            f(&mut dst[i..i + len], self.offsets(at), steps);
            i += len;
        }
    }
}

/// [`crate::layout::broadcast_strides`] without allocating for short shapes.
fn broadcast_dims(shape: &[usize], out: &[usize]) -> Dims {
    let mut s = Dims::collect(out.iter().map(|_| 0));
    let lead = out.len().saturating_sub(shape.len());
    let skip = shape.len().saturating_sub(out.len());
    let mut step = 1usize;
    for i in (0..out.len()).rev() {
        if i < lead {
            break;
        }
        let n = shape[i - lead + skip];
        if n != 1 {
            s[i] = step;
        }
        step = step.saturating_mul(n);
    }
    s
}

/// Runs `f(first output index, chunk)` over `dst` in [`CHUNK`]s on the team.
pub(crate) fn par_chunks<T: Element>(dst: &mut [T], f: impl Fn(usize, &mut [T]) + Sync) {
    // One chunk: run it here, with no job list to allocate (small tensors
    // are most ops of a training step).
    if dst.len() <= CHUNK {
        return f(0, dst);
    }
    let jobs: Vec<(usize, &mut [T])> = dst
        .chunks_mut(CHUNK)
        .enumerate()
        .map(|(t, c)| (t * CHUNK, c))
        .collect();
    run_each(jobs, |(s, c)| f(s, c));
}

/// `k` applied to every element of `x`.
pub(crate) fn unary<T: Element>(k: Unary, x: &[T]) -> Buffer<T> {
    let mut out = Buffer::take(x.len());
    unary_into(k, x, &Layout::flat(x.len()), &mut out);
    out
}

/// The exact GELU of `x` and its slope, in one pass through one Gaussian
/// tail per value (`vmath::gelu_erf_and_slope`: the bits of the two
/// separate kernels), for an f32 accumulation type.
pub(crate) fn gelu_and_slope<T: Element>(x: &[T]) -> (Buffer<T>, Buffer<T>) {
    let (mut y, mut z) = (Buffer::take(x.len()), Buffer::take(x.len()));
    let jobs: Vec<(usize, &mut [T], &mut [T])> = y
        .chunks_mut(CHUNK)
        .zip(z.chunks_mut(CHUNK))
        .enumerate()
        .map(|(t, (a, b))| (t * CHUNK, a, b))
        .collect();
    let run = |(s, y, z): (usize, &mut [T], &mut [T])| {
        let x = &x[s..s + y.len()];
        dispatch(vmath::GeluRow { x, y, z })
    };
    if jobs.len() > 1 {
        run_each(jobs, run);
    } else {
        jobs.into_iter().for_each(run);
    }
    (y, z)
}

/// `k` applied to `x` (of shape `xs`) broadcast to `out`. The caller has
/// checked that `xs` broadcasts to `out`; `dst` holds `out`'s elements.
pub(crate) fn unary_broadcast<T: Element>(
    k: Unary,
    x: &[T],
    xs: &[usize],
    out: &[usize],
    dst: &mut [T],
) {
    let lay = Layout::of(out, [xs]);
    unary_into(k, x, &lay, dst);
}

fn unary_into<T: Element>(k: Unary, x: &[T], lay: &Layout<1>, dst: &mut [T]) {
    let a = <Acc<T> as Accum>::of;
    macro_rules! go {
        ($f:expr) => {
            map_into(x, lay, dst, $f)
        };
    }
    match k {
        Unary::Copy => go!(|v| v),
        Unary::Fill(c) => {
            let c = a(c);
            go!(move |_| c)
        }
        Unary::Neg => go!(|v: Acc<T>| -v),
        Unary::AddScalar(c) => {
            let c = a(c);
            go!(move |v| v + c)
        }
        Unary::MulScalar(c) => {
            let c = a(c);
            go!(move |v| v * c)
        }
        Unary::DivScalar(c) => {
            let c = a(c);
            go!(move |v| v / c)
        }
        Unary::Powi(n) => go!(move |v: Acc<T>| v.powi(n)),
        Unary::Sqrt => go!(|v: Acc<T>| v.sqrt()),
        Unary::Rsqrt => {
            let one = a(1.0);
            go!(move |v: Acc<T>| one / v.sqrt())
        }
        // f32 accumulation: the vectorizable f32 functions.
        Unary::Exp if is_f32::<Acc<T>>() => fast_map_into(x, lay, dst, vmath::exp),
        Unary::Log if is_f32::<Acc<T>>() => fast_map_into(x, lay, dst, vmath::ln),
        Unary::Tanh if is_f32::<Acc<T>>() => fast_map_into(x, lay, dst, vmath::tanh),
        Unary::Sigmoid if is_f32::<Acc<T>>() => fast_map_into(x, lay, dst, vmath::sigmoid),
        Unary::GeluErf if is_f32::<Acc<T>>() => fast_map_into(x, lay, dst, vmath::gelu_erf),
        Unary::Exp => go!(|v: Acc<T>| v.exp()),
        Unary::Log => go!(|v: Acc<T>| v.ln()),
        Unary::Tanh => go!(|v: Acc<T>| v.tanh()),
        Unary::Sigmoid => go!(sigmoid::<Acc<T>>),
        Unary::GeluTanh => go!(gelu_tanh::<Acc<T>>),
        Unary::GeluErf => go!(|v: Acc<T>| a(gelu_erf(v.f64()))),
    }
}

/// [`map_into`] with `f` one of [`vmath`]'s f32 functions, contiguous
/// pieces in its SIMD build. Only for element types that accumulate in f32.
fn fast_map_into<T: Element>(
    x: &[T],
    lay: &Layout<1>,
    dst: &mut [T],
    f: impl Fn(f32) -> f32 + Sync + Copy,
) {
    par_chunks(dst, |s, d| {
        lay.walk(s, d, |d, [o], [st]| {
            if st == 1 {
                map_row(f, &x[o..o + d.len()], d);
            } else {
                let y = T::from_acc(via_f32::<T>(f, x[o].to_acc()));
                d.fill(y);
            }
        })
    });
}

#[inline(always)]
fn map_into<T: Element>(
    x: &[T],
    lay: &Layout<1>,
    dst: &mut [T],
    f: impl Fn(Acc<T>) -> Acc<T> + Sync,
) {
    par_chunks(dst, |s, d| {
        lay.walk(s, d, |d, [o], [st]| {
            if st == 1 {
                let xs = &x[o..o + d.len()];
                for (y, &v) in d.iter_mut().zip(xs) {
                    *y = T::from_acc(f(v.to_acc()));
                }
            } else {
                let y = T::from_acc(f(x[o].to_acc()));
                d.fill(y);
            }
        })
    });
}

/// `k(a, b)` elementwise, `a` and `b` (shapes `sa`, `sb`) broadcast to
/// `out`, into `dst` (`out`'s elements). The caller has checked the shapes.
pub(crate) fn binary<T: Element>(
    k: Binary,
    (a, sa): (&[T], &[usize]),
    (b, sb): (&[T], &[usize]),
    out: &[usize],
    dst: &mut [T],
) {
    let lay = Layout::of(out, [sa, sb]);
    let c = <Acc<T> as Accum>::of;
    let (one, two, half) = (c(1.0), c(2.0), c(0.5));
    macro_rules! go {
        ($f:expr) => {
            zip_into(a, b, &lay, dst, None, $f)
        };
        ($lin:expr, $f:expr) => {
            zip_into(a, b, &lay, dst, Some($lin), $f)
        };
    }
    match k {
        Binary::Add => go!(Lin::Add, |p, q| p + q),
        Binary::Sub => go!(Lin::Sub, |p, q| p - q),
        Binary::Mul => go!(Lin::Mul, |p, q| p * q),
        Binary::Div => go!(|p, q| p / q),
        Binary::NegMul => go!(|p: Acc<T>, q| -(p * q)),
        Binary::PowiGrad(0) => go!(|_, _| Acc::<T>::zero()),
        Binary::PowiGrad(n) => {
            let nf = c(n as f64);
            match n.checked_sub(1) {
                Some(m) => go!(move |g, x: Acc<T>| g * nf * x.powi(m)),
                None => go!(move |g, x: Acc<T>| g * nf * x.powi(n) / x),
            }
        }
        Binary::SqrtGrad => go!(move |g, y| g / (two * y)),
        Binary::RsqrtGrad => go!(move |g, y| -half * g * y * y * y),
        Binary::TanhGrad => go!(move |g, y| g * (one - y * y)),
        Binary::SigmoidGrad => go!(move |g, y| g * y * (one - y)),
        Binary::GeluTanhGrad => go!(|g, x| g * gelu_tanh_slope(x)),
        Binary::GeluErfGrad if is_f32::<Acc<T>>() => {
            let f = |g: f32, x: f32| g * vmath::gelu_erf_slope(x);
            let fs = move |g: Acc<T>, x: Acc<T>| g * via_f32::<T>(vmath::gelu_erf_slope, x);
            par_chunks(dst, |s, d| {
                lay.walk(s, d, |d, [oa, ob], steps| {
                    let n = d.len();
                    if steps == [1, 1] {
                        zip_row(f, &a[oa..oa + n], &b[ob..ob + n], d);
                    } else {
                        zip_piece(a, b, d, [oa, ob], steps, fs);
                    }
                })
            })
        }
        Binary::GeluErfGrad => go!(move |g, x: Acc<T>| g * c(gelu_erf_slope(x.f64()))),
    }
}

/// One piece of [`zip_into`]'s scalar loops: `d[i] = f(a, b)` with each
/// operand stepping by 1 or 0.
#[inline(always)]
fn zip_piece<T: Element>(
    a: &[T],
    b: &[T],
    d: &mut [T],
    [oa, ob]: [usize; 2],
    steps: [usize; 2],
    f: impl Fn(Acc<T>, Acc<T>) -> Acc<T>,
) {
    let n = d.len();
    match steps {
        [1, 1] => {
            for ((y, &p), &q) in d.iter_mut().zip(&a[oa..oa + n]).zip(&b[ob..ob + n]) {
                *y = T::from_acc(f(p.to_acc(), q.to_acc()));
            }
        }
        [1, _] => {
            let q = b[ob].to_acc();
            for (y, &p) in d.iter_mut().zip(&a[oa..oa + n]) {
                *y = T::from_acc(f(p.to_acc(), q));
            }
        }
        [_, 1] => {
            let p = a[oa].to_acc();
            for (y, &q) in d.iter_mut().zip(&b[ob..ob + n]) {
                *y = T::from_acc(f(p, q.to_acc()));
            }
        }
        _ => d.fill(T::from_acc(f(a[oa].to_acc(), b[ob].to_acc()))),
    }
}

/// `(g b, g a)` for same-shape operands, chunk by chunk: the second
/// product reads its chunk of `g` back from cache, so memory sees `g`, `a`
/// and `b` once.
pub(crate) fn mul_grads<T: Element>(g: &[T], a: &[T], b: &[T]) -> (Buffer<T>, Buffer<T>) {
    let n = g.len();
    let (mut da, mut db) = (Buffer::take(n), Buffer::take(n));
    let nt = should_stream::<T>(n);
    let jobs: Vec<_> = da
        .chunks_mut(CHUNK)
        .zip(db.chunks_mut(CHUNK))
        .enumerate()
        .collect();
    run_each(jobs, |(t, (da, db))| {
        let r = t * CHUNK..t * CHUNK + da.len();
        let (g, a, b) = (&g[r.clone()], &a[r.clone()], &b[r]);
        dispatch(LinRow {
            op: Lin::Mul,
            a: g,
            b,
            dst: da,
            nt,
        });
        dispatch(LinRow {
            op: Lin::Mul,
            a: g,
            b: a,
            dst: db,
            nt,
        });
        fence::<true>();
    });
    (da, db)
}

/// Kinds with a SIMD-lane form (the same IEEE operation per element).
#[derive(Clone, Copy)]
enum Lin {
    Add,
    Sub,
    Mul,
}

#[inline(always)]
fn zip_into<T: Element>(
    a: &[T],
    b: &[T],
    lay: &Layout<2>,
    dst: &mut [T],
    lin: Option<Lin>,
    f: impl Fn(Acc<T>, Acc<T>) -> Acc<T> + Sync,
) {
    let nt = should_stream::<T>(dst.len());
    par_chunks(dst, |s, d| {
        lay.walk(s, d, |d, [oa, ob], steps| {
            let n = d.len();
            match (steps, lin) {
                ([1, 1], Some(op)) => dispatch(LinRow {
                    op,
                    a: &a[oa..oa + n],
                    b: &b[ob..ob + n],
                    dst: d,
                    nt,
                }),
                ([1, 1], None) => {
                    for ((y, &p), &q) in d.iter_mut().zip(&a[oa..oa + n]).zip(&b[ob..ob + n]) {
                        *y = T::from_acc(f(p.to_acc(), q.to_acc()));
                    }
                }
                ([1, _], _) => {
                    let q = b[ob].to_acc();
                    for (y, &p) in d.iter_mut().zip(&a[oa..oa + n]) {
                        *y = T::from_acc(f(p.to_acc(), q));
                    }
                }
                ([_, 1], _) => {
                    let p = a[oa].to_acc();
                    for (y, &q) in d.iter_mut().zip(&b[ob..ob + n]) {
                        *y = T::from_acc(f(p, q.to_acc()));
                    }
                }
                _ => d.fill(T::from_acc(f(a[oa].to_acc(), b[ob].to_acc()))),
            }
        });
        fence::<true>();
    });
}

/// One contiguous piece of an add, sub or mul.
struct LinRow<'a, T: Element> {
    op: Lin,
    a: &'a [T],
    b: &'a [T],
    dst: &'a mut [T],
    nt: bool,
}

impl<T: Element> Kernel<T> for LinRow<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run<V: Lanes<T>>(self) {
        let LinRow { op, a, b, dst, nt } = self;
        // Streaming builds for f32 only (`<T as crate::device::cpu::CpuBuilds>::SIMD` keeps the others out).
        match (op, nt) {
            (Lin::Add, true) if <T as crate::device::cpu::CpuBuilds>::SIMD => {
                lin::<T, V, true>(dst, a, b, V::add, |p, q| p + q)
            }
            (Lin::Sub, true) if <T as crate::device::cpu::CpuBuilds>::SIMD => {
                lin::<T, V, true>(dst, a, b, V::sub, |p, q| p - q)
            }
            (Lin::Mul, true) if <T as crate::device::cpu::CpuBuilds>::SIMD => {
                lin::<T, V, true>(dst, a, b, V::mul, |p, q| p * q)
            }
            (Lin::Add, _) => lin::<T, V, false>(dst, a, b, V::add, |p, q| p + q),
            (Lin::Sub, _) => lin::<T, V, false>(dst, a, b, V::sub, |p, q| p - q),
            (Lin::Mul, _) => lin::<T, V, false>(dst, a, b, V::mul, |p, q| p * q),
        }
    }
}

/// `dst[i] = f(a[i], b[i])` in lanes (`fv`) and scalars (`fs`, the same
/// operation, for the unaligned head and the tail).
#[inline(always)]
fn lin<T: Element, V: Lanes<T>, const NT: bool>(
    dst: &mut [T],
    a: &[T],
    b: &[T],
    fv: impl Fn(V, V) -> V,
    fs: impl Fn(Acc<T>, Acc<T>) -> Acc<T>,
) {
    let n = dst.len();
    let (a, b) = (&a[..n], &b[..n]);
    write_row::<T, V, NT>(
        dst,
        // SAFETY: `write_row` keeps `i + LANES <= n`, the length of `a` and `b`.
        #[inline(always)]
        |i| unsafe { fv(V::load_at(a, i), V::load_at(b, i)) },
        #[inline(always)]
        |i| fs(a[i].to_acc(), b[i].to_acc()),
    );
}

/// `1 / (1 + e^-x)`, as `e^x / (1 + e^x)` for negative `x` so that `e^-x`
/// never overflows.
#[inline(always)]
pub(crate) fn sigmoid<A: Accum>(x: A) -> A {
    let one = A::one();
    if x >= A::zero() {
        one / (one + (-x).exp())
    } else {
        let e = x.exp();
        e / (one + e)
    }
}

/// `(sigma(v), sigma(-v))` from one exponential, each without cancellation.
#[inline(always)]
fn sigmoid_pair<A: Accum>(v: A) -> (A, A) {
    let one = A::one();
    let e = (-v.abs()).exp();
    let (big, small) = (one / (one + e), e / (one + e));
    if v >= A::zero() {
        (big, small)
    } else {
        (small, big)
    }
}

/// sqrt(2 / pi).
const GELU_K: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the tanh approximation.
const GELU_A: f64 = 0.044_715;

/// `2u = 2 k (x + a x^3)`, the argument of `s = sigma(2u)`.
#[inline(always)]
fn gelu_2u<A: Accum>(x: A) -> A {
    A::of(2.0) * A::of(GELU_K) * (x + A::of(GELU_A) * x * x * x)
}

/// `x sigma(2u)`.
#[inline(always)]
fn gelu_tanh<A: Accum>(x: A) -> A {
    x * sigmoid(gelu_2u(x))
}

/// `s + 2 x s (1 - s) k (1 + 3 a x^2)`, with the second term 0 where
/// `s (1 - s)` is exactly 0 (so huge `|x|` gives a finite slope).
#[inline(always)]
fn gelu_tanh_slope<A: Accum>(x: A) -> A {
    let (s, s_neg) = sigmoid_pair(gelu_2u(x));
    let ss = s * s_neg;
    if ss == A::zero() {
        return s;
    }
    let (one, three) = (A::one(), A::of(3.0));
    s + A::of(2.0) * x * ss * A::of(GELU_K) * (one + three * A::of(GELU_A) * x * x)
}

/// `x Phi(x)`, in f64 whatever the element type (the f32 result is the
/// exact one rounded once).
#[inline]
fn gelu_erf(x: f64) -> f64 {
    // At -inf the limit 0 (as -0), not -inf * 0.
    if x == f64::NEG_INFINITY {
        -0.0
    } else {
        x * normal_cdf(x)
    }
}

/// `Phi(x) + x phi(x)`, with the second term 0 where `phi` underflows to
/// exactly 0 (so `|x|` past ~38, infinities included, gives 0 or 1, not
/// NaN). Both terms are accurate relative to themselves in the left tail.
#[inline]
fn gelu_erf_slope(x: f64) -> f64 {
    let p = normal_pdf(x);
    if p == 0.0 {
        return normal_cdf(x);
    }
    normal_cdf(x) + x * p
}

/// Relu's forward and its gradient mask: one bit per element, bit `i % 8`
/// of byte `i / 8`, set where the gradient passes (`x > 0` or NaN).
pub(crate) fn relu_forward<T: Element>(x: &[T]) -> (Buffer<T>, Vec<u8>) {
    let mut y = Buffer::take(x.len());
    let mut mask = vec![0u8; x.len().div_ceil(8)];
    // CHUNK is a multiple of 8, so each task owns whole mask bytes.
    let jobs: Vec<_> = y
        .chunks_mut(CHUNK)
        .zip(mask.chunks_mut(CHUNK / 8))
        .zip(x.chunks(CHUNK))
        .collect();
    run_each(jobs, |((y, m), x)| {
        for ((y8, m), x8) in y.chunks_mut(8).zip(m.iter_mut()).zip(x.chunks(8)) {
            let mut bits = 0u8;
            for (j, (o, &v)) in y8.iter_mut().zip(x8).enumerate() {
                let a = v.to_acc();
                let pass = a > Acc::<T>::zero() || a.is_nan();
                bits |= u8::from(pass) << j;
                *o = if pass { v } else { T::ZERO };
            }
            *m = bits;
        }
    });
    (y, mask)
}

/// `g` where the mask's bit is set, else 0.
pub(crate) fn relu_backward<T: Element>(mask: &[u8], g: &[T]) -> Buffer<T> {
    let mut out = Buffer::take(g.len());
    par_chunks(&mut out, |s, d| {
        for (k, o) in d.iter_mut().enumerate() {
            let i = s + k;
            let pass = mask.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0);
            *o = if pass { g[i] } else { T::ZERO };
        }
    });
    out
}

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;
    use crate::layout::broadcast_strides;

    // The tests, run by `tests/unit.rs`.
    unit_tests![
        inline_strides_match_the_shape_module_past_the_inline_rank,
        broadcast_add_of_rank_six_matches_an_index_loop,
    ];

    fn inline_strides_match_the_shape_module_past_the_inline_rank() {
        let out = [2, 3, 1, 4, 5, 2];
        for shape in [
            &[3, 1, 4, 1, 2][..],
            &[2, 3, 1, 4, 5, 2],
            &[1],
            &[5, 2],
            &[],
        ] {
            assert_eq!(
                &*broadcast_dims(shape, &out),
                &broadcast_strides(shape, &out)[..]
            );
        }
    }

    fn broadcast_add_of_rank_six_matches_an_index_loop() {
        let (sa, sb, out) = ([2, 1, 3, 1, 2, 2], [4, 1, 2, 1], [2, 1, 3, 4, 2, 2]);
        let a: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..8).map(|i| 100.0 * i as f32).collect();
        let mut dst = vec![0.0f32; 96];
        binary(Binary::Add, (&a, &sa), (&b, &sb), &out, &mut dst);
        let (pa, pb) = (broadcast_strides(&sa, &out), broadcast_strides(&sb, &out));
        let mut idx = [0usize; 6];
        for (i, &y) in dst.iter().enumerate() {
            let mut r = i;
            for d in (0..6).rev() {
                idx[d] = r % out[d];
                r /= out[d];
            }
            let oa: usize = idx.iter().zip(&pa).map(|(i, s)| i * s).sum();
            let ob: usize = idx.iter().zip(&pb).map(|(i, s)| i * s).sum();
            assert_eq!(y, a[oa] + b[ob], "element {i}");
        }
    }
}
