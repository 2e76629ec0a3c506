//! `rdaq run`: the main job, an acquisition on this host with the emulated detector
//! (`rdaq_run::emulated`), or a whole plan of receivers (`rdaq_run::topology`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use clap::Args;
use rdaq_emulator::Control;
use rdaq_run::board::Board;
use rdaq_run::config::Config;
use rdaq_run::progress_bar;

use crate::acquire::{set, AcquireArgs};
use crate::interrupt::on_interrupt;

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    acq: AcquireArgs,
    /// Frames the emulated detector sends (emulator.frames).
    #[arg(long)]
    frames: Option<u64>,
    /// Frames per second (emulator.rate_hz; 0: as fast as possible).
    #[arg(long)]
    rate: Option<f64>,
    /// Output directory (output.dir).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Serve the web dashboard and the run's API (/status, /events, POST /stop) here:
    /// ADDRESS:PORT, or a port alone for localhost. After the run, the page shows the
    /// summary until Ctrl-C.
    #[arg(long, value_parser = rdaq_control::http::listen_addr)]
    serve: Option<std::net::SocketAddr>,
    /// The token POST /stop needs (and reads with --protect-reads).
    #[command(flatten)]
    access: rdaq_control::auth::AccessArgs,
    /// Topology file: run the planned system (several receivers, any transfer mode) in this
    /// process, over the receivers' data addresses (which must be local). Default: one receiver.
    #[arg(long)]
    topology: Option<PathBuf>,
}


pub fn run(a: RunArgs) -> anyhow::Result<ExitCode> {
    let mut cfg = a.acq.config(Config::default())?;
    set(&mut cfg.emulator.frames, a.frames);
    set(&mut cfg.emulator.rate_hz, a.rate);
    set(&mut cfg.output.dir, a.out);
    cfg.check()?;
    rdaq_run::outputs::refuse_existing(a.acq.summary_json.as_deref(), cfg.output.overwrite)?;
    let control = Arc::new(Control::default());
    let stop = control.clone();
    let interrupts = on_interrupt("rdaq", "finishing", move || stop.stop.store(true, Ordering::Relaxed));
    if let Some(t) = &a.topology {
        if a.serve.is_some() {
            anyhow::bail!("--serve: the dashboard shows a run of one receiver; with --topology, run the daemons under `rdaq manage --serve`");
        }
        return run_topology(&cfg, t, control);
    }
    let board = Arc::new(Board::default());
    let view = match a.serve {
        Some(addr) => Some(rdaq_control::run::serve(addr, a.access.access()?, format!("rdaq run {}", cfg.output.name), Some(cfg.emulator.frames), board.clone(), control.clone())?),
        None => None,
    };
    let sum = rdaq_run::emulated::run(&cfg, control, board, &progress_bar(Some(cfg.emulator.frames), "run"))?;
    sum.print();
    if let Some(p) = a.acq.summary_json {
        sum.write_json(&p, cfg.output.overwrite)?;
    }
    if let Some(v) = view {
        v.finish(serde_json::json!({ "lost": sum.lost(), "summary": sum }));
        // a Ctrl-C during the run means the operator wants out; otherwise the page stays
        if !interrupts.seen() {
            eprintln!("rdaq run: finished; the dashboard shows the summary until Ctrl-C");
            interrupts.wait();
        }
    }
    Ok(sum.exit_code("run", cfg.output.tolerate_loss))
}

/// Prints each receiver's summary of a run of a plan; the exit status is the worst.
fn run_topology(cfg: &Config, path: &Path, control: Arc<Control>) -> anyhow::Result<ExitCode> {
    let (sums, emu) = rdaq_run::topology::run(cfg, path, control)?;
    let mut worst = ExitCode::SUCCESS;
    let mut text = String::new();
    for (name, sum) in sums {
        text.push_str(&format!("---- receiver {name} ----\n"));
        sum.write_to(&mut text);
        if sum.lost() {
            worst = sum.exit_code("run", cfg.output.tolerate_loss);
        }
    }
    text.push_str(&format!("sent: {} datagrams, {:.3} GB in {:.2} s\n", emu.sent.datagrams, emu.sent.bytes as f64 / 1e9, emu.elapsed.as_secs_f64()));
    rdaq_run::summary::print_out(&text);
    Ok(worst)
}

