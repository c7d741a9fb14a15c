//! Run-time kernel compilation: finding NVRTC, compiling a kernel family
//! to a CUBIN for one architecture, and reading ptxas's resource report.
//!
//! NVRTC is looked up the way cudarc loads it (by library name through the
//! loader), after first loading `libnvrtc.so.12` by absolute path from
//! `$FUSEGRAD_NVRTC` or `target/cuda-tools/` (where
//! `scripts/install-cuda-tools.sh` puts the pip wheel): the loader then
//! answers the bare name with the library already loaded.

use crate::error::{Error, Result};
use cudarc::nvrtc::sys;
use std::ffi::{c_char, CStr, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Every kernel family: its name and CUDA C source (the two fused norms
/// share `norm_core.cuh`, placed before each). The host prepends
/// [`COMMON`] to each before compiling.
pub(crate) const FAMILIES: &[(&str, &str)] = &[
    (
        "layer_norm",
        concat!(
            include_str!("../../kernels/norm_core.cuh"),
            include_str!("../../kernels/layer_norm.cu")
        ),
    ),
    (
        "rms_norm",
        concat!(
            include_str!("../../kernels/norm_core.cuh"),
            include_str!("../../kernels/rms_norm.cu")
        ),
    ),
    ("elementwise", include_str!("../../kernels/elementwise.cu")),
    ("reduce", include_str!("../../kernels/reduce.cu")),
    ("softmax", include_str!("../../kernels/softmax.cu")),
    ("loss", include_str!("../../kernels/loss.cu")),
    ("shape", include_str!("../../kernels/shape.cu")),
    ("embedding", include_str!("../../kernels/embedding.cu")),
    ("masked_fill", include_str!("../../kernels/masked_fill.cu")),
    ("dropout", include_str!("../../kernels/dropout.cu")),
    ("optim", include_str!("../../kernels/optim.cu")),
    ("bench", include_str!("../../kernels/bench.cu")),
];

/// Types and helpers every kernel file uses.
pub(crate) const COMMON: &str = include_str!("../../kernels/common.cuh");

/// The architectures CI compiles every kernel for.
pub const CHECKED_ARCHS: [u32; 2] = [80, 90];

/// Where NVRTC was looked for, when it was not found.
fn searched() -> Vec<PathBuf> {
    let rel = "target/cuda-tools/nvidia/cuda_nvrtc/lib/libnvrtc.so.12";
    let mut v = Vec::new();
    if let Some(p) = std::env::var_os("FUSEGRAD_NVRTC") {
        v.push(PathBuf::from(p));
    }
    v.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel));
    if let Ok(d) = std::env::current_dir() {
        v.push(d.join(rel));
    }
    v
}

/// Loads NVRTC once; `Err` says where it was looked for.
pub(crate) fn available() -> Result<()> {
    static FOUND: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            for p in searched() {
                if p.exists() {
                    // SAFETY: loading NVRTC runs only its initialisers; the
                    // handle is leaked so the library stays for the process.
                    if let Ok(lib) = unsafe { libloading::Library::new(&p) } {
                        std::mem::forget(lib);
                        break;
                    }
                }
            }
            // SAFETY: only tries to load the library by name.
            if unsafe { sys::is_culib_present() } {
                Ok(())
            } else {
                let list: Vec<String> =
                    searched().iter().map(|p| p.display().to_string()).collect();
                Err(format!(
                    "NVRTC (libnvrtc.so.13 or .so.12) not found on the loader path \
                     (LD_LIBRARY_PATH) nor at {}; run scripts/install-cuda-tools.sh",
                    list.join(", ")
                ))
            }
        })
        .clone()
        .map_err(|reason| Error::CudaUnavailable { reason })
}

/// A compiled family: the CUBIN and ptxas's log.
pub(crate) struct Compiled {
    pub(crate) cubin: Vec<u8>,
    pub(crate) log: String,
}

fn check(op: &'static str, r: sys::nvrtcResult, log: &str) -> Result<()> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    Err(Error::Cuda {
        op,
        device: "nvrtc".into(),
        msg: format!("{r:?}\n{log}"),
    })
}

/// Compiles family `name` for `sm_<arch>` to a CUBIN, with ptxas's
/// resource report in the log. A compile error is `Error::Cuda` carrying
/// the NVRTC log.
pub(crate) fn compile(name: &str, src: &str, arch: u32) -> Result<Compiled> {
    available()?;
    let text = CString::new(format!("{COMMON}\n{src}")).map_err(|_| Error::Cuda {
        op: "nvrtc",
        device: "nvrtc".into(),
        msg: format!("kernel file {name} holds a NUL byte"),
    })?;
    let cname = CString::new(format!("{name}.cu")).unwrap_or_default();
    let opts: Vec<CString> = [
        format!("-arch=sm_{arch}"),
        "--std=c++17".into(),
        "--ptxas-options=-v".into(),
        "-default-device".into(),
    ]
    .into_iter()
    .filter_map(|o| CString::new(o).ok())
    .collect();
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is to a live NUL-terminated string; the program
    // is destroyed on every path below.
    unsafe {
        let r = sys::nvrtcCreateProgram(
            &mut prog,
            text.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        check("nvrtc create", r, "")?;
        let rc = sys::nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr());
        let mut n = 0usize;
        sys::nvrtcGetProgramLogSize(prog, &mut n);
        let mut buf = vec![0 as c_char; n.max(1)];
        sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr());
        let log = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
        let out = check("nvrtc compile", rc, &log).and_then(|_| {
            let mut size = 0usize;
            check("nvrtc cubin", sys::nvrtcGetCUBINSize(prog, &mut size), "")?;
            let mut cubin = vec![0u8; size];
            check(
                "nvrtc cubin",
                sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char),
                "",
            )?;
            Ok(Compiled { cubin, log })
        });
        sys::nvrtcDestroyProgram(&mut prog);
        out
    }
}

/// One kernel's resources as ptxas reports them.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelInfo {
    /// Kernel family (file name without `.cu`).
    pub family: String,
    /// Entry point.
    pub kernel: String,
    /// `sm_XY` as XY.
    pub arch: u32,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory, bytes.
    pub shared_bytes: u32,
    /// Spill stores plus spill loads, bytes.
    pub spill_bytes: u32,
}

/// Parses ptxas's `-v` report into one row per entry point.
fn parse_log(family: &str, arch: u32, log: &str) -> Vec<KernelInfo> {
    let mut rows = Vec::new();
    let mut cur: Option<KernelInfo> = None;
    let num_before = |line: &str, word: &str| -> Option<u32> {
        let i = line.find(word)?;
        line[..i].split_whitespace().last()?.parse().ok()
    };
    for line in log.lines() {
        if let Some(i) = line.find("Compiling entry function '") {
            let rest = &line[i + 26..];
            let name = rest.split('\'').next().unwrap_or("").to_string();
            cur = Some(KernelInfo {
                family: family.into(),
                kernel: name,
                arch,
                registers: 0,
                shared_bytes: 0,
                spill_bytes: 0,
            });
        } else if let Some(k) = cur.as_mut() {
            if line.contains("spill stores") {
                k.spill_bytes = num_before(line, "bytes spill stores").unwrap_or(0)
                    + num_before(line, "bytes spill loads").unwrap_or(0);
            }
            if line.contains("Used") && line.contains("registers") {
                k.registers = num_before(line, "registers").unwrap_or(0);
                k.shared_bytes = num_before(line, "bytes smem").unwrap_or(0);
                rows.extend(cur.take());
            }
        }
    }
    rows
}

/// Compiles every kernel family for each of `archs` and reports every
/// entry point's registers, shared memory and spills. Any compile error
/// is returned with its log.
pub fn kernel_table(archs: &[u32]) -> Result<Vec<KernelInfo>> {
    let mut rows = Vec::new();
    for &(name, src) in FAMILIES {
        for &arch in archs {
            let c = compile(name, src, arch)?;
            rows.extend(parse_log(name, arch, &c.log));
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_report_is_parsed() {
        let log = "ptxas info    : Compiling entry function 'ln_fwd_f32' for 'sm_90'\n\
                   ptxas info    : Function properties for ln_fwd_f32\n\
                   \x20   8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n\
                   ptxas info    : Used 40 registers, used 1 barriers, 128 bytes smem, 400 bytes cmem[0]\n";
        let r = parse_log("layer_norm", 90, log);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].kernel, "ln_fwd_f32");
        assert_eq!(
            (r[0].registers, r[0].shared_bytes, r[0].spill_bytes),
            (40, 128, 8)
        );
    }
}
