//! What the `fusegrad` command's benchmarks, its analysis and the developer
//! probes in `benches/` read from inside the library (feature `probes`, not
//! part of the API).

pub use crate::device::cpu::{
    cpu_vendor, set_prefetch_next, set_profile, set_simd_limit, set_stream_threshold, set_team,
    Profile, Simd, DEFAULT_STREAM_BYTES,
};
pub use crate::device::pool::{fresh, set_enabled as set_pool_enabled, set_huge_pages};
pub use crate::layout::{alloc, checked_numel};
pub use crate::ops::norm::cpu::tuning::{
    backward_pairs, reset_switches, set_backward_pairs, set_interleaved_partials, set_lockstep,
    set_long_fwd_tasks, set_narrow_lanes, set_overlap, set_paired_partials, set_segmented,
    set_stats_first,
};

pub mod counted;
#[cfg(feature = "cuda")]
pub mod cuda_bench;

/// The CPU device's helpers the benchmarks time with.
pub mod cpu {
    pub use crate::device::cpu::{profile, run_each, simd, stream_copy, stream_threshold};
}

/// The buffer pool: fresh (never recycled) buffers and the on/off switch.
pub mod pool {
    pub use crate::device::pool::{clear, fresh, set_enabled};
}

/// The per-op timers behind `fusegrad bench --train`'s breakdown.
pub mod profile {
    pub use crate::profile::{alloc_so_far, set_enabled, take_ops, Key, Phase, Tally};
}

/// Row groups the CPU norm kernels split `n` rows of `d` into.
pub fn norm_groups(n: usize, d: usize) -> usize {
    crate::ops::norm::cpu::rows::groups(n, d)
}

/// `out = a @ b` by the CPU kernel `ops::matmul` runs.
pub fn matmul_kernel(
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    mkn: [usize; 3],
    transposed: [bool; 2],
) {
    crate::ops::matmul_kernel(a, b, out, mkn, transposed)
}
