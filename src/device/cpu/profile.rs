//! Which CPU the kernels' speed defaults were measured on. Some choices
//! ([`overlap`](super::overlap), [`narrow_lanes`](super::narrow_lanes),
//! the backward's rows in step) paid on one vendor's cores and cost on the
//! other's, so they follow the CPU the process runs on. None changes any
//! bits, only the speed.

use std::sync::atomic::{AtomicU8, Ordering};

/// A set of measured speed defaults, chosen by the CPU's vendor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// Tuned on Intel Sapphire Rapids (AVX-512, 2 MiB L2 per core); the
    /// default on every CPU that is not AMD's.
    Intel,
    /// Tuned on AMD Zen 4 (AVX-512 on 256-bit units) and Zen 5 (full
    /// 512-bit units), 1 MiB L2 per core. Where the Intel profile's
    /// choices cost time on these cores, it differs:
    /// - overlapped passes, forward and backward, only for rows in
    ///   lockstep and longer (see [`Profile::backward_overlap`]);
    /// - 512-bit lanes for rows past 64 KiB;
    /// - two rows, not four, in the backward's step at every lockstep
    ///   width, 16 KiB rows included.
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
    /// forward. Shorter rows lose time to the joined loop on AMD; rows in
    /// lockstep gain from it there because their partials pair in it
    /// ([`paired_partials`](super::paired_partials)).
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
