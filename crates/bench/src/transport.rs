//! `rdaq bench transport`: the receive engines side by side, on loopback and on a veth pair
//! between two network namespaces (AF_XDP runs only on the latter).
//!
//! - Bandwidth and latency against message size (as OSU's osu_bw / osu_latency and
//!   perftest): each engine's bare loop (no placement: payloads land in successive cells of
//!   a ring made as the receiver's; reads paced as the receiver paces them) at the sender's
//!   full speed, then one-way latency at a light paced load, read as soon as data is there,
//!   from a CLOCK_MONOTONIC stamp the sender writes into each datagram just before its send
//!   (one clock: same machine).
//! - The highest rate each engine holds without loss for 8 KiB rdaq datagrams, for its bare
//!   loop and for the full receiver (placement), found as PERCIVAL did: full speed, then
//!   bisecting paced probes, then a confirming run at the full count; and the loss at 1.2x
//!   that rate.
//!
//! Sender and receiver threads are pinned to CPUs 0 and 1. The receive thread's CPU time is
//! what the engine costs in that thread; on loopback and veth the kernel's delivery work
//! (softirq, and AF_XDP's copy into UMEM in copy mode) runs on the sender's CPU, which the
//! all-CPU column (both CPUs, from /proc/stat) includes.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use rdaq_net::batch::Batch;
use rdaq_net::engine::{Engine, EngineKind, EngineSpec};
use rdaq_net::netns::VethPair;
use rdaq_net::send::BatchSender;
use rdaq_net::socket;
use rdaq_proto::telegram::{BufferMap, LocalBufferInfo};
use rdaq_receiver::arena::Arena;
use rdaq_receiver::coalesce::{Coalesce, Next};

use crate::ingest::{map_for, MODULE_BYTES, RING_BYTES};
use crate::Probe;
use rdaq_receiver::{Format, IncompletePolicy, Receiver, ReceiverConfig};

#[derive(clap::Args)]
pub struct TransportArgs {
    /// Where to run: loopback, veth or both.
    #[arg(long, default_value = "both")]
    net: String,
    /// Engines to compare.
    #[arg(long, value_delimiter = ',', default_values_t = [EngineKind::Recvmmsg, EngineKind::IoUring, EngineKind::AfXdp])]
    engines: Vec<EngineKind>,
    /// UDP payload sizes of the bandwidth and latency table, bytes (16 to 65000).
    #[arg(long, value_delimiter = ',', default_values_t = [64usize, 512, 1472, 4096, 8208, 16384, 65000])]
    sizes: Vec<usize>,
    /// Bytes sent per size at full speed (at least 20,000 datagrams, at most 2,000,000).
    #[arg(long, default_value_t = 2_000_000_000)]
    bytes_per_size: u64,
    /// Datagrams per latency measurement, and their rate.
    #[arg(long, default_value_t = 2000)]
    latency_count: u64,
    #[arg(long, default_value_t = 2000.0, value_parser = crate::rate_arg)]
    latency_rate: f64,
    /// Datagrams of 8 KiB per lossless run (the confirming run; probes use --probe).
    #[arg(long, default_value_t = 10_000_000)]
    datagrams: u64,
    #[arg(long, default_value_t = 1_000_000)]
    probe: u64,
    /// Skip the lossless-rate search (the longest part).
    #[arg(long)]
    no_lossless: bool,
    /// Frames of the paced acquisition (`rdaq run`, raw, 2 modules at 100 Hz) whose latency
    /// is broken down per step, on loopback, for each socket engine (0: skip).
    #[arg(long, default_value_t = 1000)]
    breakdown_frames: u64,
    #[arg(long, default_value_t = 64, value_parser = crate::ingest::batch_size)]
    batch: usize,
    #[arg(long, default_value_t = 256)]
    recv_buffer_mib: usize,
}

/// Where sender and receiver run.
enum Net {
    Loopback,
    Veth(VethPair),
}

impl Net {
    fn name(&self) -> &'static str {
        match self {
            Net::Loopback => "loopback",
            Net::Veth(_) => "veth pair between two namespaces (MTU 65535)",
        }
    }
    fn receiver_ip(&self) -> Ipv4Addr {
        match self {
            Net::Loopback => Ipv4Addr::LOCALHOST,
            Net::Veth(p) => p.receiver_ip,
        }
    }
    fn sender_ip(&self) -> Ipv4Addr {
        match self {
            Net::Loopback => Ipv4Addr::LOCALHOST,
            Net::Veth(p) => p.sender_ip,
        }
    }
    fn enter_receiver(&self) -> anyhow::Result<()> {
        if let Net::Veth(p) = self {
            VethPair::enter(&p.receiver_ns)?;
        }
        Ok(())
    }
    fn enter_sender(&self) -> anyhow::Result<()> {
        if let Net::Veth(p) = self {
            VethPair::enter(&p.sender_ns)?;
        }
        Ok(())
    }
}

/// What the sender sends.
#[derive(Clone, Copy)]
enum Load {
    /// Datagrams of this many bytes: an 8-byte send stamp, a sequence number, filler.
    Sized(usize),
    /// 8 KiB rdaq datagrams of a 1 MiB module frame, as the emulator sends them.
    Rdaq,
}

const STAMP: usize = 16;

/// One measured run.
struct Run {
    sent: u64,
    received: u64,
    window: Duration,
    in_window: u64,
    recv_cpu: Duration,
    all_cpu: Duration,
    rate_asked: Option<f64>,
    latency: Option<Histogram<u64>>,
    engine: String,
}

impl Probe for Run {
    fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.received)
    }
    fn rate(&self) -> f64 {
        self.in_window as f64 / self.window.as_secs_f64().max(1e-9)
    }
}

impl Run {
    fn ns_per(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1e9 / self.received.max(1) as f64
    }
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Busy time of all CPUs so far (/proc/stat: everything but idle and iowait).
fn all_cpu_busy() -> Duration {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat.lines().next().unwrap_or("").split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Duration::from_secs_f64((total - idle) as f64 / hz)
}

/// Sends `count` datagrams of `load` to `dest` from the sender's side, paced at `rate` or
/// at full speed; returns how many the kernel took.
fn send(net: &Net, dest: SocketAddr, load: Load, map: Option<&BufferMap>, count: u64, rate: Option<f64>) -> anyhow::Result<u64> {
    net.enter_sender()?;
    socket::pin_current_thread(0)?;
    let mut tx = BatchSender::connect(SocketAddr::new(net.sender_ip().into(), 0), dest, true, 16 << 20)?;
    let start = Instant::now();
    match load {
        Load::Sized(size) => {
            let body = vec![0x5a_u8; size - STAMP];
            let mut heads = vec![[0u8; STAMP]; 32];
            let mut sent = 0u64;
            while sent < count {
                let n = if rate.is_some() { 1 } else { heads.len().min((count - sent) as usize) };
                if let Some(r) = rate {
                    rdaq_net::pace::wait_until(start + Duration::from_secs_f64(sent as f64 / r));
                }
                let t = now_ns();
                for (i, h) in heads[..n].iter_mut().enumerate() {
                    h[..8].copy_from_slice(&t.to_le_bytes());
                    h[8..].copy_from_slice(&(sent + i as u64).to_le_bytes());
                }
                tx.send(n, |i| (&heads[i][..], &body[..]))?;
                sent += n as u64;
            }
        }
        Load::Rdaq => {
            let map = map.context("rdaq datagrams need the receiver's buffer map")?;
            crate::ingest::send_module_frames(&mut tx, map, count, rate)?;
        }
    }
    Ok(tx.stats.datagrams)
}

/// The bare loop of one engine: receives into successive cells of a ring, no checks, and
/// with stamps in the datagrams records their one-way latency.
fn bare(net: &Net, kind: EngineKind, load: Load, count: u64, rate: Option<f64>, a: &TransportArgs) -> anyhow::Result<Run> {
    let (hdr, landing) = match load {
        Load::Sized(s) => (STAMP, s - STAMP),
        Load::Rdaq => (rdaq_proto::HEADER_LEN, 8192),
    };
    let map = match load {
        // one 1 MiB buffer: the bare loop checks nothing, any id and key do
        Load::Rdaq => Some(map_for(&[LocalBufferInfo { id: 1, key: 1, size: MODULE_BYTES, va: 0 }], 8192, 0)),
        Load::Sized(_) => None,
    };
    let done = AtomicBool::new(false);
    let (port_tx, port_rx) = mpsc::channel();
    let mut cpu0 = Duration::ZERO;
    let (sent, mut run) = std::thread::scope(|s| -> anyhow::Result<(u64, Run)> {
        let receiver = s.spawn(|| bare_receive(net, kind, hdr, landing, count, rate.is_some() && matches!(load, Load::Sized(_)), a, &done, port_tx));
        let Ok(port) = port_rx.recv() else {
            return Err(receiver.join().expect("receiver panicked").err().unwrap_or_else(|| anyhow::anyhow!("the receiver did not start")));
        };
        // from here: the ring and the engine are set up, their page clearing is not counted
        cpu0 = all_cpu_busy();
        let dest = SocketAddr::new(net.receiver_ip().into(), port);
        let map = map.as_ref();
        let sent = s.spawn(move || send(net, dest, load, map, count, rate)).join().expect("sender panicked");
        done.store(true, Ordering::Relaxed);
        let run = receiver.join().expect("receiver panicked")?;
        Ok((sent?, run))
    })?;
    run.sent = sent;
    run.rate_asked = rate;
    run.all_cpu = all_cpu_busy().saturating_sub(cpu0);
    Ok(run)
}

#[allow(clippy::too_many_arguments)]
fn bare_receive(net: &Net, kind: EngineKind, hdr: usize, landing: usize, count: u64, stamped: bool, a: &TransportArgs, done: &AtomicBool, port: mpsc::Sender<u16>) -> anyhow::Result<Run> {
    net.enter_receiver()?;
    socket::pin_current_thread(1)?;
    let (sock, _) = socket::bind_receiver(SocketAddr::new(net.receiver_ip().into(), 0), a.recv_buffer_mib << 20)?;
    let sockets: [UdpSocket; 1] = [sock];
    let spec = EngineSpec { sockets: &sockets, bind: IpAddr::V4(net.receiver_ip()), batch: a.batch, hdr_len: hdr, landing_len: landing, buffer_bytes: a.recv_buffer_mib << 20, roce: None };
    let mut engine = Engine::open(kind, &spec)?;
    let arena = Arena::new(RING_BYTES / MODULE_BYTES as usize, MODULE_BYTES as usize)?;
    let (base, cells) = (arena.slot_ptr(0), RING_BYTES / landing.max(1));
    let mut latency = stamped.then(|| Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds"));
    let _ = port.send(sockets[0].local_addr()?.port());
    let cpu0 = socket::thread_cpu_time();
    let (mut got, mut cell, mut first, mut first_n, mut last) = (0u64, 0usize, None, 0u64, Instant::now());
    let mut quiet = Instant::now();
    let mut pollfds = engine.pollfds();
    // the receiver's read policy, except for latency, which is the transport's own
    let mut pace = Coalesce::new(Duration::from_millis(1), if stamped { Duration::ZERO } else { Duration::from_millis(4) }, 2 * a.batch);
    while got < count {
        let (mut round, mut more) = (0, false);
        for q in 0..engine.queues() {
            // SAFETY: landings are distinct cells of the arena (they wrap at its end, and a
            // batch is far smaller than the ring), which only this loop touches and which
            // outlive it; a zero-length landing (16-byte datagrams) lands nothing.
            let n = unsafe {
                engine.recv(q, |_| {
                    let p = base.add((cell % cells) * landing);
                    cell += 1;
                    Some(p)
                })
            }?;
            let t = now_ns();
            if let Some(h) = latency.as_mut() {
                for i in 0..n {
                    let sent = u64::from_le_bytes(engine.header(i)[..8].try_into().expect("8-byte stamp"));
                    h.saturating_record(t.saturating_sub(sent));
                }
            }
            round += n;
            more |= n == engine.batch();
        }
        match pace.next(round, more, true) {
            Next::Now => {}
            Next::Sleep(d) => std::thread::sleep(d),
            Next::Idle => {
                if done.load(Ordering::Relaxed) && quiet.elapsed() > Duration::from_millis(300) {
                    break;
                }
                socket::wait_readable(&mut pollfds, 2)?;
            }
        }
        if round == 0 {
            continue;
        }
        let now = Instant::now();
        if first.is_none() {
            first = Some(now);
            first_n = round as u64;
        }
        (last, quiet) = (now, now);
        got += round as u64;
    }
    Ok(Run {
        sent: 0,
        received: got,
        window: first.map_or(Duration::ZERO, |f| last - f),
        in_window: got.saturating_sub(first_n),
        recv_cpu: socket::thread_cpu_time() - cpu0,
        all_cpu: Duration::ZERO,
        rate_asked: None,
        latency,
        engine: engine.describe(),
    })
}

/// The full receiver on `kind`: rdaq datagrams of one 1 MiB module placed into a 256 MiB ring.
fn place(net: &Net, kind: EngineKind, count: u64, rate: Option<f64>, a: &TransportArgs) -> anyhow::Result<Run> {
    let frames = count.div_ceil(MODULE_BYTES / 8192);
    let cfg = ReceiverConfig {
        format: Format::Rdaq,
        engine: kind,
        bind: IpAddr::V4(net.receiver_ip()),
        data_port: 0,
        module_bytes: MODULE_BYTES,
        payload_bytes: 8192,
        slots: RING_BYTES / MODULE_BYTES as usize,
        recv_buffer: a.recv_buffer_mib << 20,
        batch: a.batch,
        policy: IncompletePolicy::Discard,
        frames: Some(frames),
        linger: Duration::from_millis(300),
        cpu: Some(1),
        nack: None,
        ..ReceiverConfig::default()
    };
    let done = AtomicBool::new(false);
    let (map_tx, map_rx) = mpsc::channel();
    let mut cpu0 = Duration::ZERO;
    let (sent, mut run) = std::thread::scope(|s| -> anyhow::Result<(u64, Run)> {
        let receiver = s.spawn(|| -> anyhow::Result<Run> {
            // owned here: a receiver that fails to start closes the channel
            let map_tx = map_tx;
            net.enter_receiver()?;
            // the consumer beside the receive thread, not on the sender's CPU
            socket::pin_current_thread(1)?;
            let rx = Receiver::start(cfg)?;
            let _ = map_tx.send(rx.buffer_map().clone());
            let (first, last) = crate::drain(&rx, Some(&done));
            let mut rx = rx;
            let c = rx.join()?;
            let window = first.map_or(Duration::ZERO, |f| last - f);
            let engine = rx.engine().to_string();
            Ok(Run { sent: 0, received: c.placed, window, in_window: c.placed.saturating_sub(MODULE_BYTES / 8192), recv_cpu: c.cpu_time, all_cpu: Duration::ZERO, rate_asked: rate, latency: None, engine })
        });
        let Ok(map) = map_rx.recv() else {
            return Err(receiver.join().expect("receiver panicked").err().unwrap_or_else(|| anyhow::anyhow!("the receiver did not start")));
        };
        cpu0 = all_cpu_busy();
        let dest = SocketAddr::new(net.receiver_ip().into(), map.data_ports[0]);
        let sent = s.spawn(move || send(net, dest, Load::Rdaq, Some(&map), count, rate)).join().expect("sender panicked");
        done.store(true, Ordering::Relaxed);
        let run = receiver.join().expect("receiver panicked")?;
        Ok((sent?, run))
    })?;
    run.sent = sent;
    run.all_cpu = all_cpu_busy().saturating_sub(cpu0);
    Ok(run)
}

/// Full speed first; on loss, bisect the paced rate with probes, then confirm at full
/// count; returns the lossless run and the loss at 1.2 times its rate (a probe).
fn lossless(what: &str, a: &TransportArgs, measure: impl Fn(u64, Option<f64>) -> anyhow::Result<Run>) -> anyhow::Result<(Run, Run)> {
    let full = measure(a.datagrams, None)?;
    eprintln!("  {what} full speed: {:.0} datagrams/s, lost {}", full.rate(), full.lost());
    let found = if full.lost() == 0 { Some(full) } else { crate::search_lossless(what, full.rate(), a.probe, a.datagrams, &measure)? };
    let Some(found) = found else { bail!("{what}: no lossless rate found") };
    let over = 1.2 * found.rate();
    let beyond = measure(a.probe, Some(over))?;
    eprintln!("  {what} at 1.2x ({over:.0}/s): lost {} of {}", beyond.lost(), beyond.sent);
    Ok((found, beyond))
}

pub fn bench(a: TransportArgs) -> anyhow::Result<ExitCode> {
    if let Some(s) = a.sizes.iter().find(|&&s| !(STAMP..=65000).contains(&s)) {
        bail!("--sizes: {s} bytes is outside 16..=65000");
    }
    if a.datagrams < 1000 || a.probe < 1000 {
        bail!("--datagrams and --probe must be at least 1000");
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        bail!("the transport benchmark pins sender and receiver to CPUs 0 and 1: it needs 2 CPUs");
    }
    let mut nets = Vec::new();
    if a.net == "loopback" || a.net == "both" {
        nets.push(Net::Loopback);
    }
    if a.net == "veth" || a.net == "both" {
        nets.push(Net::Veth(VethPair::create("bench", 65535).context("the veth pair (needs root and iproute2)")?));
    }
    if nets.is_empty() {
        bail!("--net must be loopback, veth or both, not {:?}", a.net);
    }
    if a.breakdown_frames > 0 {
        breakdown_table(&a)?;
    }
    for net in &nets {
        let engines: Vec<EngineKind> = a.engines.iter().copied().filter(|&k| !(k == EngineKind::AfXdp && matches!(net, Net::Loopback))).collect();
        sizes_table(net, &engines, &a)?;
        if !a.no_lossless {
            lossless_table(net, &engines, &a)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn sizes_table(net: &Net, engines: &[EngineKind], a: &TransportArgs) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for &size in &a.sizes {
        let count = (a.bytes_per_size / size as u64).clamp(20_000, 2_000_000);
        for &k in engines {
            eprintln!("rdaq bench transport: {} {k} {size} B: {count} at full speed, {} paced", net.name(), a.latency_count);
            let full = bare(net, k, Load::Sized(size), count, None, a).with_context(|| format!("{k}, {size} B, full speed"))?;
            let light = bare(net, k, Load::Sized(size), a.latency_count, Some(a.latency_rate), a).with_context(|| format!("{k}, {size} B, paced"))?;
            rows.push((size, k, full, light));
        }
    }
    println!();
    println!("rdaq bench transport: bare loops (no placement) on {}, batch {}, receive thread on CPU 1, sender on CPU 0", net.name(), a.batch);
    println!("{}", crate::machine_line());
    println!(
        "{:>6} {:<9} {:>10} {:>12} {:>7} {:>6} {:>12} {:>12} {:>9} {:>9} {:>9} {:>6}",
        "bytes", "engine", "datagrams", "datagrams/s", "Gb/s", "lost%", "rx CPU ns/dg", "all CPU ns/dg", "p50 us", "p99 us", "p99.9 us", "lat n"
    );
    for (size, k, full, light) in &rows {
        let h = light.latency.as_ref();
        let q = |p: f64| h.map_or(f64::NAN, |h| h.value_at_quantile(p) as f64 / 1e3);
        println!(
            "{:>6} {:<9} {:>10} {:>12.0} {:>7.2} {:>6.2} {:>12.0} {:>12.0} {:>9.1} {:>9.1} {:>9.1} {:>6}",
            size,
            k.name(),
            full.received,
            full.rate(),
            full.rate() * *size as f64 * 8.0 / 1e9,
            100.0 * full.lost() as f64 / full.sent.max(1) as f64,
            full.ns_per(full.recv_cpu),
            full.ns_per(full.all_cpu),
            q(0.5),
            q(0.99),
            q(0.999),
            light.received
        );
    }
    if let Some((_, _, f, _)) = rows.iter().find(|r| r.1 == EngineKind::AfXdp) {
        println!("af_xdp ran as: {}", f.engine);
    }
    println!("Full speed: the sender's GSO sendmmsg as fast as it goes; datagrams/s over the receiver's first-to-last window.");
    println!("Latency: {} datagrams at {} /s, sent one per call, stamped just before the send; p* over those received.", a.latency_count, a.latency_rate);
    Ok(())
}

fn lossless_table(net: &Net, engines: &[EngineKind], a: &TransportArgs) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for &k in engines {
        eprintln!("rdaq bench transport: {} {k}: lossless search, {} datagrams per confirming run", net.name(), a.datagrams);
        let b = lossless(&format!("{k} bare"), a, |n, r| bare(net, k, Load::Rdaq, n, r, a))?;
        let p = lossless(&format!("{k} placement"), a, |n, r| place(net, k, n, r, a))?;
        rows.push((k, b, p));
    }
    println!();
    println!("rdaq bench transport: highest lossless rate of 8 KiB rdaq datagrams on {}, {} per confirming run", net.name(), a.datagrams);
    println!("{}", crate::machine_line());
    println!(
        "{:<9} {:<10} {:>12} {:>7} {:>9} {:>12} {:>12} {:>10}  asked 1.2x: reached, lost",
        "engine", "loop", "datagrams/s", "Gb/s", "paced at", "rx CPU ns/dg", "all CPU ns/dg", "place/bare"
    );
    for (k, (b, bo), (p, po)) in &rows {
        for (name, r, over, ratio) in [("bare", b, bo, None), ("placement", p, po, Some(p.rate() / b.rate()))] {
            println!(
                "{:<9} {:<10} {:>12.0} {:>7.2} {:>9} {:>12.0} {:>12.0} {:>10}  {:.0}/s: {:.0}/s, {:.2}%",
                k.name(),
                name,
                r.rate(),
                r.rate() * 8192.0 * 8.0 / 1e9,
                r.rate_asked.map_or("full".into(), |x| format!("{x:.0}")),
                r.ns_per(r.recv_cpu),
                r.ns_per(r.all_cpu),
                ratio.map_or("-".into(), |x| format!("{:.1}%", 100.0 * x)),
                1.2 * r.rate(),
                over.rate(),
                100.0 * over.lost() as f64 / over.sent.max(1) as f64
            );
        }
    }
    println!("bare: the engine into a 256 MiB ring, no checks; placement: the full receiver (checks, placement, frames) on the same engine.");
    println!("A rate 'full' was lossless at the sender's full speed: the sender, not the receiver, was the limit there.");
    println!("The 1.2x probe sends {} datagrams paced at 1.2 times the rate found; 'reached' is what arrived per second (below 1.2x: the sender's limit).", a.probe);
    Ok(())
}

/// Ctrl-C and SIGTERM during the paced runs: the run under way stops, so that its scratch
/// files are removed as after a normal end, and the bench ends.
struct Interrupts {
    seen: AtomicBool,
    run: std::sync::Mutex<Option<std::sync::Arc<rdaq_emulator::Control>>>,
}

impl Interrupts {
    fn install() -> std::sync::Arc<Interrupts> {
        let i = std::sync::Arc::new(Interrupts { seen: AtomicBool::new(false), run: std::sync::Mutex::new(None) });
        let on = i.clone();
        // the bench sets no other handler; were one set, the default action would stay
        let _ = ctrlc::set_handler(move || {
            on.seen.store(true, Ordering::Relaxed);
            if let Some(c) = on.run.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_ref() {
                c.stop.store(true, Ordering::Relaxed);
            }
        });
        i
    }

    fn seen(&self) -> bool {
        self.seen.load(Ordering::Relaxed)
    }

    /// The control of the next run, which an interrupt stops; none after one came.
    fn next_run(&self) -> anyhow::Result<std::sync::Arc<rdaq_emulator::Control>> {
        let control = std::sync::Arc::new(rdaq_emulator::Control::default());
        *self.run.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(control.clone());
        if self.seen() {
            bail!("interrupted");
        }
        Ok(control)
    }
}

/// The per-step latency of a paced `rdaq run` (raw frames, written to a scratch directory)
/// on each socket engine over loopback. AF_XDP has no row: `rdaq run` keeps emulator and
/// receiver in one namespace, where the receiver's address is reached through loopback.
fn breakdown_table(a: &TransportArgs) -> anyhow::Result<()> {
    let interrupts = Interrupts::install();
    let mut rows = Vec::new();
    for &k in a.engines.iter().filter(|&&k| k != EngineKind::AfXdp) {
        let dir = std::env::temp_dir().join(format!("rdaq-bench-transport-{}", std::process::id()));
        let mut cfg = rdaq_run::config::Config::default();
        cfg.emulator.frames = a.breakdown_frames;
        cfg.emulator.rate_hz = 100.0;
        cfg.process.mode = "raw".into();
        cfg.network.engine = k.name().into();
        cfg.stream.endpoint = "none".into();
        cfg.stream.preview = "none".into();
        cfg.output.dir = dir.clone();
        cfg.output.overwrite = true;
        cfg.check()?;
        eprintln!("rdaq bench transport: a paced acquisition on {k}: {} frames of 2 modules at 100 Hz, raw, written to {}", a.breakdown_frames, dir.display());
        let sum = rdaq_run::emulated::run(&cfg, interrupts.next_run()?, std::sync::Arc::default(), &indicatif::ProgressBar::hidden());
        let _ = std::fs::remove_dir_all(&dir);
        if interrupts.seen() {
            bail!("interrupted; the paced acquisition's files in {} are removed", dir.display());
        }
        let sum = sum.with_context(|| format!("the paced acquisition on {k}"))?;
        rows.push((k, sum));
    }
    println!();
    println!("rdaq bench transport: latency per frame, step by step, of a paced acquisition (rdaq run --raw, 2 modules, 100 Hz, {} frames) on loopback", a.breakdown_frames);
    println!("{}", crate::machine_line());
    println!("{:<9} {:<22} {:>7} {:>10} {:>10} {:>10}", "engine", "step", "frames", "p50 ms", "p99 ms", "max ms");
    for (k, sum) in &rows {
        for l in &sum.latency {
            println!("{:<9} {:<22} {:>7} {:>10.3} {:>10.3} {:>10.3}", k.name(), l.step, l.frames, l.p50_us as f64 / 1e3, l.p99_us as f64 / 1e3, l.max_us as f64 / 1e3);
        }
        if sum.lost() {
            println!("{:<9} (this acquisition lost frames: {} complete of {:?})", k.name(), sum.frames_complete, sum.frames_expected);
        }
    }
    println!("received -> complete spans the frame's own sending: the emulator spreads each frame over its 10 ms period.");
    println!("The receiver reads a running stream at most every network.coalesce_ms (4 ms by default), which sent -> received includes.");
    Ok(())
}
