//! The three-way property check for LayerNorm and RMSNorm: fused = composed
//! = finite differences, on random shapes (rank 1-4, normalized over 1-2
//! trailing dims, N 0..=64, D 1..=2048 with primes), scales 1e-3..1e6,
//! offsets up to 1e8 (f64) or 1e4 (f32), eps 1e-12..1e-2, and a random
//! cotangent. Cases come from `analysis::random_case` with a proptest-drawn
//! seed (the same generator `layernorm_analysis sweep` measures the
//! tolerances on); a failure prints the whole case. The body is shared:
//! each module sets `NORM` and includes it.

mod layer_norm {
    use fusegrad_cli::analysis::Norm;
    const NORM: Norm = Norm::LayerNorm;
    include!("norm_props_body.rs");
}

mod rms_norm {
    use fusegrad_cli::analysis::Norm;
    const NORM: Norm = Norm::RmsNorm;
    include!("norm_props_body.rs");
}
