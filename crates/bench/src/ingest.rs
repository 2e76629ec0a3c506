//! `rdaq bench ingest`: the highest lossless rate of the receive path for 8 KiB rdaq datagrams over
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
use rdaq_receiver::arena::Arena;
use rdaq_receiver::{Format, IncompletePolicy, Receiver, ReceiverConfig};

use crate::Probe;

#[derive(clap::Args)]
pub struct IngestArgs {
    /// rdaq: highest lossless rate of rdaq datagrams against a bare recvmmsg loop. sls: CPU
    /// per native JUNGFRAU packet against slsReceiver's recvfrom + copy, at the same rates.
    #[arg(long, default_value = "rdaq")]
    pub(crate) format: String,
    /// Native packets of this detector (jungfrau, eiger: one EIGER port at 1GbE and 10GbE
    /// packet sizes) against slsReceiver's method; implies --format sls.
    #[arg(long)]
    pub(crate) detector: Option<String>,
    /// Datagrams per measured run (rdaq).
    #[arg(long, default_value_t = 10_000_000)]
    datagrams: u64,
    /// Datagrams per probe while searching for the lossless rate (rdaq).
    #[arg(long, default_value_t = 1_000_000)]
    probe: u64,
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u32).range(1..=rdaq_proto::MAX_PAYLOAD as i64))]
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
    #[arg(long, default_value_t = 3.0, value_parser = rdaq_run::config::seconds_arg)]
    pub(crate) seconds: f64,
}

pub(crate) const MODULE_BYTES: u64 = 1 << 20;

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
pub(crate) const RING_BYTES: usize = 256 << 20;

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
    /// Placement only: payloads that landed in place, were copied once, and were first
    /// moved out of a wrong cell (a second copy).
    copies: Option<(u64, u64, u64)>,
}

impl crate::Probe for Outcome {
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
    send_module_frames(&mut tx, map, count, rate)?;
    Ok((tx.stats.datagrams, tx.gso()))
}

/// Sends `count` datagrams of one module's 1 MiB frames into the buffers of `map`, paced at
/// `rate` datagrams/s (in small chunks) or at full speed (a frame per call).
pub(crate) fn send_module_frames(tx: &mut BatchSender, map: &BufferMap, count: u64, rate: Option<f64>) -> anyhow::Result<()> {
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
    Ok(())
}

pub(crate) fn map_for(buffers: &[LocalBufferInfo], payload: u32, port: u16) -> BufferMap {
    BufferMap {
        version: TELEGRAM_VERSION,
        modules: 1,
        module_bytes: MODULE_BYTES,
        payload_bytes: payload,
        data_ports: vec![port],
        buffers: buffers.to_vec(),
        checksum: false,
        roce: Vec::new(),
    }
}

fn run_bare(a: &IngestArgs, count: u64, rate: Option<f64>, ring: bool) -> anyhow::Result<Outcome> {
    let (sock, _) = socket::bind_receiver(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), a.recv_buffer_mib << 20)?;
    let port = sock.local_addr()?.port();
    let map = map_for(&[LocalBufferInfo { id: 1, key: 1, size: MODULE_BYTES, va: 0 }], a.payload_bytes, port);
    let done = Arc::new(AtomicBool::new(false));
    let (pin_rx, pin_tx) = if a.no_pin { (None, None) } else { (Some(1), Some(0)) };
    let receiver = {
        let (done, batch, payload) = (done.clone(), a.batch, a.payload_bytes as usize);
        std::thread::Builder::new().name("rdaq-bare".into()).spawn(move || bare_loop(sock, batch, payload, count, pin_rx, ring, &done))?
    };
    let (sent, gso) = send(&map, SocketAddr::from((Ipv4Addr::LOCALHOST, port)), count, rate, pin_tx)?;
    done.store(true, Ordering::Relaxed);
    let (received, window, in_window, cpu) = receiver.join().expect("bare loop panicked")?;
    Ok(Outcome { sent, received, window, in_window, recv_cpu: cpu, rate_asked: rate, gso, copies: None })
}

/// A `--batch` value: what one read of the receiver takes.
pub(crate) fn batch_size(s: &str) -> Result<usize, String> {
    let max = rdaq_receiver::engine::MAX_BATCH;
    match s.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("must be a number of datagrams from 1 to {max}")),
    }
}

/// Receives and discards, into scratch or (`ring`) into successive cells of a ring made as
/// the receiver makes its own ([`Arena`]: one mapping, huge pages where granted, every page
/// written before the clock starts); returns (received, first..last, datagrams in that
/// window, thread CPU time).
fn bare_loop(sock: UdpSocket, batch: usize, payload: usize, count: u64, pin: Option<usize>, ring: bool, done: &AtomicBool) -> anyhow::Result<(u64, Duration, u64, Duration)> {
    if let Some(cpu) = pin {
        socket::pin_current_thread(cpu)?;
    }
    let arena = if ring { Some(Arena::new(RING_BYTES / MODULE_BYTES as usize, MODULE_BYTES as usize)?) } else { None };
    let base = arena.as_ref().map_or(std::ptr::null_mut(), |a| a.slot_ptr(0));
    let cells = arena.as_ref().map_or(0, |a| a.slots() * a.slot_bytes() / payload.max(1));
    let mut cell = 0usize;
    let cpu0 = socket::thread_cpu_time();
    let mut rx = MmsgReceiver::new(batch, rdaq_proto::HEADER_LEN, payload);
    let mut pfd = [socket::pollfd(&sock)];
    let (mut got, mut first, mut last, mut first_n) = (0u64, None, Instant::now(), 0u64);
    let mut quiet_since = Instant::now();
    while got < count {
        // SAFETY: landings are distinct `payload`-byte cells of the arena's slots (cells wrap
        // at the ring's end, and a batch is far smaller than the ring), which nothing else
        // reads or writes and which live until the loop ends; or scratch without a ring.
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
        let consumer = s.spawn(move || crate::drain(rx_ref, None));
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
        copies: Some((c.landed_in_place, c.copied, c.evacuated)),
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
    let found = crate::search_lossless(&format!("{mode:?}"), full.rate(), a.probe, a.datagrams, |n, r| measure(a, mode, n, r))?;
    found.with_context(|| format!("{mode:?}: no lossless rate found"))
}

pub fn ingest(a: IngestArgs) -> anyhow::Result<ExitCode> {
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
    print_table(&a, [("bare recvmmsg (discard)", bare), ("bare recvmmsg into ring", bare_ring), ("placement (rdaq)", place)]);
    Ok(ExitCode::SUCCESS)
}

/// The table: each path's highest lossless rate and receive CPU per datagram, against the
/// bare loop into scratch (`/bare`) and against the bare loop into the same kind of ring
/// (`/ring`: the same pages and memory traffic, so the difference is rdaq's own work).
fn print_table(a: &IngestArgs, rows: [(&str, Outcome); 3]) {
    let [(_, bare), (_, ring), (_, place)] = rows;
    println!();
    println!("rdaq bench ingest: highest lossless rate, {} B datagrams ({} B payload) over loopback, {} per run", a.payload_bytes as usize + rdaq_proto::HEADER_LEN, a.payload_bytes, a.datagrams);
    println!("{}, sender GSO {}, pinned {}", crate::machine_line(), place.gso, !a.no_pin);
    println!(
        "{:<23} {:>10} {:>5} {:>9} {:>12} {:>7} {:>10} {:>14} {:>9} {:>9} {:>9}",
        "path", "datagrams", "lost", "paced at", "datagrams/s", "Gb/s", "recv CPU%", "CPU ns/dgram", "rate/bare", "CPU/bare", "CPU/ring"
    );
    let ns = |o: &Outcome| o.recv_cpu.as_secs_f64() * 1e9 / o.received.max(1) as f64;
    for (name, o) in rows {
        let gbps = o.rate() * a.payload_bytes as f64 * 8.0 / 1e9;
        let cpu = 100.0 * o.recv_cpu.as_secs_f64() / o.window.as_secs_f64().max(1e-9);
        println!(
            "{:<23} {:>10} {:>5} {:>9} {:>12.0} {:>7.2} {:>10.0} {:>14.0} {:>8.1}% {:>8.1}% {:>8.1}%",
            name,
            o.received,
            o.lost(),
            o.rate_asked.map_or("full".into(), |r| format!("{r:.0}")),
            o.rate(),
            gbps,
            cpu,
            ns(&o),
            100.0 * o.rate() / bare.rate(),
            100.0 * ns(&o) / ns(&bare),
            100.0 * ns(&o) / ns(&ring)
        );
    }
    if let Some((in_place, copied, evacuated)) = place.copies {
        println!(
            "placement: {in_place} payloads landed in place (the kernel's copy only), {copied} were copied once more by placement, {evacuated} of them first moved out of a wrongly predicted cell (two copies)"
        );
    }
    println!("Gb/s counts payload bits; recv CPU% is the receive thread's CPU time over its receive window.");
    println!("The ring loop lands payloads in a {} MiB ring made as the receiver's (one mapping, huge pages", RING_BYTES >> 20);
    println!("where granted, pre-faulted), without any checks: placement against it (CPU/ring) is the cost of");
    println!("rdaq's own work with the same memory traffic; the scratch loop (CPU/bare) also leaves out the ring.");
    if bare.rate_asked.is_none() && place.rate_asked.is_none() {
        println!("Both paths were lossless at the sender's full speed: the sender is the limit of this");
        println!("machine, so rate/bare mostly shows sender variance; the CPU columns compare the receive paths.");
    }
}
