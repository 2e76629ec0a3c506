//! `rdaq bench roce`: the software RoCEv2 target beside rdaq datagrams, on the same engine
//! (AF_XDP) and the same veth pair in the same run: the emulator sends JUNGFRAU module frames
//! at full speed, the receiver places them (a consumer releases each frame at once), and the
//! table gives the rate placed, the receive thread's CPU per 8 KiB of payload, and for RoCEv2
//! what the RC protocol cost (NAKs, go-back resends). A second table times the ICRC of one
//! 4 KiB packet in this process, as a share of the RoCEv2 receive CPU per packet.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rdaq_emulator::{Control, EmulatorConfig};
use rdaq_net::engine::EngineKind;
use rdaq_net::netns::VethPair;
use rdaq_proto::telegram::ModuleDtp;
use rdaq_receiver::{Counters, Format, IncompletePolicy, Receiver, ReceiverConfig};

use crate::ingest::{MODULE_BYTES, RING_BYTES};

#[derive(clap::Args)]
pub struct RoceArgs {
    /// Module frames (1 MiB) per format.
    #[arg(long, default_value_t = 2000)]
    frames: u64,
    /// RoCEv2 path MTU.
    #[arg(long, default_value_t = 4096)]
    mtu: u32,
    /// Packets timed for the ICRC row.
    #[arg(long, default_value_t = 1_000_000)]
    icrc_packets: u64,
}

struct Run {
    counters: Counters,
    window: Duration,
    resent: u64,
    sent: u64,
}

/// One format through the AF_XDP engine: receiver in one namespace, emulator in the other.
fn run(pair: &VethPair, format: Format, payload: u32, frames: u64) -> anyhow::Result<Run> {
    let cfg = ReceiverConfig {
        format,
        engine: EngineKind::AfXdp,
        bind: IpAddr::V4(pair.receiver_ip),
        module_bytes: MODULE_BYTES,
        payload_bytes: payload,
        slots: RING_BYTES / MODULE_BYTES as usize,
        recv_buffer: 256 << 20,
        policy: IncompletePolicy::Keep,
        frames: Some(frames),
        linger: Duration::from_millis(300),
        frame_timeout: Duration::from_secs(2),
        cpu: Some(1),
        nack: None,
        ..ReceiverConfig::default()
    };
    let done = AtomicBool::new(false);
    let (map_tx, map_rx) = mpsc::channel();
    std::thread::scope(|s| {
        let receiver = s.spawn(|| -> anyhow::Result<(Counters, Duration)> {
            let map_tx = map_tx;
            VethPair::enter(&pair.receiver_ns)?;
            rdaq_net::socket::pin_current_thread(1)?;
            let mut rx = Receiver::start(cfg)?;
            let _ = map_tx.send(rx.buffer_map().clone());
            let (first, last) = crate::drain(&rx, Some(&done));
            Ok((rx.join()?, first.map_or(Duration::ZERO, |f| last - f)))
        });
        let Ok(map) = map_rx.recv() else {
            return Err(receiver.join().expect("receiver panicked").err().unwrap_or_else(|| anyhow::anyhow!("the receiver did not start")));
        };
        let emu = s
            .spawn(move || -> anyhow::Result<rdaq_emulator::EmulatorReport> {
                VethPair::enter(&pair.sender_ns)?;
                rdaq_net::socket::pin_current_thread(0)?;
                let ecfg = EmulatorConfig { frames, rate_hz: None, frame_pool: 16, history_bytes: 0, ..EmulatorConfig::default() };
                let dtps = [ModuleDtp::single(&map, 0, SocketAddr::new(pair.receiver_ip.into(), map.data_ports[0]))];
                Ok(rdaq_emulator::run(&ecfg, &dtps, Arc::new(Control::default()))?)
            })
            .join()
            .expect("emulator panicked");
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let (counters, window) = receiver.join().expect("receiver panicked")?;
        let emu = emu?;
        Ok(Run { counters, window, resent: emu.retransmit.resent, sent: emu.sent.datagrams })
    })
}

/// Nanoseconds of one ICRC over a WRITE_MIDDLE packet of `mtu` payload bytes.
fn icrc_ns(mtu: usize, packets: u64) -> f64 {
    let ip = [0x45u8, 0, 0x10, 0x3A, 0, 1, 0x40, 0, 64, 17, 0, 0, 10, 99, 0, 1, 10, 99, 0, 2];
    let udp = [0xC0u8, 0, 0x12, 0xB7, 0x10, 0x26, 0, 0];
    let rest: Vec<u8> = (0..12 + mtu).map(|i| i as u8).collect();
    let t = Instant::now();
    let mut x = 0u32;
    for i in 0..packets {
        let mut r = [&rest[..]];
        std::hint::black_box(&mut r);
        x ^= rdaq_proto::roce::icrc_ipv4_parts(&ip, &udp, &r).wrapping_add(i as u32);
    }
    std::hint::black_box(x);
    t.elapsed().as_nanos() as f64 / packets as f64
}

pub fn bench(a: RoceArgs) -> anyhow::Result<ExitCode> {
    println!("rdaq bench roce: {}", crate::machine_line());
    let pair = VethPair::create("roce", 9000).context("the veth pair (needs root and iproute2)")?;
    println!("veth pair between two namespaces (MTU 9000), AF_XDP engine (copy mode), receive thread on CPU 1, emulator on CPU 0, {} module frames of 1 MiB each, full speed", a.frames);
    println!("{:<44} {:>9} {:>9} {:>10} {:>12} {:>12} {:>10}", "format", "complete", "GB/s", "recv CPU", "ns / 8 KiB", "sent/placed", "go-back");
    let rows = [
        ("rdaq datagrams, 8 KiB (UDP sockets, GSO)", Format::Rdaq, 8192),
        ("RoCEv2 WRITE, MTU 4096 (raw frames, RC)", Format::Roce { mtu: a.mtu, first_frame: 0, frame_stride: 1 }, a.mtu),
    ];
    let mut roce_ns_per_packet = None;
    for (name, format, payload) in rows {
        let r = run(&pair, format, payload, a.frames)?;
        let c = &r.counters;
        let kib8 = c.bytes_placed as f64 / 8192.0;
        let cpu_ns = c.cpu_time.as_nanos() as f64;
        println!(
            "{:<44} {:>9} {:>9.2} {:>9.2}s {:>12.0} {:>12.3} {:>10}",
            name,
            c.frames_complete,
            c.bytes_placed as f64 / r.window.as_secs_f64().max(1e-9) / 1e9,
            c.cpu_time.as_secs_f64(),
            cpu_ns / kib8.max(1.0),
            r.sent as f64 / c.placed.max(1) as f64,
            r.resent
        );
        if matches!(format, Format::Roce { .. }) {
            roce_ns_per_packet = Some(cpu_ns / c.datagrams.max(1) as f64);
        }
    }
    let icrc = icrc_ns(a.mtu as usize, a.icrc_packets);
    println!();
    println!("{:<44} {:>12} {:>22} {:>8}", "ICRC (crc32fast)", "ns / packet", "RoCEv2 recv ns / packet", "share");
    if let Some(p) = roce_ns_per_packet {
        println!("{:<44} {:>12.0} {:>22.0} {:>7.1}%", format!("{} B packet (BTH + payload)", 12 + a.mtu), icrc, p, 100.0 * icrc / p);
    }
    Ok(ExitCode::SUCCESS)
}
