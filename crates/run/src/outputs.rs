//! Output files and the rule that protects them: rdaq never overwrites data unless told to
//! (`--overwrite`). A file named on the command line that exists is refused before anything
//! starts (exit 2); `rdaq run`, whose file names come from a run name, numbers the run
//! instead (`rdaq_run_000002`). The free space is checked against what a run may write, and
//! a data file that would hold no frame is not kept.

use std::path::{Path, PathBuf};

use anyhow::bail;

use crate::consume::ConsumeStats;

/// Fails, naming the file, when one of `paths` exists and `overwrite` is off.
pub fn refuse_existing<'a>(paths: impl IntoIterator<Item = &'a Path>, overwrite: bool) -> anyhow::Result<()> {
    if overwrite {
        return Ok(());
    }
    for p in paths {
        if p.exists() {
            bail!("{} exists: rdaq does not overwrite data (choose another name, or add --overwrite to replace it)", p.display());
        }
    }
    Ok(())
}

/// The files of the series whose master is `master` that an earlier run would have left:
/// the master and its first data file (refused like any other existing file).
pub fn series_files(master: &Path) -> [PathBuf; 2] {
    [master.to_owned(), master.with_file_name(rdaq_sink::data_file_name(master, 1))]
}

/// The run name whose files (`<name><suffix>` in `dir` for each suffix) do not exist yet:
/// `name` itself, else `name_000002`, `name_000003`, ...; with `overwrite`, `name`.
pub fn free_run_name(dir: &Path, name: &str, suffixes: &[&str], overwrite: bool) -> String {
    let taken = |n: &str| suffixes.iter().any(|s| dir.join(format!("{n}{s}")).exists());
    if overwrite || !taken(name) {
        return name.to_string();
    }
    (2u32..)
        .map(|k| format!("{name}_{k:06}"))
        .find(|n| !taken(n))
        .expect("some run number is free")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_numbered_and_named_files_refused() {
        let dir = std::env::temp_dir().join(format!("rdaq-outputs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sfx = [".h5", "_manifest.csv"];
        assert_eq!(free_run_name(&dir, "run", &sfx, false), "run");
        std::fs::write(dir.join("run_manifest.csv"), "x").unwrap();
        assert_eq!(free_run_name(&dir, "run", &sfx, false), "run_000002");
        std::fs::write(dir.join("run_000002.h5"), "x").unwrap();
        assert_eq!(free_run_name(&dir, "run", &sfx, false), "run_000003");
        assert_eq!(free_run_name(&dir, "run", &sfx, true), "run");
        let e = refuse_existing([dir.join("run_000002.h5").as_path()], false).unwrap_err().to_string();
        assert!(e.contains("run_000002.h5 exists") && e.contains("--overwrite"), "{e}");
        refuse_existing([dir.join("run_000002.h5").as_path()], true).unwrap();
        refuse_existing([dir.join("new.h5").as_path()], false).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
