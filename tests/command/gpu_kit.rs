//! The GPU kit rehearsed here: `scripts/gpu-check.sh --emulate` runs the
//! same steps as on the GPU machine against the CPU emulation of the driver
//! (small shapes, test subsets), writes at most six files, and its summary
//! gives every step a result. The kit is assembled from this build's
//! `fusegrad` and `library` test binary, as `scripts/gpu-build.sh` would.

#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};

/// The newest test executable `name-<hash>` in this build's deps folder.
fn test_binary(deps: &Path, name: &str) -> Option<PathBuf> {
    let prefix = format!("{name}-");
    std::fs::read_dir(deps)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| {
            let f = e.file_name().to_string_lossy().into_owned();
            f.strip_prefix(&prefix)
                .is_some_and(|h| h.len() == 16 && h.chars().all(|c| c.is_ascii_hexdigit()))
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, p)| p)
}

#[test]
fn the_kit_runs_end_to_end_on_the_emulation() {
    let root = crate::common::workspace_root();
    let root = root.as_path();
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_fusegrad"));
    let deps = exe.parent().unwrap().join("deps");
    let nvrtc = root.join("target/cuda-tools/nvidia/cuda_nvrtc/lib");
    if !nvrtc.exists() {
        eprintln!("skipped: no NVRTC in target/cuda-tools (scripts/install-cuda-tools.sh)");
        return;
    }
    let kit = root.join(format!("target/gpu-kit-emulated-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&kit);
    std::fs::create_dir_all(&kit).unwrap();
    std::fs::copy(&exe, kit.join("fusegrad")).unwrap();
    let bin = test_binary(&deps, "library").unwrap_or_else(|| {
        panic!(
            "no library test binary in {}: build all tests",
            deps.display()
        )
    });
    std::fs::copy(bin, kit.join("test-library")).unwrap();
    for s in ["gpu-check.sh", "bench_torch_cuda.py"] {
        std::fs::copy(root.join("scripts").join(s), kit.join(s)).unwrap();
    }
    let out_dir = kit.join("out");
    // The kernel cache the other CUDA tests fill, so nothing compiles twice.
    let cache = std::env::var_os("FUSEGRAD_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/fusegrad")))
        .unwrap_or_else(|| kit.join("cache"));
    let run = std::process::Command::new("bash")
        .arg(kit.join("gpu-check.sh"))
        .arg("--emulate")
        .env("OUT", &out_dir)
        .env("FUSEGRAD_ROOT", root)
        .env("FUSEGRAD_CACHE_DIR", &cache)
        .env("FUSEGRAD_NVRTC", &nvrtc)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    let files: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let summary = std::fs::read_to_string(out_dir.join("summary.md")).unwrap_or_default();
    let ctx = format!("files {files:?}\n{summary}\n-- stdout\n{stdout}\n-- stderr\n{stderr}");
    assert!(files.len() <= 6, "{ctx}");
    for f in ["summary.md", "bench.jsonl", "tests.log", "kernels.txt"] {
        assert!(files.iter().any(|x| x == f), "{f} missing: {ctx}");
    }
    // Every step has a row with a result, and none failed.
    for step in [
        "kernels",
        "tests-unavailable",
        "tests-cuda",
        "tests-norms",
        "tests-bench",
        "bench",
        "torch",
        "memcheck",
        "racecheck",
    ] {
        let row = summary
            .lines()
            .find(|l| l.starts_with(&format!("| {step} |")))
            .unwrap_or_else(|| panic!("no row for {step}: {ctx}"));
        let result = row.trim_end_matches('|').rsplit('|').next().unwrap().trim();
        assert!(
            result == "ok" || result.starts_with("skipped:"),
            "{step}: {result}\n{ctx}"
        );
    }
    assert!(run.status.success(), "{ctx}");
    assert!(
        summary.contains("## Tests") && summary.contains("## Bench"),
        "{ctx}"
    );
    assert!(!summary.contains(" 0 passed"), "no test ran: {ctx}");
    // The bench wrote one JSON object per measured row.
    let rows = std::fs::read_to_string(out_dir.join("bench.jsonl")).unwrap();
    let measured = rows.lines().filter(|l| l.contains("\"op\"")).count();
    assert!(measured >= 4, "{rows}");
    std::fs::remove_dir_all(&kit).unwrap();
}
