//! A receiver on a network port under hostile input, over loopback: a real checksummed
//! stream from the configured sender is interleaved with every kind of bad datagram and a
//! flood from an address it was not configured to accept. Each bad datagram is dropped and
//! counted under its reason, the real stream completes bit-exact, and the guard regions
//! around the ring stay intact.

mod common;
use common::Net;

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use rdaq_proto::datagram::{checksum, Flags, Header, CHECKSUM_LEN, HEADER_LEN};
use rdaq_proto::telegram::BufferMap;
use rdaq_receiver::{FrameReady, FrameStatus};
use rdaq_receiver::{DropReason, IncompletePolicy, Receiver, ReceiverConfig};

const MODULE_BYTES: u64 = 32 * 1024;
const CELL: usize = 8192;
const CELLS: u64 = MODULE_BYTES / CELL as u64;
const FRAMES: u64 = 24;

fn byte(frame: u64, cell: u64, i: usize) -> u8 {
    (frame as usize * 13 + cell as usize * 5 + i / 100) as u8
}

/// Datagram `cell` of `frame` with a valid checksum.
fn datagram(map: &rdaq_proto::telegram::BufferMap, frame: u64, cell: u64, seq: u32) -> Vec<u8> {
    let buf = map.buffer_for(frame);
    let h = Header {
        flags: Flags::CHECKSUM,
        module: 0,
        buffer: buf.id,
        key: buf.key,
        offset: cell * CELL as u64,
        length: CELL as u32,
        seq,
        frame,
        dataset: 0,
        imm: 0,
    };
    let mut d = vec![0u8; HEADER_LEN + CHECKSUM_LEN + CELL];
    for (i, b) in d[HEADER_LEN + CHECKSUM_LEN..].iter_mut().enumerate() {
        *b = byte(frame, cell, i);
    }
    seal(&h, &mut d);
    d
}

/// Encodes `h` into `d` and writes the checksum of header and payload.
fn seal(h: &Header, d: &mut [u8]) {
    h.encode((&mut d[..HEADER_LEN]).try_into().unwrap());
    let head: [u8; HEADER_LEN] = d[..HEADER_LEN].try_into().unwrap();
    let c = checksum(&head, &d[HEADER_LEN + CHECKSUM_LEN..]);
    d[HEADER_LEN..HEADER_LEN + CHECKSUM_LEN].copy_from_slice(&c.to_le_bytes());
}

/// The hostile variant sent before real datagram `d` (cell `c` of frame `f`), and the reason
/// it must be dropped for: each kind in turn.
fn hostile_variant(map: &BufferMap, d: &[u8], f: u64, c: u64) -> Option<(Vec<u8>, DropReason)> {
    let (h, _) = Header::parse(d).unwrap();
    let sealed = |h: Header| {
        let mut x = d.to_vec();
        seal(&h, &mut x);
        x
    };
    let flipped = |at: usize, x: u8| {
        let mut v = d.to_vec();
        v[at] ^= x;
        v
    };
    Some(match (f * CELLS + c) % 12 {
        0 => (d[..30].to_vec(), DropReason::Truncated),
        1 => (vec![0xAB; 60_000], DropReason::Oversized),
        2 => (flipped(0, b'Z' ^ d[0]), DropReason::BadMagic),
        3 => (flipped(4, 7 ^ d[4]), DropReason::BadVersion),
        4 => (sealed(Header { key: h.key ^ 1, ..h }), DropReason::BadKey),
        5 => (sealed(Header { offset: MODULE_BYTES, ..h }), DropReason::OutOfBounds),
        6 => (sealed(Header { module: 3, ..h }), DropReason::UnknownModule),
        7 => (flipped(HEADER_LEN + 100, 0x10), DropReason::BadChecksum),
        8 => {
            // the same datagram without the extension: not what this receiver takes
            let mut x = vec![0u8; HEADER_LEN + CELL];
            Header { flags: Flags::empty(), ..h }.encode((&mut x[..HEADER_LEN]).try_into().unwrap());
            x[HEADER_LEN..].copy_from_slice(&d[HEADER_LEN + CHECKSUM_LEN..]);
            (x, DropReason::ChecksumMode)
        }
        9 => (sealed(Header { buffer: 999, ..h }), DropReason::UnknownBuffer),
        // a replay of a frame that finished long ago (its slot has moved on)
        10 if f >= 10 => (datagram(map, f - 8, c, 0), DropReason::Stale),
        _ => return None,
    })
}

/// Checks a sample of a handed frame's bytes against what was sent.
fn check_bytes(rx: &Receiver, fr: &FrameReady) {
    let data = rx.data(fr).unwrap();
    for c in 0..CELLS {
        for i in (0..CELL).step_by(61) {
            assert_eq!(data[c as usize * CELL + i], byte(fr.frame(), c, i), "frame {} cell {c}", fr.frame());
        }
    }
}

engines!(every_hostile_datagram_is_dropped_by_reason_and_the_real_stream_completes);
fn every_hostile_datagram_is_dropped_by_reason_and_the_real_stream_completes(net: &Net) {
    net.as_receiver();
    let mut rx = Receiver::start(ReceiverConfig {
        engine: net.engine,
        bind: net.receiver_ip(),
        data_port: 0,
        modules: 1,
        module_bytes: MODULE_BYTES,
        payload_bytes: CELL as u32,
        slots: 8,
        checksum: true,
        sources: vec![net.sender_ip()],
        policy: IncompletePolicy::Keep,
        frame_timeout: Duration::from_secs(2),
        linger: Duration::from_millis(200),
        recv_buffer: 32 << 20,
        nack: None,
        ..ReceiverConfig::default()
    })
    .unwrap();
    let map = rx.buffer_map().clone();
    let port = SocketAddr::new(net.receiver_ip(), map.data_ports[0]);
    net.as_sender();
    let good = UdpSocket::bind(SocketAddr::new(net.sender_ip(), 0)).unwrap();
    // a second host for the flood
    let stranger = UdpSocket::bind(SocketAddr::new(net.stranger_ip(), 0)).unwrap();
    let mut expect: Vec<(DropReason, u64)> = Vec::new();
    let mut send_bad = |d: &[u8], r: DropReason| {
        good.send_to(d, port).unwrap();
        match expect.iter_mut().find(|(x, _)| *x == r) {
            Some((_, n)) => *n += 1,
            None => expect.push((r, 1)),
        }
    };
    let mut seq = 0u32;
    let mut frames_seen = Vec::new();
    for f in 0..FRAMES {
        for c in 0..CELLS {
            let d = datagram(&map, f, c, seq);
            seq += 1;
            // before each real datagram, one hostile variant of it
            if let Some((bad, reason)) = hostile_variant(&map, &d, f, c) {
                send_bad(&bad, reason);
            }
            // the stranger's copy of the real datagram must not be taken either
            stranger.send_to(&d, port).unwrap();
            good.send_to(&d, port).unwrap();
        }
        // a flood from the stranger between frames
        for _ in 0..500 {
            stranger.send_to(&[0u8; 64], port).unwrap();
        }
        std::thread::sleep(Duration::from_millis(2));
        while let Ok(fr) = rx.frames().try_recv() {
            frames_seen.push((fr.frame(), fr.status()));
            check_bytes(&rx, &fr);
            rx.release(fr).unwrap();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while frames_seen.len() < FRAMES as usize && Instant::now() < deadline {
        if let Ok(fr) = rx.frames().recv_timeout(Duration::from_millis(50)) {
            frames_seen.push((fr.frame(), fr.status()));
            rx.release(fr).unwrap();
        }
    }
    rx.stop();
    let counters = rx.join().unwrap();
    assert!(rx.guards_intact(), "nothing written outside the ring");
    assert_eq!(frames_seen.len(), FRAMES as usize, "{counters}");
    assert!(frames_seen.iter().all(|(_, s)| *s == FrameStatus::Complete), "{frames_seen:?}");
    assert_eq!(counters.placed, FRAMES * CELLS);
    let stranger_sent = FRAMES * CELLS + FRAMES * 500;
    assert_eq!(counters.dropped(DropReason::UnknownSource), stranger_sent, "{counters}");
    for (r, n) in &expect {
        assert_eq!(counters.dropped(*r), *n, "{r:?}: {counters}");
    }
    let accounted: u64 = expect.iter().map(|(_, n)| n).sum::<u64>() + stranger_sent;
    assert_eq!(counters.dropped_total(), accounted, "no other drops: {counters}");
    assert_eq!(counters.kernel_drops, 0);
}
