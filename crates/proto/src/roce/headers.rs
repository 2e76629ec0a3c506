//! The InfiniBand transport headers RoCEv2 carries: BTH, RETH, ImmDt and AETH, and the RC
//! opcodes rdaq speaks. All fields are big-endian on the wire.

/// UDP destination port of RoCEv2.
pub const ROCE_PORT: u16 = 4791;
pub const BTH_LEN: usize = 12;
pub const RETH_LEN: usize = 16;
pub const IMMDT_LEN: usize = 4;
pub const AETH_LEN: usize = 4;

/// The reliable-connection (RC) opcodes rdaq sends and takes, and UD SEND_ONLY.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    SendFirst = 0x00,
    SendMiddle = 0x01,
    SendLast = 0x02,
    SendLastImm = 0x03,
    SendOnly = 0x04,
    SendOnlyImm = 0x05,
    WriteFirst = 0x06,
    WriteMiddle = 0x07,
    WriteLast = 0x08,
    WriteLastImm = 0x09,
    WriteOnly = 0x0A,
    WriteOnlyImm = 0x0B,
    Ack = 0x11,
    UdSendOnly = 0x64,
}

impl Opcode {
    pub fn from_u8(b: u8) -> Option<Opcode> {
        use Opcode::*;
        Some(match b {
            0x00 => SendFirst,
            0x01 => SendMiddle,
            0x02 => SendLast,
            0x03 => SendLastImm,
            0x04 => SendOnly,
            0x05 => SendOnlyImm,
            0x06 => WriteFirst,
            0x07 => WriteMiddle,
            0x08 => WriteLast,
            0x09 => WriteLastImm,
            0x0A => WriteOnly,
            0x0B => WriteOnlyImm,
            0x11 => Ack,
            0x64 => UdSendOnly,
            _ => return None,
        })
    }

    /// The first (or only) packet of an RDMA WRITE names the remote address: a RETH follows.
    pub fn has_reth(self) -> bool {
        matches!(self, Opcode::WriteFirst | Opcode::WriteOnly | Opcode::WriteOnlyImm)
    }

    /// The packet carries a 32-bit immediate after its other headers.
    pub fn has_imm(self) -> bool {
        matches!(self, Opcode::WriteLastImm | Opcode::WriteOnlyImm | Opcode::SendLastImm | Opcode::SendOnlyImm)
    }

    pub fn has_aeth(self) -> bool {
        self == Opcode::Ack
    }

    /// UD packets carry a DETH (8 bytes: Q_Key, source QP) after the BTH.
    pub fn has_deth(self) -> bool {
        self == Opcode::UdSendOnly
    }

}

/// Base transport header (12 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bth {
    pub opcode: u8,
    /// Solicited event: the responder raises a completion event.
    pub solicited: bool,
    pub mig_req: bool,
    /// Pad bytes (0-3) after the payload, which make it a multiple of 4.
    pub pad: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    /// Destination queue pair (24 bits).
    pub dest_qp: u32,
    /// The requester asks for an acknowledgement.
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl Bth {
    pub fn encode(&self, out: &mut [u8; BTH_LEN]) {
        out[0] = self.opcode;
        out[1] = (self.solicited as u8) << 7 | (self.mig_req as u8) << 6 | (self.pad & 3) << 4;
        out[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        out[4] = (self.fecn as u8) << 7 | (self.becn as u8) << 6;
        out[5..8].copy_from_slice(&(self.dest_qp & 0xFF_FFFF).to_be_bytes()[1..]);
        out[8] = (self.ack_req as u8) << 7;
        out[9..12].copy_from_slice(&(self.psn & 0xFF_FFFF).to_be_bytes()[1..]);
    }

    /// The BTH at the start of `b`; `None` when `b` is shorter or the transport version is
    /// not 0.
    pub fn parse(b: &[u8]) -> Option<Bth> {
        let b: &[u8; BTH_LEN] = b.get(..BTH_LEN)?.try_into().ok()?;
        if b[1] & 0x0F != 0 {
            return None;
        }
        Some(Bth {
            opcode: b[0],
            solicited: b[1] & 0x80 != 0,
            mig_req: b[1] & 0x40 != 0,
            pad: (b[1] >> 4) & 3,
            pkey: u16::from_be_bytes([b[2], b[3]]),
            fecn: b[4] & 0x80 != 0,
            becn: b[4] & 0x40 != 0,
            dest_qp: u32::from_be_bytes([0, b[5], b[6], b[7]]),
            ack_req: b[8] & 0x80 != 0,
            psn: u32::from_be_bytes([0, b[9], b[10], b[11]]),
        })
    }
}

/// RDMA extended transport header: where a WRITE goes in the responder's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reth {
    pub va: u64,
    pub rkey: u32,
    /// Bytes of the whole WRITE message (all its packets).
    pub len: u32,
}

impl Reth {
    pub fn encode(&self, out: &mut [u8; RETH_LEN]) {
        out[..8].copy_from_slice(&self.va.to_be_bytes());
        out[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        out[12..].copy_from_slice(&self.len.to_be_bytes());
    }

    pub fn parse(b: &[u8; RETH_LEN]) -> Reth {
        Reth {
            va: u64::from_be_bytes(b[..8].try_into().expect("8 bytes")),
            rkey: u32::from_be_bytes(b[8..12].try_into().expect("4 bytes")),
            len: u32::from_be_bytes(b[12..].try_into().expect("4 bytes")),
        }
    }
}

/// What an acknowledgement says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AethKind {
    /// Positive acknowledgement of every PSN up to the packet's, with the credit count.
    Ack { credits: u8 },
    /// Receiver not ready: retry after the timer (5-bit code).
    Rnr { timer: u8 },
    /// Negative acknowledgement; code 0 is a PSN sequence error: resend from the PSN in the
    /// packet.
    Nak { code: u8 },
}

/// NAK code of a PSN sequence error.
pub const NAK_PSN_SEQUENCE_ERROR: u8 = 0;

/// ACK extended transport header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aeth {
    pub kind: AethKind,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl Aeth {
    fn syndrome(&self) -> u8 {
        match self.kind {
            AethKind::Ack { credits } => credits & 0x1F,
            AethKind::Rnr { timer } => 0x20 | (timer & 0x1F),
            AethKind::Nak { code } => 0x60 | (code & 0x1F),
        }
    }

    pub fn encode(&self, out: &mut [u8; AETH_LEN]) {
        out[0] = self.syndrome();
        out[1..].copy_from_slice(&(self.msn & 0xFF_FFFF).to_be_bytes()[1..]);
    }

    /// `None` for the reserved syndrome (0b10).
    pub fn parse(b: &[u8; AETH_LEN]) -> Option<Aeth> {
        let s = b[0];
        let kind = match s >> 5 {
            0b000 => AethKind::Ack { credits: s & 0x1F },
            0b001 => AethKind::Rnr { timer: s & 0x1F },
            0b011 => AethKind::Nak { code: s & 0x1F },
            _ => return None,
        };
        Some(Aeth { kind, msn: u32::from_be_bytes([0, b[1], b[2], b[3]]) })
    }
}
