//! The kernel cache on disk: each family's CUBIN and ptxas report, keyed
//! by everything that decides the machine code (the source as compiled,
//! the architecture, NVRTC's version and the options), so a process only
//! compiles what no earlier process compiled.
//!
//! Where: `$FUSEGRAD_CACHE_DIR`, else `$XDG_CACHE_HOME/fusegrad`, else
//! `~/.cache/fusegrad`. Entries are written to a temporary name and
//! renamed, so a reader sees a whole entry or none. An entry that cannot be
//! read, is truncated, fails its checksum or is rejected by the driver is
//! compiled again and replaced; a folder that cannot be written leaves the
//! cache off for the process, with one warning.

use super::nvrtc::{self, Compiled, COMMON, OPTIONS};
use crate::error::Result;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

const MAGIC: &str = "fusegrad-kernel-cache 1";

/// What the kernel cache has done in this process.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelStats {
    /// Families compiled by NVRTC.
    pub compiled: usize,
    /// Seconds spent in those compiles.
    pub compile_seconds: f64,
    /// Families loaded from the cache on disk.
    pub loaded: usize,
    /// The cache folder, or `None` when the cache is off.
    pub dir: Option<PathBuf>,
}

static COMPILED: AtomicUsize = AtomicUsize::new(0);
static COMPILE_NANOS: AtomicU64 = AtomicU64::new(0);
static LOADED: AtomicUsize = AtomicUsize::new(0);

/// The cache's counters so far in this process.
pub fn kernel_stats() -> KernelStats {
    KernelStats {
        compiled: COMPILED.load(Ordering::Relaxed),
        compile_seconds: COMPILE_NANOS.load(Ordering::Relaxed) as f64 * 1e-9,
        loaded: LOADED.load(Ordering::Relaxed),
        dir: default_dir(),
    }
}

/// The folder the environment names, before any write was tried.
fn configured_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = var("FUSEGRAD_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("fusegrad"));
    }
    var("HOME").map(|h| PathBuf::from(h).join(".cache/fusegrad"))
}

/// Folders found unwritable in this process (warned about once each).
static UNWRITABLE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// The process's cache folder, or `None` when there is none or it could
/// not be written.
fn default_dir() -> Option<PathBuf> {
    let d = configured_dir()?;
    let bad = UNWRITABLE.lock().unwrap_or_else(|e| e.into_inner());
    (!bad.contains(&d)).then_some(d)
}

/// 64-bit FNV-1a: stable across builds and platforms, unlike std's hasher.
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter() {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separates parts, so ("ab", "c") and ("a", "bc") differ.
        h = (h ^ 0xff).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The entry's file name for `family` on `sm_<arch>` with NVRTC `version`.
fn entry_name(family: &str, src: &str, arch: u32, version: (i32, i32)) -> String {
    let v = format!("{}.{}", version.0, version.1);
    let a = arch.to_string();
    let mut parts: Vec<&[u8]> = vec![COMMON.as_bytes(), src.as_bytes(), a.as_bytes()];
    parts.push(v.as_bytes());
    parts.extend(OPTIONS.iter().map(|o| o.as_bytes()));
    let key = fnv(&parts);
    format!("{family}-sm_{arch}-nvrtc{v}-{key:016x}.cubin")
}

/// Reads a whole, checked entry.
fn read_entry(path: &Path) -> Option<Compiled> {
    let bytes = std::fs::read(path).ok()?;
    let header_end = bytes.iter().position(|&b| b == b'\n')?;
    let header = std::str::from_utf8(&bytes[..header_end]).ok()?;
    let mut f = header.split(' ');
    let magic = format!("{} {}", f.next()?, f.next()?);
    let (log_len, cubin_len): (usize, usize) = (f.next()?.parse().ok()?, f.next()?.parse().ok()?);
    let sum = u64::from_str_radix(f.next()?, 16).ok()?;
    let body = &bytes[header_end + 1..];
    if magic != MAGIC || body.len() != log_len.checked_add(cubin_len)? {
        return None;
    }
    let (log, cubin) = body.split_at(log_len);
    if fnv(&[body]) != sum || !cubin.starts_with(b"\x7fELF") {
        return None;
    }
    Some(Compiled {
        cubin: cubin.to_vec(),
        log: String::from_utf8_lossy(log).into_owned(),
    })
}

/// Writes an entry through a temporary file and a rename.
fn write_entry(dir: &Path, name: &str, c: &Compiled) -> std::io::Result<()> {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    std::fs::create_dir_all(dir)?;
    let mut body = c.log.as_bytes().to_vec();
    body.extend_from_slice(&c.cubin);
    let mut out = format!(
        "{MAGIC} {} {} {:016x}\n",
        c.log.len(),
        c.cubin.len(),
        fnv(&[&body])
    )
    .into_bytes();
    out.extend_from_slice(&body);
    let tmp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&tmp, &out)?;
    std::fs::rename(&tmp, dir.join(name)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Where a family's code came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    Cache,
    Compiled,
}

fn compile_counted(family: &str, src: &str, arch: u32) -> Result<Compiled> {
    let t = Instant::now();
    let c = nvrtc::compile(family, src, arch)?;
    COMPILED.fetch_add(1, Ordering::Relaxed);
    COMPILE_NANOS.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    Ok(c)
}

/// Stores `c` in `dir`, turning the cache off (with one warning) when the
/// folder cannot be written.
fn store(dir: &Path, name: &str, c: &Compiled) {
    if let Err(e) = write_entry(dir, name, c) {
        let mut bad = UNWRITABLE.lock().unwrap_or_else(|e| e.into_inner());
        if !bad.iter().any(|b| b == dir) {
            eprintln!(
                "fusegrad: kernel cache {} cannot be written ({e}); compiling in memory",
                dir.display()
            );
            bad.push(dir.to_path_buf());
        }
    }
}

/// Family `family` for `sm_<arch>`: from `dir` (default: the process's
/// cache) when a sound entry is there, else compiled and stored. `fresh`
/// skips the lookup (an entry the driver rejected).
pub(crate) fn family_code(
    family: &str,
    src: &str,
    arch: u32,
    dir: Option<&Path>,
    fresh: bool,
) -> Result<(Compiled, Origin)> {
    let version = nvrtc::nvrtc_info()?.version;
    let name = entry_name(family, src, arch, version);
    let dir = dir.map(Path::to_path_buf).or_else(default_dir);
    if let (Some(d), false) = (&dir, fresh) {
        if let Some(c) = read_entry(&d.join(&name)) {
            LOADED.fetch_add(1, Ordering::Relaxed);
            return Ok((c, Origin::Cache));
        }
    }
    let c = compile_counted(family, src, arch)?;
    if let Some(d) = &dir {
        store(d, &name, &c);
    }
    Ok((c, Origin::Compiled))
}

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    // The tests, run by `tests/unit.rs`.
    unit_tests![
        entries_round_trip_and_damage_is_detected,
        the_key_changes_with_every_input,
    ];

    fn sample() -> Compiled {
        let mut cubin = b"\x7fELF".to_vec();
        cubin.extend((0..200u32).map(|i| (i * 7) as u8));
        Compiled {
            cubin,
            log: "ptxas info : Used 40 registers\n".into(),
        }
    }

    fn entries_round_trip_and_damage_is_detected() {
        let dir = std::env::temp_dir().join(format!("fg-kc-{}", std::process::id()));
        let c = sample();
        write_entry(&dir, "x.cubin", &c).unwrap();
        let back = read_entry(&dir.join("x.cubin")).unwrap();
        assert_eq!((back.cubin, back.log), (c.cubin.clone(), c.log.clone()));
        let bytes = std::fs::read(dir.join("x.cubin")).unwrap();
        // Truncated, one byte flipped, or an empty file: each is refused.
        std::fs::write(dir.join("t.cubin"), &bytes[..bytes.len() - 9]).unwrap();
        assert!(read_entry(&dir.join("t.cubin")).is_none());
        let mut flipped = bytes.clone();
        let last = flipped.len() - 3;
        flipped[last] ^= 1;
        std::fs::write(dir.join("f.cubin"), &flipped).unwrap();
        assert!(read_entry(&dir.join("f.cubin")).is_none());
        std::fs::write(dir.join("e.cubin"), b"").unwrap();
        assert!(read_entry(&dir.join("e.cubin")).is_none());
        // No temporary files are left behind.
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(left.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn the_key_changes_with_every_input() {
        let base = entry_name("f", "src", 90, (13, 0));
        assert_ne!(base, entry_name("f", "src2", 90, (13, 0)));
        assert_ne!(base, entry_name("f", "src", 80, (13, 0)));
        assert_ne!(base, entry_name("f", "src", 90, (12, 9)));
        assert_eq!(base, entry_name("f", "src", 90, (13, 0)));
        assert!(base.starts_with("f-sm_90-nvrtc13.0-"));
    }
}
