//! fusegrad: reverse-mode autodiff with a first-class, fused LayerNorm whose
//! gradients are checked against a twin built from primitive ops.
#![doc = include_str!("../README.md")]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod analysis;
pub mod app;
pub mod bench;
pub mod device;
pub mod dtype;
pub mod error;
pub mod gradcheck;
pub(crate) mod layout;
pub mod mask;
pub mod nn;
pub mod op;
pub mod plot;
pub(crate) mod profile;
pub mod report;
pub mod rng;
pub mod shadow;
pub mod special;
pub mod stability;
pub mod tape;
pub mod tensor;
pub mod tolerance;

#[path = "../ops/mod.rs"]
pub mod ops;

/// The CPU kernels' speed switches and the buffer pool's, for the
/// developer probes in `benches/` (`cargo bench --features probes --bench
/// NAME`). Not part of the library's API: only with the `probes` feature,
/// and free to change with the kernels.
#[cfg(feature = "probes")]
pub mod probes {
    pub use crate::device::cpu::{
        cpu_vendor, reset_switches, set_backward_pairs, set_interleaved_partials, set_lockstep,
        set_long_fwd_tasks, set_narrow_lanes, set_overlap, set_paired_partials, set_prefetch_next,
        set_profile, set_segmented, set_simd_limit, set_stats_first, set_stream_threshold,
        set_team, Profile, Simd, DEFAULT_STREAM_BYTES,
    };
    pub use crate::device::pool::{fresh, set_enabled as set_pool_enabled, set_huge_pages};

    /// `out = a @ b` by the CPU kernel `ops::matmul` runs.
    pub fn matmul_kernel(a: &[f32], b: &[f32], out: &mut [f32], [m, k, n]: [usize; 3]) {
        crate::ops::matmul_kernel(a, b, out, [m, k, n])
    }
}

pub use device::Device;
pub use dtype::{Accum, Element};
pub use error::{Error, Result};
pub use mask::Mask;
pub use op::{Op, Saved, SavedItem};
pub use shadow::{Shadow, ShadowConfig};
pub use tape::{Gradients, NodeInfo, NodeMemory, Tape, Var};
pub use tensor::Tensor;
