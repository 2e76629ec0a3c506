//! `rdaq write`: NXmx files from a Stream V2 stream (`rdaq_run::write`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use rdaq_run::progress_bar;
use rdaq_run::write::{write as write_series, WriteOptions};
use rdaq_stream::SocketKind;

use crate::interrupt::on_interrupt;

#[derive(Args)]
pub struct WriteArgs {
    /// The publisher's endpoint, e.g. tcp://receiver-host:31001; several (--from A --from B,
    /// one per receiver of an acquisition) are written as one series in frame order, the
    /// parts of receivers that each hold some of the modules joined into whole images.
    #[arg(long, required = true)]
    from: Vec<String>,
    /// Output directory (none: no files; then --stream).
    #[arg(long, required_unless_present = "stream")]
    out: Option<PathBuf>,
    /// Publish the merged series again as one Stream V2 series on this endpoint (one live
    /// stream of the receivers' shares: one start, every image once in frame order, one end).
    #[arg(long)]
    stream: Option<String>,
    /// The joined stream's socket: push (consumers share the images) or pub.
    #[arg(long, default_value = "push")]
    stream_socket: String,
    /// The joined stream's policy when its consumers are slower: drop (counted) or block.
    #[arg(long, default_value = "drop")]
    stream_policy: String,
    /// Files are <NAME>_master.h5, <NAME>_data_000001.h5, ...
    #[arg(long, default_value = "series")]
    name: String,
    /// Images per data file (default: what the source says, else 1000).
    #[arg(long)]
    images_per_file: Option<usize>,
    /// The publisher's socket is PUB (subscribe to every image) instead of PUSH.
    #[arg(long)]
    sub: bool,
    /// Give up after this many seconds without a message (default: wait for the end).
    #[arg(long, value_parser = rdaq_run::config::seconds_arg)]
    idle_timeout_s: Option<f64>,
    /// Replace existing files of that name.
    #[arg(long)]
    overwrite: bool,
    /// Write the report as JSON here too.
    #[arg(long)]
    summary_json: Option<PathBuf>,
}

pub fn write(a: WriteArgs) -> anyhow::Result<ExitCode> {
    if a.images_per_file == Some(0) {
        anyhow::bail!("--images-per-file must be at least 1");
    }
    rdaq_run::outputs::plain_name("--name", &a.name)?;
    let idle_timeout = a.idle_timeout_s.map(Duration::from_secs_f64);
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    on_interrupt("rdaq write", "closing the files", move || flag.store(true, Ordering::Relaxed));
    let stream = match a.stream {
        Some(endpoint) => {
            let s = rdaq_run::config::Stream { endpoint, socket: a.stream_socket, policy: a.stream_policy, ..Default::default() };
            s.config().map_err(|e| anyhow::anyhow!("--stream: {e}"))?
        }
        None => None,
    };
    let o = WriteOptions {
        from: a.from,
        socket: if a.sub { SocketKind::Pub } else { SocketKind::Push },
        dir: a.out,
        stream,
        name: Some(a.name),
        images_per_file: a.images_per_file,
        overwrite: a.overwrite,
        idle_timeout,
    };
    rdaq_run::outputs::refuse_existing(a.summary_json.as_deref(), a.overwrite)?;
    eprintln!("rdaq write: waiting for a series from {}", o.from.join(", "));
    let report = write_series(&o, &stop, &progress_bar(None, "write"))?;
    report.print();
    if let Some(p) = a.summary_json {
        rdaq_run::outputs::write_file(&p, serde_json::to_string_pretty(&report)?.as_bytes(), a.overwrite)?;
    }
    if report.complete() {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("rdaq write: the series did not arrive whole (exit 1)");
    Ok(ExitCode::from(1))
}
