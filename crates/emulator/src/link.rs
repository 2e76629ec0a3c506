//! A module's data channels: one connected socket per destination, its packetizer, the
//! frames it sent (for retransmission), and the fault injector's held datagrams.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rdaq_net::send::BatchSender;
use rdaq_proto::telegram::{LocalBufferInfo, ModuleDtp, Route};

use crate::config::EmulatorConfig;
use crate::faults::{Fate, FaultStats, Faults};
use crate::packetize::Packetizer;

/// Datagrams per paced send: one GSO group.
pub(crate) const CHUNK: usize = 7;
/// A frame sent on a channel, kept while its bytes are in the history.
#[derive(Clone, Copy)]
pub(crate) struct Record {
    pub(crate) frame: u64,
    pub(crate) first_seq: u32,
    pub(crate) buf: LocalBufferInfo,
    pub(crate) offset: u64,
}

/// A datagram held back by the fault injector: sent after the channel's `after`-th
/// datagram, or at `at`.
pub(crate) struct Held {
    pub(crate) bytes: Vec<u8>,
    pub(crate) after: u64,
    pub(crate) at: Option<Instant>,
}

/// The sending side of a channel, with the fault injector's state.
pub(crate) struct Link {
    pub(crate) tx: BatchSender,
    /// Datagrams handed to the kernel on this channel.
    pub(crate) sent: u64,
    /// Retransmitted datagrams so far (varies the fate of each resend).
    pub(crate) resends: u64,
    pub(crate) held: Vec<Held>,
    pub(crate) spare: Vec<Vec<u8>>,
}

/// A data channel: one connected socket, its packetizer (and sequence), the frames it sent.
pub(crate) struct Channel {
    pub(crate) link: Link,
    pub(crate) pk: Packetizer,
    pub(crate) records: VecDeque<Record>,
}

pub(crate) type Channels = HashMap<SocketAddr, Channel>;

/// One datagram to send: header, payload, sequence number, attempt (0: first sending).
pub(crate) type Part<'a> = (&'a [u8], &'a [u8], u32, u64);

impl Link {
    pub(crate) fn owned(&mut self, h: &[u8], p: &[u8]) -> Vec<u8> {
        let mut b = self.spare.pop().unwrap_or_default();
        b.clear();
        b.extend_from_slice(h);
        b.extend_from_slice(p);
        b
    }

    /// Sends up to [`CHUNK`] datagrams through the fault injector (if any).
    pub(crate) fn send(&mut self, parts: &[Part], faults: Option<&Faults>, delay: Duration, stats: &mut FaultStats) -> io::Result<()> {
        let Some(faults) = faults else {
            self.tx.send(parts.len(), |j| (parts[j].0, parts[j].1))?;
            self.sent += parts.len() as u64;
            return Ok(());
        };
        debug_assert!(parts.len() <= CHUNK);
        let mut pass: [(&[u8], &[u8]); 2 * CHUNK] = [(&[], &[]); 2 * CHUNK];
        let mut np = 0;
        let mut corrupted: [Option<Vec<u8>>; CHUNK] = Default::default();
        for (j, &(h, p, seq, attempt)) in parts.iter().enumerate() {
            let fate = faults.fate(seq, attempt);
            stats.count(fate);
            match fate {
                Fate::Pass | Fate::Duplicate => {
                    pass[np] = (h, p);
                    np += 1;
                    if fate == Fate::Duplicate {
                        pass[np] = (h, p);
                        np += 1;
                    }
                }
                Fate::Drop => {}
                Fate::Corrupt { byte, bit } => {
                    let mut b = self.owned(h, p);
                    let i = byte as usize % b.len();
                    b[i] ^= 1 << bit;
                    corrupted[j] = Some(b);
                }
                Fate::Reorder(d) => {
                    let bytes = self.owned(h, p);
                    self.held.push(Held { bytes, after: self.sent + np as u64 + d as u64, at: None });
                }
                Fate::Delay => {
                    let bytes = self.owned(h, p);
                    self.held.push(Held { bytes, after: u64::MAX, at: Some(Instant::now() + delay) });
                }
            }
        }
        self.tx.send(np, |j| pass[j])?;
        self.sent += np as u64;
        for b in corrupted.iter_mut().filter_map(Option::take) {
            self.tx.send(1, |_| (&b[..], &[]))?;
            self.sent += 1;
            self.spare.push(b);
        }
        self.release(false)
    }

    /// Sends the held datagrams that are due (all of them with `all`).
    pub(crate) fn release(&mut self, all: bool) -> io::Result<()> {
        let now = Instant::now();
        let mut i = 0;
        while i < self.held.len() {
            let h = &self.held[i];
            if all || h.after <= self.sent || h.at.is_some_and(|t| t <= now) {
                let h = self.held.swap_remove(i);
                self.tx.send(1, |_| (&h.bytes[..], &[]))?;
                self.sent += 1;
                self.spare.push(h.bytes);
            } else {
                i += 1;
            }
        }
        Ok(())
    }
}

pub(crate) fn channel<'a>(channels: &'a mut Channels, cfg: &EmulatorConfig, dtp: &ModuleDtp, route: &Route) -> io::Result<&'a mut Channel> {
    let data = route.data;
    if !channels.contains_key(&data) {
        let local = SocketAddr::new(if data.is_ipv4() { [0, 0, 0, 0].into() } else { [0u16; 8].into() }, 0);
        let tx = BatchSender::connect(local, data, cfg.gso, cfg.send_buffer)?;
        let link = Link { tx, sent: 0, resends: 0, held: Vec::new(), spare: Vec::new() };
        let pk = Packetizer::new(dtp.module, dtp.module_bytes, dtp.payload_bytes, route.checksum);
        channels.insert(data, Channel { link, pk, records: VecDeque::new() });
    }
    Ok(channels.get_mut(&data).expect("inserted above"))
}

/// Sends the channel's current frame in chunks, calling `pace` before each.
pub(crate) fn send_frame(
    ch: &mut Channel,
    bytes: &[u8],
    faults: Option<&Faults>,
    delay: Duration,
    stats: &mut FaultStats,
    pace: impl Fn(usize),
) -> io::Result<()> {
    let n = ch.pk.datagrams();
    let seq0 = ch.pk.first_seq();
    let mut k = 0;
    while k < n {
        let m = CHUNK.min(n - k);
        pace(m);
        let mut parts: [Part; CHUNK] = [(&[], &[], 0, 0); CHUNK];
        for (j, p) in parts.iter_mut().enumerate().take(m) {
            let (h, pl) = ch.pk.datagram(k + j, bytes);
            *p = (h, pl, seq0.wrapping_add((k + j) as u32), 0);
        }
        ch.link.send(&parts[..m], faults, delay, stats)?;
        k += m;
    }
    Ok(())
}
