//! Which CPU the kernels' speed defaults were measured on. Some choices
//! (the LayerNorm kernels' overlap, narrow lanes and rows in step, in
//! `ops/norm/cpu/tuning.rs`) paid on one vendor's cores and cost on
//! the other's, so they follow the CPU the process runs on. None changes
//! any bits, only the speed.

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
    ///   lockstep and longer;
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
pub(crate) struct Switch(AtomicU8);

impl Switch {
    pub(crate) const fn new() -> Self {
        Switch(AtomicU8::new(0))
    }

    /// Forces the switch on or off.
    pub(crate) fn set(&self, on: bool) {
        self.0.store(1 + on as u8, Ordering::Relaxed)
    }

    /// Back to the profile's default.
    pub(crate) fn reset(&self) {
        self.0.store(0, Ordering::Relaxed)
    }

    /// The forced setting, else `default()`.
    #[inline(always)]
    pub(crate) fn on(&self, default: impl FnOnce() -> bool) -> bool {
        match self.0.load(Ordering::Relaxed) {
            0 => default(),
            s => s == 2,
        }
    }
}
