//! A software RoCEv2 reliable-connection (RC) endpoint for RDMA WRITE streams, sans I/O:
//! the [`responder`] a receiver runs (PSN order, opcode sequence, memory-region checks,
//! coalesced ACKs, sequence-error NAKs) and the [`requester`] a sender runs (PSNs, the
//! unacknowledged window, go-back-N on a NAK or a timeout). The packets are
//! [`rdaq_proto::roce`]'s; the frames travel through [`crate::raw`] and the AF_XDP engine.

pub mod requester;
pub mod responder;

/// PSNs are 24-bit and wrap.
pub const PSN_MASK: u32 = 0xFF_FFFF;

/// How far `psn` is ahead of `base` (0..2^23: ahead; larger: behind), modulo 2^24.
pub fn psn_ahead(psn: u32, base: u32) -> u32 {
    psn.wrapping_sub(base) & PSN_MASK
}

/// Whether `psn` is behind `base` in 24-bit serial arithmetic.
pub fn psn_behind(psn: u32, base: u32) -> bool {
    psn_ahead(psn, base) >= 1 << 23
}
