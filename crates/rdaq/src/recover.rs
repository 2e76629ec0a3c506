//! `rdaq recover MASTER`: a series whose writer was killed (a crash, `kill -9`, a power
//! cut) made whole again ([`rdaq_sink::recover`]): the data files' writer flags cleared, each
//! trimmed to the frames its tables list, the master written for every frame they hold, and
//! the writer's hidden leftovers removed.

use std::path::PathBuf;

use clap::Args;

#[derive(Args)]
pub struct RecoverArgs {
    /// The series' master file (`<name>_master.h5`); its data files are found beside it.
    master: PathBuf,
}

pub fn recover(a: RecoverArgs) -> anyhow::Result<()> {
    use std::fmt::Write;
    let r = rdaq_sink::recover::recover(&a.master)?;
    let mut o = String::new();
    for (path, frames) in &r.data_files {
        writeln!(o, "data file   : {} ({frames} frames)", path.display())?;
    }
    if r.rows_dropped > 0 {
        writeln!(o, "dropped     : {} rows past the frame tables (frames whose write the crash interrupted)", r.rows_dropped)?;
    }
    for p in &r.removed {
        writeln!(o, "removed     : {}", p.display())?;
    }
    writeln!(o, "master      : {} lists {} frames", a.master.display(), r.frames)?;
    rdaq_run::summary::print_out(&o);
    Ok(())
}
