//! Output files and the rule that protects them: rdaq never overwrites data unless told to
//! (`--overwrite`), and never writes through a symbolic link. A file named on the command
//! line that exists (a dangling link too) is refused before anything starts (exit 2); `rdaq
//! run`, whose file names come from a run name, numbers the run instead (`rdaq_run_000002`),
//! claiming the name atomically ([`rdaq_sink::claim`]) so that two runs started together get
//! two names. The free space is checked against what a run may write, and a data file that
//! would hold no frame is not kept.

use std::path::{Path, PathBuf};

use rdaq_sink::claim::{self, ClaimError};
use rdaq_sink::SinkError;

use crate::consume::ConsumeStats;

pub use claim::refuse_existing;

/// Fails unless `name` (the setting `what`) names files inside the output directory: not
/// empty, no `/`, no NUL.
pub fn plain_name(what: &str, name: &str) -> anyhow::Result<()> {
    if name.len() > 200 || !rdaq_proto::names::is_plain_file_name(name) {
        anyhow::bail!("{what} must be a plain file name (files are made inside the output directory: no '/', not hidden, no control characters, at most 200 bytes), not {name:?}");
    }
    Ok(())
}

/// The directory `rel` (a setting `what` that a client sends) under `root`, lexically: relative,
/// without `..`, without control characters. Nothing is created (see [`make_subdirectory`]).
pub fn subdirectory(what: &str, rel: &str) -> anyhow::Result<PathBuf> {
    if rel.len() > 1024 || !rdaq_proto::names::is_relative_dir(rel) {
        anyhow::bail!("{what}: {rel:?} is not a directory under the output directory (relative, without ..)");
    }
    Ok(PathBuf::from(rel))
}

/// Makes directory `rel` (checked by [`subdirectory`]) under `root`, one level at a time,
/// refusing a level that is a symbolic link or not a directory: what a client names stays
/// under `root`, and nothing is created outside it on the way. Returns `root/rel`.
pub fn make_subdirectory(what: &str, root: &Path, rel: &Path) -> anyhow::Result<PathBuf> {
    walk_subdirectory(what, root, rel, true)
}

/// What [`make_subdirectory`] would refuse, found without creating anything (the levels
/// that exist are directories, not links): a directory checked now and made later.
pub fn check_subdirectory(what: &str, root: &Path, rel: &Path) -> anyhow::Result<()> {
    walk_subdirectory(what, root, rel, false).map(|_| ())
}

fn walk_subdirectory(what: &str, root: &Path, rel: &Path, create: bool) -> anyhow::Result<PathBuf> {
    let mut at = root.to_owned();
    for c in rel.components().filter(|c| matches!(c, std::path::Component::Normal(_))) {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => anyhow::bail!("{what}: {} is a symbolic link: rdaq writes only under the output directory", at.display()),
            Ok(m) if !m.is_dir() => anyhow::bail!("{what}: {} is not a directory", at.display()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match std::fs::create_dir(&at) {
                Ok(()) => {}
                // made meanwhile by another start: a directory is what was wanted
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && !claim::is_link(&at) && at.is_dir() => {}
                Err(e) => anyhow::bail!("{what}: cannot create {}: {e}", at.display()),
            },
            Err(e) => anyhow::bail!("{what}: {}: {e}", at.display()),
        }
    }
    Ok(at)
}

/// Writes `bytes` to the output file `path` named on the command line: a new file, or with
/// `overwrite` replacing a regular one; never through a link.
pub fn write_file(path: &Path, bytes: &[u8], overwrite: bool) -> anyhow::Result<()> {
    Ok(claim::write(path, bytes, overwrite)?)
}

/// The files of the series whose master is `master` that an earlier run would have left:
/// the master and its first data file (refused like any other existing file).
pub fn series_files(master: &Path) -> [PathBuf; 2] {
    [master.to_owned(), master.with_file_name(rdaq_sink::data_file_name(master, 1))]
}

/// Claims the first run name whose files (`<name><suffix>` in `dir`) are all free: `name`
/// itself, else `name_000002`, `name_000003`, ...; with `overwrite`, `name`. `create` makes
/// the series of a candidate's master (`<name>_master.h5`) and claims its name exclusively:
/// when another process got there first it fails with a [`ClaimError::Exists`], and the
/// next number is tried. Returns the name and what `create` made.
pub fn claim_run<T>(dir: &Path, name: &str, suffixes: &[&str], overwrite: bool, mut create: impl FnMut(&Path) -> Result<T, SinkError>) -> anyhow::Result<(String, T)> {
    let free = |n: &str| !suffixes.iter().any(|s| claim::taken(&dir.join(format!("{n}{s}"))));
    let candidates = std::iter::once(name.to_string()).chain((2u32..=999_999).map(|k| format!("{name}_{k:06}")));
    for n in candidates.filter(|n| overwrite || free(n)) {
        if overwrite {
            // replaced files must be files: a link of the run's names is refused before it starts
            let files: Vec<PathBuf> = suffixes.iter().map(|s| dir.join(format!("{n}{s}"))).collect();
            refuse_existing(files.iter().map(PathBuf::as_path), true)?;
        }
        match create(&dir.join(format!("{n}_master.h5"))) {
            Err(SinkError::Claim(ClaimError::Exists(_))) if !overwrite => continue,
            r => return Ok((n, r?)),
        }
    }
    anyhow::bail!("{}: every run number of {name} is taken", dir.display())
}

/// Warns when the filesystem holding `dir` has less free space than `need` bytes (`what`
/// says what they are). Compression makes most runs smaller, so this is a warning only.
pub fn warn_if_short(dir: &Path, need: u64, what: &str) {
    match rdaq_sink::space::free_bytes(dir) {
        Ok(free) if free < need => eprintln!(
            "rdaq: warning: {} has {:.1} MB free; this run may write up to {:.1} MB ({what}); if the disk fills up, \
             writing stops and the file keeps the frames written before",
            dir.display(),
            free as f64 / 1e6,
            need as f64 / 1e6
        ),
        Ok(_) => {}
        Err(e) => eprintln!("rdaq: warning: cannot read the free space of {}: {e}", dir.display()),
    }
}

/// Warns when the writer could not hold space back for closing its file.
pub fn warn_without_reserve(w: &rdaq_sink::NxmxWriter, path: &Path) {
    if !w.has_reserve() {
        eprintln!(
            "rdaq: warning: cannot hold {} MiB of disk space beside {}: if the disk fills up, the file may not close cleanly",
            rdaq_sink::RESERVE_BYTES >> 20,
            path.display()
        );
    }
}

/// Closes the data file and squares the consumer's counts with what the file holds (after a
/// failed write, HDF5 may hold fewer frames than were handed to it). Keeps the file only if
/// it holds a frame: a run that saved nothing leaves no empty file behind (the summary says
/// so).
pub fn close(w: rdaq_sink::NxmxWriter, stats: &mut ConsumeStats) -> anyhow::Result<Option<PathBuf>> {
    let closed = w.finish()?;
    if closed.frames < stats.written {
        stats.not_saved += stats.written - closed.frames;
        stats.written = closed.frames;
    }
    if let (Some(why), Some(e)) = (&closed.untrimmed, stats.write_error.as_mut()) {
        e.push_str(&format!("; the data set keeps the failed frame's row after the {} frames listed in frame_number ({why})", closed.frames));
    }
    if let Some(why) = closed.unreadable {
        // the frames are in the files but no reader would decode them: data not saved
        stats.write_error.get_or_insert(why);
    }
    if closed.frames > 0 {
        return Ok(Some(closed.path));
    }
    std::fs::remove_file(&closed.path).map_err(|e| anyhow::anyhow!("cannot remove the empty {}: {e}", closed.path.display()))?;
    Ok(None)
}

/// Writes what the modules sent (see [`rdaq_emulator::manifest_csv`]) to a new file (or
/// replacing one, with `overwrite`).
pub fn write_manifest(path: &Path, m: &[rdaq_emulator::ManifestEntry], overwrite: bool) -> anyhow::Result<()> {
    write_file(path, rdaq_emulator::manifest_csv(m).as_bytes(), overwrite)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `claim_run` hands `create`: a claim of the master's name, as the writer makes.
    fn claim_master(p: &Path) -> Result<PathBuf, SinkError> {
        claim::claim(p, false)?;
        Ok(p.to_owned())
    }

    #[test]
    fn subdirectories_stay_under_the_root_and_links_are_not_followed() {
        let base = std::env::temp_dir().join(format!("rdaq-subdir-{}", std::process::id()));
        let (root, outside) = (base.join("root"), base.join("outside"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
        std::fs::write(root.join("file"), b"").unwrap();
        for bad in ["../x", "/etc", "a/../../x", "a\nb"] {
            assert!(subdirectory("directory", bad).is_err(), "{bad}");
        }
        let made = make_subdirectory("directory", &root, &subdirectory("directory", "a/./b").unwrap()).unwrap();
        assert_eq!(made, root.join("a/b"));
        assert!(made.is_dir());
        assert_eq!(make_subdirectory("directory", &root, Path::new("a/b")).unwrap(), made, "again: it exists");
        let e = make_subdirectory("directory", &root, Path::new("escape/x")).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(!outside.join("x").exists(), "nothing made through the link");
        assert!(make_subdirectory("directory", &root, Path::new("file/x")).unwrap_err().to_string().contains("not a directory"));
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn runs_are_numbered_and_named_files_refused() {
        let dir = std::env::temp_dir().join(format!("rdaq-outputs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sfx = ["_master.h5", "_manifest.csv"];
        let name = |overwrite| claim_run(&dir, "run", &sfx, overwrite, claim_master).unwrap().0;
        assert_eq!(name(false), "run");
        // the master just claimed is taken now: the next run is numbered
        assert_eq!(name(false), "run_000002");
        std::fs::write(dir.join("run_000003_manifest.csv"), "x").unwrap();
        assert_eq!(name(false), "run_000004");
        let replace = |p: &Path| -> Result<PathBuf, SinkError> { Ok(claim::claim(p, true).map(|()| p.to_owned())?) };
        assert_eq!(claim_run(&dir, "run", &sfx, true, replace).unwrap().0, "run", "--overwrite takes the name itself");
        let e = refuse_existing([dir.join("run_000002_master.h5").as_path()], false).unwrap_err().to_string();
        assert!(e.contains("run_000002_master.h5 exists") && e.contains("--overwrite"), "{e}");
        refuse_existing([dir.join("run_000002_master.h5").as_path()], true).unwrap();
        refuse_existing([dir.join("new.h5").as_path()], false).unwrap();
        std::os::unix::fs::symlink(dir.join("nowhere"), dir.join("dangling.h5")).unwrap();
        for overwrite in [false, true] {
            let e = refuse_existing([dir.join("dangling.h5").as_path()], overwrite).unwrap_err().to_string();
            assert!(e.contains("symbolic link"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn runs_started_together_get_different_names() {
        let dir = std::env::temp_dir().join(format!("rdaq-outputs-race-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let barrier = std::sync::Barrier::new(8);
        let names: Vec<String> = std::thread::scope(|s| {
            let runs: Vec<_> = (0..8).map(|_| s.spawn(|| {
                barrier.wait();
                claim_run(&dir, "run", &["_master.h5", "_manifest.csv"], false, claim_master).unwrap().0
            })).collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let unique: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(unique.len(), 8, "{names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
