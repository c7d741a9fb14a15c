//! Which CPU the kernels' speed defaults were measured on. Some choices
//! ([`overlap`](super::overlap), [`narrow_lanes`](super::narrow_lanes),
//! the backward's rows in step) paid on one vendor's cores and cost on the
//! other's, so they follow the CPU the process runs on. None changes any
//! bits, only the speed.

use std::sync::atomic::{AtomicU8, Ordering};

/// A set of measured speed defaults, chosen by the CPU's vendor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// Measured on Intel Sapphire Rapids (AVX-512, 2 MiB L2 per core); the
    /// default on every CPU that is not AMD's.
    Intel,
    /// Measured on AMD Zen 4 (EPYC, family 25 model 17; AVX-512 on 256-bit
    /// units, 1 MiB L2 per core), and since 2026-12-01 (night) on Zen 5
    /// (family 26, full 512-bit units, 1 MiB L2 per core). On Zen 4,
    /// fwd+bwd time with the Intel profile's choice over without it
    /// (`ab_switches`, 21 reps):
    /// - overlapped backward passes: 1.03-1.29 at rows of 512-8192 f32
    ///   (2-32 KiB), 0.97-1.05 at rows of 64-256 KiB; Zen 5 gains at rows
    ///   past 64 KiB and, with paired partials, at rows in lockstep, which
    ///   now overlap on AMD too (see [`Profile::backward_overlap`]);
    /// - overlapped forward passes of rows taken one at a time: 1.11-1.43
    ///   at rows of 1024-2048, 1.00-1.05 at 512-768; but rows in lockstep
    ///   (16-64 KiB) gain, 0.89-0.98, and keep it;
    /// - 256-bit lanes for rows past 64 KiB: 1.04-1.14 at 512 x 65536,
    ///   2048 x 65536, 4096 x 32768 and 1024 x 131072;
    /// - four 16 KiB rows in the backward's step instead of two: 1.04-1.19
    ///   of the backward's time at 4096, 8192 and 16384 x 4096.
    Amd,
}

impl Profile {
    /// The profile for a CPU whose `cpuid` vendor string is `vendor`.
    pub fn for_vendor(vendor: &str) -> Self {
        match vendor {
            "AuthenticAMD" | "HygonGenuine" => Profile::Amd,
            _ => Profile::Intel,
        }
    }

    /// Whether the forward overlaps rows of `row_bytes` (at least
    /// [`OVERLAP_ROW_BYTES`](super::OVERLAP_ROW_BYTES)) by default.
    pub fn forward_overlap(self, row_bytes: usize) -> bool {
        match self {
            Profile::Intel => true,
            Profile::Amd => row_bytes >= *super::STEP_ROW_BYTES.start(),
        }
    }

    /// Whether the backward overlaps its passes for rows of `row_bytes`
    /// (at least [`OVERLAP_ROW_BYTES`](super::OVERLAP_ROW_BYTES)) by
    /// default: always on Intel; on AMD for rows in lockstep and longer
    /// (from [`STEP_ROW_BYTES`](super::STEP_ROW_BYTES)' start), as its
    /// forward. Measured on AMD Zen 5 (EPYC, family 26; 1 MiB L2 per core),
    /// backward time overlapped over not: 0.90-0.93 at 4096 x 32768,
    /// 0.93-0.96 at 1024 x 131072 and 512 x 65536, 0.91-0.98 at
    /// 2048 x 65536 (`ab_switches --switch overlap`, 21-31 reps, seven
    /// runs; one of seven 1.03); 1.09-1.20 at rows of 2-16 KiB, as on
    /// Zen 4. Rows in lockstep overlapped only since their partials pair
    /// in the joined loop ([`paired_partials`](super::paired_partials),
    /// 2026-12-02): then 0.88, 0.91 and 0.92 at 1024 x 16384, 0.87, 0.93
    /// and 0.91 at 2048 x 8192, and 0.92-1.03 at 16-32 KiB rows (median
    /// 0.96 of eleven runs at 4096 x 4096, 8192 x 4096, 16384 x 4096 and
    /// 4096 x 8192; 21 reps each).
    pub fn backward_overlap(self, row_bytes: usize) -> bool {
        match self {
            Profile::Intel => true,
            Profile::Amd => row_bytes >= *super::STEP_ROW_BYTES.start(),
        }
    }

    /// Whether the backward takes rows of `row_bytes` that go in lockstep
    /// two at a time rather than four ([`bwd_rows_in_step`](super::bwd_rows_in_step)):
    /// past 16 KiB on Intel, at every such row on AMD.
    pub fn backward_pairs(self, row_bytes: usize) -> bool {
        match self {
            Profile::Intel => row_bytes > *super::STEP_ROW_BYTES.start(),
            Profile::Amd => true,
        }
    }

    /// Whether rows past 64 KiB run in 256-bit lanes by default.
    pub fn narrow_lanes(self) -> bool {
        self == Profile::Intel
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Profile::Intel => "Intel",
            Profile::Amd => "AMD",
        })
    }
}

/// The `cpuid` vendor string ("GenuineIntel", "AuthenticAMD", ...), or ""
/// off x86-64.
pub fn cpu_vendor() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let r = std::arch::x86_64::__cpuid(0);
        let bytes: Vec<u8> = [r.ebx, r.edx, r.ecx]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
    #[cfg(not(target_arch = "x86_64"))]
    String::new()
}

/// 0: not yet detected; 1: Intel; 2: AMD.
static PROFILE: AtomicU8 = AtomicU8::new(0);

/// The profile in use: detected from [`cpu_vendor`] on first use, unless
/// set by [`set_profile`].
pub fn profile() -> Profile {
    match PROFILE.load(Ordering::Relaxed) {
        1 => Profile::Intel,
        2 => Profile::Amd,
        _ => {
            let p = Profile::for_vendor(&cpu_vendor());
            set_profile(p);
            p
        }
    }
}

/// Sets the profile (process-wide; for benchmarks that compare the two on
/// one machine). It changes only the speed.
pub fn set_profile(p: Profile) {
    PROFILE.store(if p == Profile::Intel { 1 } else { 2 }, Ordering::Relaxed)
}

/// A speed switch whose default comes from [`profile`] until it is set.
pub(super) struct Switch(AtomicU8);

impl Switch {
    pub(super) const fn new() -> Self {
        Switch(AtomicU8::new(0))
    }

    /// Forces the switch on or off.
    pub(super) fn set(&self, on: bool) {
        self.0.store(1 + on as u8, Ordering::Relaxed)
    }

    /// Back to the profile's default.
    pub(super) fn reset(&self) {
        self.0.store(0, Ordering::Relaxed)
    }

    /// The forced setting, else `default()`.
    #[inline(always)]
    pub(super) fn on(&self, default: impl FnOnce() -> bool) -> bool {
        match self.0.load(Ordering::Relaxed) {
            0 => default(),
            s => s == 2,
        }
    }
}
