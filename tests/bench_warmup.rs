//! The bench's figures are a warm loop's: a shape that runs first in its
//! process is warmed up until its steps fault in no page. Its own test
//! binary, because the fault count is the whole process's.

/// `bench::measure` of `n x d` (no composed twin, a short budget), with its
/// faults per step; `None`, after saying so, where the OS counts no faults.
fn measure_faults(n: usize, d: usize) -> Option<(fusegrad::bench::Row, f64)> {
    let row = fusegrad::bench::measure(n, d, 0.01, false).expect("bench");
    let Some(faults) = row.faults_per_step else {
        eprintln!("skipped: this OS reports no page-fault counts (/proc/self/stat)");
        return None;
    };
    Some((row, faults))
}

/// 2048 x 65536 f32: `y` and `dx` (512 MiB each) fill the pool, so the
/// 16 MiB of dgamma/dbeta partial rows go back to glibc after the first
/// step, and the second step maps them afresh (519 faults, then none).
const SHAPE: (usize, usize) = (2048, 65536);

#[test]
fn a_shape_run_first_is_measured_warm() {
    let (n, d) = SHAPE;
    let Some((row, faults)) = measure_faults(n, d) else {
        return;
    };
    // One warm-up step left the second step's 519 faults in the timed
    // reps: 103.8 per step over five.
    assert!(
        faults < 16.0,
        "{faults} faults per step over {} reps",
        row.reps
    );
}
