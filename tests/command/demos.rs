//! Training claims measured on the seeded demos (`fusegrad_cli::demo`):
//! the loss falls, and the composed norm twins follow the fused curve.

use fusegrad::nn::NormImpl;
use fusegrad::tolerance::{TRAIN_FUSED_VS_COMPOSED_F32, TRAIN_FUSED_VS_COMPOSED_F64};
use fusegrad_cli::demo::{compare_spirals_with, train_regression, RegressionConfig, SpiralConfig};

/// f32 spirals, 300 full-batch Adam steps: the loss falls by a clear factor,
/// train and held-out accuracy are high, and the composed LayerNorm twin
/// gives the same loss at every step.
#[test]
fn spirals_train_and_fused_matches_composed_f32() {
    let config = SpiralConfig::default();
    assert_eq!(config.steps, 300);
    let a = compare_spirals_with::<f32>(&config).unwrap();
    let f = &a.fused;
    assert_eq!(f.losses.len(), 300);
    let first = f.losses[0];
    assert!(first > 0.9, "initial loss {first} (ln 3 = 1.10)");
    assert!(f.reduction() > 100.0, "loss {first} -> {}", f.final_loss);
    assert!(f.train_accuracy.unwrap() >= 0.98, "{:?}", f.train_accuracy);
    assert!(f.test_accuracy.unwrap() >= 0.95, "{:?}", f.test_accuracy);
    assert_eq!(a.composed.losses.len(), 300);
    assert!(
        a.max_abs_diff <= TRAIN_FUSED_VS_COMPOSED_F32.atol,
        "fused vs composed loss differs by {:.3e}",
        a.max_abs_diff
    );
    for (x, y) in f.losses.iter().zip(&a.composed.losses) {
        assert!(TRAIN_FUSED_VS_COMPOSED_F32.accepts(*x, *y), "{x} vs {y}");
    }
}

/// The same comparison in f64, to a bar five orders tighter.
#[test]
fn spirals_fused_matches_composed_f64() {
    let config = SpiralConfig {
        steps: 120,
        ..SpiralConfig::default()
    };
    let a = compare_spirals_with::<f64>(&config).unwrap();
    assert_eq!(a.fused.losses.len(), 120);
    assert!(a.fused.reduction() > 10.0, "{:?}", a.fused.losses.last());
    assert!(
        a.max_abs_diff <= TRAIN_FUSED_VS_COMPOSED_F64.atol,
        "fused vs composed loss differs by {:.3e}",
        a.max_abs_diff
    );
}

/// The regression demo with RMSNorm and mse: loss falls, held-out R^2 high,
/// composed RMSNorm twin follows the same curve (first 100 steps).
#[test]
fn regression_trains_with_rms_norm() {
    let config = RegressionConfig::default();
    let f = train_regression::<f32>(&config).unwrap();
    assert!(
        f.reduction() > 50.0,
        "mse {} -> {}",
        f.losses[0],
        f.final_loss
    );
    assert!(f.test_r2.unwrap() > 0.95, "{:?}", f.test_r2);
    // Runs are deterministic, so a shorter composed run is a prefix.
    let c = train_regression::<f32>(&RegressionConfig {
        norm_impl: NormImpl::Composed,
        steps: 100,
        ..config
    })
    .unwrap();
    assert_eq!(c.losses.len(), 100);
    assert!(TRAIN_FUSED_VS_COMPOSED_F32.accepts_all(&f.losses[..100], &c.losses));
}
