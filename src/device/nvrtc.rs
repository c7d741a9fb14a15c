//! Run-time kernel compilation: finding NVRTC, compiling a kernel family
//! to a CUBIN for one architecture, and reading ptxas's resource report.
//!
//! NVRTC is found as a user's machine has it: from `$FUSEGRAD_NVRTC` (the
//! library file or the folder holding it), else by name through the loader
//! (`libnvrtc.so`, `.so.13`, `.so.12`: cudarc's list), else from
//! `target/cuda-tools*/` where `scripts/install-cuda-tools.sh` puts the pip
//! wheel. A library loaded from a folder has that folder's
//! `libnvrtc-builtins` loaded first by path, because NVRTC opens it by bare
//! name and the loader then finds the one already loaded.

use crate::error::{Error, Result};
use cudarc::nvrtc::sys;
use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A kernel family: its name and CUDA C source. Each op family declares
/// its own (`KERNELS` in its `cuda.rs`) beside its launchers; the host
/// prepends `kernels/common.cuh` to the source before compiling.
#[derive(Debug)]
pub struct Family {
    /// The family's name (its module in the kernel cache).
    pub name: &'static str,
    /// Its CUDA C source.
    pub source: &'static str,
}

/// Types and helpers every kernel file uses.
pub(crate) const COMMON: &str = include_str!("../../kernels/common.cuh");

/// The architectures CI compiles every kernel for.
pub const CHECKED_ARCHS: [u32; 2] = [80, 90];

/// The options every family is compiled with (after `-arch=sm_XY`).
pub(crate) const OPTIONS: [&str; 3] = ["--std=c++17", "--ptxas-options=-v", "-default-device"];

/// The NVRTC this process uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvrtcInfo {
    /// `(major, minor)` as `nvrtcVersion` reports it.
    pub version: (i32, i32),
    /// The library file the process has mapped, where it can be read.
    pub path: Option<PathBuf>,
}

impl std::fmt::Display for NvrtcInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NVRTC {}.{}", self.version.0, self.version.1)?;
        match &self.path {
            Some(p) => write!(f, " ({})", p.display()),
            None => Ok(()),
        }
    }
}

/// NVRTC library names in the order they are preferred in a folder.
const NAMES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// The library in `folder`, if it holds one of [`NAMES`].
fn in_folder(folder: &Path) -> Option<PathBuf> {
    NAMES.iter().map(|n| folder.join(n)).find(|p| p.is_file())
}

/// Folders where the pip wheels are installed for development.
fn dev_folders() -> Vec<PathBuf> {
    let mut roots = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR"))];
    roots.extend(std::env::current_dir().ok());
    let mut v = Vec::new();
    for r in roots {
        for tools in ["target/cuda-tools", "target/cuda-tools-13"] {
            v.push(r.join(tools).join("nvidia/cuda_nvrtc/lib"));
            v.push(r.join(tools).join("nvidia/cu13/lib"));
        }
    }
    v
}

/// Loads `lib` by absolute path (after its folder's builtins) and keeps it
/// for the process.
fn load_file(lib: &Path) -> std::result::Result<(), String> {
    if let Some(dir) = lib.parent() {
        let mut builtins: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        builtins.retain(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so"))
        });
        for b in builtins {
            // SAFETY: NVRTC's own helper library; only its initialisers run.
            if let Ok(l) = unsafe { libloading::Library::new(&b) } {
                std::mem::forget(l);
            }
        }
    }
    // SAFETY: loading NVRTC runs only its initialisers; the handle is
    // leaked so the library stays for the process.
    let l =
        unsafe { libloading::Library::new(lib) }.map_err(|e| format!("{}: {e}", lib.display()))?;
    std::mem::forget(l);
    Ok(())
}

/// The mapped file whose name starts with `libnvrtc.so`, from the
/// process's memory map (Linux).
fn mapped_path() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc.so"))
        })
        .map(PathBuf::from)
}

fn find_and_load() -> std::result::Result<NvrtcInfo, String> {
    if let Some(v) = std::env::var_os("FUSEGRAD_NVRTC") {
        let p = PathBuf::from(&v);
        let lib = if p.is_dir() {
            in_folder(&p)
        } else {
            Some(p.clone())
        };
        let lib = lib.ok_or_else(|| {
            format!(
                "FUSEGRAD_NVRTC={} holds none of {}",
                p.display(),
                NAMES.join(", ")
            )
        })?;
        load_file(&lib).map_err(|e| format!("FUSEGRAD_NVRTC: cannot load {e}"))?;
    } else {
        // SAFETY: only tries to load the library by name.
        if !unsafe { sys::is_culib_present() } {
            if let Some(lib) = dev_folders().iter().find_map(|f| in_folder(f)) {
                load_file(&lib)?;
            }
        }
    }
    // SAFETY: only tries to load the library by name; a library loaded by
    // path above answers its own soname.
    if !unsafe { sys::is_culib_present() } {
        let dev: Vec<String> = dev_folders()
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        return Err(format!(
            "NVRTC (libnvrtc.so.13 or .so.12) is not on the loader path \
             (LD_LIBRARY_PATH), FUSEGRAD_NVRTC is unset, and none is in {}; \
             run scripts/install-cuda-tools.sh or set FUSEGRAD_NVRTC to its folder",
            dev.join(", ")
        ));
    }
    // cudarc panics at a missing symbol; a stub or an old NVRTC is refused
    // here instead.
    super::driver_lib::nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-parameters; the library is loaded (checked above).
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("nvrtcVersion failed: {r:?}"));
    }
    Ok(NvrtcInfo {
        version: (major, minor),
        path: mapped_path(),
    })
}

/// Finds and loads NVRTC once; `Err` says where it was looked for.
pub fn nvrtc_info() -> Result<NvrtcInfo> {
    static FOUND: OnceLock<std::result::Result<NvrtcInfo, String>> = OnceLock::new();
    FOUND
        .get_or_init(find_and_load)
        .clone()
        .map_err(|reason| Error::CudaUnavailable { reason })
}

/// Loads NVRTC once; `Err` says where it was looked for.
pub(crate) fn available() -> Result<()> {
    nvrtc_info().map(|_| ())
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
    let opts: Vec<CString> = std::iter::once(format!("-arch=sm_{arch}"))
        .chain(OPTIONS.iter().map(|o| o.to_string()))
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

/// Compiles each of `families` for each of `archs` (or reads it from the
/// kernel cache: `cache`, else the process's) and reports every entry
/// point's registers, shared memory and spills. Families compile on as
/// many threads as the machine has cores (NVRTC is single-threaded). Any
/// compile error is returned with its log.
pub(crate) fn table_of(
    families: &[&Family],
    archs: &[u32],
    cache: Option<&Path>,
) -> Result<Vec<KernelInfo>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    available()?;
    let jobs: Vec<(&str, &str, u32)> = families
        .iter()
        .flat_map(|f| archs.iter().map(move |&a| (f.name, f.source, a)))
        .collect();
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len().max(1));
    let mut done: Vec<(usize, Result<Vec<KernelInfo>>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(name, src, arch)) = jobs.get(i) else {
                            return out;
                        };
                        let r = super::kernel_cache::family_code(name, src, arch, cache, false)
                            .map(|(c, _)| parse_log(name, arch, &c.log));
                        out.push((i, r));
                    }
                })
            })
            .collect();
        let mut all = Vec::new();
        for w in workers {
            match w.join() {
                Ok(v) => all.extend(v),
                Err(_) => all.push((
                    usize::MAX,
                    Err(Error::Cuda {
                        op: "nvrtc",
                        device: "nvrtc".into(),
                        msg: "a compile thread panicked".into(),
                    }),
                )),
            }
        }
        all
    });
    done.sort_by_key(|(i, _)| *i);
    let mut rows = Vec::new();
    for (_, r) in done {
        rows.extend(r?);
    }
    Ok(rows)
}

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    // The tests, run by `tests/unit.rs`.
    unit_tests![ptxas_report_is_parsed];

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
