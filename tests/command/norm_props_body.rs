// The property tests' shared body (`props.rs`), included in a module that
// defines `const NORM: Norm`.

use fusegrad_cli::analysis::{self, Case};
use fusegrad::rng::Rng;
use fusegrad::{tolerance, Element};
use half::{bf16, f16};
use proptest::prelude::*;

fn case(seed: u64, max_offset: f64) -> Case {
    analysis::random_case(&mut Rng::new(seed), NORM, max_offset)
}

/// The condition number of the case's x as rounded to `T`.
fn cond<T: Element>(c: &Case) -> f64 {
    let x = c.inputs::<T>().unwrap()[0].to_f64_vec().unwrap();
    analysis::condition(c.norm, &x, c.d(), c.eps)
}

/// A case whose values fit f16 (|x| < 6e4): scale 10^U(-2, 2), offset up to 1e2.
fn half_case(seed: u64) -> Case {
    let mut c = case(seed, 1e2);
    let mut rng = Rng::new(seed ^ 1);
    c.scale = 10f64.powf(rng.range(-2.0, 2.0));
    c.eps = c.eps.max(1e-7);
    c
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn f64_fused_equals_composed_equals_finite_differences(seed in any::<u64>()) {
        let c = case(seed, 1e8);
        let k = cond::<f64>(&c);
        let fc = analysis::fused_vs_composed::<f64>(&c).unwrap();
        let tol = tolerance::norm_fused_vs_composed_f64(k).rtol;
        prop_assert!(fc.max() <= tol, "fused vs composed: {fc} > {tol:e}\n{c:?}");
        let fd = analysis::fd_error(&c, 8).unwrap();
        let tol = tolerance::norm_vs_fd_f64(k).rtol;
        prop_assert!(fd.max_diff <= tol, "vs FD: {:e} > {tol:e}\n{c:?}", fd.max_diff);
    }

    #[test]
    fn f32_fused_equals_composed_and_f64(seed in any::<u64>()) {
        let c = case(seed, 1e4);
        let tol = tolerance::norm_f32(cond::<f32>(&c)).rtol;
        let fc = analysis::fused_vs_composed::<f32>(&c).unwrap();
        prop_assert!(fc.max() <= tol, "f32 fused vs composed: {fc} > {tol:e}\n{c:?}");
        let lo = analysis::vs_f64::<f32>(&c).unwrap();
        prop_assert!(lo.max() <= tol, "f32 vs f64: {lo} > {tol:e}\n{c:?}");
    }

    #[test]
    fn f16_and_bf16_follow_f64(seed in any::<u64>()) {
        let c = half_case(seed);
        let tol = tolerance::norm_f16(cond::<f16>(&c)).rtol;
        let d = analysis::vs_f64::<f16>(&c).unwrap();
        prop_assert!(d.max() <= tol, "f16 vs f64: {d} > {tol:e}\n{c:?}");
        let tol = tolerance::norm_bf16(cond::<bf16>(&c)).rtol;
        let d = analysis::vs_f64::<bf16>(&c).unwrap();
        prop_assert!(d.max() <= tol, "bf16 vs f64: {d} > {tol:e}\n{c:?}");
    }
}

/// The bar is tight enough to matter: a composed twin whose eps is off by
/// 0.1% (a change of ~5e-9 in rstd here) fails it.
#[test]
fn the_bar_catches_a_slightly_wrong_twin() {
    let c = Case::new(NORM, &[6, 40], &[40]);
    let other = Case {
        eps: c.eps * 1.001,
        ..c.clone()
    };
    let cmp = fusegrad::gradcheck::fused_vs_composed(
        |v| c.fused(v),
        |v| other.composed(v),
        &c.inputs::<f64>().unwrap(),
        c.seed,
    )
    .unwrap();
    let tol = tolerance::norm_fused_vs_composed_f64(cond::<f64>(&c)).rtol;
    assert!(cmp.max() > tol, "{cmp} vs {tol:e}");
    // While the same eps agrees far inside it.
    let same = analysis::fused_vs_composed::<f64>(&c).unwrap();
    assert!(same.max() < tol / 100.0, "{same}");
}

/// The three-way table the docs show passes the same bars.
#[test]
fn representative_table_is_within_tolerance() {
    let cases: Vec<Case> = analysis::three_way_cases()
        .into_iter()
        .filter(|c| c.norm == NORM)
        .collect();
    assert!(!cases.is_empty());
    for c in &cases {
        let row = analysis::three_way(c, 32).unwrap();
        let fc = tolerance::norm_fused_vs_composed_f64(row.cond).rtol;
        let fd = tolerance::norm_vs_fd_f64(row.cond).rtol;
        assert!(row.fc.max() <= fc, "{row}");
        assert!(row.fd.max_diff <= fd, "{row}");
        assert!(row.fd.checked > 0, "{row}");
    }
}
