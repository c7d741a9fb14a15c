//! The LayerNorm kernels' speed switches and thresholds: which rows go in
//! lockstep, in runs, statistics first or overlapped, in narrow lanes, and
//! what each CPU vendor's [`Profile`] picks by default. Each switch changes
//! only the speed (except [`set_segmented`]), and each can be turned off
//! process-wide to measure what it is worth.

use crate::device::cpu::{profile, Profile, Switch};
use std::sync::atomic::{AtomicBool, Ordering};

/// Rows a LayerNorm task advances in lockstep where that pays (see
/// [`rows_in_step`]).
pub const ROWS_IN_STEP: usize = 4;

/// The row sizes, in bytes, at which [`rows_in_step`] is [`ROWS_IN_STEP`].
/// Shorter rows are bound by their per-row arithmetic, which four rows at
/// once only slows (more live registers); longer ones would not fit in L2
/// four at a time between the passes.
pub const STEP_ROW_BYTES: std::ops::RangeInclusive<usize> = (16 << 10)..=(64 << 10);

static LOCKSTEP: AtomicBool = AtomicBool::new(true);

/// Rows the LayerNorm backward advances together for rows of `row_bytes`:
/// [`rows_in_step`], but two, not four, where [`Profile::backward_pairs`]
/// says so: rows past 16 KiB on Intel, every row in lockstep on AMD. The joined
/// loop holds two groups of rows at once (this group's pass B, the next
/// group's pass A): at four rows their statistics, row sums and pointers
/// need about 56 vector registers of 32 and spill, and at 64 KiB rows the
/// two groups' `x` and `dy` fill half of L2. At 16 KiB rows, Intel keeps
/// four. On AMD Zen 4, whose L1 is 8-way (32 KiB), four 16 KiB rows of `x`
/// and of `dy` fall in one L1 set with `gamma` and the partials, so AMD
/// takes two at every width ([`set_backward_pairs`]).
/// Each row keeps its own accumulators and the partials still take
/// the rows in row order, so the bits are unchanged.
pub fn bwd_rows_in_step(row_bytes: usize) -> usize {
    match rows_in_step(row_bytes) {
        ROWS_IN_STEP if PAIRS.on(|| backward_pairs(profile(), row_bytes)) => 2,
        r => r,
    }
}

static PAIRS: Switch = Switch::new();

/// Makes [`bwd_rows_in_step`] take rows in lockstep two at a time (`true`)
/// or [`ROWS_IN_STEP`] at a time (`false`) at every lockstep width,
/// overriding the [`profile()`] (process-wide; for benchmarks that measure
/// what it is worth; [`reset_switches`] restores the profile's choice). It
/// changes only the speed.
#[cfg_attr(not(feature = "probes"), allow(dead_code))]
pub fn set_backward_pairs(on: bool) {
    PAIRS.set(on)
}

/// Rows the LayerNorm kernels advance together for rows of `row_bytes`:
/// [`ROWS_IN_STEP`] within [`STEP_ROW_BYTES`] (unless turned off by
/// [`set_lockstep`]), else 1. Reading several rows at once keeps several
/// read and write streams in flight from one core.
pub fn rows_in_step(row_bytes: usize) -> usize {
    if LOCKSTEP.load(Ordering::Relaxed) && STEP_ROW_BYTES.contains(&row_bytes) {
        ROWS_IN_STEP
    } else {
        1
    }
}

static SEGMENTED: AtomicBool = AtomicBool::new(true);

/// Whether the LayerNorm kernels walk rows of `row_bytes` as [`UNROLL`]
/// runs in lockstep ([`each_chunk_in`]): for rows past [`STEP_ROW_BYTES`],
/// too long to take several at once. The runs decide which accumulator
/// each chunk of the row goes to, so this changes the order of the row
/// sums (still a function of the shape only).
pub fn segmented(row_bytes: usize) -> bool {
    SEGMENTED.load(Ordering::Relaxed) && row_bytes > *STEP_ROW_BYTES.end()
}

/// Turns [`segmented`] rows on or off (process-wide; for benchmarks that
/// measure what it is worth). Unlike the other switches it changes the
/// bits of the long-row results, within the usual rounding.
#[cfg_attr(not(feature = "probes"), allow(dead_code))]
pub fn set_segmented(on: bool) {
    SEGMENTED.store(on, Ordering::Relaxed)
}

static LONG_FWD_TASKS: AtomicBool = AtomicBool::new(true);

/// Whether a LayerNorm forward task over rows in lockstep spans several
/// steps (on unless turned off by [`set_long_fwd_tasks`]).
pub fn long_fwd_tasks() -> bool {
    LONG_FWD_TASKS.load(Ordering::Relaxed)
}

/// Turns [`long_fwd_tasks`] on or off (process-wide; for benchmarks that
/// measure what it is worth). It changes only the speed: forward rows are
/// independent, so how they are cut into tasks changes no bits.
#[cfg_attr(not(feature = "probes"), allow(dead_code))]
pub fn set_long_fwd_tasks(on: bool) {
    LONG_FWD_TASKS.store(on, Ordering::Relaxed)
}

/// Turns lockstep rows on or off (process-wide; for benchmarks that
/// measure what it is worth). It changes only the speed: every row's
/// arithmetic, and the order in which rows are added into dgamma/dbeta,
/// are the same either way.
#[cfg_attr(not(feature = "probes"), allow(dead_code))]
pub fn set_lockstep(on: bool) {
    LOCKSTEP.store(on, Ordering::Relaxed)
}

static OVERLAP: Switch = Switch::new();

/// Turns [`overlap`] and [`overlap_backward`] on or off, overriding the
/// [`profile()`] (process-wide; for benchmarks that measure what it is
/// worth; [`reset_switches`] restores the profile's choice). It changes
/// only the speed.
#[cfg_attr(not(feature = "probes"), allow(dead_code))]
pub fn set_overlap(on: bool) {
    OVERLAP.set(on)
}

static STATS_FIRST: AtomicBool = AtomicBool::new(true);

/// Rows a LayerNorm forward task takes [`stats_first`].
pub const STATS_FIRST_ROWS: usize = 8;

/// The longest row, in bytes, that goes [`stats_first`].
pub const STATS_FIRST_ROW_BYTES: usize = 1024;

/// Whether the LayerNorm forward runs the statistics passes of
/// [`STATS_FIRST_ROWS`] rows of `row_bytes` back to back, then their output
/// passes: for rows of at most [`STATS_FIRST_ROW_BYTES`] (unless turned off
/// by [`set_stats_first`]). Each row's statistics end in a chain of
/// dependent folds, a division and `1/sqrt`, and at 128 wide that chain is
/// as long as the row's loads; back to back, one row's chain overlaps the
/// next row's loads. The backward's pass A does not gain from this and
/// does not use it.
#[inline(always)]
pub fn stats_first(row_bytes: usize) -> bool {
    STATS_FIRST.load(Ordering::Relaxed) && row_bytes <= STATS_FIRST_ROW_BYTES
}

/// Turns [`stats_first`] on or off (process-wide; for benchmarks that
/// measure what it is worth). It changes only the speed.
#[cfg_attr(not(feature = "probes"), allow(dead_code))]
pub fn set_stats_first(on: bool) {
    STATS_FIRST.store(on, Ordering::Relaxed)
}

static PAIRED: AtomicBool = AtomicBool::new(true);

/// Turns [`paired_partials`] on or off (process-wide; for benchmarks that
/// measure what it is worth). It changes only the speed.
#[cfg_attr(not(feature = "probes"), allow(dead_code))]
pub fn set_paired_partials(on: bool) {
    PAIRED.store(on, Ordering::Relaxed)
}

/// Whether the LayerNorm backward, where it [`overlap`]s rows of
/// `row_bytes`, adds two groups of rows' dgamma/dbeta partials in one
/// read-modify-write of the partial row (the second group's pass A adds the
/// first group's terms, then its own): for rows in lockstep and longer
/// (from [`STEP_ROW_BYTES`]' start), whose partial row (32 KiB and up) is
/// not held in L1 beside the rows, and unless turned off by
/// [`set_paired_partials`]. Shorter rows' partial rows sit in L1 anyway.
/// What the partials cost at all: `benches/partials_cost.rs`.
#[inline(always)]
pub fn paired_partials(row_bytes: usize) -> bool {
    PAIRED.load(Ordering::Relaxed) && row_bytes >= *STEP_ROW_BYTES.start()
}

static INTERLEAVED: AtomicBool = AtomicBool::new(true);

/// Turns [`interleaved_partials`] on or off (process-wide; for benchmarks
/// that measure what it is worth). It changes only the speed.
#[cfg_attr(not(feature = "probes"), allow(dead_code))]
pub fn set_interleaved_partials(on: bool) {
    INTERLEAVED.store(on, Ordering::Relaxed)
}

/// Whether the LayerNorm backward's partial rows hold dgamma and dbeta
/// interleaved chunk by chunk (one stream of lines) instead of as two
/// halves `2d` values apart. The bits are the same.
#[inline(always)]
pub fn interleaved_partials() -> bool {
    INTERLEAVED.load(Ordering::Relaxed)
}

/// The shortest row, in bytes, whose kernels [`overlap`] one group of
/// rows' output pass with the next group's first pass: shorter rows are
/// too short for the joined loop to pay for itself.
pub const OVERLAP_ROW_BYTES: usize = 2 << 10;

/// Whether the LayerNorm forward runs the next rows' first pass inside this
/// rows' output pass ([`write_rows_with`]) for rows of `row_bytes`: only
/// for outputs that are streamed (the caller checks), rows of at least
/// [`OVERLAP_ROW_BYTES`], and where the [`profile()`] or [`set_overlap`] says
/// so (on AMD, only rows in lockstep).
#[inline(always)]
pub fn overlap(row_bytes: usize) -> bool {
    row_bytes >= OVERLAP_ROW_BYTES && OVERLAP.on(|| forward_overlap(profile(), row_bytes))
}

/// Whether the LayerNorm backward runs the next rows' pass A inside this
/// rows' pass B, as [`overlap`] for the forward (on AMD by default only
/// for rows in lockstep and longer).
#[inline(always)]
pub fn overlap_backward(row_bytes: usize) -> bool {
    row_bytes >= OVERLAP_ROW_BYTES && OVERLAP.on(|| backward_overlap(profile(), row_bytes))
}

static NARROW: Switch = Switch::new();

/// Whether the LayerNorm kernels run rows of `row_bytes` in 256-bit lanes
/// (the AVX2 build) on a CPU with AVX-512: for rows past
/// [`STEP_ROW_BYTES`] (unless turned off by [`set_narrow_lanes`]): there
/// they pay on Intel, while shorter rows run faster in 512-bit lanes.
/// Every build gives the same bits. On AMD the 256-bit lanes cost time
/// (see [`Profile::Amd`]), so the [`profile()`] turns them off there.
pub fn narrow_lanes(row_bytes: usize) -> bool {
    row_bytes > *STEP_ROW_BYTES.end() && NARROW.on(|| narrow_default(profile()))
}

/// Turns [`narrow_lanes`] on or off, overriding the [`profile()`]
/// (process-wide; for benchmarks that measure what it is worth). It
/// changes only the speed.
#[cfg_attr(not(feature = "probes"), allow(dead_code))]
pub fn set_narrow_lanes(on: bool) {
    NARROW.set(on)
}

/// Gives [`overlap`], [`overlap_backward`], [`narrow_lanes`] and
/// [`bwd_rows_in_step`] back to the [`profile()`]'s defaults after
/// [`set_overlap`], [`set_narrow_lanes`] or [`set_backward_pairs`].
#[cfg_attr(not(feature = "probes"), allow(dead_code))]
pub fn reset_switches() {
    OVERLAP.reset();
    NARROW.reset();
    PAIRS.reset();
}

/// Whether the forward overlaps rows of `row_bytes` (at least
/// [`OVERLAP_ROW_BYTES`]) by default on `p`'s CPUs: always on Intel; on
/// AMD for rows in lockstep and longer.
pub fn forward_overlap(p: Profile, row_bytes: usize) -> bool {
    match p {
        Profile::Intel => true,
        Profile::Amd => row_bytes >= *STEP_ROW_BYTES.start(),
    }
}

/// Whether the backward overlaps its passes for rows of `row_bytes` (at
/// least [`OVERLAP_ROW_BYTES`]) by default: always on Intel; on AMD for
/// rows in lockstep and longer (from [`STEP_ROW_BYTES`]' start), as its
/// forward. Shorter rows lose time to the joined loop on AMD; rows in
/// lockstep gain from it there because their partials pair in it
/// ([`paired_partials`]).
pub fn backward_overlap(p: Profile, row_bytes: usize) -> bool {
    match p {
        Profile::Intel => true,
        Profile::Amd => row_bytes >= *STEP_ROW_BYTES.start(),
    }
}

/// Whether the backward takes rows of `row_bytes` that go in lockstep two
/// at a time rather than four ([`bwd_rows_in_step`]): past 16 KiB on
/// Intel, at every such row on AMD.
pub fn backward_pairs(p: Profile, row_bytes: usize) -> bool {
    match p {
        Profile::Intel => row_bytes > *STEP_ROW_BYTES.start(),
        Profile::Amd => true,
    }
}

/// Whether rows past 64 KiB run in 256-bit lanes by default.
pub fn narrow_default(p: Profile) -> bool {
    p == Profile::Intel
}
