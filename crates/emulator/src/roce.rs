//! A module's RoCEv2 queue pairs: each frame is one RDMA WRITE message into the receiver's
//! buffer (VA and R_Key from the buffer map), cut into packets of the path MTU, the last one
//! WRITE_*_WITH_IMM carrying the frame number. The packets go out as whole Ethernet frames
//! on a raw socket (their ICRC covers the IP header); ACKs and NAKs come back on it, and
//! the RC requester goes back to the PSN a NAK names, or to its oldest unacknowledged packet
//! after a timeout.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use rdaq_net::iface::Interface;
use rdaq_net::raw::{self, RawSocket, MAX_SEND_BATCH};
use rdaq_net::roce::requester::{Answer, Requester, WriteMessage};
use rdaq_proto::roce::{self, frame, AethKind, Endpoints, Opcode, ROCE_PORT};
use rdaq_proto::telegram::{LocalBufferInfo, RoceQp, Route};

use crate::faults::{Fate, FaultStats, Faults};
use crate::report::RetransmitStats;

/// Without progress for this long, the requester sends again from its oldest packet.
pub const RETRANSMIT_TIMEOUT: Duration = Duration::from_millis(20);
/// Timeouts in a row after which the receiver is taken to be gone.
pub const RETRY_LIMIT: u32 = 50;
/// Packets a queue pair may have unacknowledged: the sender waits for ACKs beyond it, so
/// that a loss costs at most this much go-back and the receiver's ring is not flooded.
pub const WINDOW_PACKETS: u32 = 1024;
/// Bytes of the largest frame: headers, the largest path MTU, pad and ICRC.
const FRAME_MAX: usize = frame::FRAME_HEADERS_LEN + roce::MAX_HEAD + 4096 + 4;

/// What a frame read from the raw socket is to one queue pair.
enum Heard {
    /// An ACK or NAK for it, ICRC checked.
    Answer(AethKind, u32),
    /// Addressed to it but not a valid acknowledgement (bad ICRC, not an ACK, malformed).
    Bad,
    /// Another queue pair's, or not RoCEv2 to this host.
    NotOurs,
}

/// One queue pair to one receiver, on a raw socket of the interface towards it.
pub(crate) struct RoceLink {
    raw: RawSocket,
    ends: Endpoints,
    peer_qpn: u32,
    req: Requester,
    ident: u16,
    /// Frames being built for one send call; from [`MAX_SEND_BATCH`] on, those fault
    /// injection sends after the others.
    frames: Vec<Vec<u8>>,
    rx: Vec<u8>,
    /// Packets of the message being written that were not sent yet (a go-back stops there).
    unsent: u32,
    /// Go-backs so far (varies the fate fault injection gives each resend).
    go_backs: u64,
    pub(crate) packets: u64,
    pub(crate) bytes: u64,
}

pub(crate) type RoceLinks = HashMap<SocketAddr, RoceLink>;

/// Where the bytes of a frame still in the window are.
pub(crate) type Bytes<'a> = &'a dyn Fn(u64) -> Option<&'a [u8]>;

/// The sending side of fault injection, shared with the datagram path.
pub(crate) struct Spoil<'a> {
    pub(crate) faults: Option<&'a Faults>,
    pub(crate) stats: &'a mut FaultStats,
}

/// The link of `route`, opened on first use: the interface towards the receiver, the
/// hardware addresses of both ends.
pub(crate) fn link<'a>(links: &'a mut RoceLinks, route: &Route, qp: RoceQp, send_buffer: usize) -> io::Result<&'a mut RoceLink> {
    if !links.contains_key(&route.data) {
        links.insert(route.data, RoceLink::open(route.data, qp, send_buffer)?);
    }
    Ok(links.get_mut(&route.data).expect("inserted above"))
}

impl RoceLink {
    /// Frames the interface's queue refused so far.
    pub(crate) fn refused(&self) -> u64 {
        self.raw.refused
    }

    fn open(data: SocketAddr, qp: RoceQp, send_buffer: usize) -> io::Result<RoceLink> {
        let IpAddr::V4(dst_ip) = data.ip() else {
            return Err(io::Error::new(io::ErrorKind::Unsupported, format!("RoCEv2 to {data}: rdaq sends RoCEv2 over IPv4 only")));
        };
        let probe = UdpSocket::bind("0.0.0.0:0")?;
        probe.connect((dst_ip, ROCE_PORT))?;
        let IpAddr::V4(src_ip) = probe.local_addr()?.ip() else { unreachable!("an IPv4 socket has an IPv4 address") };
        let itf = Interface::holding(src_ip)?.ok_or_else(|| io::Error::other(format!("no interface holds {src_ip}, the address towards {dst_ip}")))?;
        if itf.loopback {
            return Err(io::Error::new(io::ErrorKind::Unsupported, format!("RoCEv2 to {dst_ip} would go over loopback: the receiver must be on another host or network namespace")));
        }
        let ends = Endpoints {
            src_mac: raw::mac_address(&itf.name)?,
            dst_mac: raw::neighbour_mac(dst_ip, Duration::from_secs(2))?,
            src_ip,
            dst_ip,
            // the UDP source port carries the flow's entropy (ECMP), from the queue pair
            src_port: 0xC000 | (qp.peer_qpn & 0x3FFF) as u16,
        };
        Ok(RoceLink {
            raw: RawSocket::open(itf.index, send_buffer)
                .map_err(|e| io::Error::new(e.kind(), format!("a raw socket on {} for RoCEv2 (needs root or CAP_NET_RAW): {e}", itf.name)))?,
            ends,
            peer_qpn: qp.peer_qpn,
            req: Requester::new(qp.qpn, qp.start_psn, qp.mtu),
            ident: 0,
            frames: (0..2 * MAX_SEND_BATCH).map(|_| Vec::with_capacity(FRAME_MAX)).collect(),
            rx: vec![0; 2048],
            unsent: 0,
            go_backs: 0,
            packets: 0,
            bytes: 0,
        })
    }

    /// The oldest frame not yet acknowledged.
    pub(crate) fn oldest_frame(&self) -> Option<u64> {
        self.req.oldest_frame()
    }

    pub(crate) fn outstanding(&self) -> usize {
        self.req.outstanding()
    }

    /// Posts frame `frame` as one WRITE to `buf` at `offset` and sends it, calling
    /// `pace(packets)` before each batch and waiting for ACKs while the window is full.
    /// `bytes` finds the frames of the window (this one included).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write_frame(
        &mut self,
        frame: u64,
        buf: &LocalBufferInfo,
        offset: u64,
        bytes: Bytes,
        spoil: &mut Spoil,
        stats: &mut RetransmitStats,
        pace: impl Fn(usize),
    ) -> io::Result<()> {
        let len = bytes(frame).ok_or_else(|| gone(frame))?.len() as u32;
        let msg = WriteMessage { frame, from: 0, va: buf.va + offset, rkey: buf.key, len, imm: Some(frame as u32) };
        let n = self.req.post(msg);
        let mut k = 0;
        while k < n {
            let m = (n - k).min(MAX_SEND_BATCH as u32);
            // the packets not sent yet count as in flight already
            self.unsent = n - k;
            while self.req.in_flight() - (n - k) > WINDOW_PACKETS.saturating_sub(m) {
                if !self.serve(bytes, spoil, stats)? {
                    rdaq_net::socket::wait_readable(&mut [libc::pollfd { fd: self.fd(), events: libc::POLLIN, revents: 0 }], 1)?;
                }
            }
            pace(m as usize);
            // go-backs while waiting may have released earlier messages: this one is last
            let i = self.req.outstanding() - 1;
            self.send((k..k + m).map(|j| (i, j)), bytes, spoil, 0)?;
            k += m;
        }
        self.unsent = 0;
        Ok(())
    }

    /// Builds and sends packets (window position, packet index), at most a batch; `attempt`
    /// 0 is the first sending.
    fn send(&mut self, which: impl Iterator<Item = (usize, u32)>, bytes: Bytes, spoil: &mut Spoil, attempt: u64) -> io::Result<usize> {
        let mut n = 0;
        let mut late = 0;
        for (i, k) in which.take(MAX_SEND_BATCH) {
            let plan = self.req.packet(i, k);
            let data = bytes(plan.frame).ok_or_else(|| gone(plan.frame))?;
            let f = &mut self.frames[n];
            build(f, &self.ends, self.ident, &plan.headers, &data[plan.from..plan.from + plan.len]);
            self.ident = self.ident.wrapping_add(1);
            let fate = spoil.faults.map_or(Fate::Pass, |x| x.fate(plan.headers.bth.psn, attempt));
            spoil.stats.count(fate);
            match fate {
                Fate::Pass => n += 1,
                Fate::Drop => {}
                Fate::Corrupt { byte, bit } => {
                    // past the Ethernet header, so the frame still reaches the receiver
                    let at = frame::ETH_HEADER_LEN + byte as usize % (f.len() - frame::ETH_HEADER_LEN);
                    f[at] ^= 1 << bit;
                    n += 1;
                }
                // reordered, delayed and duplicated packets go out after the rest of the batch
                Fate::Reorder(_) | Fate::Delay | Fate::Duplicate => {
                    let f = std::mem::take(&mut self.frames[n]);
                    self.frames[MAX_SEND_BATCH + late].clone_from(&f);
                    self.frames[n] = f;
                    late += 1;
                    n += (fate == Fate::Duplicate) as usize;
                }
            }
        }
        let sent = self.raw.send_batch(n, |j| &self.frames[j][..])?;
        let held = self.raw.send_batch(late, |j| &self.frames[MAX_SEND_BATCH + j][..])?;
        self.packets += (sent + held) as u64;
        self.bytes += self.frames[..n].iter().chain(&self.frames[MAX_SEND_BATCH..MAX_SEND_BATCH + late]).map(|f| f.len() as u64).sum::<u64>();
        Ok(sent + held)
    }

    /// Sends again every packet from `psn` to the end of the window.
    fn go_back(&mut self, psn: u32, bytes: Bytes, spoil: &mut Spoil, stats: &mut RetransmitStats) -> io::Result<()> {
        let mut all: Vec<(usize, u32)> = self.req.resend_from(psn).collect();
        all.truncate(all.len().saturating_sub(self.unsent as usize));
        stats.requested += all.len() as u64;
        self.go_backs += 1;
        for chunk in all.chunks(MAX_SEND_BATCH) {
            stats.resent += self.send(chunk.iter().copied(), bytes, spoil, self.go_backs)? as u64;
        }
        Ok(())
    }

    /// Takes every ACK and NAK waiting, going back where one asks, and goes back to the
    /// oldest packet after a timeout; true if an answer came.
    pub(crate) fn serve(&mut self, bytes: Bytes, spoil: &mut Spoil, stats: &mut RetransmitStats) -> io::Result<bool> {
        let mut any = false;
        while let Some(len) = self.raw.try_recv(&mut self.rx)? {
            let (kind, psn) = match self.answer_in(len) {
                Heard::Answer(kind, psn) => (kind, psn),
                Heard::Bad => {
                    stats.bad_nacks += 1;
                    continue;
                }
                Heard::NotOurs => continue,
            };
            any = true;
            match self.req.answer(kind, psn) {
                Answer::GoBack { psn } => {
                    stats.nacks += 1;
                    self.go_back(psn, bytes, spoil, stats)?;
                }
                Answer::Fatal { code } => {
                    return Err(io::Error::other(format!("the receiver at {} refused queue pair {:#x} (NAK code {code}: invalid request or remote access error)", self.ends.dst_ip, self.peer_qpn)));
                }
                Answer::Acked { .. } | Answer::Ignored => {}
            }
        }
        if let Some(psn) = self.req.timed_out(Instant::now(), RETRANSMIT_TIMEOUT) {
            if self.req.retries > RETRY_LIMIT {
                return Err(io::Error::new(io::ErrorKind::TimedOut, format!("no acknowledgement from {} after {RETRY_LIMIT} retransmissions", self.ends.dst_ip)));
            }
            stats.probes += 1;
            self.go_back(psn, bytes, spoil, stats)?;
        }
        Ok(any)
    }

    /// What the frame just read is to this queue pair. Every module's raw socket sees every
    /// frame that reaches the interface, so the other queue pairs' answers are skipped here.
    fn answer_in(&self, len: usize) -> Heard {
        let f = &self.rx[..len];
        // from the receiver this queue pair writes to (queue pair numbers are per receiver)
        let ours = |h: &frame::FrameHeaders| h.dst_port == ROCE_PORT && h.ends.dst_ip == self.ends.src_ip && h.ends.src_ip == self.ends.dst_ip;
        let Some(h) = frame::parse_headers(f).filter(ours) else {
            return Heard::NotOurs;
        };
        let Some(p) = f.get(frame::FRAME_HEADERS_LEN..frame::FRAME_HEADERS_LEN + h.udp_payload).and_then(|b| roce::parse(b).ok().map(|p| (b, p))) else {
            return Heard::Bad;
        };
        let (body, p) = p;
        if p.headers.bth.dest_qp != self.peer_qpn {
            return Heard::NotOurs;
        }
        match p.headers.aeth {
            Some(a) if p.opcode == Opcode::Ack && p.icrc_ok_ipv4(h.ip, h.udp, body) => Heard::Answer(a.kind, p.headers.bth.psn),
            _ => Heard::Bad,
        }
    }

    pub(crate) fn fd(&self) -> i32 {
        self.raw.fd()
    }
}

/// A frame of the window whose bytes are no longer kept: the history is kept until every
/// WRITE is acknowledged (`Controller::roce_window`), so this is a bug, reported, not skipped.
fn gone(frame: u64) -> io::Error {
    io::Error::other(format!("frame {frame} left the history before its RoCEv2 WRITE was acknowledged"))
}

/// Writes the whole frame of one packet into `f`.
fn build(f: &mut Vec<u8>, ends: &Endpoints, ident: u16, headers: &roce::Headers, payload: &[u8]) {
    f.resize(FRAME_MAX, 0);
    let len = roce::write_frame(ends, ident, headers, payload, f).expect("the requester makes WRITE packets of at most the MTU");
    f.truncate(len);
}
