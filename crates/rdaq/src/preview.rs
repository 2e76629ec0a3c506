//! `rdaq preview`: the latest image of a run's preview stream, or a frame of a master file,
//! as a PNG with its spots circled (`rdaq_preview`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use rdaq_preview::{from_file, from_stream, render, write_png, Shown};

#[derive(Args)]
#[command(group = clap::ArgGroup::new("source").required(true).args(["from", "file"]))]
pub struct PreviewArgs {
    /// A run's preview endpoint (stream.preview), e.g. tcp://receiver-host:31002.
    #[arg(long)]
    from: Option<String>,
    /// A master file (`<name>_master.h5`).
    #[arg(long)]
    file: Option<PathBuf>,
    /// The frame of the file to show (its index in the series, from 0).
    #[arg(long, default_value_t = 0, requires = "file")]
    frame: usize,
    /// Where to write the picture.
    #[arg(long)]
    png: PathBuf,
    /// How long to wait for an image on the stream.
    #[arg(long, value_parser = rdaq_run::config::seconds_arg, default_value_t = 10.0)]
    timeout_s: f64,
    /// Replace the --png file if it exists.
    #[arg(long)]
    overwrite: bool,
}

pub fn preview(a: PreviewArgs) -> anyhow::Result<()> {
    rdaq_run::outputs::refuse_existing([a.png.as_path()], a.overwrite)?;
    let p = match (&a.from, &a.file) {
        (Some(endpoint), _) => {
            anyhow::ensure!(a.timeout_s > 0.0 && a.timeout_s.is_finite(), "--timeout-s must be positive");
            from_stream(endpoint, Duration::from_secs_f64(a.timeout_s))?
        }
        (None, Some(file)) => from_file(file, a.frame)?,
        (None, None) => unreachable!("clap requires a source"),
    };
    let picture = render(&Shown { width: p.width, height: p.height, values: &p.values, spots: &p.spots, pixel_size_m: p.pixel_size_m });
    let out = rdaq_sink::claim::create(&a.png, a.overwrite)?;
    write_png(&picture, std::io::BufWriter::new(out)).with_context(|| format!("cannot write {}", a.png.display()))?;
    println!("preview: frame {}, {} x {} pixels, {} spots -> {}", p.frame_number, p.width, p.height, p.spots.len(), a.png.display());
    Ok(())
}
