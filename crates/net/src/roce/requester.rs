//! The requester side of an RC queue pair that sends RDMA WRITEs: messages are cut into
//! packets of the path MTU with consecutive PSNs and stay in the window until an ACK covers
//! them; a sequence-error NAK, or no progress for the retransmission timeout, sends every
//! packet again from the PSN named (go-back-N), as IBTA RC requesters do.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rdaq_proto::roce::{AethKind, Bth, Headers, Opcode, Reth};

use super::{psn_ahead, psn_behind, PSN_MASK};

/// One RDMA WRITE message: `len` bytes to `va` under `rkey`, of frame `frame` (whose bytes
/// the caller keeps until the message is acknowledged), ending with an immediate or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteMessage {
    pub frame: u64,
    /// Where the message's bytes start in the caller's copy of the frame.
    pub from: usize,
    pub va: u64,
    pub rkey: u32,
    pub len: u32,
    pub imm: Option<u32>,
}

#[derive(Clone, Copy)]
struct Posted {
    msg: WriteMessage,
    first_psn: u32,
    packets: u32,
}

/// What an answer from the responder did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// An ACK; `released` messages left the window.
    Acked { released: usize },
    /// A sequence-error NAK: resend from the PSN (see [`Requester::resend_from`]).
    GoBack { psn: u32 },
    /// A NAK the requester cannot recover from (invalid request, remote access error).
    Fatal { code: u8 },
    /// For a PSN outside the window, or an answer kind the requester ignores (RNR).
    Ignored,
}

/// One packet to send: its headers and which bytes of which frame it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketPlan {
    pub headers: Headers,
    pub frame: u64,
    /// Byte range in the caller's copy of the frame.
    pub from: usize,
    pub len: usize,
}

pub struct Requester {
    dest_qp: u32,
    mtu: u32,
    next_psn: u32,
    window: VecDeque<Posted>,
    /// When the oldest unacknowledged packet last made progress (or was last resent).
    progress: Instant,
    /// Timeouts in a row without progress.
    pub retries: u32,
}

impl Requester {
    /// A queue pair writing to the responder's `dest_qp` from `start_psn`, `mtu` payload bytes
    /// per packet.
    pub fn new(dest_qp: u32, start_psn: u32, mtu: u32) -> Requester {
        Requester { dest_qp, mtu, next_psn: start_psn & PSN_MASK, window: VecDeque::new(), progress: Instant::now(), retries: 0 }
    }

    /// Messages sent and not yet acknowledged.
    pub fn outstanding(&self) -> usize {
        self.window.len()
    }

    /// Packets sent and not yet acknowledged.
    pub fn in_flight(&self) -> u32 {
        self.window.front().map_or(0, |p| psn_ahead(self.next_psn, p.first_psn))
    }

    /// The oldest frame still in the window (the caller must keep its bytes).
    pub fn oldest_frame(&self) -> Option<u64> {
        self.window.front().map(|p| p.msg.frame)
    }

    /// Posts a message; returns its packet count. Its packets are [`Requester::packet`]
    /// `(index, 0..count)` where index is [`Requester::outstanding`] - 1 after the call.
    pub fn post(&mut self, msg: WriteMessage) -> u32 {
        let packets = msg.len.div_ceil(self.mtu).max(1);
        if self.window.is_empty() {
            self.progress = Instant::now();
        }
        self.window.push_back(Posted { msg, first_psn: self.next_psn, packets });
        self.next_psn = (self.next_psn + packets) & PSN_MASK;
        packets
    }

    /// Packet `k` of the message at position `i` of the window.
    pub fn packet(&self, i: usize, k: u32) -> PacketPlan {
        let p = &self.window[i];
        let m = p.msg;
        let first = k == 0;
        let last = k + 1 == p.packets;
        let opcode = match (first, last, m.imm.is_some()) {
            (true, true, false) => Opcode::WriteOnly,
            (true, true, true) => Opcode::WriteOnlyImm,
            (true, false, _) => Opcode::WriteFirst,
            (false, false, _) => Opcode::WriteMiddle,
            (false, true, false) => Opcode::WriteLast,
            (false, true, true) => Opcode::WriteLastImm,
        };
        let off = k as usize * self.mtu as usize;
        let len = (m.len as usize - off).min(self.mtu as usize);
        let psn = (p.first_psn + k) & PSN_MASK;
        let bth = Bth { opcode: opcode as u8, solicited: last && m.imm.is_some(), mig_req: false, pad: 0, pkey: 0xFFFF, fecn: false, becn: false, dest_qp: self.dest_qp, ack_req: last, psn };
        let reth = first.then_some(Reth { va: m.va, rkey: m.rkey, len: m.len });
        let imm = if last { m.imm } else { None };
        PacketPlan { headers: Headers { bth, reth, imm, aeth: None }, frame: m.frame, from: m.from + off, len }
    }

    /// Takes an ACK or NAK for PSN `psn`.
    pub fn answer(&mut self, kind: AethKind, psn: u32) -> Answer {
        let Some(front) = self.window.front() else { return Answer::Ignored };
        let base = front.first_psn;
        // an answer can only be about PSNs sent: from the window's start to next_psn
        let inside = |psn: u32| !psn_behind(psn, base.wrapping_sub(1) & PSN_MASK) && psn_behind(psn, self.next_psn);
        match kind {
            AethKind::Ack { .. } if inside(psn) => {
                let mut released = 0;
                while let Some(p) = self.window.front() {
                    let last_psn = (p.first_psn + p.packets - 1) & PSN_MASK;
                    if psn_behind(psn, last_psn) {
                        break;
                    }
                    self.window.pop_front();
                    released += 1;
                }
                if released > 0 || psn_ahead(psn, base) < 1 << 23 {
                    self.progress = Instant::now();
                    self.retries = 0;
                }
                Answer::Acked { released }
            }
            AethKind::Nak { code: 0 } if inside(psn) || psn == self.next_psn => {
                self.progress = Instant::now();
                Answer::GoBack { psn }
            }
            // a sequence error for a PSN already acknowledged: a late answer to an old gap
            AethKind::Nak { code: 0 } => Answer::Ignored,
            AethKind::Nak { code } => Answer::Fatal { code },
            _ => Answer::Ignored,
        }
    }

    /// The packets to send again from `psn` to the end of the window, as (window position,
    /// packet) in order (empty when `psn` is not in the window).
    pub fn resend_from(&self, psn: u32) -> impl Iterator<Item = (usize, u32)> + '_ {
        let start = self.window.iter().position(|p| psn_ahead(psn, p.first_psn) < p.packets);
        let skip = start.map_or(0, |i| psn_ahead(psn, self.window[i].first_psn));
        self.window
            .iter()
            .enumerate()
            .skip(start.unwrap_or(self.window.len()))
            .flat_map(move |(i, p)| {
                let from = if Some(i) == start { skip } else { 0 };
                (from..p.packets).map(move |k| (i, k))
            })
    }

    /// The PSN to go back to when nothing was acknowledged for `timeout` (the window's
    /// oldest); counts the retry.
    pub fn timed_out(&mut self, now: Instant, timeout: Duration) -> Option<u32> {
        let front = self.window.front()?;
        if now.duration_since(self.progress) < timeout {
            return None;
        }
        self.progress = now;
        self.retries += 1;
        Some(front.first_psn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(frame: u64, len: u32) -> WriteMessage {
        WriteMessage { frame, from: 0, va: 0x1000, rkey: 9, len, imm: Some(frame as u32) }
    }

    #[test]
    fn cuts_messages_into_mtu_packets_with_the_right_opcodes() {
        let mut r = Requester::new(0x11, PSN_MASK - 1, 1024);
        assert_eq!(r.post(msg(3, 2500)), 3);
        let p: Vec<PacketPlan> = (0..3).map(|k| r.packet(0, k)).collect();
        let ops: Vec<u8> = p.iter().map(|x| x.headers.bth.opcode).collect();
        assert_eq!(ops, vec![Opcode::WriteFirst as u8, Opcode::WriteMiddle as u8, Opcode::WriteLastImm as u8]);
        assert_eq!(p.iter().map(|x| x.headers.bth.psn).collect::<Vec<_>>(), vec![PSN_MASK - 1, PSN_MASK, 0]);
        assert_eq!((p[0].headers.reth.unwrap().len, p[2].from, p[2].len, p[2].headers.imm), (2500, 2048, 452, Some(3)));
        assert!(p[1].headers.reth.is_none() && p[2].headers.bth.ack_req);
        r.post(WriteMessage { imm: None, ..msg(4, 100) });
        assert_eq!(r.packet(1, 0).headers.bth.opcode, Opcode::WriteOnly as u8);
    }

    #[test]
    fn acks_release_and_a_nak_goes_back_to_its_psn() {
        let mut r = Requester::new(0x11, 10, 1024);
        r.post(msg(0, 3000)); // PSN 10..12
        r.post(msg(1, 3000)); // 13..15
        assert_eq!(r.answer(AethKind::Ack { credits: 0 }, 11), Answer::Acked { released: 0 });
        assert_eq!(r.answer(AethKind::Nak { code: 0 }, 12), Answer::GoBack { psn: 12 });
        let again: Vec<(usize, u32)> = r.resend_from(12).collect();
        assert_eq!(again, vec![(0, 2), (1, 0), (1, 1), (1, 2)]);
        assert_eq!(r.in_flight(), 6);
        assert_eq!(r.answer(AethKind::Ack { credits: 0 }, 13), Answer::Acked { released: 1 });
        assert_eq!(r.in_flight(), 3);
        assert_eq!(r.oldest_frame(), Some(1));
        assert_eq!(r.answer(AethKind::Ack { credits: 0 }, 99), Answer::Ignored, "not a PSN sent");
        assert_eq!(r.answer(AethKind::Nak { code: 0 }, 11), Answer::Ignored, "a late NAK of a PSN acknowledged");
        assert_eq!(r.answer(AethKind::Ack { credits: 0 }, 15), Answer::Acked { released: 1 });
        assert_eq!(r.outstanding(), 0);
        assert_eq!(r.answer(AethKind::Nak { code: 2 }, 16), Answer::Ignored, "nothing outstanding");
    }

    #[test]
    fn a_timeout_goes_back_to_the_oldest_packet() {
        let mut r = Requester::new(0x11, 0, 1024);
        r.post(msg(0, 10));
        let t = Instant::now() + Duration::from_secs(1);
        assert_eq!(r.timed_out(t, Duration::from_millis(10)), Some(0));
        assert_eq!(r.retries, 1);
        assert_eq!(r.timed_out(t, Duration::from_millis(10)), None, "the resend restarted the clock");
        assert_eq!(r.answer(AethKind::Nak { code: 2 }, 0), Answer::Fatal { code: 2 });
    }
}
