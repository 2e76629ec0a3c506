//! The recovery of a series whose writer was killed (`rdaq recover MASTER`). What a crash
//! leaves: data files still flagged as open by an SWMR writer (plain readers refuse them),
//! the last one possibly with rows past its frame tables (frames appended after the last
//! flush), a master at most one flush behind the data files, and the writer's hidden
//! `.<master>.tmp`, `.<master>.reserve` and `.<data file>.tmp` (a data file being made,
//! not yet in SWMR mode). Recovery clears the flags, trims each data file
//! to the frames its tables list (the rows after them are incomplete writes), writes the
//! master for every frame the data files hold, removes data files left without a frame (or
//! empty: claimed, not yet created), and removes the leftovers.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use hdf5::{Dataset, File};

use crate::instrument::MaskChunk;
use crate::master::{data_file_name, read_meta, write_master, Contents, Part};
use crate::nexus::rows_with_chunks;

/// What a recovery did.
#[derive(Debug, Default)]
pub struct Recovered {
    /// The data files kept, each with its frames.
    pub data_files: Vec<(PathBuf, u64)>,
    /// Frames the master lists now.
    pub frames: u64,
    /// Rows dropped from the data files: frames whose write the crash interrupted.
    pub rows_dropped: u64,
    /// Files removed: the writer's leftovers and data files without a frame.
    pub removed: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error("{path}: not the master of an rdaq series ({source})")]
    NotMaster { path: PathBuf, source: hdf5::Error },
    #[error("{path}: {source}")]
    Hdf5 { path: PathBuf, source: hdf5::Error },
    #[error("cannot remove {path}: {source}")]
    Remove { path: PathBuf, source: std::io::Error },
    /// A writer is still alive: its files are left as they are.
    #[error("{path} is open in process {pid}: its writer still runs; the series is left as it is")]
    InUse { path: PathBuf, pid: u32 },
}

/// One data file as recovery found it.
struct Held {
    numbers: Vec<u64>,
    incomplete: Vec<u64>,
    dropped: u64,
}

/// Recovers the series whose master is `master` (see the module's documentation).
pub fn recover(master: &Path) -> Result<Recovered, RecoverError> {
    if let Some((pid, path)) = holder(master) {
        return Err(RecoverError::InUse { path, pid });
    }
    let meta = read_meta(master).map_err(|source| RecoverError::NotMaster { path: master.to_owned(), source })?;
    let mut done = Recovered::default();
    let (mut parts, mut numbers, mut incomplete) = (Vec::new(), Vec::new(), Vec::new());
    for k in 1.. {
        let file = data_file_name(master, k);
        let path = master.with_file_name(&file);
        if !crate::claim::taken(&path) {
            break;
        }
        let staged = crate::claim::staging(&path);
        if crate::claim::taken(&staged) {
            // the writer died while it made this data file, before it took its name
            remove(&staged, &mut done)?;
        }
        let hdf5 = |source| RecoverError::Hdf5 { path: path.clone(), source };
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == 0) {
            // claimed, but the writer died before HDF5 created it
            remove(&path, &mut done)?;
            continue;
        }
        clear_writer_flags(&path).map_err(hdf5)?;
        let held = trim(&path).map_err(hdf5)?;
        done.rows_dropped += held.dropped;
        if held.numbers.is_empty() {
            remove(&path, &mut done)?;
            continue;
        }
        parts.push(Part { file, frames: held.numbers.len() as u64, incomplete: held.incomplete.len() as u64 });
        done.data_files.push((path, held.numbers.len() as u64));
        numbers.extend(held.numbers);
        incomplete.extend(held.incomplete);
    }
    let c = Contents { parts: &parts, incomplete: &incomplete, frames: &numbers, end_time: None };
    write_master(master, &meta, &MaskChunk::new(&meta), &c).map_err(|source| RecoverError::Hdf5 { path: master.to_owned(), source })?;
    done.frames = numbers.len() as u64;
    let name = master.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    for p in [crate::claim::staging(master), master.with_file_name(format!(".{name}.reserve"))] {
        if crate::claim::taken(&p) {
            remove(&p, &mut done)?;
        }
    }
    Ok(done)
}

/// A process of this host (another than this one) that has a file of the series of
/// `master` open, from /proc: a writer that still runs, whose files recovery must not touch.
/// A writer on another host that shares the file system is not seen.
fn holder(master: &Path) -> Option<(u32, PathBuf)> {
    let dir = master.parent()?.canonicalize().ok()?;
    let stem = master.file_stem()?.to_string_lossy().strip_suffix("_master").map(str::to_owned)?;
    let ours = |p: &Path| {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        p.parent() == Some(dir.as_path()) && (name.starts_with(&stem) || name.strip_prefix('.').is_some_and(|n| n.starts_with(&stem)))
    };
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if pid == std::process::id() {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if ours(&target) {
                    return Some((pid, target));
                }
            }
        }
    }
    None
}

fn remove(path: &Path, done: &mut Recovered) -> Result<(), RecoverError> {
    std::fs::remove_file(path).map_err(|source| RecoverError::Remove { path: path.to_owned(), source })?;
    done.removed.push(path.to_owned());
    Ok(())
}

/// Clears the superblock's flags that a killed SWMR writer left (what `h5clear -s` does,
/// through the same file-access property), so that any reader opens the file.
fn clear_writer_flags(path: &Path) -> hdf5::Result<()> {
    let name = CString::new(path.as_os_str().as_bytes()).map_err(|_| hdf5::Error::from("a path with a NUL byte"))?;
    let fapl = hdf5::plist::FileAccess::try_new()?;
    let property = c"clear_status_flags";
    hdf5::sync::sync(|| {
        // SAFETY: `fapl` is a live file-access property list, `property` a NUL-terminated
        // name, and the value a live hbool_t (the property's type) for the call; the file
        // id is closed before return. HDF5's global lock is held (`sync`).
        unsafe {
            if hdf5_sys::h5p::H5Pexist(fapl.id(), property.as_ptr()) <= 0 {
                return Err(hdf5::Error::from("this HDF5 library cannot clear a writer's flags; run `h5clear -s` on the data files first"));
            }
            let mut clear: hdf5_sys::h5::hbool_t = 1;
            hdf5::h5check(hdf5_sys::h5p::H5Pset(fapl.id(), property.as_ptr(), (&mut clear as *mut hdf5_sys::h5::hbool_t).cast()))?;
            let id = hdf5::h5check(hdf5_sys::h5f::H5Fopen(name.as_ptr(), hdf5_sys::h5f::H5F_ACC_RDWR, fapl.id()))?;
            hdf5::h5check(hdf5_sys::h5f::H5Fclose(id)).map(drop)
        }
    })
}

/// Trims the data file `path` to the frames its tables list and whose chunks it holds, and
/// returns their frame numbers and the incomplete ones among them.
fn trim(path: &Path) -> hdf5::Result<Held> {
    let file = File::open_rw(path)?;
    let data = file.dataset("entry/data/data")?;
    let numbers: Vec<u64> = file.dataset("entry/data/frame_number")?.read_raw()?;
    let complete = file.dataset("entry/data/frame_complete")?;
    let rows = data.shape()[0];
    let mut n = numbers.len().min(complete.shape()[0]).min(rows).min(rows_with_chunks(&data));
    let results = file.group("entry/result_1").ok();
    let per_frame = ["nPeaks", "hit", "peakXPosRaw", "peakYPosRaw", "peakTotalIntensity", "peakNPixels"];
    if let Some(r) = &results {
        for name in per_frame {
            n = n.min(r.dataset(name)?.shape()[0]);
        }
    }
    resize_rows(&data, n)?;
    resize_rows(&complete, n)?;
    resize_rows(&file.dataset("entry/data/frame_number")?, n)?;
    if let Some(r) = &results {
        for name in per_frame {
            resize_rows(&r.dataset(name)?, n)?;
        }
    }
    let kept = &numbers[..n];
    // incomplete frames come in the order of the frames: the kept ones are a prefix
    let listed: Vec<u64> = file.dataset("entry/data/incomplete_frame_number")?.read_raw()?;
    let mask = file.dataset("entry/data/incomplete_pixel_mask")?;
    let k = listed.iter().take_while(|f| kept.contains(f)).count().min(rows_with_chunks(&mask));
    resize_rows(&file.dataset("entry/data/incomplete_frame_number")?, k)?;
    resize_rows(&mask, k)?;
    file.flush()?;
    Ok(Held { numbers: kept.to_vec(), incomplete: listed[..k].to_vec(), dropped: (rows - n) as u64 })
}

/// Resizes `ds` along its first dimension to `n` rows.
fn resize_rows(ds: &Dataset, n: usize) -> hdf5::Result<()> {
    let mut shape = ds.shape();
    if shape[0] != n {
        shape[0] = n;
        ds.resize(shape)?;
    }
    Ok(())
}
