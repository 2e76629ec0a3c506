//! `rdaq bench`: benchmarks as commands. Each prints a table against a baseline measured in
//! the same run.
//!
//! `ingest`: the highest lossless rate of the receive path for 8 KiB rdaq datagrams over
//! loopback, for the full receiver (checks, placement, bitmaps, frame completion) beside a
//! bare recvmmsg loop that discards the data (the ceiling of this path). Sender and receiver
//! are pinned to different cores; the sender is a GSO sendmmsg loop over pre-built frames.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdaq_emulator::Packetizer;
use rdaq_net::recv::MmsgReceiver;
use rdaq_net::send::BatchSender;
use rdaq_net::socket;
use rdaq_proto::telegram::{BufferMap, LocalBufferInfo, TELEGRAM_VERSION};
use rdaq_receiver::{Format, IncompletePolicy, Receiver, ReceiverConfig};

#[derive(clap::Subcommand)]
pub enum BenchCmd {
    /// Highest lossless receive rate of rdaq datagrams over loopback: placement vs a bare
    /// recvmmsg loop, measured in the same run; with --format sls, CPU per native JUNGFRAU
    /// packet against slsReceiver's recvfrom + copy at the same rates.
    Ingest(IngestArgs),
    /// Highest lossless aggregate throughput of one and of two receivers (temporal mode) fed
    /// by the same emulated detector; per-receiver efficiency against the single one.
    Hosts(HostsArgs),
    /// Many small frames through injected loss, reordering, duplication and corruption:
    /// every frame must arrive bit-exact (checksums, loss window, retransmission).
    Soak(crate::soak::SoakArgs),
    /// Each processing stage on one core against memory copy bandwidth and the reference
    /// libraries (aare, cfelpyutils peakfinder8, bitshuffle) on the same frames.
    Process(crate::bench_process::ProcessBenchArgs),
}

#[derive(clap::Args)]
pub struct HostsArgs {
    #[arg(long, default_value_t = 4)]
    modules: u16,
    /// Frames per measured run.
    #[arg(long, default_value_t = 600)]
    frames: u64,
    /// Distinct frames the emulator synthesizes once and sends in turn (synthesis would
    /// otherwise limit the sender).
    #[arg(long, default_value_t = 8)]
    pool: usize,
    #[arg(long, default_value_t = 512)]
    memory_mib: u64,
}

#[derive(clap::Args)]
pub struct IngestArgs {
    /// rdaq: highest lossless rate of rdaq datagrams against a bare recvmmsg loop. sls: CPU
    /// per native JUNGFRAU packet against slsReceiver's recvfrom + copy, at the same rates.
    #[arg(long, default_value = "rdaq")]
    format: String,
    /// Datagrams per measured run (rdaq).
    #[arg(long, default_value_t = 10_000_000)]
    datagrams: u64,
    /// Datagrams per probe while searching for the lossless rate (rdaq).
    #[arg(long, default_value_t = 1_000_000)]
    probe: u64,
    #[arg(long, default_value_t = 8192)]
    payload_bytes: u32,
    /// Datagrams per read (1..=1024).
    #[arg(long, default_value_t = 64, value_parser = batch_size)]
    pub(crate) batch: usize,
    #[arg(long, default_value_t = 256)]
    pub(crate) recv_buffer_mib: usize,
    /// Do not pin sender and receiver to CPUs 0 and 1.
    #[arg(long)]
    pub(crate) no_pin: bool,
    /// Frame rates of one JUNGFRAU module to measure at (sls), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [100.0, 1000.0, 2000.0])]
    pub(crate) frame_rates: Vec<f64>,
    /// Seconds of stream per measurement (sls).
    #[arg(long, default_value_t = 3.0)]
    pub(crate) seconds: f64,
}

pub fn bench(b: BenchCmd) -> anyhow::Result<ExitCode> {
    match b {
        BenchCmd::Ingest(a) => match a.format.as_str() {
            "rdaq" => ingest(a),
            "sls" => crate::bench_sls::ingest_sls(&a),
            other => bail!("--format must be rdaq or sls, not {other:?}"),
        },
        BenchCmd::Hosts(a) => hosts(a),
        BenchCmd::Soak(a) => crate::soak::soak(a),
        BenchCmd::Process(a) => crate::bench_process::bench(a),
    }
}

struct HostsOutcome {
    receivers: usize,
    /// Frames per second asked of the emulator.
    rate: f64,
    /// True when the emulator could not send as fast as asked (the sender is the limit).
    sender_limited: bool,
    frames_complete: u64,
    lost: u64,
    bytes: u64,
    window: Duration,
    per_receiver: Vec<(u64, Duration, Duration)>,
}

/// One acquisition over `n` receivers on loopback at `rate` frames/s; consumers only give
/// slots back.
fn hosts_run(a: &HostsArgs, n: usize, rate: f64) -> anyhow::Result<HostsOutcome> {
    let mut text = format!("[detector]\nmodules = {}\n[transfer]\nmode = \"temporal\"\n", a.modules);
    for i in 0..n {
        text += &format!(
            "[[receivers]]\nname = \"dr{i}\"\ncontrol = \"127.0.0.1:{}\"\ndata = \"127.0.0.1\"\ndata_port = 0\nmemory_mib = {}\n",
            7000 + i,
            a.memory_mib
        );
    }
    let t = rdaq_manager::Topology::from_toml(&text)?;
    let plan = rdaq_manager::Plan::new(&t)?;
    let mut receivers = plan
        .buffer_requests(&t)
        .into_iter()
        .map(|(_, req)| {
            Receiver::start(ReceiverConfig {
                recv_buffer: 256 << 20,
                policy: IncompletePolicy::Discard,
                linger: Duration::from_millis(300),
                ..ReceiverConfig::for_request(&req)
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let maps: Vec<BufferMap> = receivers.iter().map(|r| r.buffer_map().clone()).collect();
    let dtps = plan.module_dtps(&t, &maps)?;
    let cfg = rdaq_emulator::EmulatorConfig { modules: a.modules, frames: a.frames, rate_hz: Some(rate), frame_pool: a.pool, ..Default::default() };
    let windows = std::thread::scope(|s| -> anyhow::Result<Vec<(Option<Instant>, Instant)>> {
        let consumers: Vec<_> = receivers
            .iter()
            .map(|rx| {
                s.spawn(move || {
                    let (mut first, mut last) = (None, Instant::now());
                    for f in rx.frames().iter() {
                        let now = Instant::now();
                        first.get_or_insert(now);
                        last = now;
                        rx.release(f).expect("a frame of this receiver");
                    }
                    (first, last)
                })
            })
            .collect();
        let r = rdaq_emulator::run(&cfg, &dtps, std::sync::Arc::new(rdaq_emulator::Control::default()));
        for rx in &receivers {
            rx.stop();
        }
        r?;
        Ok(consumers.into_iter().map(|c| c.join().expect("consumer panicked")).collect())
    })?;
    let first = windows.iter().filter_map(|w| w.0).min();
    let last = windows.iter().map(|w| w.1).max();
    let window = match (first, last) {
        (Some(f), Some(l)) if l > f => l - f,
        _ => Duration::ZERO,
    };
    let mut out =
        HostsOutcome { receivers: n, rate, sender_limited: false, frames_complete: 0, lost: 0, bytes: 0, window, per_receiver: Vec::new() };
    for (rx, w) in receivers.iter_mut().zip(&windows) {
        let c = rx.join()?;
        out.frames_complete += c.frames_complete;
        out.bytes += c.bytes_placed;
        let win = w.0.map_or(Duration::ZERO, |f| w.1 - f);
        out.per_receiver.push((c.bytes_placed, win, c.cpu_time));
    }
    out.lost = a.frames - out.frames_complete.min(a.frames);
    Ok(out)
}

impl HostsOutcome {
    fn achieved(&self) -> f64 {
        self.frames_complete as f64 / self.window.as_secs_f64().max(1e-9)
    }
}

/// Doubles the paced frame rate from 50 Hz until frames are lost (then bisects 4 times), or
/// until the emulator cannot send as fast as asked (then the sender is the limit).
fn highest_lossless(a: &HostsArgs, n: usize) -> anyhow::Result<HostsOutcome> {
    let mut good: Option<HostsOutcome> = None;
    let mut rate = 50.0;
    let bad = loop {
        let mut o = hosts_run(a, n, rate)?;
        eprintln!("  {n} receiver(s) at {rate:.0} frames/s: lost {}, achieved {:.0}/s", o.lost, o.achieved());
        if o.lost > 0 {
            break rate;
        }
        if o.achieved() < 0.8 * rate {
            o.sender_limited = true;
            return Ok(o);
        }
        good = Some(o);
        rate *= 2.0;
    };
    let Some(mut best) = good else { bail!("{n} receiver(s): frames lost even at 50 frames/s") };
    let mut bad = bad;
    for _ in 0..4 {
        let mid = 0.5 * (best.rate + bad);
        let o = hosts_run(a, n, mid)?;
        eprintln!("  {n} receiver(s) at {mid:.0} frames/s: lost {}", o.lost);
        if o.lost == 0 {
            best = o;
        } else {
            bad = mid;
        }
    }
    Ok(best)
}

fn hosts(a: HostsArgs) -> anyhow::Result<ExitCode> {
    if a.modules == 0 || a.frames < 100 {
        bail!("--modules must be positive and --frames at least 100");
    }
    eprintln!("rdaq bench hosts: {} modules, {} frames per run, pool of {} distinct frames", a.modules, a.frames, a.pool);
    let one = highest_lossless(&a, 1)?;
    let two = highest_lossless(&a, 2)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!();
    println!("rdaq bench hosts: highest lossless rate, temporal mode over loopback, {} JUNGFRAU modules, {} frames per run", a.modules, a.frames);
    println!("machine: {cores} CPUs shared by the emulator's {} module threads, the receivers and their consumers", a.modules);
    println!(
        "{:<10} {:>9} {:>9} {:>8} {:>6} {:>8} {:>10} {:>24} {:>11}",
        "receivers", "asked/s", "frames/s", "frames", "lost", "GB/s", "GB/s/host", "per host (GB/s, CPU%)", "efficiency"
    );
    let base = one.bytes as f64 / one.window.as_secs_f64().max(1e-9);
    for o in [&one, &two] {
        let agg = o.bytes as f64 / o.window.as_secs_f64().max(1e-9);
        let hosts: Vec<String> = o
            .per_receiver
            .iter()
            .map(|(b, w, cpu)| format!("{:.2} {:.0}%", *b as f64 / w.as_secs_f64().max(1e-9) / 1e9, 100.0 * cpu.as_secs_f64() / o.window.as_secs_f64().max(1e-9)))
            .collect();
        println!(
            "{:<10} {:>9.0} {:>9.0} {:>8} {:>6} {:>8.2} {:>10.2} {:>24} {:>10.0}%{}",
            o.receivers,
            o.rate,
            o.achieved(),
            o.frames_complete,
            o.lost,
            agg / 1e9,
            agg / 1e9 / o.receivers as f64,
            hosts.join(" | "),
            100.0 * agg / (base * o.receivers as f64),
            if o.sender_limited { "  (sender-limited)" } else { "" }
        );
    }
    println!("efficiency: aggregate rate over (receivers x the single receiver's rate). All processes share");
    println!("this machine's {cores} cores, so a second receiver adds no hardware: see docs/scaling.md for real hosts.");
    Ok(ExitCode::SUCCESS)
}

const MODULE_BYTES: u64 = 1 << 20;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// recvmmsg into a small scratch area that stays in cache, data discarded.
    Bare,
    /// recvmmsg straight into a ring as large as the receiver's, no checks: the same memory
    /// traffic as placement, none of its work.
    BareRing,
    Place,
}

/// Ring size of the placement receiver and of the bare ring loop.
const RING_BYTES: usize = 256 << 20;

#[derive(Clone, Copy, Debug)]
struct Outcome {
    sent: u64,
    received: u64,
    /// First to last datagram (bare) or frame (placement) at the receiver.
    window: Duration,
    /// Datagrams received inside the window.
    in_window: u64,
    recv_cpu: Duration,
    rate_asked: Option<f64>,
    gso: bool,
}

impl Outcome {
    fn lost(&self) -> u64 {
        self.sent - self.received.min(self.sent)
    }
    fn rate(&self) -> f64 {
        self.in_window as f64 / self.window.as_secs_f64().max(1e-9)
    }
}

/// The sender: one module, frames of 128 datagrams built once, headers rewritten per frame.
fn send(map: &BufferMap, dest: SocketAddr, count: u64, rate: Option<f64>, pin: Option<usize>) -> anyhow::Result<(u64, bool)> {
    if let Some(cpu) = pin {
        socket::pin_current_thread(cpu)?;
    }
    let mut tx = BatchSender::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), dest, true, 16 << 20)?;
    let frame: Vec<u8> = (0..MODULE_BYTES as usize).map(|i| (i * 7 + i / 4096) as u8).collect();
    let mut pk = Packetizer::new(0, map.module_bytes, map.payload_bytes, map.checksum);
    let start = Instant::now();
    let mut sent = 0u64;
    let mut f = 0u64;
    while sent < count {
        let n = pk.frame(f, map.buffer_for(f), 0, &frame).min((count - sent) as usize);
        let mut k = 0;
        while k < n {
            // paced: small chunks spread over time; full speed: the whole frame per call
            let m = if rate.is_some() { 28.min(n - k) } else { n - k };
            if let Some(r) = rate {
                rdaq_net::pace::wait_until(start + Duration::from_secs_f64((sent + k as u64) as f64 / r));
            }
            tx.send(m, |j| pk.datagram(k + j, &frame))?;
            k += m;
        }
        sent += n as u64;
        f += 1;
    }
    Ok((tx.stats.datagrams, tx.gso()))
}

fn map_for(buffers: &[LocalBufferInfo], payload: u32, port: u16) -> BufferMap {
    BufferMap {
        version: TELEGRAM_VERSION,
        modules: 1,
        module_bytes: MODULE_BYTES,
        payload_bytes: payload,
        data_ports: vec![port],
        buffers: buffers.to_vec(),
        checksum: false,
    }
}

fn run_bare(a: &IngestArgs, count: u64, rate: Option<f64>, ring: bool) -> anyhow::Result<Outcome> {
    let (sock, _) = socket::bind_receiver(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), a.recv_buffer_mib << 20)?;
    let port = sock.local_addr()?.port();
    let map = map_for(&[LocalBufferInfo { id: 1, key: 1, size: MODULE_BYTES }], a.payload_bytes, port);
    let done = Arc::new(AtomicBool::new(false));
    let (pin_rx, pin_tx) = if a.no_pin { (None, None) } else { (Some(1), Some(0)) };
    let receiver = {
        let (done, batch, payload) = (done.clone(), a.batch, a.payload_bytes as usize);
        std::thread::Builder::new().name("rdaq-bare".into()).spawn(move || bare_loop(sock, batch, payload, count, pin_rx, ring, &done))?
    };
    let (sent, gso) = send(&map, SocketAddr::from((Ipv4Addr::LOCALHOST, port)), count, rate, pin_tx)?;
    done.store(true, Ordering::Relaxed);
    let (received, window, in_window, cpu) = receiver.join().expect("bare loop panicked")?;
    Ok(Outcome { sent, received, window, in_window, recv_cpu: cpu, rate_asked: rate, gso })
}

/// Receives into scratch and discards; returns (received, first..last, datagrams in that
/// window, thread CPU time).
#[allow(clippy::too_many_arguments)]
/// A `--batch` value: what one read of the receiver takes.
fn batch_size(s: &str) -> Result<usize, String> {
    let max = rdaq_receiver::engine::MAX_BATCH;
    match s.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("must be a number of datagrams from 1 to {max}")),
    }
}

fn bare_loop(sock: UdpSocket, batch: usize, payload: usize, count: u64, pin: Option<usize>, ring: bool, done: &AtomicBool) -> anyhow::Result<(u64, Duration, u64, Duration)> {
    if let Some(cpu) = pin {
        socket::pin_current_thread(cpu)?;
    }
    // written once so its pages exist before the clock starts
    let mut ring_mem = if ring { vec![1u8; RING_BYTES] } else { Vec::new() };
    let cells = ring_mem.len() / payload.max(1);
    let mut cell = 0usize;
    let cpu0 = socket::thread_cpu_time();
    let mut rx = MmsgReceiver::new(batch, rdaq_proto::HEADER_LEN, payload);
    let mut pfd = [socket::pollfd(&sock)];
    let (mut got, mut first, mut last, mut first_n) = (0u64, None, Instant::now(), 0u64);
    let mut quiet_since = Instant::now();
    while got < count {
        let base = ring_mem.as_mut_ptr();
        // SAFETY: landings are distinct `payload`-byte cells of `ring_mem` (cells wrap at the
        // ring's end, and a batch is far smaller than the ring), or scratch without a ring.
        let n = unsafe { rx.recv(sock.as_raw_fd(), |i| (cells > 0).then(|| base.add(((cell + i) % cells) * payload))) }? as u64;
        cell = if cells > 0 { (cell + n as usize) % cells } else { 0 };
        if n == 0 {
            if done.load(Ordering::Relaxed) && quiet_since.elapsed() > Duration::from_millis(300) {
                break;
            }
            socket::wait_readable(&mut pfd, 2)?;
            continue;
        }
        let now = Instant::now();
        if first.is_none() {
            first = Some(now);
            first_n = n;
        }
        last = now;
        quiet_since = now;
        got += n;
    }
    let window = first.map_or(Duration::ZERO, |f| last - f);
    Ok((got, window, got.saturating_sub(first_n), socket::thread_cpu_time() - cpu0))
}

fn run_place(a: &IngestArgs, count: u64, rate: Option<f64>) -> anyhow::Result<Outcome> {
    let cells = MODULE_BYTES.div_ceil(a.payload_bytes as u64);
    let frames = count.div_ceil(cells);
    let cfg = ReceiverConfig {
        format: Format::Rdaq,
        data_port: 0,
        modules: 1,
        module_bytes: MODULE_BYTES,
        payload_bytes: a.payload_bytes,
        slots: RING_BYTES / MODULE_BYTES as usize,
        recv_buffer: a.recv_buffer_mib << 20,
        batch: a.batch,
        frame_timeout: Duration::from_millis(500),
        policy: IncompletePolicy::Discard,
        frames: Some(frames),
        linger: Duration::from_millis(300),
        cpu: (!a.no_pin).then_some(1),
        ..ReceiverConfig::default()
    };
    let mut rx = Receiver::start(cfg)?;
    let map = rx.buffer_map().clone();
    let dest = SocketAddr::from((Ipv4Addr::LOCALHOST, map.data_ports[0]));
    let (sent, gso, first, last) = std::thread::scope(|s| -> anyhow::Result<_> {
        let rx_ref = &rx;
        let consumer = s.spawn(move || {
            let (mut first, mut last) = (None, Instant::now());
            for f in rx_ref.frames().iter() {
                let now = Instant::now();
                first.get_or_insert(now);
                last = now;
                rx_ref.release(f).expect("a frame of this receiver");
            }
            (first, last)
        });
        let (sent, gso) = send(&map, dest, count, rate, (!a.no_pin).then_some(0))?;
        rx.stop();
        let (first, last) = consumer.join().expect("consumer panicked");
        Ok((sent, gso, first, last))
    })?;
    let c = rx.join()?;
    let window = first.map_or(Duration::ZERO, |f| last - f);
    Ok(Outcome {
        sent,
        received: c.placed,
        window,
        in_window: c.placed.saturating_sub(cells),
        recv_cpu: c.cpu_time,
        rate_asked: rate,
        gso,
    })
}

fn measure(a: &IngestArgs, mode: Mode, count: u64, rate: Option<f64>) -> anyhow::Result<Outcome> {
    match mode {
        Mode::Bare => run_bare(a, count, rate, false),
        Mode::BareRing => run_bare(a, count, rate, true),
        Mode::Place => run_place(a, count, rate),
    }
}

/// Full speed first; on loss, bisect the paced rate with probes, then confirm at full count.
fn lossless(a: &IngestArgs, mode: Mode) -> anyhow::Result<Outcome> {
    let full = measure(a, mode, a.datagrams, None)?;
    eprintln!("  {mode:?} full speed: {:.0} datagrams/s, lost {}", full.rate(), full.lost());
    if full.lost() == 0 {
        return Ok(full);
    }
    let (mut lo, mut hi) = (0.3 * full.rate(), full.rate());
    for _ in 0..5 {
        let mid = 0.5 * (lo + hi);
        let p = measure(a, mode, a.probe, Some(mid))?;
        eprintln!("  {mode:?} probe at {mid:.0}/s: lost {}", p.lost());
        if p.lost() == 0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let mut rate = lo;
    for _ in 0..4 {
        let r = measure(a, mode, a.datagrams, Some(rate))?;
        eprintln!("  {mode:?} confirm at {rate:.0}/s: lost {}", r.lost());
        if r.lost() == 0 {
            return Ok(r);
        }
        rate *= 0.9;
    }
    bail!("{mode:?}: no lossless rate found down to {rate:.0} datagrams/s")
}

fn ingest(a: IngestArgs) -> anyhow::Result<ExitCode> {
    if a.datagrams < 1000 || a.probe < 1000 {
        bail!("--datagrams and --probe must be at least 1000");
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if !a.no_pin && cores < 2 {
        bail!("pinning needs 2 CPUs; use --no-pin");
    }
    eprintln!("rdaq bench ingest: {} datagrams of {} payload bytes per run, batch {}", a.datagrams, a.payload_bytes, a.batch);
    let bare = lossless(&a, Mode::Bare).context("bare recvmmsg loop")?;
    let bare_ring = lossless(&a, Mode::BareRing).context("bare recvmmsg loop into a ring")?;
    let place = lossless(&a, Mode::Place).context("receiver placement")?;
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!();
    println!("rdaq bench ingest: highest lossless rate, {} B datagrams ({} B payload) over loopback, {} per run", a.payload_bytes as usize + rdaq_proto::HEADER_LEN, a.payload_bytes, a.datagrams);
    println!("machine: {} CPUs, Linux {}, sender GSO {}, pinned {}", cores, kernel.trim(), place.gso, !a.no_pin);
    println!(
        "{:<23} {:>10} {:>5} {:>9} {:>12} {:>7} {:>10} {:>14} {:>9} {:>9}",
        "path", "datagrams", "lost", "paced at", "datagrams/s", "Gb/s", "recv CPU%", "CPU ns/dgram", "rate/bare", "CPU/bare"
    );
    let ns = |o: &Outcome| o.recv_cpu.as_secs_f64() * 1e9 / o.received.max(1) as f64;
    for (name, o) in [("bare recvmmsg (discard)", bare), ("bare recvmmsg into ring", bare_ring), ("placement (rdaq)", place)] {
        let gbps = o.rate() * a.payload_bytes as f64 * 8.0 / 1e9;
        let cpu = 100.0 * o.recv_cpu.as_secs_f64() / o.window.as_secs_f64().max(1e-9);
        println!(
            "{:<23} {:>10} {:>5} {:>9} {:>12.0} {:>7.2} {:>10.0} {:>14.0} {:>8.1}% {:>8.1}%",
            name,
            o.received,
            o.lost(),
            o.rate_asked.map_or("full".into(), |r| format!("{r:.0}")),
            o.rate(),
            gbps,
            cpu,
            ns(&o),
            100.0 * o.rate() / bare.rate(),
            100.0 * ns(&o) / ns(&bare)
        );
    }
    println!("Gb/s counts payload bits; recv CPU% is the receive thread's CPU time over its receive window.");
    println!("The ring loop lands payloads in a {} MiB ring like the receiver's, without any checks: it", RING_BYTES >> 20);
    println!("pays the same memory traffic, so placement vs ring is the cost of rdaq's own work.");
    if bare.rate_asked.is_none() && place.rate_asked.is_none() {
        println!("Both paths were lossless at the sender's full speed: the sender is the limit of this");
        println!("machine, so rate/bare mostly shows sender variance; CPU/bare compares the receive paths.");
    }
    Ok(ExitCode::SUCCESS)
}
