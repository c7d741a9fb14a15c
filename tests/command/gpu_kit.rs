//! The GPU kit rehearsed here, as the GPU machine will run it: a kit with
//! a full kernel cache and no NVRTC to be found runs every step of
//! `scripts/gpu-check.sh --emulate` (the CPU emulation of the driver,
//! small shapes, test subsets), writes at most seven files, and its
//! summary gives every step a result. Around it: the time limits add up
//! to at most 480 s, the preflight is quick and complete, a sanitizer
//! finding or a hung sanitizer fails the step with the finding quoted,
//! and the test counts are the runner's own. The kit is assembled from
//! this build's `fusegrad` and `library` test binary, as
//! `scripts/gpu-build.sh` would.

#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};
use std::process::Command;

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

/// The development NVRTC, or `None` (after saying why) where it is missing.
fn dev_nvrtc() -> Option<PathBuf> {
    let nvrtc = crate::common::workspace_root().join("target/cuda-tools/nvidia/cuda_nvrtc/lib");
    if nvrtc.exists() {
        Some(nvrtc)
    } else {
        eprintln!("skipped: no NVRTC in target/cuda-tools (scripts/install-cuda-tools.sh)");
        None
    }
}

/// A kit folder `target/gpu-kit-<what>-<pid>` holding the scripts, this
/// build's `fusegrad`, and `test-library`: this build's, or with `fake` a
/// shell script of that text.
fn kit(what: &str, fake: Option<&str>) -> PathBuf {
    let root = crate::common::workspace_root();
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_fusegrad"));
    let kit = root.join(format!("target/gpu-kit-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&kit);
    std::fs::create_dir_all(&kit).unwrap();
    std::fs::copy(&exe, kit.join("fusegrad")).unwrap();
    match fake {
        Some(text) => executable(&kit.join("test-library"), text),
        None => {
            let deps = exe.parent().unwrap().join("deps");
            let bin = test_binary(&deps, "library").unwrap_or_else(|| {
                panic!(
                    "no library test binary in {}: build all tests",
                    deps.display()
                )
            });
            std::fs::copy(bin, kit.join("test-library")).unwrap();
        }
    }
    for s in ["gpu-check.sh", "bench_torch_cuda.py"] {
        std::fs::copy(root.join("scripts").join(s), kit.join(s)).unwrap();
    }
    kit
}

fn executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The kernel cache the other CUDA tests fill, so nothing compiles twice.
fn shared_cache(kit: &Path) -> PathBuf {
    std::env::var_os("FUSEGRAD_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/fusegrad")))
        .unwrap_or_else(|| kit.join("cache"))
}

/// What a run of the kit's script left: its exit status, output, the
/// files in `out` and the summary.
struct Check {
    ok: bool,
    files: Vec<String>,
    summary: String,
    ctx: String,
}

/// `gpu-check.sh --emulate ARGS` in `kit`, with `env`, NVRTC hidden (the
/// kit's cache must serve) and `OUT` a fresh folder.
fn check(kit: &Path, args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Check {
    let out = kit.join("out");
    let _ = std::fs::remove_dir_all(&out);
    let no_nvrtc = kit.join("no-nvrtc");
    std::fs::create_dir_all(&no_nvrtc).unwrap();
    let mut cmd = Command::new("bash");
    cmd.arg(kit.join("gpu-check.sh"))
        .arg("--emulate")
        .args(args)
        .env("OUT", &out)
        .env("FUSEGRAD_ROOT", crate::common::workspace_root())
        .env("FUSEGRAD_CACHE_DIR", shared_cache(kit))
        .env("FUSEGRAD_NVRTC", &no_nvrtc);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let run = cmd.output().unwrap();
    let files: Vec<String> = std::fs::read_dir(&out)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap_or_default();
    let ctx = format!(
        "files {files:?}\n{summary}\n-- stdout\n{}\n-- stderr\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    Check {
        ok: run.status.success(),
        files,
        summary,
        ctx,
    }
}

/// The result column of `step`'s row in a summary.
fn result_of<'a>(summary: &'a str, step: &str) -> Option<&'a str> {
    let row = summary
        .lines()
        .find(|l| l.starts_with(&format!("| {step} |")))?;
    Some(row.trim_end_matches('|').rsplit('|').next()?.trim())
}

#[test]
fn the_kit_runs_end_to_end_on_the_emulation_without_nvrtc() {
    let Some(nvrtc) = dev_nvrtc() else { return };
    let kit = kit("emulated", None);
    // The kit's cache is filled before it travels (gpu-build.sh), with the
    // NVRTC here; the run below has none.
    let fill = Command::new(kit.join("fusegrad"))
        .args(["kernels", "--arch", "sm_90", "--cache"])
        .arg(shared_cache(&kit))
        .env("FUSEGRAD_NVRTC", &nvrtc)
        .output()
        .unwrap();
    assert!(fill.status.success(), "{fill:?}");
    let c = check(&kit, &[], &[]);
    let ctx = &c.ctx;
    assert!(c.files.len() <= 7, "{ctx}");
    for f in ["summary.md", "bench.jsonl", "tests.log", "kernels.txt"] {
        assert!(c.files.iter().any(|x| x == f), "{f} missing: {ctx}");
    }
    // Every step has a row with a result, and none failed.
    for step in [
        "unpack",
        "preflight",
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
        let result =
            result_of(&c.summary, step).unwrap_or_else(|| panic!("no row for {step}: {ctx}"));
        assert!(
            result == "ok" || result.starts_with("skipped:"),
            "{step}: {result}\n{ctx}"
        );
    }
    assert!(c.ok, "{ctx}");
    // The first lines: the limits (at most 480 s) and the NVRTC's state.
    let lines: Vec<&str> = c.summary.lines().collect();
    let limits: u32 = lines[2]
        .strip_prefix("- time limits: ")
        .and_then(|l| l.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no limits line: {ctx}"));
    assert!(limits <= 480, "{ctx}");
    assert!(
        lines[3].starts_with("- NVRTC: no NVRTC on this machine"),
        "{ctx}"
    );
    // Every family came from the cache, none compiled.
    assert!(
        c.summary
            .contains("families loaded on cuda:0, all from CUBIN"),
        "{ctx}"
    );
    assert!(c.summary.contains("0 families compiled"), "{ctx}");
    // Counts from each group's closing line.
    assert!(
        c.summary.contains("- tests-cuda: ok. 1 passed; 0 failed"),
        "{ctx}"
    );
    // The bench wrote one JSON object per measured row.
    let rows = std::fs::read_to_string(kit.join("out/bench.jsonl")).unwrap();
    let measured = rows.lines().filter(|l| l.contains("\"op\"")).count();
    assert!(measured >= 4, "{rows}");
    std::fs::remove_dir_all(&kit).unwrap();
}

#[test]
fn the_limits_add_up_to_at_most_480_s_in_every_mode() {
    let script = crate::common::workspace_root().join("scripts/gpu-check.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("--limits")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let totals: Vec<u32> = text
        .lines()
        .filter_map(|l| l.split_once(": ")?.1.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(totals.len(), 4, "{text}");
    assert!(totals[..3].iter().all(|&t| t <= 480), "{text}");
    assert_eq!(totals[3], 480, "{text}");
    // The follow-up fits the 120 s its docs give it.
    assert!(totals[2] <= 120, "{text}");
}

#[test]
fn the_preflight_is_quick_and_names_every_part() {
    if dev_nvrtc().is_none() {
        return;
    }
    let kit = kit("preflight", None);
    let t = std::time::Instant::now();
    // An empty entry in the loader path is dropped, never passed on.
    let c = check(
        &kit,
        &["--preflight"],
        &[("LD_LIBRARY_PATH", std::ffi::OsStr::new(":/nonexistent::"))],
    );
    let took = t.elapsed().as_secs_f64();
    let out = c.ctx;
    assert!(c.ok, "{out}");
    // The emulation's build is part of this run; the preflight's own
    // limit is 10 s.
    assert!(took < 60.0, "{took} s: {out}");
    for part in [
        "- GPU: cuda:0",
        "- driver: CUDA 13.0",
        "- kernel compiler: none (CUDA unavailable: NVRTC was not found",
        "- cuBLAS: 13.0.0",
        "- kernel cache: ",
        "- compute-sanitizer: ",
        "- torch: ",
        "- loader path: ",
    ] {
        assert!(out.contains(part), "{part:?} missing: {out}");
    }
    let path = out
        .lines()
        .find_map(|l| l.strip_prefix("- loader path: "))
        .unwrap();
    assert!(
        !path.split(':').any(str::is_empty) && path.contains("cuda-emu"),
        "{path}"
    );
    std::fs::remove_dir_all(&kit).unwrap();
}

/// A stand-in for compute-sanitizer: memcheck reports one finding and
/// exits with the error exit code it was given; racecheck hangs and
/// ignores SIGTERM, so only the `-k` kill ends it.
const FAKE_SANITIZER: &str = r#"#!/usr/bin/env bash
code=1
while [ $# -gt 0 ]; do
    case $1 in
        --tool) tool=$2; shift ;;
        --error-exitcode) code=$2; shift ;;
    esac
    shift
done
if [ "$tool" = memcheck ]; then
    echo "========= COMPUTE-SANITIZER"
    echo "========= Invalid __global__ write of size 4 bytes"
    echo "=========     at layer_norm_fwd_f32+0x1a0"
    echo "=========     by thread (3,0,0) in block (0,0,0)"
    echo "========= ERROR SUMMARY: 1 error"
    exit "$code"
fi
trap '' TERM
sleep 60
"#;

#[test]
fn a_sanitizer_finding_or_hang_fails_the_step_and_is_quoted() {
    if dev_nvrtc().is_none() {
        return;
    }
    let kit = kit("sanitizer", Some("#!/bin/sh\nexit 0\n"));
    let bin = kit.join("fake-bin");
    executable(&bin.join("compute-sanitizer"), FAKE_SANITIZER);
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let path = std::ffi::OsStr::new(&path);
    let c = check(&kit, &["--rerun", "memcheck"], &[("PATH", path)]);
    assert!(!c.ok, "a finding passed: {}", c.ctx);
    assert!(
        result_of(&c.summary, "memcheck").is_some_and(|r| r.starts_with("FAILED (exit 9")),
        "{}",
        c.ctx
    );
    assert!(
        c.summary.contains(
            "memcheck: FINDINGS (ERROR SUMMARY: 1 error); the first: \"Invalid __global__ write of size 4 bytes\""
        ),
        "{}",
        c.ctx
    );
    // A sanitizer that hangs through SIGTERM is killed 10 s past its limit
    // and reported as timed out, never as unusable.
    let t = std::time::Instant::now();
    let c = check(
        &kit,
        &["--rerun", "racecheck"],
        &[
            ("PATH", path),
            ("GPU_CHECK_LIMITS", std::ffi::OsStr::new("racecheck:2")),
        ],
    );
    assert!(t.elapsed().as_secs() < 40, "{}", c.ctx);
    assert!(!c.ok, "{}", c.ctx);
    assert_eq!(
        result_of(&c.summary, "racecheck"),
        Some("FAILED (timed out after 2 s)"),
        "{}",
        c.ctx
    );
    assert!(
        c.summary.contains("- racecheck: timed out after 2 s"),
        "{}",
        c.ctx
    );
    assert!(!c.summary.contains("unusable"), "{}", c.ctx);
    std::fs::remove_dir_all(&kit).unwrap();
}

/// A stand-in test binary whose output quotes a child's closing line
/// before its own, failing one test.
const FAKE_TESTS: &str = r#"#!/bin/sh
echo "running 2 tests"
echo "test cuda::a ... ok"
echo "test cuda::b ... FAILED"
echo
echo "failures:"
echo
echo "---- cuda::b stdout ----"
echo "child failed:"
echo "test result: ok. 50 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out"
echo "failures:"
echo "    quoted::child_test"
echo
echo "failures:"
echo "    cuda::b"
echo
echo "test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s"
echo
exit 101
"#;

#[test]
fn test_counts_are_the_runners_own_closing_line() {
    if dev_nvrtc().is_none() {
        return;
    }
    let kit = kit("counts", Some(FAKE_TESTS));
    let c = check(&kit, &["--rerun", "tests-cuda"], &[]);
    assert!(!c.ok, "{}", c.ctx);
    assert!(
        c.summary
            .contains("- tests-cuda: FAILED. 1 passed; 1 failed;"),
        "{}",
        c.ctx
    );
    assert!(c.summary.contains("    cuda::b"), "{}", c.ctx);
    assert!(
        !c.summary.contains("50 passed") && !c.summary.contains("quoted::child_test"),
        "{}",
        c.ctx
    );
    // The follow-up names the failed group.
    assert!(
        c.summary
            .contains("bash target/gpu-kit/gpu-check.sh --rerun tests-cuda"),
        "{}",
        c.ctx
    );
    std::fs::remove_dir_all(&kit).unwrap();
}
