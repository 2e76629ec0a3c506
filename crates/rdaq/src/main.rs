//! rdaq: data acquisition for high-rate 2D X-ray detectors.

mod offline;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use rdaq_detector::Geometry;
use rdaq_emulator::{Control, EmulatorConfig};
use rdaq_proto::telegram::BufferMap;
use rdaq_receiver::{Format, Receiver, ReceiverConfig};
use rdaq_sink::{NxmxMeta, NxmxWriter};

use rdaq_control::{detector, manage, receiver as daemon};
use rdaq_run::config::{self, Config};
use rdaq_run::run::{recv_buffer_line, single_receiver_dtps, write_manifest};
use rdaq_run::summary::{Expected, Summary};
use rdaq_run::{consume, outputs, progress_bar};

#[derive(Parser)]
#[command(name = "rdaq", version, about = "Data acquisition for high-rate 2D X-ray detectors")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// End-to-end acquisition on this host: emulated JUNGFRAU modules -> receiver -> NXmx file.
    Run(RunArgs),
    /// Emulate detector modules sending to a receiver's buffers (see `receive --buffers-out`).
    Emulate(EmulateArgs),
    /// Receive rdaq datagrams or native JUNGFRAU packets into a frame ring and an NXmx file.
    Receive(ReceiveArgs),
    /// System manager: plan and run an acquisition over detector and receiver daemons.
    Manage(manage::ManageArgs),
    /// Processing stages on HDF5 files: conversion, pedestal from dark runs, spot finding.
    #[command(subcommand)]
    Process(offline::ProcessCmd),
    /// Benchmarks (commands, not tests): print a table against a baseline measured in the same run.
    #[command(subcommand)]
    Bench(rdaq_bench::BenchCmd),
}

#[derive(Args)]
struct RunArgs {
    /// TOML configuration; every field has a default (see rdaq.example.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    frames: Option<u64>,
    #[arg(long)]
    modules: Option<u16>,
    /// Frames per second (0: as fast as possible).
    #[arg(long)]
    rate: Option<f64>,
    /// Output directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Exit 0 even if frames were lost.
    #[arg(long)]
    tolerate_loss: bool,
    /// Replace the files of an earlier run of the same name (default: number this run).
    #[arg(long)]
    overwrite: bool,
    /// Write the raw words, no processing (process.mode = "raw").
    #[arg(long)]
    raw: bool,
    /// Write the summary as JSON here too.
    #[arg(long)]
    summary_json: Option<PathBuf>,
    /// Topology file: run the planned system (several receivers, any transfer mode) in this
    /// process, over the receivers' data addresses (which must be local). Default: one receiver.
    #[arg(long)]
    topology: Option<PathBuf>,
}

#[derive(Args)]
struct EmulateArgs {
    /// Run as a daemon with a control API on this address (the system manager configures it).
    #[arg(long)]
    serve: Option<SocketAddr>,
    /// Daemon: detector name and module count.
    #[arg(long, default_value = "det")]
    name: String,
    #[arg(long, default_value_t = 1)]
    modules: u16,
    /// The receiver's buffer map (JSON written by `rdaq receive --buffers-out`).
    #[arg(long, required_unless_present = "serve")]
    buffers: Option<PathBuf>,
    /// Receiver data address.
    #[arg(long, default_value = "127.0.0.1")]
    target: IpAddr,
    #[arg(long, default_value_t = 100)]
    frames: u64,
    #[arg(long, default_value_t = 0)]
    first_frame: u64,
    /// Frames per second (0: as fast as possible).
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long)]
    no_gso: bool,
    /// Write the manifest (frame, module, xxh3 of the raw module frame) here.
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Replace an existing manifest file.
    #[arg(long)]
    overwrite: bool,
}

#[derive(Args)]
struct ReceiveArgs {
    /// Run as a daemon with a control API on this address: buffers are defined by the system
    /// manager, data arrives on --bind.
    #[arg(long)]
    serve: Option<SocketAddr>,
    /// Daemon: receiver name, memory for buffers, directory for output files.
    #[arg(long, default_value = "dr0")]
    name: String,
    #[arg(long, default_value_t = 1024)]
    memory_mib: u64,
    #[arg(long, default_value = ".")]
    out_dir: PathBuf,
    /// rdaq (RDMA-style datagrams) or sls (native JUNGFRAU packets).
    #[arg(long, default_value = "rdaq")]
    format: String,
    /// UDP interfaces per JUNGFRAU module (sls format): 1 or 2.
    #[arg(long, default_value_t = 1)]
    interfaces: u8,
    /// Rows the JUNGFRAU reads out around the module centre (sls format; the detector's
    /// `readnrows`): 8 to 512, a multiple of 8. Frames are that many rows high.
    #[arg(long, default_value_t = rdaq_receiver::engine::JUNGFRAU_ROWS)]
    read_rows: u16,
    #[arg(long, default_value_t = 1)]
    modules: u16,
    /// Modules per row of the module grid in the assembled image.
    #[arg(long, default_value_t = 1)]
    module_cols: u16,
    /// Gap pixels between modules (fast axis, slow axis).
    #[arg(long, default_value_t = rdaq_detector::geometry::DEFAULT_GAP_X)]
    gap_x: usize,
    #[arg(long, default_value_t = rdaq_detector::geometry::DEFAULT_GAP_Y)]
    gap_y: usize,
    /// Address the data ports listen on. The default takes only local senders (an emulator
    /// on this host, PSI's virtual detector); for a detector on a network card use that
    /// card's address (the detector's `udp_dstip`), or 0.0.0.0 for every interface.
    #[arg(long, default_value = "127.0.0.1")]
    bind: IpAddr,
    /// First data port: module m (interface i) listens on port + m (* interfaces + i).
    /// 50001 is the slsDetectorPackage default (`udp_dstport`).
    #[arg(long, default_value_t = 50001)]
    port: u16,
    #[arg(long, default_value_t = 8192)]
    payload_bytes: u32,
    #[arg(long, default_value_t = 256)]
    ring_mib: usize,
    #[arg(long, default_value_t = 64)]
    recv_buffer_mib: usize,
    /// Longest the receiver lets datagrams gather between two reads of a running stream
    /// (fewer wake-ups for slow streams, at most this much latency; 0: read at once).
    #[arg(long, default_value_t = 4.0)]
    coalesce_ms: f64,
    #[arg(long, default_value_t = 500)]
    frame_timeout_ms: u64,
    /// keep or discard incomplete frames.
    #[arg(long, default_value = "keep")]
    policy: String,
    /// Stop after this many frames.
    #[arg(long)]
    frames: Option<u64>,
    /// Stop after this many seconds in any case.
    #[arg(long)]
    timeout_s: Option<f64>,
    /// NXmx output file (none: frames are counted and dropped). An existing file is refused
    /// unless --overwrite.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Replace the --out file if it exists.
    #[arg(long)]
    overwrite: bool,
    /// Exit 0 even if frames were lost or incomplete.
    #[arg(long)]
    tolerate_loss: bool,
    /// Write the buffer map (ids, keys, ports) for the senders here.
    #[arg(long)]
    buffers_out: Option<PathBuf>,
    #[arg(long)]
    summary_json: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Run(a) => run(a),
        Cmd::Emulate(a) => emulate(a),
        Cmd::Receive(a) => receive(a),
        Cmd::Manage(a) => manage::manage(a),
        Cmd::Process(p) => offline::process(p).map(|()| ExitCode::SUCCESS),
        Cmd::Bench(b) => rdaq_bench::bench(b),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rdaq: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Stops the emulator on Ctrl-C; the receiver then finishes as after a normal end.
fn on_interrupt(progress: Arc<Control>) {
    let _ = ctrlc::set_handler(move || {
        eprintln!("rdaq: interrupted, finishing");
        progress.stop.store(true, Ordering::Relaxed);
    });
}

fn run(a: RunArgs) -> anyhow::Result<ExitCode> {
    let mut cfg = match &a.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    if let Some(f) = a.frames {
        cfg.emulator.frames = f;
    }
    if let Some(m) = a.modules {
        cfg.detector.modules = m;
    }
    if let Some(r) = a.rate {
        cfg.emulator.rate_hz = r;
    }
    if let Some(o) = a.out {
        cfg.output.dir = o;
    }
    cfg.output.tolerate_loss |= a.tolerate_loss;
    cfg.output.overwrite |= a.overwrite;
    if a.raw {
        cfg.process.mode = "raw".into();
    }
    cfg.check()?;
    let control = Arc::new(Control::default());
    on_interrupt(control.clone());
    if let Some(t) = &a.topology {
        return run_topology(&cfg, t, control);
    }
    let sum = rdaq_run::run::run(&cfg, control, &progress_bar(Some(cfg.emulator.frames), "run"))?;
    sum.print();
    if let Some(p) = a.summary_json {
        sum.write_json(&p)?;
    }
    Ok(sum.exit_code("run", cfg.output.tolerate_loss))
}

/// Prints each receiver's summary of a run of a plan; the exit status is the worst.
fn run_topology(cfg: &Config, path: &Path, control: Arc<Control>) -> anyhow::Result<ExitCode> {
    let (sums, emu) = rdaq_run::topology::run(cfg, path, control)?;
    let mut worst = ExitCode::SUCCESS;
    for (name, sum) in sums {
        println!("---- receiver {name} ----");
        sum.print();
        if sum.lost() {
            worst = sum.exit_code("run", cfg.output.tolerate_loss);
        }
    }
    println!("sent: {} datagrams, {:.3} GB in {:.2} s", emu.sent.datagrams, emu.sent.bytes as f64 / 1e9, emu.elapsed.as_secs_f64());
    Ok(worst)
}

fn emulate(a: EmulateArgs) -> anyhow::Result<ExitCode> {
    if let Some(addr) = a.serve {
        if a.modules == 0 || a.modules > 64 {
            bail!("--modules must be 1..=64");
        }
        let opts = detector::Options { name: a.name, modules: a.modules, seed: a.seed };
        rdaq_control::http::serve(addr, detector::router(opts), "emulate")?;
        return Ok(ExitCode::SUCCESS);
    }
    let buffers = a.buffers.expect("clap requires --buffers without --serve");
    let text = std::fs::read_to_string(&buffers).with_context(|| format!("cannot read {}", buffers.display()))?;
    let map: BufferMap = serde_json::from_str(&text).with_context(|| format!("{} is not a buffer map", buffers.display()))?;
    if !(a.rate >= 0.0) {
        bail!("--rate must be 0 (as fast as possible) or positive");
    }
    let cfg = EmulatorConfig {
        modules: map.modules,
        frames: a.frames,
        first_frame: a.first_frame,
        rate_hz: (a.rate > 0.0).then_some(a.rate),
        gso: !a.no_gso,
        synth: rdaq_detector::SynthConfig { seed: a.seed, ..Default::default() },
        ..EmulatorConfig::default()
    };
    let progress = Arc::new(Control::default());
    let p2 = progress.clone();
    let _ = ctrlc::set_handler(move || p2.stop.store(true, Ordering::Relaxed));
    if map.data_ports.len() != map.modules as usize {
        bail!("{}: {} data ports for {} modules", buffers.display(), map.data_ports.len(), map.modules);
    }
    outputs::refuse_existing(a.manifest.as_deref(), a.overwrite)?;
    let r = rdaq_emulator::run(&cfg, &single_receiver_dtps(&map, a.target), progress)?;
    if let Some(m) = &a.manifest {
        write_manifest(m, &r.manifest)?;
    }
    let secs = r.elapsed.as_secs_f64();
    println!(
        "rdaq emulate: {} modules x {} frames, {} datagrams, {:.3} GB in {:.3} s ({:.2} GB/s), gso {}, late frames {}, \
         held back by a slower module {}, refused {}, requests {} (malformed {}), resent {}, not in history {}",
        map.modules,
        a.frames,
        r.sent.datagrams,
        r.sent.bytes as f64 / 1e9,
        secs,
        r.sent.bytes as f64 / 1e9 / secs,
        r.gso,
        r.late_frames,
        r.held_back,
        r.sent.refused,
        r.retransmit.nacks,
        r.retransmit.bad_nacks,
        r.retransmit.resent,
        r.retransmit.history_misses
    );
    if r.refused_in_frames > 0 {
        eprintln!("rdaq emulate: {} sends of frames were refused: nothing listened at the receiver's port (exit 1)", r.refused_in_frames);
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

fn receive(a: ReceiveArgs) -> anyhow::Result<ExitCode> {
    if let Some(addr) = a.serve {
        std::fs::create_dir_all(&a.out_dir).with_context(|| format!("cannot create {}", a.out_dir.display()))?;
        let opts = daemon::Options {
            name: a.name,
            data: a.bind,
            memory_bytes: a.memory_mib << 20,
            out_dir: a.out_dir,
            policy: config::parse_policy(&a.policy).context("--policy")?,
            frame_timeout: Duration::from_millis(a.frame_timeout_ms),
            recv_buffer: a.recv_buffer_mib << 20,
        };
        rdaq_control::http::serve(addr, daemon::router(opts), "receive")?;
        return Ok(ExitCode::SUCCESS);
    }
    let format = match a.format.as_str() {
        "rdaq" if a.read_rows != rdaq_receiver::engine::JUNGFRAU_ROWS => bail!("--read-rows is a setting of native JUNGFRAU packets (--format sls)"),
        "rdaq" => Format::Rdaq,
        "sls" => Format::Sls { interfaces: a.interfaces, rows: a.read_rows },
        other => bail!("--format must be rdaq or sls, not {other:?}"),
    };
    if a.read_rows == 0 || a.read_rows > 512 || a.read_rows % 8 != 0 {
        bail!("--read-rows {} must be 8 to 512, a multiple of 8", a.read_rows);
    }
    let geometry = Geometry::new(a.modules, a.module_cols, a.gap_x, a.gap_y)
        .with_context(|| format!("--module-cols {} must divide --modules {} into whole rows", a.module_cols, a.modules))?
        .with_module_height(a.read_rows as usize);
    let frame_bytes = a.modules as usize * geometry.module_bytes();
    let slots = (a.ring_mib << 20) / frame_bytes.max(1);
    if slots < 2 {
        bail!("--ring-mib {} holds fewer than 2 frames of {} bytes", a.ring_mib, frame_bytes);
    }
    let rcfg = ReceiverConfig {
        format,
        bind: a.bind,
        data_port: a.port,
        modules: a.modules,
        module_bytes: geometry.module_bytes() as u64,
        payload_bytes: a.payload_bytes,
        slots,
        recv_buffer: a.recv_buffer_mib << 20,
        coalesce: Duration::try_from_secs_f64(a.coalesce_ms / 1e3).ok().filter(|d| *d <= Duration::from_millis(100)).context("--coalesce-ms must be 0 to 100")?,
        frame_timeout: Duration::from_millis(a.frame_timeout_ms),
        policy: config::parse_policy(&a.policy).context("--policy")?,
        frames: a.frames,
        ..ReceiverConfig::default()
    };
    outputs::refuse_existing(a.out.as_deref(), a.overwrite)?;
    let mut rx = Receiver::start(rcfg).context("starting the receiver")?;
    if let Some(p) = &a.buffers_out {
        std::fs::write(p, serde_json::to_string_pretty(rx.buffer_map())?).with_context(|| format!("cannot write {}", p.display()))?;
    }
    let ports: Vec<SocketAddr> = rx.ports().iter().map(|&p| SocketAddr::new(a.bind, p)).collect();
    eprintln!("rdaq receive: listening on {ports:?}, {slots} slots, {}", recv_buffer_line(a.recv_buffer_mib << 20, rx.recv_buffer_granted()));
    let mut writer = match &a.out {
        Some(p) => {
            let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            if let Some(n) = a.frames {
                let frame = (geometry.height() * geometry.width() * 2) as u64;
                outputs::warn_if_short(dir, n * frame, &format!("{n} frames of {:.1} MB before compression", frame as f64 / 1e6));
            }
            let w = NxmxWriter::create(p, &NxmxMeta::jungfrau(geometry, 12.4, 0.0))?;
            outputs::warn_without_reserve(&w, p);
            Some(w)
        }
        None => None,
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let _ = ctrlc::set_handler(move || s2.store(true, Ordering::Relaxed));
    let bar = progress_bar(a.frames, "receive");
    let start = Instant::now();
    let mut consumed = std::thread::scope(|s| {
        let rx_ref = &rx;
        let w = writer.as_mut().map(|w| (w, geometry));
        let consumer = s.spawn(|| consume::consume(rx_ref, w, &bar, None, |_| {}));
        let deadline = a.timeout_s.map(|t| start + Duration::from_secs_f64(t));
        while !consumer.is_finished() {
            if stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
                rx.stop();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        consumer.join().expect("consumer thread panicked")
    })?;
    bar.finish();
    let counters = rx.join()?;
    let h5 = match writer {
        Some(w) => outputs::close(w, &mut consumed)?,
        None => None,
    };
    let expected = a.frames.map_or(Expected::Unknown, Expected::Count);
    let sum = Summary::for_receiver(expected, &counters, &rx.outcome(), &consumed, start.elapsed(), h5.as_deref());
    sum.print();
    if let Some(p) = a.summary_json {
        sum.write_json(&p)?;
    }
    if !rx.guards_intact() {
        bail!("a guard region around the frame ring was overwritten: this is a bug");
    }
    if counters.datagrams == 0 && a.bind.is_loopback() {
        eprintln!("rdaq receive: nothing arrived on {ports:?}: a detector on a network card sends to that card's address; use --bind <its address> or --bind 0.0.0.0");
    }
    Ok(sum.exit_code("receive", a.tolerate_loss))
}
