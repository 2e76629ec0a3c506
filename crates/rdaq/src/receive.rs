//! `rdaq receive`: a receiver on its own (rdaq datagrams or a detector's native packets into a
//! frame ring and an NXmx file), or the receiver daemon (`--serve`).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use rdaq_control::auth::AccessArgs;
use rdaq_control::receiver as daemon;
use rdaq_detector::Description;
use rdaq_emulator::Control;
use rdaq_run::config::Config;
use rdaq_run::drive::{Ask, Drive, LANDED, PATIENCE};
use rdaq_run::pedestal;
use rdaq_run::receive::{Ended, Ending};
use rdaq_run::remote;
use rdaq_run::receiver_report::{recv_buffer_line, report_tuning};
use rdaq_run::summary::Summary;
use rdaq_run::{outputs, progress_bar};

use crate::acquire::{set, AcquireArgs};
use crate::interrupt::{on_interrupt, Interrupts};
use crate::sls_drive::SlsArgs;

/// Seconds without a datagram after which an acquisition of a known frame count ends.
const DEFAULT_QUIET_S: f64 = 10.0;

#[derive(Args)]
pub struct ReceiveArgs {
    #[command(flatten)]
    acq: AcquireArgs,
    /// Run as a daemon with a control API on this address (ADDRESS:PORT, or a port alone for
    /// localhost): buffers are defined by the system manager, data arrives on --bind.
    #[arg(long, value_parser = rdaq_control::http::listen_addr)]
    serve: Option<SocketAddr>,
    /// With --serve, the acquisition service of this receiver instead of the daemon: configured
    /// once from these options, then datasets armed and triggered through the API (POST
    /// /arm, /trigger, /cancel; GET /acquisition, /openapi.json), their files under this
    /// directory; for a detector's native packets (--format sls, --detector) that something
    /// else triggers.
    #[arg(long, requires = "serve", value_name = "DIR", conflicts_with_all = ["out", "frames", "timeout_s", "quiet_s", "buffers_out", "summary_json", "pedestal_run", "dashboard", "out_dir", "memory_mib", "overwrite", "tolerate_loss", "frame_time_s"])]
    data_root: Option<PathBuf>,
    #[command(flatten)]
    access: AccessArgs,
    /// Daemon and service: receiver name (the daemon's and the metrics' label). Daemon:
    /// memory for buffers, directory for output files.
    #[arg(long, default_value = "dr0")]
    name: String,
    #[arg(long, default_value_t = 1024)]
    memory_mib: u64,
    #[arg(long, default_value = ".")]
    out_dir: PathBuf,
    /// rdaq (RDMA-style datagrams), sls (native JUNGFRAU packets) or roce (RoCEv2 RDMA
    /// WRITEs; needs --engine af_xdp).
    #[arg(long, default_value = "rdaq")]
    format: String,
    /// Native packets of this detector: a shipped description (jungfrau, eiger,
    /// percival-like) or a description file (docs/detectors.md). Replaces --format.
    #[arg(long, conflicts_with = "format")]
    detector: Option<String>,
    /// Pixel bit depth the detector sends (its `dr`; default: the description's).
    #[arg(long)]
    bit_depth: Option<u32>,
    /// Link whose packet size the detector sends (e.g. 1g, 10g; default: the description's
    /// largest packets).
    #[arg(long)]
    link: Option<String>,
    /// Put gap pixels between the chips of each module (the description's [chips]), with
    /// the edge pixels' counts shared with them.
    #[arg(long)]
    gap_pixels: bool,
    /// RoCEv2 path MTU: payload bytes per packet (256, 512, 1024, 2048 or 4096).
    #[arg(long, default_value_t = 4096)]
    roce_mtu: u32,
    /// RoCEv2: the number of the first frame the modules write (the receiver numbers the
    /// frames from it; each frame's immediate confirms it).
    #[arg(long, default_value_t = 0)]
    first_frame: u64,
    /// UDP interfaces per JUNGFRAU module (sls format): 1 or 2.
    #[arg(long, default_value_t = 1)]
    interfaces: u8,
    /// Rows the JUNGFRAU reads out around the module centre (sls format; the detector's
    /// `readnrows`): 8 to 512, a multiple of 8. Frames are that many rows high.
    #[arg(long, default_value_t = rdaq_receiver::engine::JUNGFRAU_ROWS)]
    read_rows: u16,
    /// Modules per row of the module grid in the assembled image (detector.module_cols,
    /// default 1).
    #[arg(long)]
    module_cols: Option<u16>,
    /// Gap pixels between modules, fast axis and slow axis (detector.gap_x, default 8, and
    /// detector.gap_y, default 36).
    #[arg(long)]
    gap_x: Option<usize>,
    #[arg(long)]
    gap_y: Option<usize>,
    /// Address the data ports listen on (network.bind). The default, 127.0.0.1, takes only
    /// local senders (an emulator on this host, PSI's virtual detector); for a detector on a
    /// network card use that card's address (the detector's `udp_dstip`), or 0.0.0.0 for
    /// every interface.
    #[arg(long)]
    bind: Option<IpAddr>,
    /// First data port (network.data_port, default 50001, the slsDetectorPackage's
    /// `udp_dstport`): module m (interface i) listens on port + m (* interfaces + i).
    #[arg(long)]
    port: Option<u16>,
    /// Payload bytes per rdaq datagram (network.payload_bytes, default 8192).
    #[arg(long)]
    payload_bytes: Option<u32>,
    /// Memory for the frame ring (receiver.ring_mib, default 256).
    #[arg(long)]
    ring_mib: Option<usize>,
    /// Kernel buffering per data port (socket buffer), or per interface queue for af_xdp
    /// (UMEM) (network.recv_buffer_mib, default 64).
    #[arg(long)]
    recv_buffer_mib: Option<usize>,
    /// Longest the receiver lets datagrams gather between two reads of a running stream
    /// (fewer wake-ups for slow streams, at most this much latency; 0: read at once)
    /// (network.coalesce_ms, default 4).
    #[arg(long)]
    coalesce_ms: Option<f64>,
    /// An incomplete frame is finished this long after its first datagram
    /// (receiver.frame_timeout_ms, default 500).
    #[arg(long)]
    frame_timeout_ms: Option<u64>,
    /// keep or discard incomplete frames (receiver.policy, default keep).
    #[arg(long)]
    policy: Option<String>,
    /// Stop after this many frames (also the stream's and the files' number of images).
    #[arg(long)]
    frames: Option<u64>,
    /// The detector's exposure per image (its exptime), for the files and the stream; not
    /// given: 0, unknown.
    #[arg(long)]
    count_time_s: Option<f64>,
    /// The detector's period between images, for the files and the stream; not given: 0,
    /// unknown.
    #[arg(long)]
    frame_time_s: Option<f64>,
    /// How the detector is triggered (detector.trigger_mode, for the files; a driven
    /// detector is set so): internal, external or gate.
    #[arg(long)]
    trigger_mode: Option<String>,
    /// Stop after this many seconds in any case.
    #[arg(long, value_parser = rdaq_run::config::seconds_arg)]
    timeout_s: Option<f64>,
    /// End once no datagram came for this many seconds after the first: the detector has
    /// finished, and frames not seen by then never arrived. Default: 10 with --frames (a
    /// detector that sends fewer frames is not waited for until --timeout-s), none without;
    /// 0: never (slow external triggers).
    #[arg(long, value_parser = rdaq_run::config::seconds_or_off_arg)]
    quiet_s: Option<f64>,
    /// NXmx output file (none: frames are counted and dropped). An existing file is refused
    /// unless --overwrite.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write the buffer map (ids, keys, ports) for the senders here.
    #[arg(long)]
    buffers_out: Option<PathBuf>,
    /// Serve this acquisition's web dashboard (the page of `rdaq run --serve`: rates, losses,
    /// the processing, the latest image, a stop button that needs the token) here:
    /// ADDRESS:PORT, or a port alone for localhost. After the acquisition, the page shows the
    /// summary until Ctrl-C.
    #[arg(long, value_parser = rdaq_control::http::listen_addr)]
    dashboard: Option<SocketAddr>,
    /// Record a JUNGFRAU pedestal run (dark frames in G0, then forced G1 and G2) into this
    /// calibration file, for the next acquisition's --calibration: each pixel's pedestal of
    /// each stage from the frames its gain bits put in that stage; the gains from
    /// process.gain_maps, else typical values.
    #[arg(long)]
    pedestal_run: Option<PathBuf>,
    #[command(flatten)]
    sls: SlsArgs,
}

/// The configuration of `rdaq receive`: the defaults of a detector outside this process,
/// the `--config` file, and the options.
fn config(a: &ReceiveArgs) -> anyhow::Result<Config> {
    let mut cfg = a.acq.config(Config::remote())?;
    set(&mut cfg.detector.module_cols, a.module_cols);
    set(&mut cfg.detector.gap_x, a.gap_x);
    set(&mut cfg.detector.gap_y, a.gap_y);
    set(&mut cfg.network.bind, a.bind);
    set(&mut cfg.network.data_port, a.port);
    set(&mut cfg.network.payload_bytes, a.payload_bytes);
    set(&mut cfg.network.recv_buffer_mib, a.recv_buffer_mib);
    set(&mut cfg.network.coalesce_ms, a.coalesce_ms);
    set(&mut cfg.receiver.ring_mib, a.ring_mib);
    set(&mut cfg.receiver.frame_timeout_ms, a.frame_timeout_ms);
    set(&mut cfg.receiver.policy, a.policy.clone());
    set(&mut cfg.detector.trigger_mode, a.trigger_mode.clone());
    cfg.check()?;
    Ok(cfg)
}

pub fn receive(a: ReceiveArgs) -> anyhow::Result<ExitCode> {
    let cfg = config(&a)?;
    if let (Some(addr), Some(_)) = (a.serve, &a.data_root) {
        return serve_datasets(a, cfg, addr);
    }
    if let Some(addr) = a.serve {
        return serve_receiver(a, &cfg, addr);
    }
    let mut setup = remote::setup(&source(&a, &cfg)?, &cfg)?;
    for n in &setup.notes {
        eprintln!("rdaq receive: {n}");
    }
    (setup.meta.count_time_s, setup.meta.frame_time_s) = told_times(&a)?;
    if a.pedestal_run.is_some() {
        setup.chain.pedestal_run = Some(pedestal::start(&setup.chain)?);
    }
    let chain_geometry = setup.chain.geometry;
    let processing = setup.chain.processing.is_some() || setup.chain.finding.is_some();
    let overwrite = cfg.output.overwrite;
    let series = a.out.as_deref().map(outputs::series_files);
    let named = series.iter().flatten().map(PathBuf::as_path).chain(a.buffers_out.as_deref()).chain(a.acq.summary_json.as_deref()).chain(a.pedestal_run.as_deref());
    outputs::refuse_existing(named, overwrite)?;
    let (count, frame) = told_times(&a)?;
    rdaq_proto::metadata::gate_exposure("--count-time-s", &cfg.detector.trigger_mode, count).map_err(|(field, why)| anyhow::anyhow!("{field}: {why}"))?;
    let drive_command = match &a.sls.sls_detector {
        Some(_) => {
            let ask = Ask::of(&cfg, &source(&a, &cfg)?, a.frames.unwrap_or_default(), (frame, count), a.pedestal_run.is_some(), cfg.detector.trigger_mode.clone())?;
            a.sls.driver().command(&ask)?
        }
        None => None,
    };
    let receiving = rdaq_run::receive::start(setup, &cfg, a.out.as_deref())?;
    let rx = &receiving.rx;
    if let Some(p) = &a.buffers_out {
        outputs::write_file(p, serde_json::to_string_pretty(rx.buffer_map())?.as_bytes(), overwrite)?;
    }
    let bind = cfg.network.bind;
    let ports: Vec<SocketAddr> = rx.ports().iter().map(|&p| SocketAddr::new(bind, p)).collect();
    let slots = rx.buffer_map().buffers.len();
    let what = if processing { cfg.processing_said() } else { "raw".into() };
    eprintln!("rdaq receive: listening on {ports:?} ({}), {slots} slots, {}; {what}", rx.engine(), recv_buffer_line(cfg.network.recv_buffer_mib << 20, rx.recv_buffer_granted()));
    eprintln!("rdaq receive: threads: {}", cfg.thread_budget().describe());
    report_tuning("rdaq receive", rx);
    let bar = progress_bar(a.frames, "receive");
    let stop = Arc::new(Control::default());
    let flag = stop.clone();
    let interrupted = on_interrupt("rdaq receive", "finishing", move || flag.stop.store(true, Ordering::Relaxed));
    let view = match a.dashboard {
        Some(addr) => Some(rdaq_control::run::serve(addr, a.access.access()?, format!("rdaq receive {}", ports[0]), a.frames, receiving.board(), stop.clone())?),
        None => None,
    };
    let deadline = a.timeout_s.map(|t| Instant::now() + Duration::from_secs_f64(t));
    let quiet = a.quiet_s.or(a.frames.map(|_| DEFAULT_QUIET_S)).filter(|&q| q > 0.0).map(Duration::from_secs_f64);
    let drive = drive_command.map(Drive::start).transpose()?;
    let finished = drive.as_ref().map(|d| (d.ended(), cfg.frame_timeout() + LANDED));
    let done = receiving.run(&bar, Ending { deadline, quiet, finished }, &stop);
    // a receiver that has its frames lets the detector end by itself; one stopped early
    // (Ctrl-C, the dashboard, the deadline, an error) stops the detector at once
    let early = stop.stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) || done.is_err();
    let patience = if early { Duration::ZERO } else { PATIENCE };
    let drove = drive.map(|d| d.finish(patience)).transpose();
    let done = done?;
    match done.ended {
        Ended::Quiet => eprintln!("rdaq receive: no datagram for {:.1} s: the detector has finished (--quiet-s)", quiet.unwrap_or_default().as_secs_f64()),
        Ended::Finished => eprintln!("rdaq receive: the detector says it has finished, and the datagrams in flight have landed"),
        Ended::Itself => {}
    }
    let sum = done.summary;
    sum.print();
    if let Some(p) = &a.acq.summary_json {
        sum.write_json(p, overwrite)?;
    }
    if let (Some(path), Some(run)) = (&a.pedestal_run, &done.pedestal_run) {
        for line in pedestal::save(&cfg, chain_geometry, run, path, overwrite)? {
            eprintln!("rdaq receive: {line}");
        }
    }
    if done.counters.datagrams == 0 && bind.is_loopback() {
        eprintln!("rdaq receive: nothing arrived on {ports:?}: a detector on a network card sends to that card's address; use --bind <its address> or --bind 0.0.0.0");
    }
    if let Some(v) = view {
        show_until_interrupted(&v, &sum, &interrupted);
    }
    drove?;
    Ok(sum.exit_code("receive", cfg.output.tolerate_loss))
}

/// Shows the summary on the dashboard until Ctrl-C (at once when Ctrl-C ended the
/// acquisition: the operator wants out).
fn show_until_interrupted(view: &rdaq_control::run::RunView, sum: &Summary, interrupted: &Interrupts) {
    view.finish(serde_json::json!({ "lost": sum.lost(), "summary": sum }));
    if !interrupted.seen() {
        eprintln!("rdaq receive: finished; the dashboard shows the summary until Ctrl-C");
    }
    interrupted.wait();
}

/// `rdaq receive --serve`: the receiver daemon, its buffers defined by the manager; its
/// configuration (with `--calibration`, say) is where every acquisition's starts.
fn serve_receiver(a: ReceiveArgs, cfg: &Config, addr: SocketAddr) -> anyhow::Result<ExitCode> {
    let standalone = [
        ("--out", a.out.is_some()),
        ("--pedestal-run", a.pedestal_run.is_some()),
        ("--buffers-out", a.buffers_out.is_some()),
        ("--summary-json", a.acq.summary_json.is_some()),
        ("--frames", a.frames.is_some()),
        ("--timeout-s", a.timeout_s.is_some()),
        ("--quiet-s", a.quiet_s.is_some()),
        ("--detector", a.detector.is_some()),
        ("--dashboard", a.dashboard.is_some()),
        ("--sls-detector", a.sls.sls_detector.is_some()),
    ];
    if let Some((opt, _)) = standalone.iter().find(|(_, given)| *given) {
        bail!("{opt} is an option of a receiver on its own; the daemon (--serve) writes what each POST /start asks into --out-dir");
    }
    std::fs::create_dir_all(&a.out_dir).with_context(|| format!("cannot create {}", a.out_dir.display()))?;
    let opts = daemon::Options {
        name: a.name,
        data: cfg.network.bind,
        memory_bytes: a.memory_mib << 20,
        out_dir: a.out_dir,
        policy: cfg.policy()?,
        frame_timeout: cfg.frame_timeout(),
        recv_buffer: cfg.network.recv_buffer_mib << 20,
        engine: cfg.network.engine.parse().map_err(|e: String| anyhow::anyhow!("network.engine: {e}"))?,
        stream: cfg.stream.config()?,
        config: cfg.clone(),
    };
    let access = Arc::new(a.access.access()?);
    daemon::serve(addr, opts, access)?;
    Ok(ExitCode::SUCCESS)
}

/// `rdaq receive --data-root DIR --serve ADDR`: the acquisition service of this receiver,
/// each dataset an acquisition of the chain above.
fn serve_datasets(a: ReceiveArgs, cfg: Config, addr: SocketAddr) -> anyhow::Result<ExitCode> {
    let opts = rdaq_control::service::receive::Options {
        name: a.name.clone(),
        addr,
        access: a.access.access()?,
        data_root: a.data_root.clone().expect("--data-root given"),
        source: source(&a, &cfg)?,
        driver: a.sls.driver(),
        config: cfg,
        // each dataset's arm gives the period
        count_time_s: told_times(&a)?.0,
    };
    rdaq_control::service::receive::serve(opts)?;
    Ok(ExitCode::SUCCESS)
}

/// What the detector sends, as the options say (the detector: --detector, or the
/// configuration's detector.name when it is not JUNGFRAU).
fn source(a: &ReceiveArgs, cfg: &Config) -> anyhow::Result<remote::Source> {
    let detector = match &a.detector {
        Some(name) => Some(Description::load(name)?),
        None => cfg.described()?,
    };
    Ok(remote::Source {
        detector,
        bit_depth: a.bit_depth.or(cfg.detector.bit_depth),
        link: a.link.clone().or_else(|| cfg.detector.link.clone()),
        gap_pixels: a.gap_pixels,
        roce_mtu: a.roce_mtu,
        first_frame: a.first_frame,
        interfaces: a.interfaces,
        read_rows: a.read_rows,
        frames: a.frames,
        ..remote::Source::new(&a.format)
    })
}

/// What the user told of the series that the detector's packets do not say: the exposure
/// and the period (not told: 0, unknown).
fn told_times(a: &ReceiveArgs) -> anyhow::Result<(f64, f64)> {
    let (count, frame) = (a.count_time_s.unwrap_or(0.0), a.frame_time_s.unwrap_or(0.0));
    rdaq_proto::times::check(count, frame).map_err(|(field, why)| anyhow::anyhow!("--{}: {why}", field.replace('_', "-")))?;
    Ok((count, frame))
}
