//! `rdaq join OUT MASTER...`: one master over the series of several receivers of one
//! acquisition ([`rdaq_sink::join`]), every frame once, in frame order, the data files left
//! where they are. `rdaq manage` writes it by itself when the receivers' files are visible
//! from its host.

use std::path::PathBuf;

use clap::Args;

#[derive(Args)]
pub struct JoinArgs {
    /// The master file to write (`<name>_master.h5`); refused if it exists, unless --overwrite.
    #[arg(long)]
    out: PathBuf,
    /// Replace the --out file if it exists.
    #[arg(long)]
    overwrite: bool,
    /// The receivers' master files; their data files are found beside them.
    #[arg(required = true)]
    masters: Vec<PathBuf>,
}

pub fn join(a: JoinArgs) -> anyhow::Result<()> {
    let j = rdaq_sink::join::join(&a.out, &a.masters, a.overwrite)?;
    println!("master      : {} joins {} frames of {} data files", a.out.display(), j.frames, j.data_files);
    Ok(())
}
