//! A CUDA library that loads but lacks entry points (a stub, an older
//! version) makes `--device cuda` one clean `CUDA unavailable` line naming
//! the file and the missing symbol, with exit status 1: never cudarc's
//! `Missing symbol` panic message and backtrace. Each case builds a stub
//! library with gcc into a folder put first on `LD_LIBRARY_PATH` of a
//! `fusegrad` process; without gcc the cases print why and skip.
#![cfg(all(feature = "cuda", target_os = "linux"))]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A fresh folder holding `source` built as a shared library under each of
/// `names`, or `None` (after saying why) where gcc cannot build it.
fn stub(folder: &str, source: &str, names: &[&str]) -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(folder);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("stub.c");
    std::fs::write(&src, source).unwrap();
    let first = dir.join(names[0]);
    let built = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&first)
        .arg(&src)
        .output();
    match built {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            eprintln!(
                "skipped: gcc could not build a stub library: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            return None;
        }
        Err(e) => {
            eprintln!("skipped: no gcc to build a stub library ({e})");
            return None;
        }
    }
    for n in &names[1..] {
        std::fs::copy(&first, dir.join(n)).unwrap();
    }
    Some(dir)
}

/// `fusegrad args` with `dirs` searched first by the loader: exit status,
/// stdout and stderr.
fn fusegrad(args: &[&str], dirs: &[&Path]) -> (i32, String, String) {
    let mut path: Vec<PathBuf> = dirs.iter().map(|d| d.to_path_buf()).collect();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.extend(std::env::split_paths(&old));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_fusegrad"))
        .args(args)
        .env("LD_LIBRARY_PATH", std::env::join_paths(path).unwrap())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `args` fails with status 1 and a `CUDA unavailable` line naming
/// `symbol` and a library in `dirs[0]`, and nothing panicked.
fn refused(args: &[&str], dirs: &[&Path], symbol: &str) {
    check_refused(args, dirs, symbol, fusegrad(args, dirs));
}

/// [`refused`] for a run already made.
fn check_refused(args: &[&str], dirs: &[&Path], symbol: &str, run: (i32, String, String)) {
    let (code, out, err) = run;
    let all = format!("{args:?}\nstdout:\n{out}\nstderr:\n{err}");
    assert!(!all.contains("panicked"), "a panic was printed: {all}");
    assert_eq!(code, 1, "{all}");
    let line = err.lines().find(|l| l.contains("CUDA unavailable"));
    let line = line.unwrap_or_else(|| panic!("no `CUDA unavailable` line: {all}"));
    assert!(line.contains(&format!("lacks {symbol}")), "{line}");
    assert!(line.contains(dirs[0].to_str().unwrap()), "{line}");
}

/// The runs that ask for the driver first: the bench and a training run.
const DRIVER_RUNS: [&[&str]; 2] = [
    &["bench", "--device", "cuda"],
    &["train", "transformer", "--device", "cuda", "--steps", "1"],
];

/// Driver stubs and the first symbol each lacks: none at all, then only
/// `cuInit` (which succeeds, so cudarc's next call would be the first to
/// panic).
const DRIVER_STUBS: [(&str, &str, &str); 2] = [
    (
        "stub-cuda-empty",
        "int fusegrad_stub(void) { return 0; }\n",
        "cuInit",
    ),
    (
        "stub-cuda-init",
        "int cuInit(unsigned flags) { (void)flags; return 0; }\n",
        "cuDeviceGetCount",
    ),
];

#[test]
fn a_driver_stub_lacking_entry_points_is_unavailable_not_a_panic() {
    for (name, source, missing) in DRIVER_STUBS {
        let Some(dir) = stub(name, source, &["libcuda.so", "libcuda.so.1"]) else {
            return;
        };
        for args in DRIVER_RUNS {
            refused(args, &[&dir], missing);
        }
    }
}

#[test]
fn a_cublas_stub_is_unavailable_not_a_panic() {
    // A working driver is needed to reach cuBLAS: this machine's, or the
    // emulation's (tests/cuda_emu) where there is none.
    let root = crate::common::workspace_root();
    let root = root.as_path();
    let emu = root.join("target/cuda-emu");
    let driver: Vec<&Path> = if fusegrad::Device::Cuda(0).ensure_available().is_ok() {
        Vec::new()
    } else {
        match Command::new("python3")
            .arg(root.join("scripts/build-cuda-emu.py"))
            .output()
        {
            Ok(o) if o.status.success() => vec![emu.as_path()],
            Ok(o) => {
                let why = String::from_utf8_lossy(&o.stderr);
                return eprintln!("skipped: no driver, and the emulation did not build: {why}");
            }
            Err(e) => {
                return eprintln!("skipped: no driver, and no python3 for the emulation: {e}")
            }
        }
    };
    let source = "int cublasGetVersion_v2(void *h, int *v) { (void)h; *v = 0; return 0; }\n";
    let Some(dir) = stub("stub-cublas", source, &["libcublas.so"]) else {
        return;
    };
    let plots = dir.join("plots");
    let mut dirs = vec![dir.as_path()];
    dirs.extend(driver);
    // The transformer's first step reaches a matmul after a few kernels
    // (about 40 s on the emulation, most of it NVRTC).
    let args = ["train", "transformer", "--device", "cuda", "--steps", "1"];
    let plots = ["--plots", plots.to_str().unwrap()];
    let args = [&args[..], &plots[..]].concat();
    let run = fusegrad(&args, &dirs);
    if run.0 != 0 && run.2.contains("NVRTC") && !run.2.contains("lacks") {
        return eprintln!(
            "skipped: the device needs NVRTC, which is missing: {}",
            run.2
        );
    }
    check_refused(&args, &dirs, "cublasCreate_v2", run);
}
