//! Scalar losses: mean squared error and softmax cross-entropy.

use super::softmax::lane_stats;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::op::{Op, Saved, SavedItem};
use crate::tape::{Tape, Var};
use crate::tensor::Tensor;
use num_traits::{Float, One, Zero};

/// The single value of a scalar gradient.
fn scalar<T: Element>(op: &'static str, g: &Tensor<T>) -> Result<T::Acc> {
    match g.as_slice()? {
        [v] => Ok(v.to_acc()),
        _ => Err(Error::ShapeMismatch {
            op,
            lhs: g.shape().to_vec(),
            rhs: vec![],
        }),
    }
}

fn acc_of<T: Element>(n: usize) -> T::Acc {
    <T::Acc as num_traits::NumCast>::from(n).unwrap_or_else(T::Acc::infinity)
}

struct Mse;

impl<T: Element> Op<T> for Mse {
    /// `pred` and `target` (inputs, so held by the graph anyway).
    type State = (Tensor<T>, Tensor<T>);

    fn name(&self) -> &'static str {
        "mse"
    }

    /// `L = (1/N) sum_i (p_i - t_i)^2`, a rank-0 tensor; NaN for `N = 0`.
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Self::State)> {
        let [p, t] = x else {
            return Err(Error::InvalidArgument {
                op: "mse",
                msg: format!("expects 2 inputs, got {}", x.len()),
            });
        };
        if p.shape() != t.shape() {
            return Err(Error::ShapeMismatch {
                op: "mse",
                lhs: p.shape().to_vec(),
                rhs: t.shape().to_vec(),
            });
        }
        let sum: T::Acc = p
            .as_slice()?
            .iter()
            .zip(t.as_slice()?)
            .map(|(&a, &b)| {
                let d = a.to_acc() - b.to_acc();
                d * d
            })
            .sum();
        let loss = sum / acc_of::<T>(p.numel());
        Ok((
            Tensor::scalar(T::from_acc(loss)),
            ((*p).clone(), (*t).clone()),
        ))
    }

    /// With the scalar `g = dL_total/dL`: `dp_i = (2g/N)(p_i - t_i)`,
    /// `dt_i = -dp_i`.
    fn backward(
        &self,
        (p, t): &Self::State,
        g: &Tensor<T>,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor<T>>>> {
        let two = T::Acc::one() + T::Acc::one();
        let k = two * scalar("mse", g)? / acc_of::<T>(p.numel());
        let grad = |sign: T::Acc| -> Result<Tensor<T>> {
            let ks = k * sign;
            let v = p
                .as_slice()?
                .iter()
                .zip(t.as_slice()?)
                .map(|(&a, &b)| T::from_acc(ks * (a.to_acc() - b.to_acc())))
                .collect();
            Tensor::from_vec(p.shape().to_vec(), v)
        };
        let need = |i: usize| needs.get(i).copied().unwrap_or(false);
        let dp = need(0).then(|| grad(T::Acc::one())).transpose()?;
        let dt = need(1).then(|| grad(-T::Acc::one())).transpose()?;
        Ok(vec![dp, dt])
    }
}

/// Mean squared error `mean((pred - target)^2)` as a rank-0 tensor.
/// Gradients flow to both arguments (a `constant` target takes none).
///
/// Errors: `ShapeMismatch` unless the shapes are equal (no broadcasting).
pub fn mse<T: Element>(pred: &Var<T>, target: &Var<T>) -> Result<Var<T>> {
    Tape::apply(Mse, &[pred, target])
}

struct CrossEntropy {
    targets: Vec<usize>,
}

/// What cross-entropy's backward needs: the logits (an input), and per row
/// the max `m` and `ln s`, `s = sum_j exp(x_j - m)` (2 numbers per row).
struct CeState<T: Element> {
    logits: Tensor<T>,
    max: Vec<T::Acc>,
    log_sum: Vec<T::Acc>,
    targets: Vec<usize>,
}

impl<T: Element> Saved for CeState<T> {
    fn visit(&self, f: &mut dyn FnMut(SavedItem)) {
        self.logits.visit(f);
        let acc = std::mem::size_of::<T::Acc>();
        f(SavedItem::Raw((self.max.len() + self.log_sum.len()) * acc));
        f(SavedItem::Raw(
            self.targets.len() * std::mem::size_of::<usize>(),
        ));
    }
}

impl<T: Element> Op<T> for CrossEntropy {
    type State = CeState<T>;

    fn name(&self) -> &'static str {
        "cross_entropy"
    }

    /// Per row `r` with target `t`: `l_r = -log softmax(x_r)_t
    /// = (m_r - x_{r,t}) + ln s_r`, written so that large offsets cancel
    /// exactly in `m_r - x_{r,t}`; `L = (1/n) sum_r l_r` (NaN for `n = 0`).
    fn forward(&self, x: &[&Tensor<T>]) -> Result<(Tensor<T>, Self::State)> {
        let [x] = x else {
            return Err(Error::InvalidArgument {
                op: "cross_entropy",
                msg: format!("expects 1 input, got {}", x.len()),
            });
        };
        let (n, c) = check_ce(x.shape(), &self.targets)?;
        let xs = x.as_slice()?;
        let mut max = vec![T::Acc::zero(); n];
        let mut log_sum = vec![T::Acc::zero(); n];
        let mut total = T::Acc::zero();
        if c > 0 {
            for (r, ((row, &t), (m, ls))) in xs
                .chunks_exact(c)
                .zip(&self.targets)
                .zip(max.iter_mut().zip(log_sum.iter_mut()))
                .enumerate()
            {
                lane_stats::<T>(
                    row,
                    1,
                    std::slice::from_mut(m),
                    std::slice::from_mut(ls),
                    None,
                );
                *ls = ls.ln();
                let xt = row.get(t).ok_or_else(|| bad_target(x.shape(), r, t))?;
                total += (*m - xt.to_acc()) + *ls;
            }
        }
        let loss = total / acc_of::<T>(n);
        let state = CeState {
            logits: (*x).clone(),
            max,
            log_sum,
            targets: self.targets.clone(),
        };
        Ok((Tensor::scalar(T::from_acc(loss)), state))
    }

    /// With the scalar `g`: `dx_{r,j} = (g/n) (softmax(x_r)_j - [j = t_r])`,
    /// where `softmax(x_r)_j = exp((x_{r,j} - m_r) - ln s_r)`.
    fn backward(
        &self,
        st: &Self::State,
        g: &Tensor<T>,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor<T>>>> {
        if !needs.first().copied().unwrap_or(false) {
            return Ok(vec![None]);
        }
        let shape = st.logits.shape();
        let (n, c) = check_ce(shape, &st.targets)?;
        let k = scalar("cross_entropy", g)? / acc_of::<T>(n);
        let xs = st.logits.as_slice()?;
        let mut out = vec![T::ZERO; xs.len()];
        if c > 0 {
            for ((((orow, row), &t), &m), &ls) in out
                .chunks_exact_mut(c)
                .zip(xs.chunks_exact(c))
                .zip(&st.targets)
                .zip(&st.max)
                .zip(&st.log_sum)
            {
                for (j, (dx, &v)) in orow.iter_mut().zip(row).enumerate() {
                    let p = ((v.to_acc() - m) - ls).exp();
                    let onehot = if j == t {
                        T::Acc::one()
                    } else {
                        T::Acc::zero()
                    };
                    *dx = T::from_acc(k * (p - onehot));
                }
            }
        }
        Ok(vec![Some(Tensor::from_vec(shape.to_vec(), out)?)])
    }
}

fn bad_target(shape: &[usize], row: usize, t: usize) -> Error {
    Error::InvalidArgument {
        op: "cross_entropy",
        msg: format!(
            "target {t} at row {row} is not a class index for logits of shape {shape:?} \
             (need < {})",
            shape.get(1).copied().unwrap_or(0)
        ),
    }
}

/// `(n, c)` of valid `[n, c]` logits with one in-range target per row.
fn check_ce(shape: &[usize], targets: &[usize]) -> Result<(usize, usize)> {
    let &[n, c] = shape else {
        return Err(Error::InvalidArgument {
            op: "cross_entropy",
            msg: format!("logits must have shape [n, c], got {shape:?}"),
        });
    };
    if targets.len() != n {
        return Err(Error::InvalidArgument {
            op: "cross_entropy",
            msg: format!(
                "{} targets for logits of shape {shape:?} (need one per row, {n})",
                targets.len()
            ),
        });
    }
    if let Some((r, &t)) = targets.iter().enumerate().find(|(_, &t)| t >= c) {
        return Err(bad_target(shape, r, t));
    }
    Ok((n, c))
}

/// Mean softmax cross-entropy of `logits` `[n, c]` against integer class
/// `targets` (one per row, each `< c`), as a rank-0 tensor:
/// `mean_r (logsumexp(x_r) - x_{r, targets[r]})`, computed max-subtracted.
///
/// Errors (checked before any work): `InvalidArgument` naming the shape and
/// the offending value if `logits` is not 2-D, if `targets.len() != n`, or
/// if a target is `>= c`.
pub fn cross_entropy<T: Element>(logits: &Var<T>, targets: &[usize]) -> Result<Var<T>> {
    check_ce(logits.shape(), targets)?;
    Tape::apply(
        CrossEntropy {
            targets: targets.to_vec(),
        },
        &[logits],
    )
}
