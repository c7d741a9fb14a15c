//! Where no CUDA driver is installed, the CUDA tests run against a CPU
//! emulation of the driver and cuBLAS (this folder's C++, with every kernel
//! of `kernels/` compiled for the host by `scripts/build-cuda-emu.py`), so
//! the launchers and the kernels' own code are exercised without a GPU.
//! The libraries are loaded by path before fusegrad first asks for CUDA;
//! their sonames make cudarc's later load by bare name find them.
//!
//! A skip is only for a machine with no driver where the emulation cannot
//! run either (no python3, g++ or NVRTC; with `FUSEGRAD_REQUIRE_GPU=1` a
//! missing NVRTC is no reason: the kernel cache must serve). Where a driver library is found,
//! or `FUSEGRAD_REQUIRE_GPU=1` is set, a device that cannot be used fails
//! the test: a green run on a GPU machine must mean the GPU ran it.

#![cfg_attr(not(feature = "cuda"), allow(dead_code, unused_imports))]
use fusegrad::Device;
use std::sync::OnceLock;

/// Whether `FUSEGRAD_REQUIRE_GPU=1`: every CUDA test must run on a device.
pub fn gpu_required() -> bool {
    std::env::var("FUSEGRAD_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The first GPU (real or emulated), or `None` after printing why there
/// is none. Panics (failing the test) where a skip would hide a broken
/// device: see the module's comment.
pub fn gpu() -> Option<Device> {
    let emulated = match use_emulation_if_no_driver() {
        Ok(e) => *e,
        Err(why) => return skip(why),
    };
    // The emulation without NVRTC (and so, on a fresh machine, without
    // kernels) is the one skip left; under FUSEGRAD_REQUIRE_GPU=1 the
    // kernel cache must serve instead.
    #[cfg(feature = "cuda")]
    if emulated && !gpu_required() {
        if let Err(e) = fusegrad::device::nvrtc_info() {
            return skip(&format!(
                "no CUDA driver, and the emulation needs NVRTC: {e}"
            ));
        }
    }
    match Device::Cuda(0).ensure_available() {
        Ok(()) => Some(Device::Cuda(0)),
        Err(e) if emulated => panic!("the CUDA emulation (tests/cuda_emu) is loaded, but {e}"),
        Err(e) => {
            panic!("a CUDA driver library is on the loader path, but cuda:0 cannot be used: {e}")
        }
    }
}

/// Whether the CUDA tests run on the emulation (after [`gpu`] said yes).
pub fn emulated() -> bool {
    matches!(use_emulation_if_no_driver(), Ok(true))
}

/// Prints why the test does not run and returns `None`; under
/// `FUSEGRAD_REQUIRE_GPU=1` fails the test instead.
fn skip(why: &str) -> Option<Device> {
    assert!(
        !gpu_required(),
        "FUSEGRAD_REQUIRE_GPU=1, but no CUDA device can be used: {why}"
    );
    eprintln!("skipped: {why}");
    None
}

/// How the CUDA tests run here: `Ok(false)` on a real driver, `Ok(true)`
/// on the emulation, `Err(why)` when neither is possible.
fn use_emulation_if_no_driver() -> &'static Result<bool, String> {
    static STATE: OnceLock<Result<bool, String>> = OnceLock::new();
    STATE.get_or_init(|| {
        if real_driver() {
            return Ok(false);
        }
        load().map(|()| true)
    })
}

#[cfg(feature = "cuda")]
fn real_driver() -> bool {
    // SAFETY: loads a system library by name and unloads it.
    ["libcuda.so.1", "libcuda.so"]
        .iter()
        .any(|n| unsafe { libloading::Library::new(*n) }.is_ok())
}

#[cfg(not(feature = "cuda"))]
fn real_driver() -> bool {
    false
}

#[cfg(feature = "cuda")]
fn load() -> Result<(), String> {
    let root = crate::common::workspace_root();
    let out = std::process::Command::new("python3")
        .arg(root.join("scripts/build-cuda-emu.py"))
        .output()
        .map_err(|e| format!("no CUDA driver, and python3 to build its emulation: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "no CUDA driver, and its emulation did not build: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    for lib in ["libcuda.so", "libcublas.so"] {
        let path = root.join("target/cuda-emu").join(lib);
        // SAFETY: our own test library; kept loaded for the process.
        let l = unsafe { libloading::Library::new(&path) }
            .map_err(|e| format!("loading {}: {e}", path.display()))?;
        std::mem::forget(l);
    }
    eprintln!("no CUDA driver here: running on the CPU emulation (tests/cuda_emu)");
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn load() -> Result<(), String> {
    Err("built without the `cuda` feature".into())
}

/// Allocations the emulated driver has made so far through
/// `cuMemAllocAsync` and through `cuMemAlloc` (`fg_emu_stats` in
/// driver.cpp), or `None` off the emulation.
#[cfg(feature = "cuda")]
#[allow(dead_code)] // not every test file that shares this module asks
pub fn emu_alloc_counts() -> Option<(u64, u64)> {
    if !matches!(use_emulation_if_no_driver(), Ok(true)) {
        return None;
    }
    let path = crate::common::workspace_root().join("target/cuda-emu/libcuda.so");
    // SAFETY: the emulation loaded above (same path, so the same copy);
    // fg_emu_stats writes two counters through the pointers it is given.
    unsafe {
        let lib = libloading::Library::new(&path).ok()?;
        let f = lib
            .get::<unsafe extern "C" fn(*mut u64, *mut u64)>("fg_emu_stats")
            .ok()?;
        let (mut a, mut s) = (0u64, 0u64);
        f(&mut a, &mut s);
        Some((a, s))
    }
}

#[cfg(not(feature = "cuda"))]
#[allow(dead_code)] // not every test file that shares this module asks
pub fn emu_alloc_counts() -> Option<(u64, u64)> {
    None
}
