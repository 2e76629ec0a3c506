//! rdaq: data acquisition for high-rate 2D X-ray detectors. The binary parses the command
//! line and calls the libraries: one module per command, and the exit status (0 all frames
//! complete and saved, 1 data lost or not saved, 2 errors).

mod acquire;
mod check;
mod emulate;
mod interrupt;
#[cfg(test)]
mod edges;
mod join;
mod offline;
mod preview;
mod receive;
mod recover;
mod run;
mod sls_drive;
mod write;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use rdaq_control::{manager, service};

#[derive(Parser)]
#[command(name = "rdaq", version = env!("RDAQ_VERSION_LONG"), about = "Data acquisition for high-rate 2D X-ray detectors")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Log lines of the daemons and the manager (on stderr): text, or one JSON object per line.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Lowest level logged: error, warn, info, debug, trace (RUST_LOG, when set, wins).
    #[arg(long, global = true, default_value = "info", value_parser = ["error", "warn", "info", "debug", "trace"])]
    log_level: String,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Logs through `tracing` to stderr, at the level and in the format asked for.
fn init_logs(format: LogFormat, level: &str) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("RUST_LOG") {
        Ok(f) => EnvFilter::try_new(f).map_err(|e| anyhow::anyhow!("RUST_LOG: {e}"))?,
        Err(_) => EnvFilter::try_new(level).map_err(|e| anyhow::anyhow!("--log-level {level:?}: {e}"))?,
    };
    // colour codes only on a terminal: in a file or a pipe they are noise (and forge nothing)
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(colour).with_env_filter(filter);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    Ok(())
}

#[derive(Subcommand)]
enum Cmd {
    /// End-to-end acquisition on this host: emulated JUNGFRAU modules -> receiver -> NXmx file.
    Run(run::RunArgs),
    /// Write NXmx files from a Stream V2 stream (a receiver's, on another host).
    Write(write::WriteArgs),
    /// The picture a scientist looks at: the latest image of a run's preview, or a frame of
    /// a master file, as a PNG with its spots circled and a scale bar.
    Preview(preview::PreviewArgs),
    /// Emulate detector modules sending to a receiver's buffers (see `receive --buffers-out`).
    Emulate(emulate::EmulateArgs),
    /// Receive rdaq datagrams or native JUNGFRAU packets into a frame ring and an NXmx file.
    Receive(receive::ReceiveArgs),
    /// System manager: plan and run an acquisition over detector and receiver daemons.
    Manage(manager::ManageArgs),
    /// Make a crashed writer's series whole again: clear the data files' writer flags, trim
    /// them to their frame tables, write the master for what they hold, remove leftovers.
    Recover(recover::RecoverArgs),
    /// One master over the series of several receivers of an acquisition: every frame once,
    /// in frame order (virtual datasets over their data files).
    Join(join::JoinArgs),
    /// Processing stages on HDF5 files: conversion, pedestal from dark runs, spot finding.
    #[command(subcommand)]
    Process(offline::ProcessCmd),
    /// What this host can run: CPUs, memory, AF_XDP, and the GPU with every kernel compared
    /// with the CPU on it (exit 0: the GPU path runs here; 3: no usable GPU; 1: a kernel
    /// differs).
    Check(check::CheckArgs),
    /// Benchmarks (commands, not tests): print a table against a baseline measured in the same run.
    #[command(subcommand)]
    Bench(rdaq_bench::BenchCmd),
    /// Write the manual pages (rdaq.1 and one per subcommand) into DIR, from this help: the
    /// Debian package's (scripts/deb.sh).
    #[command(hide = true)]
    Manpages {
        dir: std::path::PathBuf,
    },
}

fn main() -> ExitCode {
    dispatch(Cli::parse())
}

/// Runs the command the line asked for; errors end in one line and exit status 2.
fn dispatch(cli: Cli) -> ExitCode {
    if let Err(e) = init_logs(cli.log_format, &cli.log_level) {
        eprintln!("rdaq: error: {e:#}");
        return ExitCode::from(2);
    }
    let r = match cli.cmd {
        Cmd::Run(a) => run::run(a),
        Cmd::Write(a) => write::write(a),
        Cmd::Preview(a) => preview::preview(a).map(|()| ExitCode::SUCCESS),
        Cmd::Emulate(a) => emulate::emulate(a),
        Cmd::Receive(a) => receive::receive(a),
        Cmd::Manage(a) if a.serves_datasets() => service::system::serve(&a),
        Cmd::Manage(a) => manager::manage(a),
        Cmd::Process(p) => offline::process(p).map(|()| ExitCode::SUCCESS),
        Cmd::Recover(a) => recover::recover(a).map(|()| ExitCode::SUCCESS),
        Cmd::Join(a) => join::join(a).map(|()| ExitCode::SUCCESS),
        Cmd::Check(a) => check::check(a),
        Cmd::Bench(b) => rdaq_bench::bench(b),
        Cmd::Manpages { dir } => clap_mangen::generate_to(Cli::command(), &dir)
            .map(|()| ExitCode::SUCCESS)
            .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display())),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rdaq: error: {e:#}");
            ExitCode::from(2)
        }
    }
}


