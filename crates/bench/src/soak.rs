//! `rdaq bench soak`: many small frames through the emulator with injected faults (loss in
//! bursts, reordering, duplication, corruption) to one receiver that verifies checksums,
//! detects loss and asks for retransmission; every frame must arrive bit-exact (its xxh3
//! against the emulator's manifest). A clean run of the same frames first is the baseline.
//! With `--roce-mtu`, the frames go as RoCEv2 WRITEs over a veth pair between two network
//! namespaces into the software RoCEv2 target (AF_XDP engine), and the RC protocol recovers
//! what the faults spoil (ICRC drops, NAKs, go-back-N) instead of rdaq's NACKs.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rdaq_emulator::{Control, EmulatorConfig, EmulatorReport, FaultConfig};
use rdaq_proto::telegram::ModuleDtp;
use rdaq_receiver::FrameStatus;
use rdaq_net::engine::EngineKind;
use rdaq_net::netns::VethPair;
use rdaq_receiver::{Counters, Format, IncompletePolicy, Receiver, ReceiverConfig};

/// The most frames of a soak (the checker keeps a hash of each) and of the sender's history.
const MAX_FRAMES: u64 = 100_000_000;
/// The largest frame, and the most memory the sender's history and the ring may take.
const MAX_FRAME_BYTES: u64 = 64 << 20;
const MAX_MEMORY: u64 = 16 << 30;

#[derive(clap::Args, Clone)]
pub struct SoakArgs {
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=MAX_FRAMES))]
    frames: u64,
    /// Bytes per frame (one module).
    #[arg(long, default_value_t = 65_536, value_parser = clap::value_parser!(u64).range(1..=MAX_FRAME_BYTES))]
    frame_bytes: u64,
    #[arg(long, default_value_t = 8192)]
    payload_bytes: u32,
    /// Frames per second.
    #[arg(long, default_value_t = 20_000.0)]
    rate: f64,
    /// Frames of the clean baseline run (0: none).
    #[arg(long, default_value_t = 100_000)]
    baseline_frames: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Fraction of datagrams lost, in bursts of `burst` on average.
    #[arg(long, default_value_t = 0.001)]
    loss: f64,
    #[arg(long, default_value_t = 4.0)]
    burst: f64,
    #[arg(long, default_value_t = 0.01)]
    reorder: f64,
    #[arg(long, default_value_t = 0.0001)]
    duplicate: f64,
    #[arg(long, default_value_t = 0.00001)]
    corrupt: f64,
    /// Receiver ring slots and sender history, in frames.
    #[arg(long, default_value_t = 2048)]
    slots: usize,
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=MAX_FRAMES))]
    history_frames: u64,
    /// Print the result as JSON (for tests) instead of a table.
    #[arg(long)]
    json: bool,
    /// RoCEv2 with this path MTU over a veth pair (AF_XDP engine; needs root), instead of
    /// rdaq datagrams with checksums over loopback (0).
    #[arg(long, default_value_t = 0)]
    roce_mtu: u32,
}

/// What one run delivered.
struct Outcome {
    /// From the start to the last frame handed on (the senders' lingering not included).
    elapsed: Duration,
    sent: u64,
    exact: u64,
    mismatched: u64,
    incomplete: u64,
    missing: u64,
    rx: Counters,
    tx: EmulatorReport,
}

/// The receiver of a run: rdaq datagrams with checksums on loopback, or the RoCEv2 target
/// in the receiving namespace of `pair`.
fn start_receiver(a: &SoakArgs, pair: Option<&VethPair>) -> anyhow::Result<Receiver> {
    let cfg = ReceiverConfig {
        modules: 1,
        module_bytes: a.frame_bytes,
        payload_bytes: a.payload_bytes,
        slots: a.slots,
        data_port: 0,
        checksum: true,
        policy: IncompletePolicy::Keep,
        frame_timeout: Duration::from_secs(1),
        recv_buffer: 64 << 20,
        linger: Duration::from_millis(100),
        ..ReceiverConfig::default()
    };
    let Some(p) = pair else { return Ok(Receiver::start(cfg)?) };
    let cfg = ReceiverConfig {
        format: Format::Roce { mtu: a.roce_mtu, first_frame: 0, frame_stride: 1 },
        engine: EngineKind::AfXdp,
        bind: p.receiver_ip.into(),
        payload_bytes: a.roce_mtu,
        checksum: false,
        ..cfg
    };
    // the receive thread lives in the namespace of the thread that starts it
    std::thread::scope(|s| s.spawn(|| -> anyhow::Result<Receiver> {
        VethPair::enter(&p.receiver_ns)?;
        Ok(Receiver::start(cfg)?)
    }).join().expect("receiver start panicked"))
}

fn run(a: &SoakArgs, frames: u64, faults: Option<FaultConfig>, progress: bool, pair: Option<&VethPair>) -> anyhow::Result<Outcome> {
    let mut receiver = start_receiver(a, pair)?;
    let ip: std::net::IpAddr = pair.map_or([127, 0, 0, 1].into(), |p| p.receiver_ip.into());
    let addr = std::net::SocketAddr::new(ip, receiver.ports()[0]);
    let dtp = ModuleDtp::single(receiver.buffer_map(), 0, addr);
    let cfg = EmulatorConfig {
        modules: 1,
        frames,
        rate_hz: Some(a.rate),
        module_bytes: a.frame_bytes,
        history_bytes: a.history_frames * a.frame_bytes,
        faults,
        synth: rdaq_detector::synth::SynthConfig { seed: a.seed, ..Default::default() },
        ..EmulatorConfig::default()
    };
    let control = Arc::new(Control::default());
    let bar = progress.then(|| rdaq_run::progress_bar(Some(frames), if cfg.faults.is_some() { "soak" } else { "clean" }));
    let start = Instant::now();
    let (tx, hashes, incomplete, last) = std::thread::scope(|s| -> anyhow::Result<_> {
        let consumer = s.spawn(|| {
            let mut hashes: Vec<Option<u64>> = vec![None; frames as usize];
            let mut incomplete = 0u64;
            let mut last = start;
            for f in receiver.frames().iter() {
                last = Instant::now();
                if let Some(b) = &bar {
                    b.inc(1);
                }
                match f.status() {
                    FrameStatus::Discarded => continue,
                    FrameStatus::Incomplete => incomplete += 1,
                    FrameStatus::Complete => {
                        if let Some(h) = hashes.get_mut(f.frame() as usize) {
                            *h = Some(xxhash_rust::xxh3::xxh3_64(receiver.data(&f).expect("a complete frame of this receiver")));
                        }
                    }
                }
                receiver.release(f).expect("a frame of this receiver");
            }
            (hashes, incomplete, last)
        });
        let tx = s
            .spawn(|| -> anyhow::Result<EmulatorReport> {
                if let Some(p) = pair {
                    VethPair::enter(&p.sender_ns)?;
                }
                Ok(rdaq_emulator::run(&cfg, &[dtp], control.clone()).context("emulator")?)
            })
            .join()
            .expect("emulator panicked");
        // stopped also when the emulator failed: the consumer ends with the receiver
        receiver.stop();
        let tx = tx?;
        let (hashes, incomplete, last) = consumer.join().expect("consumer panicked");
        Ok((tx, hashes, incomplete, last))
    })?;
    let rx = receiver.join()?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let mut o = Outcome { elapsed: last - start, sent: tx.manifest.len() as u64, exact: 0, mismatched: 0, incomplete, missing: 0, rx, tx };
    for e in &o.tx.manifest {
        match hashes.get(e.frame as usize).copied().flatten() {
            Some(h) if h == e.xxh3 => o.exact += 1,
            Some(_) => o.mismatched += 1,
            None => o.missing += 1,
        }
    }
    Ok(o)
}

pub fn soak(a: SoakArgs) -> anyhow::Result<ExitCode> {
    for (what, frames) in [("--history-frames", a.history_frames), ("--slots", a.slots as u64)] {
        anyhow::ensure!(frames.saturating_mul(a.frame_bytes) <= MAX_MEMORY, "{what} {frames} of --frame-bytes {} take more than {} GiB", a.frame_bytes, MAX_MEMORY >> 30);
    }
    let faults = FaultConfig {
        seed: a.seed,
        loss: a.loss,
        burst: a.burst,
        reorder: a.reorder,
        duplicate: a.duplicate,
        corrupt: a.corrupt,
        ..FaultConfig::default()
    };
    faults.check().map_err(anyhow::Error::msg)?;
    let pair = (a.roce_mtu > 0).then(|| VethPair::create("soak", 9000).context("the veth pair for RoCEv2 (needs root and iproute2)")).transpose()?;
    let pair = pair.as_ref();
    let baseline = if a.baseline_frames > 0 { Some(run(&a, a.baseline_frames.min(a.frames), None, !a.json, pair)?) } else { None };
    let soak = run(&a, a.frames, Some(faults), !a.json, pair)?;
    let ok = soak.exact == a.frames;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&json(&a, &soak, baseline.as_ref()))?);
    } else {
        print_table(&a, &soak, baseline.as_ref());
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn rate(o: &Outcome) -> f64 {
    o.sent as f64 / o.elapsed.as_secs_f64()
}

fn json(a: &SoakArgs, o: &Outcome, base: Option<&Outcome>) -> serde_json::Value {
    let (rx, tx) = (&o.rx, &o.tx);
    serde_json::json!({
        "frames": a.frames,
        "frame_bytes": a.frame_bytes,
        "sent": o.sent,
        "bit_exact": o.exact,
        "mismatched": o.mismatched,
        "incomplete": o.incomplete,
        "missing": o.missing,
        "elapsed_s": o.elapsed.as_secs_f64(),
        "frames_per_s": rate(o),
        "baseline_frames_per_s": base.map(rate),
        "injected": {
            "dropped": tx.faults.dropped, "reordered": tx.faults.reordered,
            "duplicated": tx.faults.duplicated, "corrupted": tx.faults.corrupted, "delayed": tx.faults.delayed,
        },
        "receiver": {
            "datagrams": rx.datagrams, "placed": rx.placed, "placed_retransmitted": rx.placed_retransmitted,
            "redundant": rx.redundant, "dropped": rx.drops_by_reason().into_iter().collect::<std::collections::BTreeMap<_, _>>(),
            "seq_missing": rx.seq_missing, "seq_recovered": rx.seq_recovered, "seq_reordered": rx.seq_reordered,
            "nacks_sent": rx.nacks_sent, "nack_ranges": rx.nack_ranges, "nack_ranges_dropped": rx.nack_ranges_dropped,
            "frames_recovered": rx.frames_recovered, "frames_given_up": rx.frames_given_up,
            "kernel_drops": rx.kernel_drops, "acks_sent": rx.acks_sent, "replies_refused": rx.replies_refused,
        },
        "controller": {
            "nacks": tx.retransmit.nacks, "bad_nacks": tx.retransmit.bad_nacks, "requested": tx.retransmit.requested,
            "resent": tx.retransmit.resent, "history_misses": tx.retransmit.history_misses, "probes": tx.retransmit.probes,
            "roce_refused": tx.roce_refused,
        },
    })
}

fn print_table(a: &SoakArgs, o: &Outcome, base: Option<&Outcome>) {
    let (rx, tx) = (&o.rx, &o.tx);
    let payload = if a.roce_mtu > 0 { a.roce_mtu } else { a.payload_bytes };
    println!(
        "soak: {} frames of {} bytes ({} datagrams of {} B each) at {} frames/s asked",
        a.frames,
        a.frame_bytes,
        a.frame_bytes.div_ceil(payload as u64),
        payload,
        a.rate
    );
    if a.roce_mtu > 0 {
        println!("transport: RoCEv2 WRITEs, path MTU {}, over a veth pair into the AF_XDP engine", a.roce_mtu);
    }
    println!(
        "faults (seed {}): loss {} in bursts of {} on average, reorder {}, duplicate {}, corrupt {}",
        a.seed, a.loss, a.burst, a.reorder, a.duplicate, a.corrupt
    );
    use rdaq_receiver::DropReason::{BadChecksum, Duplicate};
    // section headings have no value
    let rows: [(&str, Option<u64>); 35] = [
        ("frames", None),
        ("  sent", Some(o.sent)),
        ("  bit-exact (xxh3 = manifest)", Some(o.exact)),
        ("  wrong bytes", Some(o.mismatched)),
        ("  incomplete (not recovered)", Some(o.incomplete)),
        ("  never delivered", Some(o.missing)),
        ("injected by the emulator", None),
        ("  datagrams dropped", Some(tx.faults.dropped)),
        ("  datagrams reordered", Some(tx.faults.reordered)),
        ("  datagrams duplicated", Some(tx.faults.duplicated)),
        ("  datagrams corrupted", Some(tx.faults.corrupted)),
        ("detected and recovered by the receiver", None),
        ("  sequence numbers declared missing", Some(rx.seq_missing)),
        ("  ... of which arrived late", Some(rx.seq_recovered)),
        ("  reordered within the lag", Some(rx.seq_reordered)),
        ("  bad checksums dropped", Some(rx.dropped(BadChecksum))),
        ("  duplicates dropped", Some(rx.dropped(Duplicate))),
        ("  retransmission requests sent", Some(rx.nacks_sent)),
        ("  ... naming ranges", Some(rx.nack_ranges)),
        ("  retransmitted datagrams placed", Some(rx.placed_retransmitted)),
        ("  retransmissions no longer needed", Some(rx.redundant)),
        ("  frames completed by retransmission", Some(rx.frames_recovered)),
        ("  frames given up", Some(rx.frames_given_up)),
        ("  kernel drops", Some(rx.kernel_drops)),
        ("  RoCEv2 ACKs sent", Some(rx.acks_sent)),
        ("  RoCEv2 ACKs/NAKs refused by the interface", Some(rx.replies_refused)),
        ("controller (sender's history)", None),
        ("  requests received", Some(tx.retransmit.nacks)),
        ("  datagrams asked for", Some(tx.retransmit.requested)),
        ("  datagrams resent", Some(tx.retransmit.resent)),
        ("  asked for but out of history", Some(tx.retransmit.history_misses)),
        ("  tail probes", Some(tx.retransmit.probes)),
        ("  RoCEv2 frames refused by the interface", Some(tx.roce_refused)),
        ("  malformed requests", Some(tx.retransmit.bad_nacks)),
        ("  other drops at the receiver", Some(rx.dropped_total() - rx.dropped(BadChecksum) - rx.dropped(Duplicate))),
    ];
    println!();
    for (label, v) in rows {
        println!("{label:<44} {:>14}", v.map_or(String::new(), |v| v.to_string()));
    }
    let reasons: Vec<String> = rx.drops_by_reason().iter().map(|(n, v)| format!("{n}={v}")).collect();
    println!("{:<44} {}", "drops by reason", if reasons.is_empty() { "none".to_string() } else { reasons.join(" ") });
    println!();
    println!("{:<30} {:>12} {:>12} {:>10}", "run", "frames/s", "GB/s", "vs clean");
    if let Some(b) = base {
        println!("{:<30} {:>12.0} {:>12.3} {:>10}", format!("clean ({} frames)", b.sent), rate(b), rate(b) * a.frame_bytes as f64 / 1e9, "1.00");
    }
    let vs = base.map_or("-".to_string(), |b| format!("{:.2}", rate(o) / rate(b)));
    println!("{:<30} {:>12.0} {:>12.3} {:>10}", format!("with faults ({} frames)", o.sent), rate(o), rate(o) * a.frame_bytes as f64 / 1e9, vs);
    println!();
    println!(
        "{}",
        if o.exact == a.frames {
            format!("PASS: all {} frames bit-exact", a.frames)
        } else {
            format!("FAIL: {} of {} frames bit-exact", o.exact, a.frames)
        }
    );
}
