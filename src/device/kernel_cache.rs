//! The kernel cache on disk: each family's CUBIN, its PTX and ptxas's
//! report, keyed by what decides the program (the source as compiled, the
//! architecture and the options), so a process only compiles what no
//! earlier process compiled, and a hit needs no NVRTC at all.
//!
//! The key leaves out the NVRTC version: a CUBIN is machine code for its
//! architecture whichever NVRTC made it, and a kit's cache must serve a
//! machine with another NVRTC or none. Each entry's header names the NVRTC
//! that made it; `fusegrad kernels` (the register report) recompiles an
//! entry made by another NVRTC than its own.
//!
//! Where: `$FUSEGRAD_CACHE_DIR`, else `$XDG_CACHE_HOME/fusegrad`, else
//! `~/.cache/fusegrad`. Entries are written to a temporary name and
//! renamed, so a reader sees a whole entry or none. An entry that cannot be
//! read, is truncated or fails its checksum is compiled again and
//! replaced; a folder that cannot be written leaves the cache off for the
//! process, with one warning.

pub(crate) use super::nvrtc::Compiled;
use super::nvrtc::{self, Family, KernelInfo, COMMON, OPTIONS};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

const MAGIC: &str = "fusegrad-kernel-cache 2";

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

/// The entry's file name for `family` on `sm_<arch>`.
fn entry_name(family: &str, src: &str, arch: u32) -> String {
    let a = arch.to_string();
    let mut parts: Vec<&[u8]> = vec![COMMON.as_bytes(), src.as_bytes(), a.as_bytes()];
    parts.extend(OPTIONS.iter().map(|o| o.as_bytes()));
    let key = crate::file::fnv1a64(&parts);
    format!("{family}-sm_{arch}-{key:016x}.cubin")
}

/// `nvrtcM.m` as `(M, m)`.
fn parse_nvrtc(field: &str) -> Option<(i32, i32)> {
    let (ma, mi) = field.strip_prefix("nvrtc")?.split_once('.')?;
    Some((ma.parse().ok()?, mi.parse().ok()?))
}

/// An entry's header: `MAGIC nvrtcM.m LOG PTX CUBIN SUM`.
struct Header {
    nvrtc: (i32, i32),
    lens: [usize; 3],
    sum: u64,
}

fn parse_header(line: &str) -> Option<Header> {
    let mut f = line.split(' ');
    let magic = format!("{} {}", f.next()?, f.next()?);
    if magic != MAGIC {
        return None;
    }
    let nvrtc = parse_nvrtc(f.next()?)?;
    let mut lens = [0usize; 3];
    for l in lens.iter_mut() {
        *l = f.next()?.parse().ok()?;
    }
    let sum = u64::from_str_radix(f.next()?, 16).ok()?;
    Some(Header { nvrtc, lens, sum })
}

/// Reads a whole, checked entry.
fn read_entry(path: &Path) -> Option<Compiled> {
    let bytes = std::fs::read(path).ok()?;
    let header_end = bytes.iter().position(|&b| b == b'\n')?;
    let h = parse_header(std::str::from_utf8(&bytes[..header_end]).ok()?)?;
    let body = &bytes[header_end + 1..];
    let [log_len, ptx_len, cubin_len] = h.lens;
    if body.len() != log_len.checked_add(ptx_len)?.checked_add(cubin_len)? {
        return None;
    }
    let (log, rest) = body.split_at(log_len);
    let (ptx, cubin) = rest.split_at(ptx_len);
    let ptx_ok = ptx.is_empty() || ptx.last() == Some(&0);
    if crate::file::fnv1a64(&[body]) != h.sum || !cubin.starts_with(b"\x7fELF") || !ptx_ok {
        return None;
    }
    Some(Compiled {
        cubin: cubin.to_vec(),
        ptx: ptx.to_vec(),
        log: String::from_utf8_lossy(log).into_owned(),
        nvrtc: h.nvrtc,
    })
}

/// Writes an entry through a temporary file and a rename.
fn write_entry(dir: &Path, name: &str, c: &Compiled) -> std::io::Result<()> {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    std::fs::create_dir_all(dir)?;
    let mut body = c.log.as_bytes().to_vec();
    body.extend_from_slice(&c.ptx);
    body.extend_from_slice(&c.cubin);
    let mut out = format!(
        "{MAGIC} nvrtc{}.{} {} {} {} {:016x}\n",
        c.nvrtc.0,
        c.nvrtc.1,
        c.log.len(),
        c.ptx.len(),
        c.cubin.len(),
        crate::file::fnv1a64(&[&body])
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

/// Which cache entry a lookup takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// A sound entry, whichever NVRTC made it: a hit loads no NVRTC.
    Any,
    /// An entry made by the NVRTC this process compiles with (the register
    /// report's own compiler); where no NVRTC can be found, as `Any`.
    SameCompiler,
    /// None: compile again (the driver refused the entry's code).
    Fresh,
}

/// Family `family` for `sm_<arch>`: from `dir` (default: the process's
/// cache) when a sound entry is there (see [`Lookup`]), else compiled and
/// stored. A miss where NVRTC cannot be found is `CudaUnavailable` naming
/// the family, the cache and where NVRTC was looked for.
pub(crate) fn family_code(
    family: &str,
    src: &str,
    arch: u32,
    dir: Option<&Path>,
    lookup: Lookup,
) -> Result<(Compiled, Origin)> {
    let name = entry_name(family, src, arch);
    let dir = dir.map(Path::to_path_buf).or_else(default_dir);
    if let (Some(d), false) = (&dir, lookup == Lookup::Fresh) {
        if let Some(c) = read_entry(&d.join(&name)) {
            let same = match lookup {
                Lookup::SameCompiler => nvrtc::nvrtc_info().map_or(true, |n| n.version == c.nvrtc),
                _ => true,
            };
            if same {
                LOADED.fetch_add(1, Ordering::Relaxed);
                return Ok((c, Origin::Cache));
            }
        }
    }
    let c = compile_counted(family, src, arch).map_err(|e| match e {
        Error::CudaUnavailable { reason } => Error::CudaUnavailable {
            reason: format!(
                "kernel family `{family}` for sm_{arch} is not in the kernel cache ({}) and \
                 cannot be compiled: {reason}",
                dir.as_ref()
                    .map_or("off".into(), |d| d.join(&name).display().to_string())
            ),
        },
        e => e,
    })?;
    if let Some(d) = &dir {
        store(d, &name, &c);
    }
    Ok((c, Origin::Compiled))
}

/// The NVRTC that made the entry for `family` on `sm_<arch>` in `dir`
/// (default: the process's cache), from its header alone; `None` when
/// there is no entry.
pub(crate) fn entry_nvrtc(
    family: &str,
    src: &str,
    arch: u32,
    dir: Option<&Path>,
) -> Option<(i32, i32)> {
    use std::io::Read;
    let dir = dir.map(Path::to_path_buf).or_else(default_dir)?;
    let mut head = [0u8; 160];
    let mut f = std::fs::File::open(dir.join(entry_name(family, src, arch))).ok()?;
    let k = f.read(&mut head).ok()?;
    let line = head[..k].split(|&b| b == b'\n').next()?;
    parse_header(std::str::from_utf8(line).ok()?).map(|h| h.nvrtc)
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
                        let r = family_code(name, src, arch, cache, Lookup::SameCompiler)
                            .map(|(c, _)| nvrtc::parse_log(name, arch, &c.log));
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
    unit_tests![
        entries_round_trip_and_damage_is_detected,
        the_key_changes_with_every_input,
    ];

    fn sample() -> Compiled {
        let mut cubin = b"\x7fELF".to_vec();
        cubin.extend((0..200u32).map(|i| (i * 7) as u8));
        Compiled {
            cubin,
            ptx: b".version 9.0\n.target sm_90\n\0".to_vec(),
            log: "ptxas info : Used 40 registers\n".into(),
            nvrtc: (13, 0),
        }
    }

    fn entries_round_trip_and_damage_is_detected() {
        let dir = std::env::temp_dir().join(format!("fg-kc-{}", std::process::id()));
        let c = sample();
        write_entry(&dir, "x.cubin", &c).unwrap();
        let back = read_entry(&dir.join("x.cubin")).unwrap();
        assert_eq!(
            (back.cubin, back.ptx, back.log, back.nvrtc),
            (c.cubin.clone(), c.ptx.clone(), c.log.clone(), (13, 0))
        );
        // The compiler is read from the header alone.
        let name = entry_name("fam", "src", 90);
        std::fs::copy(dir.join("x.cubin"), dir.join(&name)).unwrap();
        assert_eq!(entry_nvrtc("fam", "src", 90, Some(&dir)), Some((13, 0)));
        assert_eq!(entry_nvrtc("fam", "src", 80, Some(&dir)), None);
        std::fs::remove_file(dir.join(&name)).unwrap();
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
        let base = entry_name("f", "src", 90);
        assert_ne!(base, entry_name("f", "src2", 90));
        assert_ne!(base, entry_name("f", "src", 80));
        assert_eq!(base, entry_name("f", "src", 90));
        // No NVRTC version in the key: a hit is found without loading it.
        assert!(base.starts_with("f-sm_90-") && !base.contains("nvrtc"));
    }
}
