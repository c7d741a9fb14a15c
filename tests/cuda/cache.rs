//! The kernel cache across processes: a second process compiles nothing,
//! damaged entries are compiled again, a full cache runs every CUDA test
//! with no NVRTC to be found, an empty one then fails naming NVRTC, and a
//! CUBIN the driver refuses runs from the PTX beside it. Also the
//! allocation fallback. Each test runs this binary as a child process
//! with an environment of its own.
#![cfg(feature = "cuda")]

use crate::cuda_emu::{emu_alloc_counts, gpu};
use fusegrad::{ops, Device, Tape, Tensor};
use std::ffi::OsStr;
use std::path::PathBuf;

/// Run as a child process by the tests below: one embedding lookup on the
/// GPU (so one kernel family), checked, then the kernel cache's counters
/// and the device line on stdout.
#[test]
#[ignore = "a child process of the kernel-cache and allocation tests"]
fn child_embedding_lookup() {
    let Some(dev) = gpu() else { return };
    let tape = Tape::<f32>::new();
    let host: Vec<f32> = (0..15).map(|i| i as f32 * 0.5 - 2.0).collect();
    let w = tape
        .var_on(Tensor::from_vec(vec![5, 3], host.clone()).unwrap(), dev)
        .unwrap();
    let ids = [4, 0, 2, 2];
    let y = ops::embedding(&w, &ids, &[4]).unwrap();
    let got = y.value().to_vec().unwrap();
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&i| host[3 * i..3 * i + 3].to_vec())
        .collect();
    assert_eq!(got, want);
    let st = fusegrad::device::kernel_stats();
    let (pooled, plain) = emu_alloc_counts().unwrap_or((0, 0));
    println!(
        "CHILD compiled={} loaded={} pooled={pooled} plain={plain} device={}",
        st.compiled,
        st.loaded,
        Device::cuda_status().unwrap()
    );
}

/// A child process's exit status and output.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// This test binary with `args` and `env` added to this process's, and
/// `FUSEGRAD_REQUIRE_GPU=1`: a child that cannot get the device fails
/// rather than skips.
fn run(args: &[&str], env: &[(&str, &OsStr)]) -> Run {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(args).env("FUSEGRAD_REQUIRE_GPU", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// [`child_embedding_lookup`] with `env`, run alone.
fn lookup(env: &[(&str, &OsStr)]) -> Run {
    run(
        &[
            "--exact",
            "cuda::cache::child_embedding_lookup",
            "--include-ignored",
            "--nocapture",
        ],
        env,
    )
}

/// [`lookup`], which must succeed: its CHILD line and stderr.
fn child(env: &[(&str, &OsStr)]) -> (String, String) {
    let r = lookup(env);
    assert!(r.ok, "child failed:\n{}\n{}", r.stdout, r.stderr);
    let line = r
        .stdout
        .lines()
        .find(|l| l.starts_with("CHILD "))
        .unwrap_or_else(|| panic!("no CHILD line (skipped?):\n{}\n{}", r.stdout, r.stderr))
        .to_string();
    (line, r.stderr)
}

fn field(line: &str, key: &str) -> usize {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

/// FNV-1a as the kernel cache computes its checksums.
fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes.iter().chain([0xffu8].iter()) {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The CUBIN of a cache entry (its last bytes, as long as the header says;
/// the ptxas log before it holds compile times, so it differs per compile).
fn cubin_of(entry: &[u8]) -> Vec<u8> {
    let header = entry.split(|&b| b == b'\n').next().unwrap();
    let header = String::from_utf8_lossy(header);
    let len: usize = header.split(' ').nth(5).unwrap().parse().unwrap();
    let cubin = entry[entry.len() - len..].to_vec();
    assert!(cubin.starts_with(b"\x7fELF"), "{header}");
    cubin
}

/// A fresh temporary folder named for `what` and this process.
fn temp(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fg-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `FUSEGRAD_NVRTC` set to an empty folder: the only place then searched,
/// so NVRTC cannot be found, as on a machine without it.
fn without_nvrtc() -> PathBuf {
    temp("no-nvrtc")
}

/// Whether this process can compile (it may itself be a child without
/// NVRTC, where the tests that need it check the error instead).
fn can_compile() -> bool {
    fusegrad::device::nvrtc_info().is_ok()
}

/// An empty cache and no NVRTC: the failure names NVRTC, where it was
/// looked for, the family and the cache.
fn check_no_nvrtc_error(r: &Run, searched: &str) {
    let all = format!("{}\n{}", r.stdout, r.stderr);
    assert!(!r.ok, "ran without NVRTC or an entry:\n{all}");
    let line = all
        .lines()
        .find(|l| l.contains("is not in the kernel cache"))
        .unwrap_or_else(|| panic!("no line on the missing entry:\n{all}"));
    for want in ["NVRTC", "embedding", searched] {
        assert!(line.contains(want), "{want:?} not in: {line}");
    }
}

#[test]
fn a_second_process_compiles_nothing_and_damaged_entries_are_recompiled() {
    if gpu().is_none() {
        return;
    }
    let dir = temp("cache");
    let env = [("FUSEGRAD_CACHE_DIR", dir.as_os_str())];
    if !can_compile() {
        let nv = std::env::var("FUSEGRAD_NVRTC").unwrap_or_default();
        check_no_nvrtc_error(&lookup(&env), &nv);
        return std::fs::remove_dir_all(&dir).unwrap();
    }
    let (first, _) = child(&env);
    assert_eq!(
        (field(&first, "compiled"), field(&first, "loaded")),
        (1, 0),
        "{first}"
    );
    let entry = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().contains("embedding-sm_"))
        .expect("an embedding entry in the cache");
    let whole = cubin_of(&std::fs::read(&entry).unwrap());
    let (second, _) = child(&env);
    assert_eq!(
        (field(&second, "compiled"), field(&second, "loaded")),
        (0, 1),
        "{second}"
    );
    // A truncated entry is compiled again and rewritten whole.
    std::fs::write(&entry, &whole[..whole.len() / 2]).unwrap();
    let (third, _) = child(&env);
    assert_eq!(field(&third, "compiled"), 1, "{third}");
    assert!(
        cubin_of(&std::fs::read(&entry).unwrap()) == whole,
        "not rewritten whole"
    );
    // A sound entry whose image the driver rejects (and no PTX beside it)
    // is compiled again too.
    let mut body = b"log".to_vec();
    body.extend_from_slice(b"\x7fELF\x01not a 64-bit image");
    let mut bad = format!(
        "fusegrad-kernel-cache 2 nvrtc12.9 3 0 {} {:016x}\n",
        body.len() - 3,
        fnv(&body)
    )
    .into_bytes();
    bad.extend_from_slice(&body);
    std::fs::write(&entry, &bad).unwrap();
    let (fourth, _) = child(&env);
    assert_eq!(
        (field(&fourth, "compiled"), field(&fourth, "loaded")),
        (1, 1),
        "{fourth}"
    );
    assert!(!fourth.contains("PTX"), "{fourth}");
    assert!(
        cubin_of(&std::fs::read(&entry).unwrap()) == whole,
        "not rewritten whole"
    );
    // The entry, whole again, serves a process that has no NVRTC at all.
    let nv = without_nvrtc();
    let no_nvrtc = [
        ("FUSEGRAD_CACHE_DIR", dir.as_os_str()),
        ("FUSEGRAD_NVRTC", nv.as_os_str()),
    ];
    let (fifth, _) = child(&no_nvrtc);
    assert_eq!(
        (field(&fifth, "compiled"), field(&fifth, "loaded")),
        (0, 1),
        "{fifth}"
    );
    // A cache folder that cannot be made: one warning, compiled in memory.
    let blocked = dir.join("a-file");
    std::fs::write(&blocked, b"x").unwrap();
    let sub = blocked.join("cache");
    let (sixth, err) = child(&[("FUSEGRAD_CACHE_DIR", sub.as_os_str())]);
    assert_eq!(field(&sixth, "compiled"), 1, "{sixth}");
    assert_eq!(err.matches("cannot be written").count(), 1, "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn without_nvrtc_an_empty_cache_fails_naming_nvrtc_and_where_it_looked() {
    if gpu().is_none() {
        return;
    }
    let (dir, nv) = (temp("empty-cache"), without_nvrtc());
    let r = lookup(&[
        ("FUSEGRAD_CACHE_DIR", dir.as_os_str()),
        ("FUSEGRAD_NVRTC", nv.as_os_str()),
    ]);
    check_no_nvrtc_error(&r, nv.to_str().unwrap());
    assert!(!r.stderr.contains("panicked at src"), "{}", r.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn without_nvrtc_a_full_cache_runs_every_cuda_test() {
    if gpu().is_none() {
        return;
    }
    // Every family for every checked architecture, as a kit's cache holds
    // them (compiled here where missing, read where present).
    let rows = fusegrad::kernel_table(&fusegrad::device::CHECKED_ARCHS, None).unwrap();
    assert!(!rows.is_empty());
    let nv = without_nvrtc();
    let me = "cuda::cache::without_nvrtc_a_full_cache_runs_every_cuda_test";
    let r = run(
        &["cuda::", "--skip", me, "--test-threads=2"],
        &[("FUSEGRAD_NVRTC", nv.as_os_str())],
    );
    let all = format!("{}\n{}", r.stdout, r.stderr);
    assert!(r.ok, "a CUDA test failed without NVRTC:\n{all}");
    // The runner's own closing line: the last one of its stdout.
    let last = r.stdout.lines().rev().find(|l| !l.trim().is_empty());
    let passed: usize = last
        .and_then(|l| l.strip_prefix("test result: ok. "))
        .and_then(|l| l.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no closing line:\n{all}"));
    assert!(passed >= 15, "only {passed} CUDA tests ran:\n{all}");
    assert!(!all.contains("skipped:"), "{all}");
}

#[test]
fn a_cubin_the_driver_refuses_runs_from_its_ptx() {
    // Only the emulation can be made to refuse CUBINs (FG_EMU_REFUSE_CUBIN).
    if gpu().is_none() || emu_alloc_counts().is_none() {
        return;
    }
    let dir = temp("ptx-cache");
    let mut env = vec![("FUSEGRAD_CACHE_DIR", dir.as_os_str())];
    if can_compile() {
        // Fill the entry first, then hide NVRTC: PTX is the only way left.
        child(&env);
    } else {
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    }
    let nv = without_nvrtc();
    env.push(("FUSEGRAD_NVRTC", nv.as_os_str()));
    env.push(("FG_EMU_REFUSE_CUBIN", OsStr::new("1")));
    let (line, _) = child(&env);
    assert_eq!(
        (field(&line, "compiled"), field(&line, "loaded")),
        (0, 1),
        "{line}"
    );
    assert!(
        line.contains("kernels run from PTX: embedding")
            && line.contains("no kernel image is available"),
        "{line}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn allocation_falls_back_to_cu_mem_alloc_when_pools_are_missing_or_fail() {
    if gpu().is_none() || emu_alloc_counts().is_none() {
        return;
    }
    for (mode, says, pools) in [
        ("1", "stream-ordered pools", true),
        ("0", "the device has no memory pools", false),
        ("fail", "memory pools failed", false),
    ] {
        // The process's own cache: warm, so this also runs without NVRTC.
        let (line, _) = child(&[("FG_EMU_POOLS", OsStr::new(mode))]);
        assert!(line.contains(says), "FG_EMU_POOLS={mode}: {line}");
        let (pooled, plain) = (field(&line, "pooled"), field(&line, "plain"));
        assert_eq!(
            (pooled > 0, plain > 0),
            (pools, !pools),
            "FG_EMU_POOLS={mode}: {line}"
        );
    }
}
