//! Files a user keeps (weights, replay files, plots), written so that a
//! crash, a kill or a full disk mid-write leaves the old file as it was.
//!
//! The bytes go to a temporary file in the target's folder (so the rename
//! stays on one filesystem), which is flushed to disk, given the old
//! file's permissions, renamed over the target, and then the folder is
//! flushed so the rename itself survives a power loss. On any failure the
//! temporary file is removed and the target is untouched.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Writes `bytes` to `path` whole or not at all (see the module's comment).
/// The error names the path and the step that failed, with the system's
/// reason (no space left on device, permission denied, a folder).
pub fn write_atomic(path: impl AsRef<Path>, bytes: &[u8]) -> io::Result<()> {
    write_with(path.as_ref(), |f| f.write_all(bytes))
}

/// [`write_atomic`] with the file's contents written by `fill`.
pub(crate) fn write_with(
    path: &Path,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let fail = |what: &str, e: io::Error| {
        io::Error::new(e.kind(), format!("{}: {what}: {e}", path.display()))
    };
    if path.is_dir() {
        return Err(io::Error::other(format!(
            "{}: is a folder, not a file",
            path.display()
        )));
    }
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{}: names no file", path.display())))?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| fail("creating a temporary file beside it", e))?;
    let written = fill(&mut f)
        .map_err(|e| fail("writing", e))
        .and_then(|()| f.sync_all().map_err(|e| fail("flushing to disk", e)))
        .and_then(|()| match fs::metadata(path) {
            // The replacement keeps the permissions the user gave the file.
            Ok(m) => fs::set_permissions(&tmp, m.permissions())
                .map_err(|e| fail("keeping its permissions", e)),
            Err(_) => Ok(()),
        });
    drop(f);
    let renamed =
        written.and_then(|()| fs::rename(&tmp, path).map_err(|e| fail("renaming over it", e)));
    if renamed.is_err() {
        let _ = fs::remove_file(&tmp);
        return renamed;
    }
    // The rename is durable once the folder is; a folder that cannot be
    // opened for that (some filesystems) still has the whole new file.
    sync_dir(dir);
    Ok(())
}

/// Writes `bytes` to a new file at `path` and flushes it to disk: the
/// pieces of a folder that is renamed into place whole (a checkpoint).
pub(crate) fn write_new_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let fail = |what: &str, e: io::Error| {
        io::Error::new(e.kind(), format!("{}: {what}: {e}", path.display()))
    };
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| fail("creating", e))?;
    f.write_all(bytes).map_err(|e| fail("writing", e))?;
    f.sync_all().map_err(|e| fail("flushing to disk", e))
}

/// Flushes `dir`'s entries (a rename into it) to disk, where the
/// filesystem lets a folder be opened for that.
pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// 64-bit FNV-1a: stable across builds and platforms, unlike std's hasher.
pub(crate) fn fnv1a64(parts: &[&[u8]]) -> u64 {
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

#[cfg(feature = "selftest")]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    // The tests, run by `tests/unit.rs`.
    unit_tests![a_failed_write_leaves_the_old_file_and_no_temporary];

    fn leftovers(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect()
    }

    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("fg-atomic-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("weights.safetensors");
        write_atomic(&path, b"first").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        write_atomic(&path, b"second").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o640
        );
        // A disk that fills halfway through: the old file stays whole.
        let e = write_with(&path, |f| {
            f.write_all(b"half of a new fi")?;
            Err(io::Error::from_raw_os_error(28)) // ENOSPC
        })
        .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("weights.safetensors") && msg.contains("writing"),
            "{msg}"
        );
        assert!(msg.to_lowercase().contains("no space left"), "{msg}");
        assert_eq!(fs::read(&path).unwrap(), b"second");
        assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
        // A path that is a folder is refused, and the folder left as it was.
        let folder = dir.join("a-folder");
        fs::create_dir(&folder).unwrap();
        let e = write_atomic(&folder, b"x").unwrap_err().to_string();
        assert!(e.contains("is a folder"), "{e}");
        assert!(folder.is_dir() && leftovers(&dir).is_empty());
        // A folder that does not exist: the error names the path.
        let e = write_atomic(dir.join("no/such/file"), b"x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no/such/file") && e.contains("temporary"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
