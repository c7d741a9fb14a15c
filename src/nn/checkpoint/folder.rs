//! A checkpoint folder on disk: written whole under a hidden name, renamed
//! into place, and only ever removed after a rename out of sight, so that
//! a folder named `step-N` is always complete.

use crate::file::{fnv1a64, sync_dir, write_new_synced};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The file that lists every other file's checksum and size.
pub(super) const SUMS: &str = "checksums.txt";

/// The folder name of the checkpoint after `step` steps.
pub(super) fn name_of(step: u64) -> String {
    format!("step-{step:08}")
}

/// The step of a complete checkpoint's folder name (`step-00000100`).
pub(super) fn step_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// A hidden name in `dir` for `what` (`partial`, `removing`) of `name`.
fn hidden(dir: &Path, name: &str, what: &str) -> PathBuf {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    dir.join(format!(
        ".{name}.{what}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Writes `files` into `dir/name` whole or not at all: into a hidden
/// folder first, each file flushed, with [`SUMS`] last, then renamed.
/// An existing `dir/name` is an error: a checkpoint is never replaced.
pub(super) fn write(dir: &Path, name: &str, files: &[(&str, Vec<u8>)]) -> io::Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let target = dir.join(name);
    if target.exists() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} already exists; a checkpoint is never overwritten",
                target.display()
            ),
        ));
    }
    clean_stale(dir);
    let tmp = hidden(dir, name, "partial");
    let done = (|| {
        fs::create_dir(&tmp)?;
        let mut sums = String::new();
        for (file, bytes) in files {
            write_new_synced(&tmp.join(file), bytes)?;
            sums.push_str(&format!(
                "{:016x} {} {file}\n",
                fnv1a64(&[bytes]),
                bytes.len()
            ));
        }
        write_new_synced(&tmp.join(SUMS), sums.as_bytes())?;
        sync_dir(&tmp);
        fs::rename(&tmp, &target)
    })();
    if let Err(e) = done {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    sync_dir(dir);
    Ok(target)
}

/// The complete checkpoints in `dir`, oldest first.
pub(super) fn list(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        if let Some(step) = step_of(&e.file_name().to_string_lossy()) {
            if e.path().is_dir() {
                out.push((step, e.path()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Removes all but the newest `keep` checkpoints, each renamed out of
/// sight before it is deleted (a kill mid-delete leaves no broken one).
pub(super) fn prune(dir: &Path, keep: usize) -> io::Result<()> {
    let all = list(dir)?;
    for (step, path) in &all[..all.len().saturating_sub(keep)] {
        let gone = hidden(dir, &name_of(*step), "removing");
        fs::rename(path, &gone)?;
        sync_dir(dir);
        fs::remove_dir_all(&gone)?;
    }
    Ok(())
}

/// Removes hidden folders that a killed save or prune left, when the
/// process that made them is gone (its pid is in the name).
fn clean_stale(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let proc_fs = Path::new("/proc/self").exists();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(".step-") else {
            continue;
        };
        let pid = rest
            .rsplit_once(['.'])
            .and_then(|(_, tail)| tail.split_once('-'))
            .and_then(|(_, ids)| ids.split_once('-'))
            .map(|(pid, _)| pid.to_string());
        let alive = match pid {
            Some(p) if proc_fs => {
                p == std::process::id().to_string() || Path::new("/proc").join(&p).exists()
            }
            // Without /proc nothing tells; leave it.
            _ => true,
        };
        if !alive {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// The files of the checkpoint folder `path`, each checked against
/// [`SUMS`]: a missing, truncated or altered file is an error naming it.
pub(super) fn read(path: &Path, names: &[&str]) -> Result<Vec<Vec<u8>>, String> {
    let sums = fs::read_to_string(path.join(SUMS))
        .map_err(|e| format!("cannot read {SUMS}: {e} (not a finished checkpoint)"))?;
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let line = sums
            .lines()
            .find(|l| l.split(' ').nth(2) == Some(name))
            .ok_or_else(|| format!("{SUMS} does not list {name}"))?;
        let mut parts = line.split(' ');
        let (sum, len) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let bytes = fs::read(path.join(name)).map_err(|e| format!("cannot read {name}: {e}"))?;
        if len != bytes.len().to_string() {
            return Err(format!(
                "{name} has {} bytes, {SUMS} says {len}: damaged",
                bytes.len()
            ));
        }
        if sum != format!("{:016x}", fnv1a64(&[&bytes])) {
            return Err(format!("{name} fails its checksum in {SUMS}: damaged"));
        }
        out.push(bytes);
    }
    Ok(out)
}
