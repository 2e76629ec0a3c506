//! Output files are claimed, never taken over. A new name is created exclusively (O_EXCL):
//! two writers that start together cannot both get it, and the second learns it at once. A
//! name that is a symbolic link is never followed (O_NOFOLLOW; O_EXCL refuses links too), so
//! rdaq writes only where it was asked, also as root, and never through a link to somewhere
//! else. Overwriting (`--overwrite`) replaces a regular file, never a link or its target.
//!
//! Files that a library creates by name (HDF5) are claimed first and then created by the
//! library over the claimed, regular file. Files that must never be seen half made (the
//! master; a data file until it is in SWMR mode) are made under their hidden staging name
//! ([`claim_staging`]) and then renamed over the claimed name.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Why an output name cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("{0} exists: rdaq does not overwrite data (choose another name, or add --overwrite to replace it)")]
    Exists(PathBuf),
    #[error("{0} is a symbolic link: rdaq does not write through links (remove it, or choose another name)")]
    Link(PathBuf),
    #[error("cannot create {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// Creates the file `path` for writing: new (refused when anything has that name) or, with
/// `overwrite`, replacing a regular file of that name (truncated). A symbolic link is
/// refused either way.
pub fn create(path: &Path, overwrite: bool) -> Result<File, ClaimError> {
    let mut o = OpenOptions::new();
    o.write(true).mode(0o644).custom_flags(libc::O_NOFOLLOW);
    if overwrite {
        o.create(true).truncate(true);
    } else {
        o.create_new(true);
    }
    o.open(path).map_err(|source| {
        let link = is_link(path);
        match source.raw_os_error() {
            _ if link => ClaimError::Link(path.to_owned()),
            Some(libc::EEXIST) => ClaimError::Exists(path.to_owned()),
            _ => ClaimError::Io { path: path.to_owned(), source },
        }
    })
}

/// Claims `path` for a library that creates the file by name: afterwards it is a regular
/// file (empty when new) that this process created or was allowed to replace.
pub fn claim(path: &Path, overwrite: bool) -> Result<(), ClaimError> {
    create(path, overwrite).map(drop)
}

/// The hidden name beside `path` (`.<name>.tmp`) under which a file is made before a rename
/// gives it `path`.
pub fn staging(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

/// Claims the staging name of `path` and returns it. A crashed writer's leftover of that
/// hidden name (or anything else so named) goes first, so that the new file is created,
/// not written through a link.
pub fn claim_staging(path: &Path) -> Result<PathBuf, ClaimError> {
    let tmp = staging(path);
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(ClaimError::Io { path: tmp, source }),
    }
    claim(&tmp, false)?;
    Ok(tmp)
}

/// Writes `bytes` to the new file `path` (or replaces it, with `overwrite`).
pub fn write(path: &Path, bytes: &[u8], overwrite: bool) -> Result<(), ClaimError> {
    let mut f = create(path, overwrite)?;
    f.write_all(bytes).map_err(|source| ClaimError::Io { path: path.to_owned(), source })
}

/// Whether `path` is a symbolic link (dangling or not).
pub fn is_link(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// Whether anything has the name `path` (a dangling link too, which `Path::exists` misses).
pub fn taken(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_names_are_exclusive_and_links_are_never_followed() {
        let dir = std::env::temp_dir().join(format!("rdaq-claim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, target, link) = (dir.join("a"), dir.join("target"), dir.join("link"));
        write(&a, b"one", false).unwrap();
        assert!(matches!(write(&a, b"two", false), Err(ClaimError::Exists(_))));
        write(&a, b"three", true).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), b"three");
        // a dangling link: neither created through nor counted as free
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(taken(&link) && !link.exists());
        for overwrite in [false, true] {
            let e = claim(&link, overwrite).unwrap_err();
            assert!(matches!(e, ClaimError::Link(_)), "{e}");
            assert!(!target.exists(), "nothing created where the link points");
        }
        // a link to an existing file: its target is not replaced
        std::fs::write(&target, b"theirs").unwrap();
        assert!(matches!(write(&link, b"ours", true), Err(ClaimError::Link(_))));
        assert_eq!(std::fs::read(&target).unwrap(), b"theirs");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Fails, naming the file, when one of `paths` is a symbolic link, or exists and
/// `overwrite` is off. (The files are claimed again when they are created: this is the
/// early, friendly refusal before anything starts.)
pub fn refuse_existing<'a>(paths: impl IntoIterator<Item = &'a Path>, overwrite: bool) -> Result<(), ClaimError> {
    for p in paths {
        if is_link(p) {
            return Err(ClaimError::Link(p.to_owned()));
        }
        if !overwrite && taken(p) {
            return Err(ClaimError::Exists(p.to_owned()));
        }
    }
    Ok(())
}
