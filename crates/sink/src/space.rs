//! Disk space: how much a filesystem has free, and space held back so that a file can be
//! closed cleanly after the disk filled up. A writer that runs out of space mid-run still has
//! to write its file's metadata (the chunk index, the frame tables) to leave a file that
//! opens; it holds a reserve file from the start and deletes it when a write fails, which
//! frees exactly that room.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Bytes the filesystem holding `path` has free for an unprivileged writer.
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: an all-zero statvfs is valid (plain integers).
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs writes one struct into `st`; `c` is a valid NUL-terminated path.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// A file of allocated blocks that stands for disk space held back; deleted on
/// [`Reserve::release`] or drop.
#[derive(Debug)]
pub struct Reserve {
    path: Option<PathBuf>,
}

impl Reserve {
    /// Holds `bytes` in a hidden file beside `next_to` (`.<name>.reserve`; a crashed run's
    /// is replaced, a symbolic link of that name is refused). Fails when the filesystem
    /// cannot give them (then there is no reserve, and nothing is left behind).
    pub fn hold(next_to: &Path, bytes: u64) -> io::Result<Reserve> {
        let name = next_to.file_name().ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let path = next_to.with_file_name(format!(".{}.reserve", name.to_string_lossy()));
        let f = crate::claim::create(&path, true).map_err(io::Error::other)?;
        let r = Reserve { path: Some(path) };
        allocate(&f, bytes)?;
        Ok(r)
    }

    /// Gives the space back (deletes the file); true if there was a reserve to give.
    pub fn release(&mut self) -> bool {
        match self.path.take() {
            Some(p) => std::fs::remove_file(p).is_ok(),
            None => false,
        }
    }
}

impl Drop for Reserve {
    fn drop(&mut self) {
        self.release();
    }
}

/// Allocates `bytes` of real blocks to `f` (fallocate; zeros where it is not supported).
fn allocate(f: &File, bytes: u64) -> io::Result<()> {
    // SAFETY: fallocate on a file this process opened for writing; no memory is passed.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, bytes as libc::off_t) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
        return Err(e);
    }
    use std::io::Write;
    let zeros = vec![0u8; 1 << 20];
    let mut w = f;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        w.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    w.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_holds_space_until_released() {
        let dir = std::env::temp_dir().join(format!("rdaq-space-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("run.h5");
        let mut r = Reserve::hold(&target, 1 << 20).unwrap();
        let hidden = dir.join(".run.h5.reserve");
        assert_eq!(std::fs::metadata(&hidden).unwrap().len(), 1 << 20);
        assert!(free_bytes(&dir).unwrap() > 0);
        assert!(r.release());
        assert!(!hidden.exists() && !r.release());
        drop(Reserve::hold(&target, 4096).unwrap());
        assert!(!hidden.exists(), "dropped reserves leave nothing behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
