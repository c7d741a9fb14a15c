//! The bench's figures are a warm loop's: a shape that runs first in its
//! process is warmed up until its steps fault in no page. Its own test
//! binary, because the fault count is the whole process's.

include!("common/faults.rs");

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
