//! Where a datagram goes, decided from its header alone: the checks that do not depend on
//! slot state (format, key, bounds, packet grid, checksum), for rdaq datagrams and native
//! sls packets (JUNGFRAU's by port, others by header). The wire formats are described in
//! `docs/protocol.md` and `docs/detectors.md`.

use rdaq_proto::datagram::{checksum, DecodeError, Flags, Header, CHECKSUM_LEN, HEADER_LEN};
use rdaq_proto::sls::{SlsHeader, SLS_HEADER_LEN, SLS_HEADER_VERSION};

use crate::counters::DropReason;
use crate::grid::Grid;
use crate::source::{PortGrid, SourceKind};

/// Where a datagram goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub slot: u32,
    /// A cell of the slot's grid (`cell < Grid::cells()`).
    pub cell: u32,
    pub frame: u64,
    pub imm: Option<u32>,
    /// The channel's sequence number (rdaq only).
    pub seq: u32,
    pub retransmit: bool,
}

/// The registered buffers a receiver serves, as far as headers are checked against them.
#[derive(Clone, Debug)]
pub(crate) struct Targets {
    pub(crate) grid: Grid,
    /// Global module id -> position in the slot (`u16::MAX`: not served here).
    module_index: Vec<u16>,
    buffer_base: u32,
    /// Access key of each local buffer (one per slot).
    keys: Vec<u32>,
    /// Datagrams carry the checksum extension (and must).
    checksum: bool,
    /// Bytes before the payload of an rdaq datagram.
    pub(crate) hdr_len: usize,
}

impl Targets {
    pub(crate) fn new(grid: Grid, module_ids: &[u16], buffer_base: u32, keys: Vec<u32>) -> Targets {
        let mut module_index = vec![u16::MAX; module_ids.iter().max().map_or(0, |&m| m as usize + 1)];
        for (i, &m) in module_ids.iter().enumerate() {
            module_index[m as usize] = i as u16;
        }
        Targets { grid, module_index, buffer_base, keys, checksum: false, hdr_len: HEADER_LEN }
    }

    pub(crate) fn set_checksum(&mut self, on: bool) {
        self.checksum = on;
        self.hdr_len = HEADER_LEN + if on { CHECKSUM_LEN } else { 0 };
    }

    /// Bytes before the payload of a datagram from a source of this kind.
    pub(crate) fn header_len(&self, kind: SourceKind) -> usize {
        match kind {
            SourceKind::Rdaq => self.hdr_len,
            SourceKind::Sls { .. } | SourceKind::SlsByHeader { .. } => SLS_HEADER_LEN,
        }
    }

    /// Where a datagram read from a source of kind `kind` goes: `hdr` is its header area as
    /// read ([`Targets::header_len`] bytes, fewer if the datagram was shorter), `payload`
    /// the rest.
    pub(crate) fn find(&self, kind: SourceKind, hdr: &[u8], datagram_len: usize, payload: &[u8]) -> Result<Target, DropReason> {
        match kind {
            SourceKind::Rdaq => self.rdaq(hdr, datagram_len).and_then(|t| self.verify(hdr, payload).map(|()| t)),
            SourceKind::Sls { module, first_cell, first_packet, packets } => {
                let port = SlsPort { module, first_cell, first_packet, packets };
                self.sls(hdr, datagram_len, port)
            }
            SourceKind::SlsByHeader { grid, .. } => self.sls_by_header(hdr, datagram_len, &grid),
        }
    }

    /// The position in the slot of the module with global id `id`, when it is served here.
    fn local_module(&self, id: u16) -> Result<u16, DropReason> {
        match self.module_index.get(id as usize) {
            Some(&i) if i != u16::MAX => Ok(i),
            _ => Err(DropReason::UnknownModule),
        }
    }

    /// Where an rdaq datagram goes.
    fn rdaq(&self, hdr: &[u8], datagram_len: usize) -> Result<Target, DropReason> {
        if hdr.len() < self.hdr_len {
            return Err(DropReason::Truncated);
        }
        let hdr: &[u8; HEADER_LEN] = hdr[..HEADER_LEN].try_into().map_err(|_| DropReason::Truncated)?;
        let h = Header::decode(hdr, datagram_len).map_err(drop_reason)?;
        if h.flags.contains(Flags::CHECKSUM) != self.checksum {
            return Err(DropReason::ChecksumMode);
        }
        let slot = h.buffer.wrapping_sub(self.buffer_base);
        if slot as usize >= self.keys.len() {
            return Err(DropReason::UnknownBuffer);
        }
        if self.keys[slot as usize] != h.key {
            return Err(DropReason::BadKey);
        }
        if h.end() > self.grid.slot_bytes() {
            return Err(DropReason::OutOfBounds);
        }
        let module = self.local_module(h.module)?;
        if h.dataset != 0 {
            return Err(DropReason::UnknownDataset);
        }
        let cell = self.grid.cell_at(module, h.offset, h.length as u64).ok_or(DropReason::Misaligned)?;
        let imm = h.flags.contains(Flags::IMM).then_some(h.imm);
        Ok(Target { slot, cell, frame: h.frame, imm, seq: h.seq, retransmit: h.flags.contains(Flags::RETRANSMIT) })
    }

    /// Checks the checksum extension of an rdaq datagram whose target was found.
    fn verify(&self, hdr: &[u8], payload: &[u8]) -> Result<(), DropReason> {
        if !self.checksum {
            return Ok(());
        }
        let head: &[u8; HEADER_LEN] = hdr[..HEADER_LEN].try_into().map_err(|_| DropReason::Truncated)?;
        let stored = hdr[HEADER_LEN..].get(..CHECKSUM_LEN).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes);
        if stored == Some(checksum(head, payload)) {
            Ok(())
        } else {
            Err(DropReason::BadChecksum)
        }
    }

    /// Where a native JUNGFRAU packet read from an sls port goes: packet `p` of frame `f`
    /// goes to the slot of `f` (frame number modulo the ring), cell
    /// `module * cells_per_module + first_cell + p - first_packet`.
    fn sls(&self, hdr: &[u8], datagram_len: usize, port: SlsPort) -> Result<Target, DropReason> {
        let hdr: &[u8; SLS_HEADER_LEN] = hdr.try_into().map_err(|_| DropReason::Truncated)?;
        let h = SlsHeader::decode(hdr);
        h.check_jungfrau(datagram_len - SLS_HEADER_LEN, u32::MAX).map_err(|_| DropReason::BadSlsPacket)?;
        let k = h.packet_number.wrapping_sub(port.first_packet);
        if k >= port.packets {
            return Err(DropReason::UnexpectedPacket);
        }
        // a port's rules name cells of its own module only (`sls_sources` makes them so; a
        // hand-made source kind that does not is refused here, not written out of bounds)
        let in_module = port.first_cell.checked_add(k).filter(|&c| c < self.grid.cells_per_module);
        let (Some(c), true) = (in_module, port.module < self.grid.modules) else {
            return Err(DropReason::OutOfBounds);
        };
        let slot = (h.frame_number % self.keys.len() as u64) as u32;
        let cell = port.module as u32 * self.grid.cells_per_module + c;
        Ok(Target { slot, cell, frame: h.frame_number, imm: None, seq: 0, retransmit: false })
    }

    /// Where an sls packet placed by its header goes: packet `p` of port `q` of the module
    /// that row and column name, in the slot of its frame (frame number modulo the ring),
    /// cell `module * cells_per_module + q * packets + p`.
    fn sls_by_header(&self, hdr: &[u8], datagram_len: usize, g: &PortGrid) -> Result<Target, DropReason> {
        let hdr: &[u8; SLS_HEADER_LEN] = hdr.try_into().map_err(|_| DropReason::Truncated)?;
        let h = SlsHeader::decode(hdr);
        if h.det_type != g.det_type || h.version != SLS_HEADER_VERSION || datagram_len - SLS_HEADER_LEN != g.payload as usize {
            return Err(DropReason::BadSlsPacket);
        }
        if h.packet_number >= g.packets {
            return Err(DropReason::UnexpectedPacket);
        }
        let (module, port) = g.locate(h.row, h.column).ok_or(DropReason::UnknownModule)?;
        let local = self.local_module(module)? as u32;
        let cell = local * self.grid.cells_per_module + port * g.packets + h.packet_number;
        if port >= g.ports() || cell >= self.grid.cells() {
            return Err(DropReason::OutOfBounds);
        }
        let slot = (h.frame_number % self.keys.len() as u64) as u32;
        Ok(Target { slot, cell, frame: h.frame_number, imm: None, seq: 0, retransmit: false })
    }
}

/// The reading rules of one sls interface (see [`SourceKind::Sls`]).
#[derive(Clone, Copy)]
struct SlsPort {
    module: u16,
    first_cell: u32,
    first_packet: u32,
    packets: u32,
}

fn drop_reason(e: DecodeError) -> DropReason {
    match e {
        DecodeError::Truncated { .. } => DropReason::Truncated,
        DecodeError::BadMagic(_) => DropReason::BadMagic,
        DecodeError::BadVersion(_) => DropReason::BadVersion,
        DecodeError::ReservedFlags(_) | DecodeError::ReservedField(_) => DropReason::BadHeader,
        DecodeError::LengthMismatch { .. } => DropReason::LengthMismatch,
        DecodeError::OffsetOverflow { .. } => DropReason::OutOfBounds,
        DecodeError::BadChecksum => DropReason::BadChecksum,
    }
}
