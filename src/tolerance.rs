//! Named tolerances, one per comparison and precision (burn-style), so every
//! test and report says which bar it holds a result to.

/// `|got - want| <= atol + rtol * |want|`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Absolute part.
    pub atol: f64,
    /// Relative part.
    pub rtol: f64,
}

impl Tolerance {
    /// Whether `got` is close enough to `want` (NaN never is).
    pub fn accepts(&self, got: f64, want: f64) -> bool {
        (got - want).abs() <= self.atol + self.rtol * want.abs()
    }

    /// Whether every pair is close enough.
    pub fn accepts_all(&self, got: &[f64], want: &[f64]) -> bool {
        got.len() == want.len() && got.iter().zip(want).all(|(g, w)| self.accepts(*g, *w))
    }
}

/// f64 analytic gradient against f64 central finite differences.
pub const F64_VS_FD: Tolerance = Tolerance {
    atol: 1e-6,
    rtol: 1e-5,
};

/// An f32 run against the same computation in f64 (values of order one).
pub const F32_VS_F64: Tolerance = Tolerance {
    atol: 1e-4,
    rtol: 1e-3,
};

/// An f16 run against f64 (f16 has an 11-bit significand).
pub const F16_VS_F64: Tolerance = Tolerance {
    atol: 1e-2,
    rtol: 1e-2,
};

/// A bf16 run against f64 (bf16 has an 8-bit significand).
pub const BF16_VS_F64: Tolerance = Tolerance {
    atol: 8e-2,
    rtol: 8e-2,
};

// ---- Sums of rounded terms (matmul, losses) and independent f64 references ----

/// An f32 sum of `terms` rounded terms (a matmul entry, a gradient entry
/// summed over a broadcast batch, a mean) against the same computation in
/// f64.
///
/// Cancellation can make such an entry arbitrarily small next to its terms,
/// so this bar is meant per unit of the entry's *magnitude* `M = sum |term|`
/// (e.g. `(|A| @ |B|)_ij`): `|got - want| <= atol * M`. Summing `n` terms in
/// any order errs by at most `(n - 1) u M` to first order (u = 2^-24); each
/// term may carry a few roundings of its own (product, difference, square,
/// final scaling), so the bar allows twice `(n + 4) u`.
pub fn f32_sum_vs_f64(terms: usize) -> Tolerance {
    Tolerance {
        atol: (terms as f64 + 4.0) * f32::EPSILON as f64,
        rtol: 0.0,
    }
}

/// An f64 result against an independent f64 formula for the same value (a
/// naive triple loop, a textbook softmax): both round, in different orders.
/// For values of order one; sums scale `atol` by their magnitude as in
/// [`f32_sum_vs_f64`]. The bar sits far above the `~n u` (u = 2^-53) either
/// side can err for n up to 10^3 terms, and far below any formula error.
pub const F64_VS_REFERENCE: Tolerance = Tolerance {
    atol: 1e-12,
    rtol: 1e-10,
};

/// An f32 run of one primitive op against the same op in f64 on identical,
/// f32-representable inputs and cotangent, judged against the magnitude `m`
/// of the terms that formed each value: `|got - want| <= atol + rtol * m`
/// (`m >= |want|`; for a sum it is the sum of the terms' absolute values, for
/// a cancelling difference such as `1 - tanh^2` the size of its parts).
/// Relative to `m`, a sum of n <= 256 terms errs by at most about
/// n * 2^-24 = 1.5e-5, a libm call or a few roundings by a few 2^-24, and
/// `e^v` by `|v|` times the ulps of `v` (gelu's tail, up to ~1.6e-5 before
/// f32 underflows); `rtol` leaves a factor of more than 6 over the worst of
/// these (measured worst: 7e-6 for gelu, <= 4e-7 for the rest). `atol` is
/// the smallest normal f32, so values that underflow in f32 (and not in f64)
/// still compare equal.
pub const F32_VS_F64_TERMS: Tolerance = Tolerance {
    atol: f32::MIN_POSITIVE as f64,
    rtol: 1e-4,
};

// ---- Training runs (nn) ----

/// One training step's loss with the fused normalization against the same
/// run with the composed twin, in f32, step by step, for losses of order one
/// and at most a few hundred steps of a stable (spike-free) run.
///
/// The two forward passes differ by a few ulp per normalized value, so the
/// first losses differ by about one ulp of the loss (`~1.2e-7` near 1);
/// after that the differing parameter updates feed back, but a stable run
/// contracts rather than amplifies them. The bar is about 30 times the
/// largest difference seen over 300 steps of the spiral demo (`3e-7`); a
/// wrong gradient in either twin moves the curves apart by far more within a
/// few steps. An unstable run (a loss spike) amplifies any rounding
/// difference exponentially and is outside this bar's scope.
pub const TRAIN_FUSED_VS_COMPOSED_F32: Tolerance = Tolerance {
    atol: 1e-5,
    rtol: 0.0,
};

/// [`TRAIN_FUSED_VS_COMPOSED_F32`] in f64: the same reasoning with
/// u = 2^-53, so differences near `1e-15`, with the bar five orders above.
pub const TRAIN_FUSED_VS_COMPOSED_F64: Tolerance = Tolerance {
    atol: 1e-10,
    rtol: 0.0,
};

// ---- LayerNorm and RMSNorm ------------------------------------------------
//
// These bars apply to differences measured the way `analysis` measures them:
// `max |a - b|` over a result divided by the size of the terms that result
// is made of (`analysis::term_scales`), and they widen with the input's
// condition number `cond = max |x| / sqrt(var + eps)` (`analysis::condition`;
// about 3 for centred data, about offset/std with a large common offset):
// rounding `x` by a unit `u` moves `xhat` by about `cond * u`, whichever path
// computes it. The factor covers summation error growth over rows of up to
// 2048 elements. Worst measured difference / (cond u) over 6000 random cases
// (`cargo run --release --example layernorm_analysis sweep 2000 SEED`, seeds
// 1, 2, 3): 2.7 for f64 fused vs composed, 3.5 for f32 fused vs composed,
// 7.7 for f32 vs f64 (docs/layernorm.md).

/// f64 fused vs f64 composed: `1e-9 + 16 * cond * 2^-52`.
pub fn norm_fused_vs_composed_f64(cond: f64) -> Tolerance {
    Tolerance {
        atol: 0.0,
        rtol: 1e-9 + 16.0 * cond * f64::EPSILON,
    }
}

/// f32 against f32 composed or against f64: `1e-5 + 32 * cond * 2^-23`.
pub fn norm_f32(cond: f64) -> Tolerance {
    Tolerance {
        atol: 0.0,
        rtol: 1e-5 + 32.0 * cond * f32::EPSILON as f64,
    }
}

/// f64 fused vs central finite differences: `1e-6 + 16 * (cond * 2^-52)^(2/3)`.
/// The step is chosen to balance truncation against rounding
/// (`analysis::fd_x_step`), which leaves an error of order
/// `(cond * 2^-52)^(2/3)`: looser than fused vs composed.
pub fn norm_vs_fd_f64(cond: f64) -> Tolerance {
    Tolerance {
        atol: 0.0,
        rtol: 1e-6 + 16.0 * (cond * f64::EPSILON).powf(2.0 / 3.0),
    }
}

/// f16 fused vs f64 fused: [`F16_VS_F64`] widened by `16 * cond * 2^-10`.
pub fn norm_f16(cond: f64) -> Tolerance {
    Tolerance {
        atol: 0.0,
        rtol: F16_VS_F64.rtol + 16.0 * cond * f64::powi(2.0, -10),
    }
}

/// bf16 fused vs f64 fused: [`BF16_VS_F64`] widened by `16 * cond * 2^-7`.
pub fn norm_bf16(cond: f64) -> Tolerance {
    Tolerance {
        atol: 0.0,
        rtol: BF16_VS_F64.rtol + 16.0 * cond * f64::powi(2.0, -7),
    }
}

/// A fused norm against its composed twin in the same dtype, as the shadow
/// check compares them during training (`dtype` is `Element::NAME`). f64
/// and f32 use their fused-vs-composed bars; f16 and bf16 twice their bar
/// against f64, since both paths round at that precision (the composed
/// one after every primitive op).
pub fn norm_shadow(dtype: &str, cond: f64) -> Tolerance {
    match dtype {
        "f64" => norm_fused_vs_composed_f64(cond),
        "f16" => Tolerance {
            atol: 0.0,
            rtol: 2.0 * norm_f16(cond).rtol,
        },
        "bf16" => Tolerance {
            atol: 0.0,
            rtol: 2.0 * norm_bf16(cond).rtol,
        },
        _ => norm_f32(cond),
    }
}

// ---- Attention ------------------------------------------------------------

/// The fused attention against its composed twin in the same dtype, as the
/// shadow check compares them, for differences measured over the size of
/// the terms each result sums (`ops/attention/twin.rs`). `cond` is the
/// largest scaled logit `|s_ij|` (at least 1): rounding an input by `u`
/// moves `exp(s_ij)` by about `|s_ij| u` relative, in either path. The bars
/// are the norms' shadow bars for the same `cond`.
pub fn attention_shadow(dtype: &str, cond: f64) -> Tolerance {
    norm_shadow(dtype, cond)
}
