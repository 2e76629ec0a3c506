//! `rdaq bench ingest --format sls` (or `--detector eiger`): the CPU that receiving native
//! JUNGFRAU (or EIGER) packets costs, per packet, for rdaq's receiver beside slsReceiver's
//! method: a thread that blocks in one
//! `recvfrom` per packet and copies each payload into its frame buffer. Both receive the same
//! paced stream in the same run, one after the other, pinned to the same core, in three
//! patterns: each frame's 128 packets at 10 GbE line rate (a JUNGFRAU's readout, and what
//! PSI's virtual detector sends: its captures show ~1.1 ms per frame), as one burst as fast
//! as loopback goes, and spread evenly over the frame period (the hardest case for
//! batching). Only the receiving side's CPU is compared, with the times it went to sleep:
//! on a virtual machine each wake-up costs tens of microseconds of CPU. An EIGER is
//! measured on one of its ports (one UDP interface of a half-module, what one slsReceiver
//! listener thread takes): 1072-byte packets on 1GbE and 4144-byte ones on 10GbE, 16 bits.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use rdaq_net::send::BatchSender;
use rdaq_net::socket;
use rdaq_detector::Description;
use rdaq_proto::sls::{SlsHeader, DET_TYPE_JUNGFRAU, JUNGFRAU_PACKETS_PER_FRAME, JUNGFRAU_PACKET_PAYLOAD, SLS_HEADER_LEN, SLS_HEADER_VERSION};
use rdaq_receiver::{Format, IncompletePolicy, PortGrid, Receiver, ReceiverConfig};

use crate::ingest::IngestArgs;

/// Frame buffer of both receivers: the same memory, so the same cache behaviour.
const RING_FRAMES: usize = 128;

/// The packet stream of one port, as both receivers take it.
#[derive(Clone, Copy, Debug)]
struct Wire {
    name: &'static str,
    packets: usize,
    payload: usize,
    det_type: u8,
    /// A packet's time on its link (with Ethernet, IP and UDP framing).
    line_gap: Duration,
    /// Placed by header row and column (EIGER) rather than JUNGFRAU's packet rules.
    by_header: bool,
}

impl Wire {
    fn frame_bytes(&self) -> usize {
        self.packets * self.payload
    }

    fn format(&self) -> Format {
        if self.by_header {
            let g = PortGrid { det_type: self.det_type, payload: self.payload as u32, packets: self.packets as u32, port_rows: 1, port_cols: 1, module_cols: 1 };
            Format::SlsByHeader(g)
        } else {
            Format::sls(1)
        }
    }
}

/// One JUNGFRAU module: 128 packets of 8240 B on 10 GbE.
const JUNGFRAU: Wire = Wire { name: "JUNGFRAU module", packets: JUNGFRAU_PACKETS_PER_FRAME as usize, payload: JUNGFRAU_PACKET_PAYLOAD, det_type: DET_TYPE_JUNGFRAU, line_gap: LINE_RATE_GAP, by_header: false };

/// One EIGER port at 16 bits on `link` ("1g" or "10g"), from the shipped description.
fn eiger_port(link: &'static str) -> anyhow::Result<Wire> {
    let d = Description::load("eiger")?;
    let w = d.wire(Some(16), Some(link))?;
    let (payload, packets) = (w.payload, w.packets_per_port);
    let bits_per_second = if link == "1g" { 1e9 } else { 1e10 };
    // preamble, Ethernet header and FCS, gap: 38 B; IPv4 and UDP: 28 B
    let wire_bytes = (payload + SLS_HEADER_LEN + 38 + 28) as f64;
    let name = if link == "1g" { "EIGER port, 1GbE" } else { "EIGER port, 10GbE" };
    Ok(Wire { name, packets, payload, det_type: d.header.det_type, line_gap: Duration::from_secs_f64(wire_bytes * 8.0 / bits_per_second), by_header: true })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pattern {
    /// Each frame's packets one every [`LINE_RATE_GAP`], then nothing until the next frame.
    LineRate,
    /// Each frame's 128 packets back to back, as fast as loopback takes them.
    Burst,
    /// Packets evenly spaced over the frame period.
    Spread,
}

/// An 8240-byte packet (with its Ethernet, IP and UDP framing) on 10 Gb/s.
const LINE_RATE_GAP: Duration = Duration::from_nanos(6_650);

#[derive(Clone, Copy, Debug)]
struct Measured {
    packets: u64,
    lost: u64,
    cpu: Duration,
    syscalls: u64,
    /// Times the receiving threads went to sleep.
    sleeps: u64,
}

impl Measured {
    fn ns_per_packet(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e9 / self.packets.max(1) as f64
    }
}

/// Sends `frames` frames of `w` to `dest` at `rate` frames/s.
fn send(w: &Wire, dest: SocketAddr, frames: u64, rate: f64, pattern: Pattern, pin: Option<usize>) -> anyhow::Result<()> {
    if let Some(cpu) = pin {
        socket::pin_current_thread(cpu)?;
    }
    let mut tx = BatchSender::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), dest, pattern == Pattern::Burst, 16 << 20)?;
    let payload: Vec<u8> = (0..w.payload).map(|i| (i * 7) as u8).collect();
    let mut headers = vec![[0u8; SLS_HEADER_LEN]; w.packets];
    let period = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now();
    for f in 0..frames {
        for (p, h) in headers.iter_mut().enumerate() {
            let hdr = SlsHeader { frame_number: f + 1, packet_number: p as u32, det_type: w.det_type, version: SLS_HEADER_VERSION, ..Default::default() };
            hdr.encode(h);
        }
        let t0 = start + period.mul_f64(f as f64);
        let gap = match pattern {
            Pattern::Burst => {
                rdaq_net::pace::wait_until(t0);
                tx.send(w.packets, |p| (&headers[p][..], &payload[..]))?;
                continue;
            }
            Pattern::LineRate => w.line_gap,
            Pattern::Spread => period / w.packets as u32,
        };
        for (p, h) in headers.iter().enumerate() {
            rdaq_net::pace::wait_until(t0 + gap * p as u32);
            tx.send(1, |_| (&h[..], &payload[..]))?;
        }
    }
    Ok(())
}

/// slsReceiver's listener: a blocking receive per packet into a packet buffer, then the
/// payload copied into the frame buffer at its frame and packet; a receive timeout lets it
/// see the stop flag.
fn bare_listener(w: Wire, sock: UdpSocket, expected: u64, done: &AtomicBool, pin: Option<usize>) -> anyhow::Result<Measured> {
    if let Some(cpu) = pin {
        socket::pin_current_thread(cpu)?;
    }
    sock.set_nonblocking(false)?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut ring = vec![1u8; RING_FRAMES * w.frame_bytes()];
    let mut packet = vec![0u8; SLS_HEADER_LEN + w.payload];
    let (cpu0, sleeps0) = (socket::thread_cpu_time(), socket::thread_waits());
    let (mut got, mut syscalls) = (0u64, 0u64);
    while got < expected {
        let n = sock.recv(&mut packet);
        syscalls += 1;
        match n {
            Err(_) if done.load(Ordering::Relaxed) => break,
            Err(_) => continue,
            Ok(n) if n != packet.len() => continue,
            Ok(_) => {}
        }
        let h = SlsHeader::decode(packet[..SLS_HEADER_LEN].try_into().expect("header length"));
        let at = (h.frame_number as usize % RING_FRAMES) * w.frame_bytes() + (h.packet_number as usize % w.packets) * w.payload;
        ring[at..at + w.payload].copy_from_slice(&packet[SLS_HEADER_LEN..]);
        got += 1;
    }
    std::hint::black_box(&ring);
    Ok(Measured { packets: got, lost: expected - got, cpu: socket::thread_cpu_time() - cpu0, syscalls, sleeps: socket::thread_waits() - sleeps0 })
}

fn run_bare(a: &IngestArgs, w: &Wire, frames: u64, rate: f64, pattern: Pattern) -> anyhow::Result<Measured> {
    let (sock, _) = socket::bind_receiver(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), a.recv_buffer_mib << 20)?;
    let dest = sock.local_addr()?;
    let done = Arc::new(AtomicBool::new(false));
    let (pin_rx, pin_tx) = if a.no_pin { (None, None) } else { (Some(1), Some(0)) };
    let expected = frames * w.packets as u64;
    let (d2, w2) = (done.clone(), *w);
    let listener = std::thread::Builder::new().name("sls-listener".into()).spawn(move || bare_listener(w2, sock, expected, &d2, pin_rx))?;
    send(w, dest, frames, rate, pattern, pin_tx)?;
    done.store(true, Ordering::Relaxed);
    listener.join().expect("listener panicked")
}

/// rdaq's receiver on sls packets, with a consumer that gives every frame back; the CPU is
/// the receive thread's and the consumer's together.
fn run_rdaq(a: &IngestArgs, w: &Wire, frames: u64, rate: f64, pattern: Pattern) -> anyhow::Result<Measured> {
    let mut rx = Receiver::start(ReceiverConfig {
        format: w.format(),
        data_port: 0,
        modules: 1,
        module_bytes: w.frame_bytes() as u64,
        payload_bytes: w.payload as u32,
        slots: RING_FRAMES,
        recv_buffer: a.recv_buffer_mib << 20,
        batch: a.batch,
        policy: IncompletePolicy::Discard,
        frames: Some(frames),
        linger: Duration::from_millis(300),
        cpu: (!a.no_pin).then_some(1),
        nack: None,
        ..ReceiverConfig::default()
    })?;
    let dest = SocketAddr::from((Ipv4Addr::LOCALHOST, rx.ports()[0]));
    let (consumer_cpu, consumer_sleeps) = std::thread::scope(|s| -> anyhow::Result<(Duration, u64)> {
        let rx_ref = &rx;
        let consumer = s.spawn(move || {
            let (cpu0, sleeps0) = (socket::thread_cpu_time(), socket::thread_waits());
            for f in rx_ref.frames().iter() {
                rx_ref.release(f).expect("a frame of this receiver");
            }
            (socket::thread_cpu_time() - cpu0, socket::thread_waits() - sleeps0)
        });
        send(w, dest, frames, rate, pattern, (!a.no_pin).then_some(0))?;
        rx.stop();
        Ok(consumer.join().expect("consumer panicked"))
    })?;
    let c = rx.join()?;
    let expected = frames * w.packets as u64;
    Ok(Measured {
        packets: c.placed,
        lost: expected - c.placed.min(expected),
        cpu: c.cpu_time + consumer_cpu,
        syscalls: c.recv_syscalls + c.recv_waits,
        sleeps: c.sleeps + consumer_sleeps,
    })
}

/// The table: per stream, pattern and frame rate, both receivers and their ratio.
pub fn ingest_sls(a: &IngestArgs) -> anyhow::Result<ExitCode> {
    if a.frame_rates.is_empty() || a.frame_rates.iter().any(|r| !(*r > 0.0)) || !(a.seconds > 0.0) {
        bail!("--frame-rates must be positive frames/s and --seconds positive");
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if !a.no_pin && cores < 2 {
        bail!("pinning needs 2 CPUs; use --no-pin");
    }
    let wires = match a.detector.as_deref() {
        None | Some("jungfrau") => vec![JUNGFRAU],
        Some("eiger") => vec![eiger_port("1g")?, eiger_port("10g")?],
        Some(other) => bail!("--detector must be jungfrau or eiger, not {other:?}"),
    };
    println!("rdaq bench ingest: native sls packets over loopback, {} s per row", a.seconds);
    println!("receive CPU per packet: slsReceiver's method (blocking recvfrom + copy into the frame buffer) vs rdaq (receive thread + consumer)");
    let mut worst: f64 = 0.0;
    for w in &wires {
        println!();
        println!("{}: {} packets of {} B per frame", w.name, w.packets, w.payload + SLS_HEADER_LEN);
        println!(
            "{:<9} {:>9} {:>10} {:<28} {:>9} {:>6} {:>13} {:>15} {:>13} {:>9}",
            "pattern", "frames/s", "packets/s", "receiver", "packets", "lost", "CPU ns/packet", "syscalls/packet", "sleeps/frame", "CPU/bare"
        );
        for pattern in [Pattern::LineRate, Pattern::Burst, Pattern::Spread] {
            for &rate in &a.frame_rates {
                if pattern == Pattern::LineRate && w.line_gap * w.packets as u32 > Duration::from_secs_f64(1.0 / rate) {
                    println!("{:<9} {:>9.0} {:>10.0} (a frame takes longer than its period on this link: not measured)", "linerate", rate, rate * w.packets as f64);
                    continue;
                }
                worst = worst.max(measure_row(a, w, pattern, rate)?);
            }
        }
    }
    println!("worst rdaq/bare CPU per packet: {worst:.2}x (target: at most 0.80x)");
    Ok(ExitCode::SUCCESS)
}

/// Both receivers on one stream, pattern and rate: their table rows, and rdaq's CPU per
/// packet over the bare loop's.
fn measure_row(a: &IngestArgs, w: &Wire, pattern: Pattern, rate: f64) -> anyhow::Result<f64> {
    let frames = ((rate * a.seconds).ceil() as u64).max(2);
    let bare = run_bare(a, w, frames, rate, pattern)?;
    let rdaq = run_rdaq(a, w, frames, rate, pattern)?;
    for (name, m) in [("recvfrom + copy (slsReceiver)", bare), ("rdaq receiver", rdaq)] {
        println!(
            "{:<9} {:>9.0} {:>10.0} {:<28} {:>9} {:>6} {:>13.0} {:>15.3} {:>13.1} {:>8.2}x",
            format!("{pattern:?}").to_lowercase(),
            rate,
            rate * w.packets as f64,
            name,
            m.packets,
            m.lost,
            m.ns_per_packet(),
            m.syscalls as f64 / m.packets.max(1) as f64,
            m.sleeps as f64 / frames as f64,
            m.ns_per_packet() / bare.ns_per_packet()
        );
    }
    Ok(rdaq.ns_per_packet() / bare.ns_per_packet())
}
