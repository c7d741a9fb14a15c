//! The analysis behind docs/layernorm.md measures what it claims to.

use fusegrad_cli::analysis::{self, Norm};

#[test]
fn report_measures_flops_bytes_and_saved_memory() {
    let (n, d) = (256, 512);
    let r = analysis::report(n, d).unwrap();
    assert_eq!(r.0.len(), 2);
    let nd = (n * d) as f64;
    for nr in &r.0 {
        let stats = if nr.norm == Norm::LayerNorm { 2 } else { 1 };
        // Saved: exactly the statistics for the fused op (f32: 4 bytes each);
        // at least one f32 per element for the composed twin.
        assert_eq!(nr.fused_saved, stats * n * 4, "{:?}", nr.norm);
        assert!(nr.composed_saved >= n * d * 4, "{:?}", nr.norm);
        // FLOP counts are exactly bilinear in (N, D): the held-out shape fits.
        for fit in [
            nr.fused_flops.0,
            nr.fused_flops.1,
            nr.composed_flops.0,
            nr.composed_flops.1,
        ] {
            assert!(fit.exact, "{fit}");
            assert!(fit.per_elem >= 1.0 && fit.per_elem < 40.0, "{fit}");
        }
        // Fused forward streams x in and y out (4 + 4 bytes per element)
        // plus per-row and per-column terms; backward reads x and dy and
        // writes dx (12 bytes per element) plus small terms.
        let f = &nr.fused_traffic;
        assert!(
            (f.fwd as f64 / nd - 8.0).abs() < 0.1,
            "{}",
            f.fwd as f64 / nd
        );
        assert!(
            (f.bwd as f64 / nd - 12.0).abs() < 0.5,
            "{}",
            f.bwd as f64 / nd
        );
        let c = &nr.composed_traffic;
        assert!(c.fwd > 3 * f.fwd && c.bwd > 5 * f.bwd);
        assert!(c.nodes.iter().all(|t| t.modelled), "{:?}", c.nodes);
        assert!(c.nodes.len() >= 6);
    }
    let text = r.to_string();
    assert!(
        text.contains("layer_norm") && text.contains("rms_norm"),
        "{text}"
    );
}

#[test]
fn flop_counter_counts_the_kernel() {
    // Counted FLOPs per element: LayerNorm's fused forward does a shifted
    // sum (2), squared deviations (3) and the output (4). RMSNorm runs the
    // same kernels without the mean pass (its mean 0 and shift -0 are still
    // subtracted and added: exact, and free in a memory-bound loop), so its
    // forward counts 3 + 4 and its backward LayerNorm's 16.
    let (fwd, bwd) = analysis::measure_flops(Norm::LayerNorm, true).unwrap();
    assert_eq!(fwd.per_elem, 9.0, "{fwd}");
    assert_eq!(bwd.per_elem, 16.0, "{bwd}");
    let (fwd, bwd) = analysis::measure_flops(Norm::RmsNorm, true).unwrap();
    assert_eq!(fwd.per_elem, 7.0, "{fwd}");
    assert_eq!(bwd.per_elem, 16.0, "{bwd}");
}

#[test]
fn three_way_rows_display() {
    let c = analysis::Case::new(Norm::RmsNorm, &[3, 5, 8], &[5, 8]);
    let row = analysis::three_way(&c, 4).unwrap();
    assert_eq!(row.shape, vec![3, 5, 8]);
    assert!(row.fd.checked > 0);
    let t = analysis::ThreeWay(vec![row]).to_string();
    assert!(t.contains("rms_norm") && t.contains("[5, 8]"), "{t}");
}
