//! `rdaq emulate`: emulated JUNGFRAU modules sending to a receiver's buffers, a described
//! detector's native packets (`--detector`), or the detector daemon (`--serve`).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use rdaq_control::auth::AccessArgs;
use rdaq_control::detector;
use rdaq_detector::Description;
use rdaq_emulator::described::{self, DescribedDetector};
use rdaq_emulator::{Control, EmulatorConfig, FaultConfig};
use rdaq_proto::telegram::{BufferMap, NativeRequest};
use rdaq_run::outputs;
use rdaq_run::outputs::write_manifest;
use rdaq_run::plan::single_receiver_dtps;

use crate::interrupt::on_interrupt;

#[derive(Args)]
pub struct EmulateArgs {
    /// Run as a daemon with a control API on this address, ADDRESS:PORT or a port alone for
    /// localhost (the system manager configures it).
    #[arg(long, value_parser = rdaq_control::http::listen_addr)]
    serve: Option<SocketAddr>,
    #[command(flatten)]
    access: AccessArgs,
    /// Daemon: detector name and module count.
    #[arg(long, default_value = "det")]
    name: String,
    #[arg(long, default_value_t = 1)]
    modules: u16,
    /// The receiver's buffer map (JSON written by `rdaq receive --buffers-out`).
    #[arg(long, required_unless_present_any = ["serve", "port"])]
    buffers: Option<PathBuf>,
    /// A described detector sent without a buffer map: the receiver's first data port
    /// (`rdaq receive --detector ... --port`); port p of module m goes to PORT + m x ports
    /// + p, as the receiver binds them. --modules says how many modules.
    #[arg(long, requires = "detector", conflicts_with_all = ["buffers", "serve"])]
    port: Option<u16>,
    /// Receiver data address.
    #[arg(long, default_value = "127.0.0.1")]
    target: IpAddr,
    #[arg(long, default_value_t = 100)]
    frames: u64,
    /// The first frame's number (default 0, or the first frame a RoCEv2 receiver's map names;
    /// with --detector 1, or 2 for a detector that sends reset frames).
    #[arg(long)]
    first_frame: Option<u64>,
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
    /// Testing: fraction of datagrams (packets) lost on purpose.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Testing: fraction with one bit flipped.
    #[arg(long, default_value_t = 0.0)]
    corrupt: f64,
    /// Testing: fraction sent twice.
    #[arg(long, default_value_t = 0.0)]
    duplicate: f64,
    /// Testing: fraction sent after later ones.
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// Send a described detector's native packets (eiger, or a description file placed by
    /// header) with a counting pattern, to a `rdaq receive --detector` of the same settings;
    /// with --serve, the detector daemon emulates it for `rdaq manage`.
    #[arg(long)]
    detector: Option<String>,
    /// The described detector's pixel bit depth (default: the description's).
    #[arg(long)]
    bit_depth: Option<u32>,
    /// The described detector's link (default: the one whose packets the receiver takes).
    #[arg(long)]
    link: Option<String>,
    /// Modules per row of the described detector's module grid (as the receiver's).
    #[arg(long, default_value_t = 1)]
    module_cols: u16,
}

/// The faults `--loss`, `--corrupt`, `--duplicate` and `--reorder` ask for (none: `None`).
fn faults(a: &EmulateArgs) -> anyhow::Result<Option<FaultConfig>> {
    let f = FaultConfig { seed: a.seed, loss: a.loss, corrupt: a.corrupt, duplicate: a.duplicate, reorder: a.reorder, ..FaultConfig::default() };
    f.check().map_err(|e| anyhow::anyhow!("fault rates: {e}"))?;
    Ok((!f.is_clean()).then_some(f))
}

/// The first frame: `--first-frame`, or the one a RoCEv2 receiver expects (which must agree).
fn first_frame(a: &EmulateArgs, map: &BufferMap, path: &std::path::Path) -> anyhow::Result<u64> {
    match (a.first_frame, map.roce.first()) {
        (Some(f), Some(qp)) if f != qp.first_frame => {
            bail!("--first-frame {f}: the RoCEv2 receiver of {} numbers its frames from {} (its --first-frame)", path.display(), qp.first_frame)
        }
        (f, qp) => Ok(f.or(qp.map(|q| q.first_frame)).unwrap_or(0)),
    }
}


pub fn emulate(a: EmulateArgs) -> anyhow::Result<ExitCode> {
    if a.detector.is_none() && (a.bit_depth.is_some() || a.link.is_some()) {
        bail!("--bit-depth and --link are settings of a --detector; JUNGFRAU's modules send 16-bit rdaq datagrams");
    }
    if let Some(addr) = a.serve {
        if a.modules == 0 || a.modules > 64 {
            bail!("--modules must be 1..=64");
        }
        let native = a.detector.as_deref().map(|name| served_native(&a, name)).transpose()?;
        let opts = detector::Options { name: a.name, modules: a.modules, seed: a.seed, native };
        let access = Arc::new(a.access.access()?);
        rdaq_control::http::serve(addr, detector::router(opts, access.clone()), "emulate", access)?;
        return Ok(ExitCode::SUCCESS);
    }
    rdaq_emulator::config::check_rate((a.rate != 0.0).then_some(a.rate)).map_err(|e| anyhow::anyhow!("--rate: {e}"))?;
    if let (Some(name), Some(port)) = (&a.detector, a.port) {
        return emulate_described(&a, name, Receiving::Port(port));
    }
    let buffers = a.buffers.clone().expect("clap requires --buffers without --serve or --port");
    let text = std::fs::read_to_string(&buffers).with_context(|| format!("cannot read {}", buffers.display()))?;
    let map: BufferMap = serde_json::from_str(&text).with_context(|| format!("{} is not a buffer map", buffers.display()))?;
    if let Some(name) = &a.detector {
        return emulate_described(&a, name, Receiving::Map(&map, &buffers));
    }
    let cfg = EmulatorConfig {
        modules: map.modules,
        frames: a.frames,
        first_frame: first_frame(&a, &map, &buffers)?,
        faults: faults(&a)?,
        rate_hz: (a.rate > 0.0).then_some(a.rate),
        gso: !a.no_gso,
        synth: rdaq_detector::SynthConfig { seed: a.seed, ..Default::default() },
        ..EmulatorConfig::default()
    };
    let progress = Arc::new(Control::default());
    let p2 = progress.clone();
    on_interrupt("rdaq emulate", "stopping", move || p2.stop.store(true, Ordering::Relaxed));
    if map.data_ports.len() != map.modules as usize {
        bail!("{}: {} data ports for {} modules", buffers.display(), map.data_ports.len(), map.modules);
    }
    outputs::refuse_existing(a.manifest.as_deref(), a.overwrite)?;
    let r = rdaq_emulator::run(&cfg, &single_receiver_dtps(&map, a.target), progress)?;
    if let Some(m) = &a.manifest {
        write_manifest(m, &r.manifest, a.overwrite)?;
    }
    let secs = r.elapsed.as_secs_f64();
    rdaq_run::summary::print_out(&format!(
        "rdaq emulate: {} modules x {} frames, {} datagrams, {:.3} GB in {:.3} s ({:.2} GB/s), gso {}, late frames {}, \
         held back by a slower module {}, refused {}, RoCEv2 frames refused by the interface {}, requests {} (malformed {}), resent {}, not in history {}\n",
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
        r.roce_refused,
        r.retransmit.nacks,
        r.retransmit.bad_nacks,
        r.retransmit.resent,
        r.retransmit.history_misses
    ));
    if r.refused_in_frames > 0 {
        eprintln!("rdaq emulate: {} sends of frames were refused: nothing listened at the receiver's port (exit 1)", r.refused_in_frames);
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// The receiver's data ports for `det`'s packets, checked against its buffer map when it
/// has one.
fn described_destinations(a: &EmulateArgs, det: &DescribedDetector, wire: &rdaq_detector::Wire, to: &Receiving) -> anyhow::Result<Vec<SocketAddr>> {
    match to {
        Receiving::Map(map, buffers) => {
            if wire.payload != map.payload_bytes as usize {
                bail!("--link {}: {}-byte packets, but the receiver of {} takes {}-byte packets", wire.link, wire.payload, buffers.display(), map.payload_bytes);
            }
            if det.module_bytes() != map.module_bytes {
                bail!("{}: the receiver holds module frames of {} bytes, {} at {} bits sends {}", buffers.display(), map.module_bytes, det.name(), wire.bits, det.module_bytes());
            }
            Ok(map.data_ports.iter().map(|&p| SocketAddr::new(a.target, p)).collect())
        }
        Receiving::Port(first) => {
            let ports = a.modules as usize * det.ports();
            if *first as usize + ports > 65_536 {
                bail!("--port {first}: {ports} ports from there run past 65535");
            }
            Ok((0..ports).map(|k| SocketAddr::new(a.target, first + k as u16)).collect())
        }
    }
}

/// The described detector the daemon emulates (`--serve --detector`).
fn served_native(a: &EmulateArgs, name: &str) -> anyhow::Result<detector::Native> {
    let request = NativeRequest {
        detector: Description::text(name)?,
        interfaces: 1,
        read_rows: 512,
        bit_depth: a.bit_depth,
        link: a.link.clone(),
        gap_pixels: false,
        module_cols: a.module_cols,
    };
    detector::Native::new(request, a.modules)
}

/// Where a described detector's packets go: the ports of a receiver's buffer map (which
/// says its packets' size too), or consecutive ports from a first one.
enum Receiving<'a> {
    Map(&'a BufferMap, &'a std::path::Path),
    Port(u16),
}

/// `rdaq emulate --detector`: a described detector's packets, port `p` of module `m` to the
/// receiver's data port `m * ports + p`.
fn emulate_described(a: &EmulateArgs, name: &str, to: Receiving) -> anyhow::Result<ExitCode> {
    if a.loss + a.corrupt + a.duplicate + a.reorder > 0.0 || a.manifest.is_some() {
        bail!("--loss, --corrupt, --duplicate, --reorder and --manifest are settings of the rdaq modules, not of --detector");
    }
    let d = Description::load(name)?;
    let link = match (a.link.as_deref(), &to) {
        (Some(l), _) => Some(l),
        (None, Receiving::Map(map, buffers)) => Some(d.link_of_payload(map.payload_bytes as usize).with_context(|| format!("{}: the receiver takes {}-byte packets, which {} sends on no link", buffers.display(), map.payload_bytes, d.name))?),
        (None, Receiving::Port(_)) => None,
    };
    let wire = d.wire(a.bit_depth, link).map_err(|e| anyhow::anyhow!("--{} {}: {}", e.field.replace('_', "-"), e.value, e.why))?;
    let modules = match &to {
        Receiving::Map(map, _) => map.modules,
        Receiving::Port(_) => a.modules,
    };
    let det = DescribedDetector::new(&d, &wire, modules, a.module_cols).map_err(|e| anyhow::anyhow!("--detector {name}: {e}"))?;
    let dests = described_destinations(a, &det, &wire, &to)?;
    let progress = Arc::new(Control::default());
    let p2 = progress.clone();
    on_interrupt("rdaq emulate", "stopping", move || p2.stop.store(true, Ordering::Relaxed));
    // sls detectors count frames from 1; a detector with reset frames starts with one (even)
    let first = a.first_frame.unwrap_or(if det.sends_reset_frames() { 2 } else { 1 });
    let r = described::send(&det, &dests, first, a.frames, (a.rate > 0.0).then_some(a.rate), !a.no_gso, &progress)?;
    let secs = r.elapsed.as_secs_f64();
    rdaq_run::summary::print_out(&format!(
        "rdaq emulate: {} modules of {} at {} bits x {} frames, {} datagrams of {} bytes, {:.3} GB in {:.3} s ({:.2} GB/s), late frames {}, refused {}\n",
        modules, d.name, wire.bits, r.frames, r.sent.datagrams, wire.payload + rdaq_proto::SLS_HEADER_LEN, r.sent.bytes as f64 / 1e9, secs, r.sent.bytes as f64 / 1e9 / secs, r.late_frames, r.sent.refused
    ));
    if r.sent.refused > 0 {
        eprintln!("rdaq emulate: {} sends were refused: nothing listened at the receiver's ports (exit 1)", r.sent.refused);
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
