//! Checks that a CUDA library cudarc is about to use exports what fusegrad
//! will call in it.
//!
//! cudarc 0.19 (dynamic loading) opens a library on its first call into it
//! and resolves each entry point lazily, on that function's first call; a
//! missing one panics (`Missing symbol cuInit`). The panic is caught, but
//! Rust's panic hook has printed it with a backtrace by then, and a symbol
//! first used in the middle of a run would escape as a panic. So before
//! cudarc first touches a library, the library it would pick (the first of
//! `cudarc::get_lib_name_candidates` the loader opens, cudarc's own order)
//! is opened here and every symbol fusegrad reaches through cudarc is
//! looked up; a stub or an older library is then `CudaUnavailable` naming
//! the file and the first missing symbol.
//!
//! The lists are what fusegrad's calls resolve: read from cudarc's safe
//! layer for the calls fusegrad makes (`src/device/cuda.rs`, `ops/*/cuda.rs`,
//! `cli/src/bench/cuda.rs`, `src/device/nvrtc.rs`), and checked against the
//! symbols a full `tests/cuda/backend.rs` run looks up in the emulated driver. A
//! call added to fusegrad that reaches a new entry point belongs here.

use std::sync::OnceLock;

/// Driver entry points every use of a GPU reaches: set-up, both
/// allocation paths (the device's memory-pool attribute picks one),
/// copies, modules and launches, and error strings.
pub(crate) const DRIVER: &[&str] = &[
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuGetErrorString",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemsetD8Async",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuStreamSynchronize",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuLaunchKernel",
];

/// Driver entry points of event timing (`fusegrad bench --device cuda`).
/// Kept apart from [`DRIVER`]: `cuEventElapsedTime_v2` is new in the 12.8
/// driver, and an older driver still trains and runs every op.
#[cfg_attr(not(feature = "probes"), allow(dead_code))] // read by `probes`
pub(crate) const DRIVER_EVENTS: &[&str] = &[
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventElapsedTime_v2",
    "cuEventDestroy_v2",
];

/// cuBLAS entry points: the handle and every GEMM `ops/matmul/cuda.rs`
/// issues (f16 and bf16 go through the `Ex` forms).
pub(crate) const CUBLAS: &[&str] = &[
    "cublasCreate_v2",
    "cublasSetStream_v2",
    "cublasDestroy_v2",
    "cublasSgemm_v2",
    "cublasDgemm_v2",
    "cublasGemmEx",
    "cublasSgemmStridedBatched",
    "cublasDgemmStridedBatched",
    "cublasGemmStridedBatchedEx",
];

/// NVRTC entry points `src/device/nvrtc.rs` calls.
pub(crate) const NVRTC: &[&str] = &[
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcDestroyProgram",
];

/// The driver library exports [`DRIVER`] (checked once per process).
pub(crate) fn driver() -> Result<(), String> {
    static R: OnceLock<Result<(), String>> = OnceLock::new();
    R.get_or_init(|| {
        check(
            &["cuda", "nvcuda"],
            "the CUDA driver library",
            DRIVER,
            "a stub or an older driver",
        )
    })
    .clone()
}

/// The driver library exports [`DRIVER_EVENTS`] (checked once).
#[cfg_attr(not(feature = "probes"), allow(dead_code))] // read by `probes`
pub(crate) fn driver_events() -> Result<(), String> {
    static R: OnceLock<Result<(), String>> = OnceLock::new();
    R.get_or_init(|| {
        check(
            &["cuda", "nvcuda"],
            "the CUDA driver library",
            DRIVER_EVENTS,
            "a stub, or a driver older than 12.8, which event timing needs",
        )
    })
    .clone()
}

/// cuBLAS exports [`CUBLAS`] (checked once).
pub(crate) fn cublas() -> Result<(), String> {
    static R: OnceLock<Result<(), String>> = OnceLock::new();
    R.get_or_init(|| check(&["cublas"], "cuBLAS", CUBLAS, "a stub or an older cuBLAS"))
        .clone()
}

/// NVRTC exports [`NVRTC`]; the NVRTC loader calls it once its
/// library is in place, before its first `cudarc::nvrtc::sys` call. Not
/// cached: loading NVRTC by path changes what the bare name finds.
pub(crate) fn nvrtc() -> Result<(), String> {
    check(&["nvrtc"], "NVRTC", NVRTC, "a stub or an older NVRTC")
}

/// The first library of cudarc's candidates for `stems` that the loader
/// opens, with the file it opened.
fn open_first(stems: &[&str]) -> Option<(libloading::Library, String)> {
    stems
        .iter()
        .flat_map(|s| cudarc::get_lib_name_candidates(s))
        .find_map(|name| {
            // SAFETY: the same load by name cudarc makes (running only the
            // library's initialisers).
            let lib = unsafe { libloading::Library::new(&name) }.ok()?;
            // SAFETY: as above; a second handle to the same library.
            let again = unsafe { libloading::Library::new(&name) }.ok();
            let path = again.and_then(path_of).unwrap_or(name);
            Some((lib, path))
        })
}

/// The driver's CUDA version and file, as `CUDA 13.0 (PATH)`; read with
/// the driver's own `cuDriverGetVersion`, before any context exists.
pub(crate) fn driver_version() -> Result<String, String> {
    let (lib, path) = open_first(&["cuda", "nvcuda"])
        .ok_or("the CUDA driver library (libcuda.so) was not found on the loader path")?;
    type F = unsafe extern "C" fn(*mut std::ffi::c_int) -> std::ffi::c_int;
    // SAFETY: the driver API's signature of cuDriverGetVersion; it writes
    // one int.
    unsafe {
        let f = lib
            .get::<F>(b"cuDriverGetVersion")
            .map_err(|_| format!("{path} lacks cuDriverGetVersion"))?;
        let mut v = 0;
        match f(&mut v) {
            0 => Ok(format!("CUDA {}.{} ({path})", v / 1000, v % 1000 / 10)),
            r => Err(format!("cuDriverGetVersion failed with {r} ({path})")),
        }
    }
}

/// cuBLAS's version and file, as `13.1.0 (PATH)`, from
/// `cublasGetProperty` (no handle, no GPU needed).
pub(crate) fn cublas_version() -> Result<String, String> {
    let (lib, path) =
        open_first(&["cublas"]).ok_or("cuBLAS (libcublas.so) was not found on the loader path")?;
    type F = unsafe extern "C" fn(std::ffi::c_int, *mut std::ffi::c_int) -> std::ffi::c_int;
    // SAFETY: cuBLAS's signature of cublasGetProperty (MAJOR_VERSION = 0,
    // MINOR_VERSION = 1, PATCH_LEVEL = 2); it writes one int.
    unsafe {
        let f = lib
            .get::<F>(b"cublasGetProperty")
            .map_err(|_| format!("{path} lacks cublasGetProperty (a stub or an older cuBLAS)"))?;
        let mut v = [0; 3];
        for (k, x) in v.iter_mut().enumerate() {
            if f(k as std::ffi::c_int, x) != 0 {
                return Err(format!("cublasGetProperty failed ({path})"));
            }
        }
        Ok(format!("{}.{}.{} ({path})", v[0], v[1], v[2]))
    }
}

/// Opens the library cudarc would open for `stems` and looks up each of
/// `symbols`; `Err` names the file and the first symbol it lacks, then
/// `likely` (what such a library usually is) in parentheses.
fn check(stems: &[&str], what: &str, symbols: &[&str], likely: &str) -> Result<(), String> {
    let names = stems
        .iter()
        .flat_map(|s| cudarc::get_lib_name_candidates(s));
    for name in names {
        // SAFETY: the same load by name cudarc makes next (running only the
        // library's initialisers); the handle is closed on return.
        let Ok(lib) = (unsafe { libloading::Library::new(&name) }) else {
            continue;
        };
        let missing: Vec<&str> = symbols
            .iter()
            .copied()
            // SAFETY: the symbol is only looked up, never called or read.
            .filter(|s| unsafe { lib.get::<*mut std::ffi::c_void>(*s) }.is_err())
            .collect();
        let Some(first) = missing.first() else {
            return Ok(());
        };
        let path = path_of(lib).unwrap_or(name);
        let more = match missing.len() {
            1 => String::new(),
            n => format!(
                " and {} more of the {} entry points fusegrad calls",
                n - 1,
                symbols.len()
            ),
        };
        return Err(format!("{what} at {path} lacks {first}{more} ({likely})"));
    }
    Err(format!(
        "{what} (lib{}.so) was not found on the loader path",
        stems[0]
    ))
}

/// The file the loader opened for `lib` (Linux), to name it in a message.
#[cfg(target_os = "linux")]
fn path_of(lib: libloading::Library) -> Option<String> {
    use std::ffi::{c_char, c_int, c_void, CStr};
    /// The leading fields of glibc's and musl's `struct link_map`.
    #[repr(C)]
    struct LinkMap {
        addr: usize,
        name: *const c_char,
    }
    extern "C" {
        fn dlinfo(handle: *mut c_void, request: c_int, info: *mut c_void) -> c_int;
    }
    const RTLD_DI_LINKMAP: c_int = 2;
    let raw = libloading::os::unix::Library::from(lib).into_raw();
    let mut map: *const LinkMap = std::ptr::null();
    // SAFETY: `raw` is a live handle from dlopen; dlinfo writes one pointer
    // to the library's link map, which lives until the handle is closed
    // below, after the name is copied out.
    let name = unsafe {
        let ok = dlinfo(
            raw,
            RTLD_DI_LINKMAP,
            (&mut map as *mut *const LinkMap).cast(),
        ) == 0;
        (ok && !map.is_null() && !(*map).name.is_null())
            .then(|| CStr::from_ptr((*map).name).to_string_lossy().into_owned())
    };
    // SAFETY: `raw` came from `into_raw` above and is closed exactly once.
    drop(unsafe { libloading::os::unix::Library::from_raw(raw) });
    name.filter(|n| !n.is_empty())
}

#[cfg(not(target_os = "linux"))]
fn path_of(_lib: libloading::Library) -> Option<String> {
    None
}
