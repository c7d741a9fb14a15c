//! Run-time kernel compilation: finding NVRTC, compiling a kernel family
//! to a CUBIN (and its PTX) for one architecture, and reading ptxas's
//! resource report. Nothing here runs until a kernel must be compiled: a
//! process whose kernels all come from the kernel cache never loads NVRTC.
//!
//! NVRTC is found as CUDA installs put it (see [`search_folders`]):
//! `$FUSEGRAD_NVRTC` (the library file or the folder holding it) alone
//! when it is set; else by name through the loader (`libnvrtc.so`,
//! `.so.13`, `.so.12`: cudarc's list); else in the first folder of the
//! search list that holds it. A library loaded from a folder has that
//! folder's `libnvrtc-builtins` loaded first by path, because NVRTC opens
//! it by bare name and the loader then finds the one already loaded.

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

/// What the search for NVRTC reads from the environment, apart so that a
/// test can give its own.
#[derive(Clone, Debug, Default)]
pub(crate) struct SearchEnv {
    pub(crate) ld_library_path: Option<std::ffi::OsString>,
    pub(crate) path: Option<std::ffi::OsString>,
    pub(crate) virtual_env: Option<std::ffi::OsString>,
    pub(crate) home: Option<std::ffi::OsString>,
    /// Roots whose `target/cuda-tools*/` hold the development wheels.
    pub(crate) dev_roots: Vec<PathBuf>,
    /// Where a system CUDA toolkit lives (`/usr/local/cuda`).
    pub(crate) cuda_home: PathBuf,
}

impl SearchEnv {
    pub(crate) fn of_process() -> Self {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let mut dev_roots = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR"))];
        dev_roots.extend(std::env::current_dir().ok());
        SearchEnv {
            ld_library_path: var("LD_LIBRARY_PATH"),
            path: var("PATH"),
            virtual_env: var("VIRTUAL_ENV"),
            home: var("HOME"),
            dev_roots,
            cuda_home: var("CUDA_HOME")
                .or_else(|| var("CUDA_PATH"))
                .map_or_else(|| PathBuf::from("/usr/local/cuda"), PathBuf::from),
        }
    }
}

/// The entries of `dir` whose names start with `prefix`, sorted (none
/// where `dir` cannot be read).
fn entries_starting(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.retain(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(prefix))
    });
    v.sort();
    v
}

/// The `site-packages` (and `dist-packages`) folders under `prefix/lib`.
fn site_packages(prefix: &Path) -> Vec<PathBuf> {
    entries_starting(&prefix.join("lib"), "python3")
        .into_iter()
        .flat_map(|p| [p.join("site-packages"), p.join("dist-packages")])
        .collect()
}

/// The folders searched for NVRTC after the loader's own search, in
/// order: each `LD_LIBRARY_PATH` entry; the CUDA toolkit's `lib64`
/// (`$CUDA_HOME`, else `/usr/local/cuda`) and that of the `nvcc` on
/// `PATH`; pip's wheels (`nvidia/cu13/lib`, `nvidia/cuda_nvrtc/lib`) in
/// the site-packages of `$VIRTUAL_ENV`, of each `python3` on `PATH`, of
/// `~/.local` and `/usr/local`; then the development wheels of
/// `scripts/install-cuda-tools.sh`. Empty entries are skipped (an empty
/// `LD_LIBRARY_PATH` entry means the current folder to the loader, never
/// a CUDA install); each folder appears once.
pub(crate) fn search_folders(env: &SearchEnv) -> Vec<PathBuf> {
    let split = |v: &Option<std::ffi::OsString>| -> Vec<PathBuf> {
        v.as_ref()
            .map(|v| {
                std::env::split_paths(v)
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut v = split(&env.ld_library_path);
    v.push(env.cuda_home.join("lib64"));
    let path = split(&env.path);
    for bin in &path {
        if bin.join("nvcc").is_file() {
            if let Some(up) = bin.parent() {
                v.push(up.join("lib64"));
            }
        }
    }
    let mut prefixes: Vec<PathBuf> = env.virtual_env.iter().map(PathBuf::from).collect();
    for bin in &path {
        if bin.join("python3").exists() {
            prefixes.extend(bin.parent().map(Path::to_path_buf));
        }
    }
    prefixes.extend(env.home.as_ref().map(|h| PathBuf::from(h).join(".local")));
    prefixes.push(PathBuf::from("/usr/local"));
    for prefix in &prefixes {
        for sp in site_packages(prefix) {
            v.push(sp.join("nvidia/cu13/lib"));
            v.push(sp.join("nvidia/cuda_nvrtc/lib"));
        }
    }
    for r in &env.dev_roots {
        for tools in ["target/cuda-tools", "target/cuda-tools-13"] {
            v.push(r.join(tools).join("nvidia/cuda_nvrtc/lib"));
            v.push(r.join(tools).join("nvidia/cu13/lib"));
        }
    }
    let mut seen = std::collections::HashSet::new();
    v.retain(|p| seen.insert(p.clone()));
    v
}

/// Loads `lib` by absolute path (after its folder's builtins) and keeps it
/// for the process.
fn load_file(lib: &Path) -> std::result::Result<(), String> {
    if let Some(dir) = lib.parent() {
        for b in entries_starting(dir, "libnvrtc-builtins.so") {
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

/// The sentence for an NVRTC that is nowhere in `searched`.
pub(crate) fn not_found(searched: &[PathBuf]) -> String {
    let list: Vec<String> = searched.iter().map(|p| p.display().to_string()).collect();
    format!(
        "NVRTC (libnvrtc.so.13 or .so.12) was not found: not on the loader path by name, \
         FUSEGRAD_NVRTC is unset, and none is in {}; install the CUDA toolkit or pip's \
         nvidia-cuda-nvrtc, or set FUSEGRAD_NVRTC to its folder",
        list.join(", ")
    )
}

fn find_and_load() -> std::result::Result<NvrtcInfo, String> {
    if let Some(v) = std::env::var_os("FUSEGRAD_NVRTC").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(&v);
        let lib = if p.is_dir() {
            in_folder(&p)
        } else {
            Some(p.clone()).filter(|p| p.is_file())
        };
        let lib = lib.ok_or_else(|| {
            format!(
                "NVRTC was not found: FUSEGRAD_NVRTC={} holds none of {} (it is the only \
                 place searched while it is set)",
                p.display(),
                NAMES.join(", ")
            )
        })?;
        load_file(&lib).map_err(|e| format!("FUSEGRAD_NVRTC: cannot load NVRTC from {e}"))?;
    } else {
        // SAFETY: only tries to load the library by name.
        if !unsafe { sys::is_culib_present() } {
            let searched = search_folders(&SearchEnv::of_process());
            let lib = searched
                .iter()
                .find_map(|f| in_folder(f))
                .ok_or_else(|| not_found(&searched))?;
            load_file(&lib)?;
        }
    }
    // SAFETY: only tries to load the library by name; a library loaded by
    // path above answers its own soname.
    if !unsafe { sys::is_culib_present() } {
        return Err("NVRTC was loaded by path, but its soname does not answer \
                    libnvrtc.so.13 or .so.12"
            .into());
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

static FOUND: OnceLock<std::result::Result<NvrtcInfo, String>> = OnceLock::new();

/// Finds and loads NVRTC once; `Err` says where it was looked for.
pub fn nvrtc_info() -> Result<NvrtcInfo> {
    FOUND
        .get_or_init(find_and_load)
        .clone()
        .map_err(|reason| Error::CudaUnavailable { reason })
}

/// A compiled family: the CUBIN, the PTX it was made from (NUL-terminated,
/// for a driver that refuses the CUBIN; empty if NVRTC gave none), ptxas's
/// log, and the NVRTC version that made them.
pub(crate) struct Compiled {
    pub(crate) cubin: Vec<u8>,
    pub(crate) ptx: Vec<u8>,
    pub(crate) log: String,
    pub(crate) nvrtc: (i32, i32),
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
    let nvrtc = nvrtc_info()?.version;
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
            let mut n = 0usize;
            // PTX is a fallback only: a family without it still loads.
            let mut ptx = Vec::new();
            if sys::nvrtcGetPTXSize(prog, &mut n) == sys::nvrtcResult::NVRTC_SUCCESS && n > 1 {
                ptx = vec![0u8; n];
                if sys::nvrtcGetPTX(prog, ptx.as_mut_ptr() as *mut c_char)
                    != sys::nvrtcResult::NVRTC_SUCCESS
                    || ptx.last() != Some(&0)
                {
                    ptx.clear();
                }
            }
            Ok(Compiled {
                cubin,
                ptx,
                log,
                nvrtc,
            })
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
pub(crate) fn parse_log(family: &str, arch: u32, log: &str) -> Vec<KernelInfo> {
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

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    // The tests, run by `tests/unit.rs`.
    unit_tests![
        ptxas_report_is_parsed,
        nvrtc_is_searched_where_cuda_installs_put_it,
    ];

    fn nvrtc_is_searched_where_cuda_installs_put_it() {
        let root = std::env::temp_dir().join(format!("fg-nvrtc-search-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mk = |p: &str| {
            let p = root.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, b"").unwrap();
        };
        // A toolkit with nvcc on PATH, a virtualenv and a python3 on PATH
        // with pip's wheels, and a user's ~/.local.
        mk("toolkit/bin/nvcc");
        mk("venv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13");
        mk("opt/bin/python3");
        mk("opt/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
        mk("home/.local/lib/python3.12/site-packages/x");
        let env = SearchEnv {
            ld_library_path: Some(format!("{0}/ld1::{0}/ld2:", root.display()).into()),
            path: Some(format!("{0}/toolkit/bin:{0}/opt/bin", root.display()).into()),
            virtual_env: Some(root.join("venv").into()),
            home: Some(root.join("home").into()),
            dev_roots: vec![root.join("repo")],
            cuda_home: root.join("cuda"),
        };
        let got = search_folders(&env);
        let rel: Vec<String> = got
            .iter()
            .map(|p| {
                p.strip_prefix(&root)
                    .map_or_else(|_| p.display().to_string(), |r| r.display().to_string())
            })
            .collect();
        let pos = |want: &str| {
            rel.iter()
                .position(|r| r == want)
                .unwrap_or_else(|| panic!("{want} not searched: {rel:?}"))
        };
        // The loader's path first (no empty entries), then the toolkits,
        // then pip's wheels, then the development wheels.
        let order = [
            pos("ld1"),
            pos("ld2"),
            pos("cuda/lib64"),
            pos("toolkit/lib64"),
            pos("venv/lib/python3.12/site-packages/nvidia/cu13/lib"),
            pos("opt/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib"),
            pos("home/.local/lib/python3.12/site-packages/nvidia/cu13/lib"),
            pos("repo/target/cuda-tools/nvidia/cuda_nvrtc/lib"),
        ];
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{rel:?}");
        assert!(got.iter().all(|p| !p.as_os_str().is_empty()), "{rel:?}");
        let unique: std::collections::HashSet<_> = got.iter().collect();
        assert_eq!(unique.len(), got.len(), "{rel:?}");
        // The first folder holding a library is the one taken.
        let first = got.iter().find_map(|f| in_folder(f)).unwrap();
        assert!(first.ends_with("venv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13"));
        // The message names every folder searched.
        let msg = not_found(&got);
        assert!(msg.contains("NVRTC") && got.iter().all(|p| msg.contains(&*p.to_string_lossy())));
        std::fs::remove_dir_all(&root).unwrap();
    }

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
