//! A whole RoCEv2 packet as it sits in a UDP datagram to port 4791: BTH, the extension
//! headers its opcode calls for (RETH, ImmDt, AETH; a UD packet's DETH), the payload, 0-3
//! pad bytes and the ICRC. Parsing borrows, encoding writes into the caller's buffer.

use thiserror::Error;

use super::headers::{Aeth, Bth, Opcode, Reth, AETH_LEN, BTH_LEN, IMMDT_LEN, RETH_LEN};
use super::icrc::{self, ICRC_LEN, IPV4_HEADER_LEN, UDP_HEADER_LEN};

const DETH_LEN: usize = 8;

#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum RoceError {
    #[error("{len} bytes cannot hold the packet's headers and ICRC ({need} needed)")]
    Short { len: usize, need: usize },
    #[error("transport header version is not 0")]
    Version,
    #[error("opcode {0:#04x} is not one rdaq takes")]
    Opcode(u8),
    #[error("AETH with the reserved syndrome")]
    Aeth,
    #[error("pad count {pad} is larger than the payload of {payload} bytes")]
    Pad { pad: u8, payload: usize },
    #[error("the output buffer of {have} bytes is smaller than the packet's {need}")]
    Output { have: usize, need: usize },
}

/// The headers of one packet, for [`encode`] (the BTH's pad count is filled in from the
/// payload's length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Headers {
    pub bth: Bth,
    pub reth: Option<Reth>,
    pub imm: Option<u32>,
    pub aeth: Option<Aeth>,
}

/// A parsed packet; `payload` excludes the pad.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet<'a> {
    pub opcode: Opcode,
    pub headers: Headers,
    pub payload: &'a [u8],
    /// The ICRC as carried (check it with [`Packet::icrc_ok_ipv4`]).
    pub icrc: u32,
}

/// Header bytes after the BTH for `op`.
fn ext_len(op: Opcode) -> usize {
    (op.has_deth() as usize) * DETH_LEN + (op.has_reth() as usize) * RETH_LEN + (op.has_aeth() as usize) * AETH_LEN + (op.has_imm() as usize) * IMMDT_LEN
}

/// The headers of a packet and where its payload lies, read from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub opcode: Opcode,
    pub headers: Headers,
    /// Offset of the payload from the BTH.
    pub payload_at: usize,
    /// Payload bytes (pad excluded).
    pub payload_len: usize,
}

/// The most header bytes a packet rdaq takes has before its payload.
pub const MAX_HEAD: usize = BTH_LEN + DETH_LEN + RETH_LEN + AETH_LEN + IMMDT_LEN;

/// Reads the headers of a packet of `total` bytes (ICRC included) from its first bytes
/// `head` (at least [`MAX_HEAD`] of them, or all): for packets that lie in several buffers.
pub fn parse_head(head: &[u8], total: usize) -> Result<Head, RoceError> {
    let short = |need| RoceError::Short { len: total, need };
    if total < BTH_LEN + ICRC_LEN || head.len() < BTH_LEN {
        return Err(short(BTH_LEN + ICRC_LEN));
    }
    let bth = Bth::parse(head).ok_or(RoceError::Version)?;
    let opcode = Opcode::from_u8(bth.opcode).ok_or(RoceError::Opcode(bth.opcode))?;
    let need = BTH_LEN + ext_len(opcode) + ICRC_LEN;
    if total < need || head.len() < need - ICRC_LEN {
        return Err(short(need));
    }
    let mut at = BTH_LEN + (opcode.has_deth() as usize) * DETH_LEN;
    let mut take = |n: usize| {
        let s = &head[at..at + n];
        at += n;
        s
    };
    let reth = opcode.has_reth().then(|| Reth::parse(take(RETH_LEN).try_into().expect("RETH_LEN bytes")));
    let aeth = match opcode.has_aeth() {
        true => Some(Aeth::parse(take(AETH_LEN).try_into().expect("AETH_LEN bytes")).ok_or(RoceError::Aeth)?),
        false => None,
    };
    let imm = opcode.has_imm().then(|| u32::from_be_bytes(take(IMMDT_LEN).try_into().expect("4 bytes")));
    let body = total - at - ICRC_LEN;
    let payload_len = body.checked_sub(bth.pad as usize).ok_or(RoceError::Pad { pad: bth.pad, payload: body })?;
    Ok(Head { opcode, headers: Headers { bth, reth, imm, aeth }, payload_at: at, payload_len })
}

/// Parses the UDP payload `b` of a RoCEv2 datagram.
pub fn parse(b: &[u8]) -> Result<Packet<'_>, RoceError> {
    let h = parse_head(b, b.len())?;
    let payload = &b[h.payload_at..h.payload_at + h.payload_len];
    let icrc = icrc::get(b[b.len() - ICRC_LEN..].try_into().expect("ICRC_LEN bytes"));
    Ok(Packet { opcode: h.opcode, headers: h.headers, payload, icrc })
}

/// Length of the packet [`encode`] makes for `op` with `payload` bytes (ICRC included).
pub fn encoded_len(op: Opcode, payload: usize) -> usize {
    BTH_LEN + ext_len(op) + payload.next_multiple_of(4) + ICRC_LEN
}

/// Writes the packet into `out` with its ICRC left as zeros (see [`seal_ipv4`]); returns its
/// length. The opcode is `h.bth.opcode`, which must be one rdaq takes.
pub fn encode(h: &Headers, payload: &[u8], out: &mut [u8]) -> Result<usize, RoceError> {
    let op = Opcode::from_u8(h.bth.opcode).ok_or(RoceError::Opcode(h.bth.opcode))?;
    let len = encoded_len(op, payload.len());
    if out.len() < len {
        return Err(RoceError::Output { have: out.len(), need: len });
    }
    let pad = (payload.len().next_multiple_of(4) - payload.len()) as u8;
    let bth = Bth { pad, ..h.bth };
    bth.encode((&mut out[..BTH_LEN]).try_into().expect("BTH_LEN bytes"));
    let mut at = BTH_LEN;
    if op.has_deth() {
        out[at..at + DETH_LEN].fill(0);
        at += DETH_LEN;
    }
    if op.has_reth() {
        h.reth.unwrap_or(Reth { va: 0, rkey: 0, len: 0 }).encode((&mut out[at..at + RETH_LEN]).try_into().expect("RETH_LEN bytes"));
        at += RETH_LEN;
    }
    if op.has_aeth() {
        let a = h.aeth.unwrap_or(Aeth { kind: super::AethKind::Ack { credits: 0 }, msn: 0 });
        a.encode((&mut out[at..at + AETH_LEN]).try_into().expect("AETH_LEN bytes"));
        at += AETH_LEN;
    }
    if op.has_imm() {
        out[at..at + IMMDT_LEN].copy_from_slice(&h.imm.unwrap_or(0).to_be_bytes());
        at += IMMDT_LEN;
    }
    out[at..at + payload.len()].copy_from_slice(payload);
    at += payload.len();
    out[at..len].fill(0);
    Ok(len)
}

/// Computes and writes the ICRC of `packet` (a whole encoded packet, its last 4 bytes the
/// ICRC's place) under the IPv4 and UDP headers it travels in.
pub fn seal_ipv4(ip: &[u8; IPV4_HEADER_LEN], udp: &[u8; UDP_HEADER_LEN], packet: &mut [u8]) {
    let n = packet.len() - ICRC_LEN;
    let c = icrc::icrc_ipv4(ip, udp, &packet[..n]);
    icrc::put(c, (&mut packet[n..]).try_into().expect("ICRC_LEN bytes"));
}

impl Packet<'_> {
    /// Whether the ICRC carried matches the packet `whole` (the UDP payload this was parsed
    /// from) under its IPv4 and UDP headers.
    pub fn icrc_ok_ipv4(&self, ip: &[u8; IPV4_HEADER_LEN], udp: &[u8; UDP_HEADER_LEN], whole: &[u8]) -> bool {
        whole.len() >= ICRC_LEN && icrc::icrc_ipv4(ip, udp, &whole[..whole.len() - ICRC_LEN]) == self.icrc
    }
}
