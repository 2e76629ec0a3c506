//! A single-receiver run (`rdaq run`): the emulated detector sends to one receiver in this
//! process, and its frames go through the online processing graph ([`crate::graph`]) or
//! straight to the NXmx file ([`crate::consume`]). The files of a run are named after it:
//! `<name>_master.h5` with `<name>_data_000001.h5`, ..., `<name>_manifest.csv`, and with
//! processing `<name>_truth.csv` and `<name>_calibration.h5`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use crossbeam_channel::Sender;
use indicatif::ProgressBar;
use rdaq_detector::Geometry;
use rdaq_emulator::described::{self, DescribedDetector};
use rdaq_emulator::Control;
use rdaq_receiver::{Format, Receiver, ReceiverConfig};
use rdaq_sink::{NxmxMeta, NxmxWriter};

use crate::config::Config;
use crate::acquisition::{self, Chain, Outcome};
use crate::remote::{self, Setup};
use crate::board::Board;
use crate::graph::{self, ProcessReport};
use crate::outputs::write_manifest;
use crate::plan::{emulated_series, plan, single_receiver_dtps};
use crate::receiver_report::{check_guards, recv_buffer_line, report_tuning};
use crate::stream::Stream;
use crate::{outputs, summary};

/// The files of a run named `<name>`, in the output directory.
pub const RUN_FILES: [&str; 5] = ["_master.h5", "_data_000001.h5", "_manifest.csv", "_truth.csv", "_calibration.h5"];

/// How often the receiver's counters are copied to the board.
const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// Runs the acquisition `cfg` describes (checked with [`Config::check`]) with one receiver;
/// `control` stops the detector early; `board` shows the run as it goes. Returns the
/// summary, not yet printed.
pub fn run(cfg: &Config, control: Arc<Control>, board: Arc<Board>, bar: &ProgressBar) -> anyhow::Result<summary::Summary> {
    run_delivering(cfg, control, board, bar, None)
}

/// [`run`], with every written frame of a processed run (or of a counting detector whose
/// spots are found) handed to `deliver` before its buffer is reused ([`graph::deliver`]:
/// the Python package's frames).
pub fn run_delivering(cfg: &Config, control: Arc<Control>, board: Arc<Board>, bar: &ProgressBar, deliver: Option<Sender<graph::deliver::Processed>>) -> anyhow::Result<summary::Summary> {
    let (detector, Setup { rcfg, mut chain, mut meta, notes }) = emulated_setup(cfg)?;
    for n in notes {
        eprintln!("rdaq run: {n}");
    }
    emulated_series(cfg, &mut meta);
    let geometry = chain.geometry;
    // a raw chain hands out nothing (an embedded acquisition refuses one before it starts)
    if let Some(tx) = deliver {
        chain.deliver_to(tx);
    }
    // what can fail at start (the stream's ports, the receiver's) before any file is made:
    // a run that fails to start leaves nothing behind
    let stream = Stream::open_configured(&cfg.stream, &meta, "rdaq run")?;
    let mut rx = Receiver::start(rcfg).context("starting the receiver")?;
    let (name, writer) = claim_run(cfg, &meta)?;
    let out = |suffix: &str| cfg.output.dir.join(format!("{name}{suffix}"));
    let frame_bytes = meta.image_bytes() as u64;
    let what = format!("{} frames of {:.1} MB before compression", cfg.emulator.frames, frame_bytes as f64 / 1e6);
    outputs::warn_if_short(&cfg.output.dir, cfg.emulator.frames * frame_bytes, &what);
    outputs::warn_without_reserve(&writer, &out("_master.h5"));
    eprintln!("{}", start_line(cfg, &rx));
    eprintln!("rdaq run: threads: {}", chain.threads.describe());
    if matches!(detector, Emulated::Jungfrau) {
        if let Some(line) = emulation_line(cfg, emulation_limit(cfg)) {
            eprintln!("rdaq run: {line}");
        }
    }
    report_tuning("rdaq run", &rx);
    // the described detector's sender keeps no send times: its frames have no send latency
    let sent = matches!(detector, Emulated::Jungfrau).then(|| control.clone());
    let chain = Chain { board: board.clone(), sent, ..chain };
    let sinks = acquisition::Sinks { writer: Some(writer), stream };
    let start = Instant::now();
    board.set_state("acquiring");
    let sampling = std::sync::atomic::AtomicBool::new(true);
    let (emu, outcome) = std::thread::scope(|s| {
        let (rx_ref, b, sampling) = (&rx, &*board, &sampling);
        s.spawn(move || {
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                b.sample(rx_ref.counters());
                std::thread::sleep(SAMPLE_EVERY);
            }
        });
        let consumer = s.spawn(move || {
            let _ended = ConsumerEnded(b);
            acquisition::consume(rx_ref, chain, sinks, bar, None, |_| {})
        });
        // the detector starts once the consumer takes frames: at 1 kHz a consumer still making
        // its frame buffers (hundreds of MB) left the receiver's ring to fill and refuse frames
        b.wait_consuming();
        let emu = emulate(&detector, cfg, &rx, &control);
        rx.stop();
        let outcome = consumer.join().expect("consumer thread panicked");
        sampling.store(false, std::sync::atomic::Ordering::Relaxed);
        (emu, outcome)
    });
    bar.finish();
    let elapsed = start.elapsed();
    let counters = rx.join()?;
    board.sample(counters);
    let emu = emu?;
    let Outcome { consumed, processed, h5, stream: streamed, threads, .. } = outcome?;
    let manifest = out("_manifest.csv");
    write_manifest(&manifest, &emu.manifest, cfg.output.overwrite)?;
    // stopped early (Ctrl-C, the API): the frames any module sent are those expected
    let sent = emu.manifest.iter().map(|e| e.frame + 1).max().unwrap_or(0);
    let stopped = control.stop.load(std::sync::atomic::Ordering::Relaxed) && sent < cfg.emulator.frames;
    let expected = if stopped { sent } else { cfg.emulator.frames };
    let mut sum = summary::Summary::new(expected, &emu, &counters, &rx.outcome(), &consumed, elapsed, h5.as_deref(), Some(&manifest)).with_receiver(&rx);
    sum.stopped_early_of = stopped.then_some(cfg.emulator.frames);
    sum.stream = streamed;
    sum.threads = Some(threads);

    if let Some(p) = processed {
        save_processing(cfg, geometry, p, &out, &mut sum, expected)?;
    }
    check_guards(&rx)?;
    Ok(sum)
}

/// The run's name and its series: the configured name, or the next free numbered one when
/// files of an earlier run (or of a run started at the same time) have it, unless told to
/// overwrite.
fn claim_run(cfg: &Config, meta: &NxmxMeta) -> anyhow::Result<(String, NxmxWriter)> {
    let (dir, overwrite) = (&cfg.output.dir, cfg.output.overwrite);
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (name, writer) = outputs::claim_run(dir, &cfg.output.name, &RUN_FILES, overwrite, |master| NxmxWriter::create(master, meta, overwrite))?;
    if name != cfg.output.name {
        eprintln!("rdaq run: {} has files of an earlier run: this run is {name} (--overwrite replaces instead)", cfg.output.name);
    }
    Ok((name, writer))
}

/// The frames per second this host's emulated modules can make: each sender makes its
/// module's synthetic frame before it sends it, and the senders share the cores with the
/// rest of the run. The making is timed on a few frames here; the sending is not counted.
fn emulation_limit(cfg: &Config) -> (f64, std::time::Duration) {
    let make = rdaq_emulator::config::frame_make_time(&cfg.synth());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let share = (cores / cfg.detector.modules.max(1) as f64).min(1.0);
    (share / make.as_secs_f64(), make)
}

/// Marks the consumer as ended when its thread leaves, however it leaves, so that nothing
/// waits for a consumer that failed before it took frames.
struct ConsumerEnded<'a>(&'a Board);

impl Drop for ConsumerEnded<'_> {
    fn drop(&mut self) {
        self.0.set_consuming();
    }
}

/// What the start says of the rate asked against what the host can emulate (`limit`, and
/// the time a module frame takes to make): a warning when it asks for more.
fn emulation_line(cfg: &Config, (limit, make): (f64, std::time::Duration)) -> Option<String> {
    let how = format!("{} senders each make a module frame in {:.1} ms", cfg.detector.modules, make.as_secs_f64() * 1e3);
    match cfg.rate() {
        None => Some(format!("the emulated detector sends as fast as this host makes its frames: at most about {limit:.0} frames/s ({how})")),
        Some(r) if r > limit => Some(format!(
            "warning: this host emulates at most about {limit:.0} frames/s ({how}), not the {r} Hz asked: frames start late (the summary's detector line counts them), and the rates measured are this host's, not the detector's"
        )),
        Some(_) => None,
    }
}

/// The detector this process emulates.
enum Emulated {
    /// JUNGFRAU modules sending rdaq datagrams.
    Jungfrau,
    /// A detector placed by header sending its own packets (`detector.name`).
    Described(Box<DescribedDetector>),
}

/// The detector `cfg` emulates, the receiver that takes its packets, and the chain of its
/// frames: JUNGFRAU's, or a described detector's as `rdaq receive --detector` takes them
/// ([`remote::setup`]).
fn emulated_setup(cfg: &Config) -> anyhow::Result<(Emulated, Setup)> {
    let Some(d) = cfg.described()? else {
        let geometry = cfg.geometry().expect("checked");
        let (meta, processing) = plan(cfg, geometry, None)?;
        let chain = Chain::new(cfg, geometry, processing, "receiver");
        return Ok((Emulated::Jungfrau, Setup { rcfg: receiver_config(cfg)?, chain, meta, notes: Vec::new() }));
    };
    if cfg.faults.config().is_some() {
        bail!("faults: loss, corruption and the other faults are the rdaq modules'; {} sends its own packets", d.name);
    }
    let source = remote::Source {
        detector: Some(d.clone()),
        bit_depth: cfg.detector.bit_depth,
        link: cfg.detector.link.clone(),
        frames: Some(cfg.emulator.frames),
        naming: remote::Naming::Fields("detector"),
        ..remote::Source::new("sls")
    };
    let setup = remote::setup(&source, cfg)?;
    let wire = d.wire(cfg.detector.bit_depth, cfg.detector.link.as_deref()).map_err(|e| anyhow::anyhow!("detector.{e}"))?;
    let det = DescribedDetector::new(&d, &wire, cfg.detector.modules, cfg.detector.module_cols).map_err(|e| anyhow::anyhow!("detector.name {}: {e}", d.name))?;
    Ok((Emulated::Described(Box::new(det)), setup))
}

/// Sends the emulated detector's frames to the receiver `rx`, until all are sent or
/// `control` stops it.
fn emulate(detector: &Emulated, cfg: &Config, rx: &Receiver, control: &Arc<Control>) -> anyhow::Result<rdaq_emulator::EmulatorReport> {
    match detector {
        Emulated::Jungfrau => {
            let dtps = single_receiver_dtps(rx.buffer_map(), cfg.network.bind);
            Ok(rdaq_emulator::run(&cfg.emulator(cfg.detector.modules), &dtps, control.clone())?)
        }
        Emulated::Described(det) => {
            // port p of module m listens on the receiver's (m * ports + p)-th port
            let dests: Vec<SocketAddr> = rx.ports().iter().map(|&p| SocketAddr::new(cfg.network.bind, p)).collect();
            // numbered from 0 like JUNGFRAU's, an even (reset) frame first
            Ok(described::send(det, &dests, 0, cfg.emulator.frames, cfg.rate(), cfg.emulator.gso, control)?.into())
        }
    }
}

fn receiver_config(cfg: &Config) -> anyhow::Result<ReceiverConfig> {
    cfg.tune(ReceiverConfig {
        format: Format::Rdaq,
        bind: cfg.network.bind,
        data_port: cfg.network.data_port,
        modules: cfg.detector.modules,
        module_bytes: rdaq_detector::MODULE_BYTES as u64,
        payload_bytes: cfg.network.payload_bytes,
        slots: cfg.slots(),
        frames: Some(cfg.emulator.frames),
        ..ReceiverConfig::default()
    })
}

fn start_line(cfg: &Config, rx: &Receiver) -> String {
    let slots = &rx.buffer_map().buffers;
    format!(
        "rdaq run: {} modules, {} frames at {}, {} slots of {:.1} MiB, ports {:?} ({}), {}; {}",
        cfg.detector.modules,
        cfg.emulator.frames,
        cfg.rate().map_or("full speed".to_string(), |r| format!("{r} Hz")),
        slots.len(),
        slots.first().map_or(0, |b| b.size) as f64 / (1u64 << 20) as f64,
        rx.ports(),
        rx.engine(),
        if cfg.processing() { cfg.processing_said() } else { "raw".to_string() },
        recv_buffer_line(cfg.network.recv_buffer_mib << 20, rx.recv_buffer_granted())
    )
}

/// Writes what the processing leaves beside the data file (the emulated detector's truth of
/// the `frames` the run expected, the tracked calibration) and adds its report to the summary.
fn save_processing(cfg: &Config, geometry: Geometry, mut p: ProcessReport, out: &dyn Fn(&str) -> PathBuf, sum: &mut summary::Summary, frames: u64) -> anyhow::Result<()> {
    write_truth(cfg, &geometry, &out("_truth.csv"), frames)?;
    if let Some(cal) = p.calibration.take() {
        let path = out("_calibration.h5");
        let cf = rdaq_process::calfile::CalFile { rows: geometry.height(), cols: geometry.width(), cal: (*cal).clone(), rms: None, frames: None };
        rdaq_sink::claim::claim(&path, cfg.output.overwrite)?;
        cf.save(&path)?;
        sum.calibration = Some(path);
    }
    sum.processing = Some(p);
    Ok(())
}

/// The synthetic detector's ground truth for the processing of its first `frames` (those
/// sent, when the run was stopped): per frame whether it was dark and a hit, and every
/// Bragg spot in image pixel coordinates (column x, row y).
fn write_truth(cfg: &Config, g: &Geometry, path: &Path, frames: u64) -> anyhow::Result<()> {
    use std::fmt::Write;
    let synths: Vec<_> = (0..g.modules).map(|m| rdaq_detector::ModuleSynth::new(cfg.synth(), m)).collect();
    let mut s = String::from("frame,dark,hit,x,y,photons\n");
    for frame in 0..frames {
        let (dark, hit) = (synths[0].is_dark(frame), synths[0].is_hit(frame));
        let _ = writeln!(s, "{frame},{},{},,,", dark as u8, hit as u8);
        for (m, syn) in synths.iter().enumerate() {
            let (r0, c0) = g.origin(m as u16);
            for sp in syn.spots(frame) {
                let _ = writeln!(s, "{frame},{},{},{:.4},{:.4},{:.1}", dark as u8, hit as u8, c0 as f64 + sp.x, r0 as f64 + sp.y, sp.photons);
            }
        }
    }
    outputs::write_file(path, s.as_bytes(), cfg.output.overwrite)
}

