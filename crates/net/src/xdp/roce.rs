//! The AF_XDP engine as a software RoCEv2 target: the XDP program steers UDP port 4791 to
//! the sockets, and each whole frame is checked (headers, ICRC over the buffers it lies in),
//! taken by the RC [`Responder`] and handed on as the rdaq datagram it amounts to (buffer,
//! key, offset, frame, immediate), so that placement checks and places it as any datagram.
//! The payload is copied once, from UMEM into the landing. ACKs and NAKs go out as raw
//! frames after each batch.

use rdaq_proto::datagram::{Flags, Header, HEADER_LEN};
use rdaq_proto::roce::{self, frame, Endpoints, ICRC_LEN, MAX_HEAD, ROCE_PORT};

use crate::raw::RawSocket;
use crate::roce::responder::{QpConfig, Region, Reply, Responder, ResponderStats, RoceDrop, Write};

use super::queue::MAX_FRAGS;
use super::{gather, XdpError};

/// A RoCEv2 target's connections: one queue pair per data channel, the module each writes,
/// the regions they may write, and the path MTU.
#[derive(Clone, Debug)]
pub struct RoceSpec {
    pub qps: Vec<QpConfig>,
    pub modules: Vec<u16>,
    pub regions: Vec<Region>,
    pub mtu: u32,
}

/// What a RoCEv2 target counted: the responder's checks, and the ACKs and NAKs the
/// interface's queue refused (lost like frames on a wire; the sender's timeout recovers).
#[derive(Clone, Copy, Debug, Default)]
pub struct RoceStats {
    pub responder: ResponderStats,
    pub replies_refused: u64,
}

/// Bytes of an ACK or NAK frame.
const REPLY_LEN: usize = frame::FRAME_HEADERS_LEN + roce::BTH_LEN + roce::AETH_LEN + ICRC_LEN;

pub(super) struct RoceTarget {
    pub(super) responder: Responder,
    modules: Vec<u16>,
    tx: RawSocket,
    replies: Vec<[u8; REPLY_LEN]>,
    ident: u16,
}

/// What one frame amounts to: the rdaq header of its write and its payload's place.
pub(super) struct Taken {
    pub(super) header: [u8; HEADER_LEN],
    pub(super) write: Write,
    pub(super) payload_at: usize,
    pub(super) from: Endpoints,
}

impl RoceTarget {
    pub(super) fn open(spec: &RoceSpec, ifindex: u32) -> Result<RoceTarget, XdpError> {
        let tx = RawSocket::open(ifindex, 1 << 20).map_err(|source| XdpError::Os { what: "opening the raw socket for ACKs", source })?;
        Ok(RoceTarget { responder: Responder::new(&spec.qps, &spec.regions, spec.mtu), modules: spec.modules.clone(), tx, replies: Vec::new(), ident: 0 })
    }

    pub(super) fn stats(&self) -> RoceStats {
        RoceStats { responder: self.responder.stats, replies_refused: self.tx.refused }
    }

    /// Checks one received frame (`parts`: its buffers in order) and takes it; `None` when
    /// it was dropped (counted by the responder).
    pub(super) fn take(&mut self, parts: &[&[u8]]) -> Option<Taken> {
        let r = &mut self.responder;
        let Some(fh) = frame::parse_headers(parts[0]).filter(|f| f.dst_port == ROCE_PORT) else {
            r.count(RoceDrop::Malformed);
            return None;
        };
        let at = frame::FRAME_HEADERS_LEN;
        let total = fh.udp_payload;
        if parts.iter().map(|p| p.len()).sum::<usize>() < at + total {
            r.count(RoceDrop::Malformed);
            return None;
        }
        let mut head = [0u8; MAX_HEAD];
        let hn = total.min(MAX_HEAD);
        gather(parts, at, &mut head[..hn]);
        let Ok(h) = roce::parse_head(&head[..hn], total) else {
            r.count(RoceDrop::Malformed);
            return None;
        };
        let mut carried = [0u8; ICRC_LEN];
        gather(parts, at + total - ICRC_LEN, &mut carried);
        let (covered, n) = window(parts, at, total - ICRC_LEN);
        if roce::icrc_ipv4_parts(fh.ip, fh.udp, &covered[..n]) != roce::icrc::get(&carried) {
            r.count(RoceDrop::Icrc);
            return None;
        }
        let write = r.take(&h, &fh.ends).ok()?;
        let mut flags = Flags::empty();
        if write.imm.is_some() {
            flags = Flags::LAST.with(Flags::IMM);
        }
        let hdr = Header {
            flags,
            module: self.modules[write.qp],
            buffer: write.buffer,
            key: write.rkey,
            offset: write.offset,
            length: write.len,
            seq: write.seq,
            frame: write.frame,
            dataset: 0,
            imm: write.imm.unwrap_or(0),
        };
        let mut header = [0u8; HEADER_LEN];
        hdr.encode(&mut header);
        Some(Taken { header, write, payload_at: at + h.payload_at, from: fh.ends })
    }

    /// Sends the ACKs and NAKs due (one system call).
    pub(super) fn answer(&mut self) -> std::io::Result<()> {
        let RoceTarget { responder, replies, ident, .. } = self;
        replies.clear();
        responder.replies(|r: Reply| {
            let mut f = [0u8; REPLY_LEN];
            roce::write_frame(&r.to, *ident, &r.headers, &[], &mut f).expect("an ACK fits its frame");
            *ident = ident.wrapping_add(1);
            replies.push(f);
        });
        if !replies.is_empty() {
            self.tx.send_batch(replies.len(), |i| &self.replies[i][..])?;
        }
        Ok(())
    }
}

/// The bytes `from..from + len` of a packet lying in `parts`, as slices of them.
fn window<'a>(parts: &[&'a [u8]], mut from: usize, mut len: usize) -> ([&'a [u8]; MAX_FRAGS], usize) {
    let mut out: [&[u8]; MAX_FRAGS] = [&[]; MAX_FRAGS];
    let mut n = 0;
    for p in parts {
        if len == 0 {
            break;
        }
        if from >= p.len() {
            from -= p.len();
            continue;
        }
        let k = (p.len() - from).min(len);
        out[n] = &p[from..from + k];
        n += 1;
        len -= k;
        from = 0;
    }
    (out, n)
}

#[cfg(test)]
mod tests {
    use super::window;

    #[test]
    fn window_spans_buffers() {
        let (a, b) = ([0u8, 1, 2, 3], [4u8, 5, 6]);
        let parts: [&[u8]; 2] = [&a, &b];
        let (w, n) = window(&parts, 2, 4);
        assert_eq!(&w[..n], &[&[2u8, 3][..], &[4u8, 5][..]]);
    }
}
