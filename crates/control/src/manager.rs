//! `rdaq manage`: the system manager's acquisition, over the daemons' control APIs, in the
//! RASHPA initialization order: telegrams (components), buffers on each receiver (buffers,
//! RAS), DTPs to the detector (RAS map, DTP), start. While it runs, the manager checks every
//! receiver's heartbeat; when one stops answering, it re-plans the remaining frames over the
//! receivers left (where the plan allows it without touching their buffers). At the end it
//! gathers the events and writes a report in which a frame counts as received only if every
//! receiver it was sent to is alive and reported it complete.
//!
//! The runtime beside the sans-I/O [`rdaq_manager`]: one acquisition's steps (`session`),
//! the daemons' APIs (`client`), re-planning (`replan`), the report (`report`) and
//! what the manager's own API shows (`board`). The acquisition service over a system of
//! daemons runs its datasets through the same session ([`crate::service::system`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::http::lock;

#[derive(clap::Args)]
pub struct ManageArgs {
    /// Topology file (TOML): detector (with its control address), receivers, transfer mode.
    #[arg(long)]
    topology: PathBuf,
    #[arg(long, default_value_t = 100)]
    frames: u64,
    /// Frames per second (0: as fast as possible).
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Directory for the report, the events and the manifest (on the manager's host).
    #[arg(long, default_value = "out")]
    out: PathBuf,
    /// Heartbeat period.
    #[arg(long, default_value_t = 200)]
    pub(crate) heartbeat_ms: u64,
    /// Heartbeats a receiver may miss before it counts as dead.
    #[arg(long, default_value_t = 3)]
    misses: u32,
    /// Give up waiting for the detector after this long.
    #[arg(long, value_parser = rdaq_run::config::seconds_arg, default_value_t = 600.0)]
    timeout_s: f64,
    #[arg(long)]
    tolerate_loss: bool,
    /// Replace the report, events and manifest in --out, and the receivers' files of the same
    /// names (default: refuse, naming the file, before anything starts).
    #[arg(long)]
    overwrite: bool,
    /// Serve the manager's API here (/status, /events, /report): events as they are gathered,
    /// the report at the end; keeps serving after the run until Ctrl-C.
    #[arg(long, value_parser = crate::http::listen_addr)]
    pub(crate) serve: Option<SocketAddr>,
    /// Run as the acquisition service instead of one acquisition: configured once, then
    /// datasets armed and triggered through the API of --serve (POST /arm, /trigger,
    /// /cancel; GET /acquisition, /openapi.json), their files under this directory (the
    /// receivers' --out-dir, on one host). Each dataset says its frames, rate and files.
    #[arg(long, requires = "serve", value_name = "DIR", conflicts_with_all = ["frames", "rate", "out", "overwrite", "tolerate_loss"])]
    pub(crate) data_root: Option<PathBuf>,
    /// The token the manager sends to the daemons, and that its own API needs for reads
    /// when `--protect-reads` is given.
    #[command(flatten)]
    pub(crate) access: crate::auth::AccessArgs,
}

impl ManageArgs {
    /// Whether these options ask for the acquisition service (`--data-root`) rather than one
    /// acquisition.
    pub fn serves_datasets(&self) -> bool {
        self.data_root.is_some()
    }
}

mod board;
mod client;
mod processing;
mod replan;
mod report;
mod session;

pub(crate) use board::{described as board_described, router as board_router, Board};
pub(crate) use session::{Files, Names, Running, Session};
use report::{print_report, JOINED};

/// The manager's acquisition: configure, start, watch, gather, report. Exit 1 when data was
/// lost (unless `--tolerate-loss`). With `--data-root` the command serves the acquisition
/// service instead ([`crate::service::system`]).
pub fn manage(a: ManageArgs) -> anyhow::Result<ExitCode> {
    let s = Session::open(&a)?;
    s.check_telegrams()?;
    // Ctrl-C or SIGTERM ends the acquisition as `POST /stop` does (the detector stopped,
    // the receivers' files closed, the report written); after it, the API's serving
    let (interrupted, interrupts) = std::sync::mpsc::channel();
    let board = s.shared.clone();
    ctrlc::set_handler(move || {
        lock(&board).stop_requested = true;
        let _ = interrupted.send(());
    })?;
    let frame_time_s = if a.rate > 0.0 { 1.0 / a.rate } else { 0.0 };
    let names = Names { prefix: None, directory: None, overwrite: a.overwrite, sections: s.sections.clone(), times: (0.0, frame_time_s) };
    let mut run = s.begin(&names)?;
    s.send(&mut run, 0, a.frames, a.rate)?;
    let files = Files { report: a.out.join("report.json"), events: a.out.join("events.jsonl"), manifest: a.out.join("manifest.csv"), master: a.out.join(JOINED), overwrite: a.overwrite };
    let report = s.end(run, &files, a.frames)?;
    let loss = report.lost();
    s.publish(&report, loss, &files)?;
    print_report(&report, &files.report);
    if a.serve.is_some() {
        tracing::info!("done; the API keeps serving the report until Ctrl-C");
        let _ = interrupts.recv();
    }
    if loss && !a.tolerate_loss {
        tracing::warn!("data was lost (use --tolerate-loss to exit 0 anyway)");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
