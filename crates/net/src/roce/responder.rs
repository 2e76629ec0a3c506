//! The responder side of RC queue pairs that receive RDMA WRITEs: each packet is taken only
//! at the expected PSN and in a valid opcode sequence, its RETH is checked against the
//! registered memory regions (R_Key, VA bounds), and what it writes is returned as a
//! [`Write`] (region, offset, length, frame) for the receiver to check and place like any
//! datagram. Answers: one coalesced ACK per queue pair per receive batch, and one NAK per
//! sequence error (the requester goes back to the PSN it names), as IBTA RC responders do.
//!
//! Frame numbers: a WRITE_*_WITH_IMM ends a module frame and carries its number as the
//! immediate. Its data arrives before the immediate, so the responder numbers each message
//! by the queue pair's frame counter (starting at the connection's first frame, + the frame
//! stride at each immediate): exact as long as the sender sends its frames in order at that
//! stride (1, or n for one of n receivers of a temporal plan), which
//! the immediate then confirms. When it does not, the packet with the immediate is dropped
//! (`ImmMismatch`), the frame stays incomplete, and the counter follows the immediate.

use rdaq_proto::roce::{Aeth, AethKind, Bth, Endpoints, Head, Headers, Opcode};

use super::{psn_ahead, psn_behind, PSN_MASK};

/// NAK code of an invalid request (a broken opcode sequence, a bad length).
pub const NAK_INVALID_REQUEST: u8 = 1;
/// NAK code of a remote access error (R_Key or VA bounds).
pub const NAK_REMOTE_ACCESS: u8 = 2;

/// One queue pair as connection setup defines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpConfig {
    /// This side's queue pair number (packets name it in the BTH).
    pub qpn: u32,
    /// The requester's queue pair number (ACKs name it).
    pub peer_qpn: u32,
    pub start_psn: u32,
    /// The number of the first frame the requester writes.
    pub first_frame: u64,
    /// How far apart the frames it writes are (a temporal plan over n receivers: n).
    pub frame_stride: u64,
}

/// A registered memory region: one local buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub va: u64,
    pub len: u64,
    pub rkey: u32,
    /// The local buffer id it is.
    pub buffer: u32,
}

/// What an accepted WRITE packet writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Write {
    /// Index of the queue pair (the data channel).
    pub qp: usize,
    pub buffer: u32,
    pub rkey: u32,
    /// Byte offset in the region.
    pub offset: u64,
    pub len: u32,
    /// Packets this queue pair accepted before this one (a 32-bit sequence without gaps).
    pub seq: u32,
    pub frame: u64,
    /// The immediate, on the packet that ends a module frame.
    pub imm: Option<u32>,
}

/// Why a packet was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoceDrop {
    /// The ICRC does not match (checked by the caller, counted here).
    Icrc,
    /// Not a RoCEv2 packet rdaq takes (headers, opcode, pad, length).
    Malformed,
    /// For a queue pair this responder does not have.
    UnknownQp,
    /// Ahead of the expected PSN: a packet before it was lost (NAK sent).
    OutOfSequence,
    /// Behind the expected PSN: already taken (a go-back resend; ACK sent).
    Duplicate,
    /// A WRITE opcode out of sequence, or a length that does not fit the message.
    InvalidRequest,
    /// R_Key unknown or not the region's, or a VA range outside every region.
    RemoteAccess,
    /// The immediate names another frame than the responder counted.
    ImmMismatch,
}

impl RoceDrop {
    pub const ALL: [RoceDrop; 8] = [
        RoceDrop::Icrc,
        RoceDrop::Malformed,
        RoceDrop::UnknownQp,
        RoceDrop::OutOfSequence,
        RoceDrop::Duplicate,
        RoceDrop::InvalidRequest,
        RoceDrop::RemoteAccess,
        RoceDrop::ImmMismatch,
    ];
}

/// The WRITE message in progress on a queue pair.
#[derive(Clone, Copy)]
struct Message {
    region: usize,
    rkey: u32,
    /// Offset in the region of the next packet's bytes.
    next: u64,
    remaining: u64,
}

struct Qp {
    cfg: QpConfig,
    epsn: u32,
    msn: u32,
    seq: u32,
    frame: u64,
    msg: Option<Message>,
    /// A sequence-error NAK was sent for `epsn` and not yet answered.
    nak_sent: bool,
    ack_due: bool,
    nak_due: Option<(u8, u32)>,
    /// Where answers go: the last packet's sender, the other way round.
    peer: Option<Endpoints>,
}

/// Counters of a responder (every packet given to it is counted once: taken or dropped).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResponderStats {
    pub taken: u64,
    pub dropped: [u64; RoceDrop::ALL.len()],
    pub acks: u64,
    pub naks: u64,
}

impl ResponderStats {
    pub fn dropped(&self, r: RoceDrop) -> u64 {
        self.dropped[r as usize]
    }
}

/// An answer to send: an ACK or NAK packet's headers and where it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    pub to: Endpoints,
    pub headers: Headers,
}

pub struct Responder {
    qps: Vec<Qp>,
    /// Regions sorted by VA.
    regions: Vec<Region>,
    mtu: u32,
    pub stats: ResponderStats,
}

impl Responder {
    /// Queue pairs in channel order, the regions they may write, and the path MTU (payload
    /// bytes of every FIRST and MIDDLE packet).
    pub fn new(qps: &[QpConfig], regions: &[Region], mtu: u32) -> Responder {
        let mut regions = regions.to_vec();
        regions.sort_by_key(|r| r.va);
        let qps = qps
            .iter()
            .map(|&cfg| Qp { cfg, epsn: cfg.start_psn & PSN_MASK, msn: 0, seq: 0, frame: cfg.first_frame, msg: None, nak_sent: false, ack_due: false, nak_due: None, peer: None })
            .collect();
        Responder { qps, regions, mtu, stats: ResponderStats::default() }
    }

    /// Counts a packet dropped before it reached [`Responder::take`].
    pub fn count(&mut self, r: RoceDrop) {
        self.stats.dropped[r as usize] += 1;
    }

    /// Takes the packet whose headers are `p` (its ICRC checked), which came from `from`, or
    /// says why not.
    pub fn take(&mut self, p: &Head, from: &Endpoints) -> Result<Write, RoceDrop> {
        let r = self.check(p, from);
        match r {
            Ok(_) => self.stats.taken += 1,
            Err(e) => self.count(e),
        }
        r
    }

    fn check(&mut self, p: &Head, from: &Endpoints) -> Result<Write, RoceDrop> {
        let bth = p.headers.bth;
        let i = self.qps.iter().position(|q| q.cfg.qpn == bth.dest_qp).ok_or(RoceDrop::UnknownQp)?;
        let mtu = self.mtu as u64;
        let q = &mut self.qps[i];
        q.peer = Some(*from);
        let d = psn_ahead(bth.psn, q.epsn);
        if d != 0 {
            if psn_behind(bth.psn, q.epsn) {
                q.ack_due = true;
                return Err(RoceDrop::Duplicate);
            }
            if !q.nak_sent {
                q.nak_sent = true;
                q.nak_due = Some((rdaq_proto::roce::headers::NAK_PSN_SEQUENCE_ERROR, q.epsn));
            }
            return Err(RoceDrop::OutOfSequence);
        }
        let len = p.payload_len as u64;
        let msg = match (p.opcode, q.msg) {
            (Opcode::WriteFirst | Opcode::WriteOnly | Opcode::WriteOnlyImm, None) => {
                let reth = p.headers.reth.expect("a FIRST or ONLY packet has a RETH");
                let only = p.opcode != Opcode::WriteFirst;
                let total = reth.len as u64;
                let fits = if only { len == total && len <= mtu && len > 0 } else { len == mtu && total > mtu };
                if !fits {
                    return refuse(q, RoceDrop::InvalidRequest);
                }
                let Some(region) = find_region(&self.regions, reth.va, reth.rkey, total) else {
                    return refuse(q, RoceDrop::RemoteAccess);
                };
                Message { region, rkey: reth.rkey, next: reth.va - self.regions[region].va, remaining: total }
            }
            (Opcode::WriteMiddle | Opcode::WriteLast | Opcode::WriteLastImm, Some(m)) => {
                let middle = p.opcode == Opcode::WriteMiddle;
                let fits = if middle { len == mtu && m.remaining > mtu } else { len == m.remaining && len <= mtu };
                if !fits {
                    return refuse(q, RoceDrop::InvalidRequest);
                }
                m
            }
            _ => return refuse(q, RoceDrop::InvalidRequest),
        };
        let region = self.regions[msg.region];
        let w = Write { qp: i, buffer: region.buffer, rkey: msg.rkey, offset: msg.next, len: len as u32, seq: q.seq, frame: q.frame, imm: p.headers.imm };
        q.epsn = (q.epsn + 1) & PSN_MASK;
        q.seq = q.seq.wrapping_add(1);
        q.nak_sent = false;
        q.ack_due = true;
        let ends = msg.remaining == len;
        q.msg = (!ends).then_some(Message { next: msg.next + len, remaining: msg.remaining - len, ..msg });
        if ends {
            q.msn = (q.msn + 1) & PSN_MASK;
        }
        if let Some(imm) = p.headers.imm {
            let counted = q.frame;
            q.frame = (counted & !0xFFFF_FFFF | imm as u64) + q.cfg.frame_stride;
            if imm != counted as u32 {
                return Err(RoceDrop::ImmMismatch);
            }
        }
        Ok(w)
    }

    /// The answers due since the last call: per queue pair an ACK of everything taken (and
    /// of duplicates, so a requester that went back stops resending), then a NAK if one is
    /// due.
    pub fn replies(&mut self, mut send: impl FnMut(Reply)) {
        for q in &mut self.qps {
            let Some(peer) = q.peer else { continue };
            let to = peer.reversed(peer.src_port);
            let answer = |kind, psn| Reply {
                to,
                headers: Headers {
                    bth: Bth { opcode: Opcode::Ack as u8, solicited: false, mig_req: false, pad: 0, pkey: 0xFFFF, fecn: false, becn: false, dest_qp: q.cfg.peer_qpn, ack_req: false, psn },
                    reth: None,
                    imm: None,
                    aeth: Some(Aeth { kind, msn: q.msn }),
                },
            };
            if std::mem::take(&mut q.ack_due) {
                send(answer(AethKind::Ack { credits: 0x1F }, q.epsn.wrapping_sub(1) & PSN_MASK));
                self.stats.acks += 1;
            }
            if let Some((code, psn)) = q.nak_due.take() {
                send(answer(AethKind::Nak { code }, psn));
                self.stats.naks += 1;
            }
        }
    }
}

/// Refuses the packet at the expected PSN with a NAK (the last refusal of a batch is answered).
fn refuse(q: &mut Qp, why: RoceDrop) -> Result<Write, RoceDrop> {
    let code = if why == RoceDrop::RemoteAccess { NAK_REMOTE_ACCESS } else { NAK_INVALID_REQUEST };
    q.nak_due = Some((code, q.epsn));
    Err(why)
}

/// The region that holds `len` bytes at `va` under `rkey`.
fn find_region(regions: &[Region], va: u64, rkey: u32, len: u64) -> Option<usize> {
    let i = regions.partition_point(|r| r.va <= va).checked_sub(1)?;
    let r = &regions[i];
    let end = va.checked_add(len)?;
    (r.rkey == rkey && end <= r.va + r.len).then_some(i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdaq_proto::roce::Reth;
    use std::net::Ipv4Addr;

    const MTU: u32 = 1024;

    fn ends() -> Endpoints {
        Endpoints { src_mac: [2; 6], dst_mac: [4; 6], src_ip: Ipv4Addr::new(10, 0, 0, 1), dst_ip: Ipv4Addr::new(10, 0, 0, 2), src_port: 49152 }
    }

    fn responder() -> Responder {
        let qp = QpConfig { qpn: 0x11, peer_qpn: 0x100, start_psn: 0xFF_FFFE, first_frame: 7, frame_stride: 1 };
        let regions = [Region { va: 0x10_0000, len: 4096, rkey: 5, buffer: 1 }, Region { va: 0x20_0000, len: 4096, rkey: 6, buffer: 2 }];
        Responder::new(&[qp], &regions, MTU)
    }

    fn packet(op: Opcode, psn: u32, reth: Option<Reth>, imm: Option<u32>, payload: &[u8]) -> Head {
        let bth = Bth { opcode: op as u8, solicited: false, mig_req: false, pad: 0, pkey: 0xFFFF, fecn: false, becn: false, dest_qp: 0x11, ack_req: false, psn };
        Head { opcode: op, headers: Headers { bth, reth, imm, aeth: None }, payload_at: 0, payload_len: payload.len() }
    }

    fn replies(r: &mut Responder) -> Vec<(AethKind, u32)> {
        let mut v = Vec::new();
        r.replies(|x| v.push((x.headers.aeth.unwrap().kind, x.headers.bth.psn)));
        v
    }

    #[test]
    fn places_a_message_in_order_across_the_psn_wrap_and_numbers_its_frame() {
        let mut r = responder();
        let data = [1u8; 1024];
        let reth = Reth { va: 0x20_0000 + 1024, rkey: 6, len: 2500 };
        let w0 = r.take(&packet(Opcode::WriteFirst, 0xFF_FFFE, Some(reth), None, &data), &ends()).unwrap();
        let w1 = r.take(&packet(Opcode::WriteMiddle, 0xFF_FFFF, None, None, &data), &ends()).unwrap();
        let w2 = r.take(&packet(Opcode::WriteLastImm, 0, None, Some(7), &data[..452]), &ends()).unwrap();
        assert_eq!((w0.buffer, w0.offset, w0.seq, w0.frame), (2, 1024, 0, 7));
        assert_eq!((w1.offset, w2.offset, w2.len, w2.imm), (2048, 3072, 452, Some(7)));
        assert_eq!(replies(&mut r), vec![(AethKind::Ack { credits: 0x1F }, 0)]);
        let next = r.take(&packet(Opcode::WriteOnlyImm, 1, Some(Reth { va: 0x10_0000, rkey: 5, len: 8 }), Some(8), &data[..8]), &ends()).unwrap();
        assert_eq!((next.frame, next.buffer), (8, 1));
    }

    #[test]
    fn a_gap_is_naked_once_and_a_resend_is_acked() {
        let mut r = responder();
        let p = |psn| packet(Opcode::WriteOnly, psn, Some(Reth { va: 0x10_0000, rkey: 5, len: 8 }), None, &[0; 8]);
        assert!(r.take(&p(0xFF_FFFE), &ends()).is_ok());
        assert_eq!(r.take(&p(0), &ends()), Err(RoceDrop::OutOfSequence));
        assert_eq!(r.take(&p(1), &ends()), Err(RoceDrop::OutOfSequence));
        assert_eq!(replies(&mut r), vec![(AethKind::Ack { credits: 0x1F }, 0xFF_FFFE), (AethKind::Nak { code: 0 }, 0xFF_FFFF)]);
        assert_eq!(r.take(&p(0xFF_FFFE), &ends()), Err(RoceDrop::Duplicate));
        assert!(r.take(&p(0xFF_FFFF), &ends()).is_ok());
        assert_eq!(replies(&mut r), vec![(AethKind::Ack { credits: 0x1F }, 0xFF_FFFF)]);
        assert_eq!((r.stats.dropped(RoceDrop::OutOfSequence), r.stats.dropped(RoceDrop::Duplicate), r.stats.taken), (2, 1, 2));
    }

    #[test]
    fn refuses_bad_keys_bounds_sequences_and_lengths() {
        let mut r = responder();
        let reth = |va, rkey, len| Some(Reth { va, rkey, len });
        let e = ends();
        assert_eq!(r.take(&packet(Opcode::WriteOnly, 0xFF_FFFE, reth(0x10_0000, 6, 8), None, &[0; 8]), &e), Err(RoceDrop::RemoteAccess));
        assert_eq!(r.take(&packet(Opcode::WriteOnly, 0xFF_FFFE, reth(0x10_0FFC, 5, 8), None, &[0; 8]), &e), Err(RoceDrop::RemoteAccess));
        assert_eq!(r.take(&packet(Opcode::WriteOnly, 0xFF_FFFE, reth(0x0F_FFFF, 5, 1), None, &[0; 1]), &e), Err(RoceDrop::RemoteAccess));
        assert_eq!(r.take(&packet(Opcode::WriteMiddle, 0xFF_FFFE, None, None, &[0; 1024]), &e), Err(RoceDrop::InvalidRequest));
        assert_eq!(r.take(&packet(Opcode::WriteOnly, 0xFF_FFFE, reth(0x10_0000, 5, 9), None, &[0; 8]), &e), Err(RoceDrop::InvalidRequest));
        assert_eq!(r.take(&packet(Opcode::WriteFirst, 0xFF_FFFE, reth(0x10_0000, 5, 4096), None, &[0; 1000]), &e), Err(RoceDrop::InvalidRequest));
        let mut bad_qp = packet(Opcode::WriteOnly, 0xFF_FFFE, reth(0x10_0000, 5, 8), None, &[0; 8]);
        bad_qp.headers.bth.dest_qp = 0x12;
        assert_eq!(r.take(&bad_qp, &e), Err(RoceDrop::UnknownQp));
        let naks = replies(&mut r);
        assert_eq!(naks, vec![(AethKind::Nak { code: NAK_INVALID_REQUEST }, 0xFF_FFFE)], "one NAK per batch");
        assert!(r.take(&packet(Opcode::WriteOnly, 0xFF_FFFE, reth(0x10_0FF8, 5, 8), None, &[0; 8]), &e).is_ok(), "nothing was taken before");
    }

    #[test]
    fn frames_follow_the_stride_of_a_temporal_plan() {
        let qp = QpConfig { qpn: 0x11, peer_qpn: 0x100, start_psn: 0, first_frame: 1, frame_stride: 3 };
        let mut r = Responder::new(&[qp], &[Region { va: 0x10_0000, len: 4096, rkey: 5, buffer: 1 }], MTU);
        let p = |psn, imm| packet(Opcode::WriteOnlyImm, psn, Some(Reth { va: 0x10_0000, rkey: 5, len: 8 }), Some(imm), &[0; 8]);
        assert_eq!(r.take(&p(0, 1), &ends()).map(|w| w.frame), Ok(1));
        assert_eq!(r.take(&p(1, 4), &ends()).map(|w| w.frame), Ok(4));
        assert_eq!(r.take(&p(2, 7), &ends()).map(|w| w.frame), Ok(7));
    }

    #[test]
    fn an_immediate_of_another_frame_is_refused_and_followed() {
        let mut r = responder();
        let p = |psn, imm| packet(Opcode::WriteOnlyImm, psn, Some(Reth { va: 0x10_0000, rkey: 5, len: 8 }), Some(imm), &[0; 8]);
        assert_eq!(r.take(&p(0xFF_FFFE, 9), &ends()), Err(RoceDrop::ImmMismatch));
        assert_eq!(r.take(&p(0xFF_FFFF, 10), &ends()).map(|w| w.frame), Ok(10));
    }
}
