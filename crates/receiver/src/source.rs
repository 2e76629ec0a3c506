//! A data channel as the receiver sees it: how its datagrams are read (rdaq or one sls
//! interface), where its next datagram is expected, and (for rdaq channels) its loss window
//! and the retransmission requests waiting to be sent.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rdaq_proto::nack::Missing;

use crate::counters::Counters;
use crate::grid::Grid;
use crate::window::LossWindow;

/// Retransmission requests a source may queue before they are sent; beyond it ranges are
/// counted as dropped (a channel losing that much needs the frame timeout, not more NACKs).
pub const NACK_QUEUE: usize = 4 * rdaq_proto::nack::NACK_MAX_ENTRIES;
/// Loss reports kept between two reads by the engine.
pub(crate) const LOSS_LOG: usize = 4096;

/// A run of sequence numbers a data channel's loss window declared missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loss {
    /// Global id of the module whose channel it is.
    pub module: u16,
    pub start: u32,
    /// Exclusive (wrapping).
    pub end: u32,
}

/// How datagrams on one socket are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    /// rdaq datagrams: the header names buffer, key, offset.
    Rdaq,
    /// Native JUNGFRAU packets of one module interface: packet `p` (expected in
    /// `first_packet..first_packet + packets`) of frame `f` goes to the slot of `f`, cell
    /// `module * cells_per_module + first_cell + p - first_packet`. A partial readout
    /// (`readnrows`) sends only the packets of the rows read, numbered as in a full frame.
    Sls { module: u16, first_cell: u32, first_packet: u32, packets: u32 },
    /// Native sls packets placed by their header (EIGER, and every detector whose
    /// description places by "header"): row and column name the port block in the
    /// detector's grid of ports, the packet number its place in that port image. `port` is
    /// the port of its module this socket is expected to carry (a guess for prediction:
    /// where packets go is the header's to say).
    SlsByHeader { port: u32, grid: PortGrid },
}

/// How a detector placed by header cuts its frames (see [`SourceKind::SlsByHeader`]): a
/// module is a `port_rows x port_cols` grid of port images, each `packets` packets of
/// `payload` bytes, held one after the other in the module's part of a slot (port
/// `r * port_cols + c` at `(r, c)`). Header row `R`, column `C` is port
/// `(R % port_rows, C % port_cols)` of module `(R / port_rows) * module_cols + C / port_cols`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortGrid {
    /// The header's detType of this detector's packets.
    pub det_type: u8,
    pub payload: u32,
    pub packets: u32,
    pub port_rows: u16,
    pub port_cols: u16,
    /// Modules per row of the detector's module grid.
    pub module_cols: u16,
}

impl PortGrid {
    pub fn ports(&self) -> u32 {
        self.port_rows as u32 * self.port_cols as u32
    }

    /// Bytes of one module frame.
    pub fn module_bytes(&self) -> u64 {
        self.ports() as u64 * self.packets as u64 * self.payload as u64
    }

    /// The global module and its port that header row `row`, column `col` name; `None`
    /// past the module grid's width.
    pub fn locate(&self, row: u16, col: u16) -> Option<(u16, u32)> {
        let (mr, mc) = (row / self.port_rows, col / self.port_cols);
        let port = (row % self.port_rows) as u32 * self.port_cols as u32 + (col % self.port_cols) as u32;
        if mc >= self.module_cols {
            return None;
        }
        Some((mr.checked_mul(self.module_cols)?.checked_add(mc)?, port))
    }
}

impl SourceKind {
    /// The cells of a slot this source fills, given the local module it sends for.
    pub fn cells(self, module: u16, grid: &Grid) -> std::ops::Range<u32> {
        let base = module as u32 * grid.cells_per_module;
        match self {
            SourceKind::Rdaq => base..base + grid.cells_per_module,
            SourceKind::Sls { first_cell, packets, .. } => base + first_cell..base + first_cell + packets,
            SourceKind::SlsByHeader { port, grid } => base + port * grid.packets..base + (port + 1) * grid.packets,
        }
    }
}

/// Packets an sls source received with a packet number it does not expect (another
/// interface's, or rows outside the readout): what the diagnosis of a wrong setting needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unexpected {
    pub packets: u64,
    pub lowest: u32,
    pub highest: u32,
}

impl Unexpected {
    pub(crate) fn record(&mut self, packet: u32) {
        if self.packets == 0 {
            (self.lowest, self.highest) = (packet, packet);
        }
        self.packets += 1;
        self.lowest = self.lowest.min(packet);
        self.highest = self.highest.max(packet);
    }
}

/// sls packets a source dropped as not its detector's (another detType or payload size, or
/// larger than any of its packets): what the diagnosis of a wrong `--detector` or `--link`
/// needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Foreign {
    pub packets: u64,
    /// Of them, those longer than the receiver reads (their size is not known).
    pub oversized: u64,
    /// The last one's pixel bytes (of one that was not oversized) and detType.
    pub payload: usize,
    pub det_type: u8,
}

impl Foreign {
    /// Records a packet with sls header `hdr` (its detType, when the header is whole) and
    /// `payload` pixel bytes (`None`: oversized, its size unknown).
    pub(crate) fn record(&mut self, hdr: &[u8], payload: Option<usize>) {
        self.packets += 1;
        self.det_type = hdr.get(46).copied().unwrap_or(0);
        match payload {
            Some(p) => self.payload = p,
            None => self.oversized += 1,
        }
    }
}

/// A socket's reading rules, its prediction of where the next datagram goes, and (for
/// rdaq channels) its loss window and the retransmission requests waiting to be sent.
#[derive(Clone, Debug)]
pub struct Source {
    pub kind: SourceKind,
    /// Position in the slot of the module sending on it, and its global id.
    pub module: u16,
    pub module_id: u16,
    pub(crate) next: Option<(u32, u32)>,
    pub(crate) window: Option<LossWindow>,
    /// Where its accepted datagrams last came from: where requests go.
    pub peer: Option<SocketAddr>,
    /// When it last delivered an accepted datagram.
    pub last_data: Option<Instant>,
    /// Its loss window was flushed since the last datagram.
    pub flushed: bool,
    /// The newest and the oldest frame it delivered a datagram of.
    pub newest_frame: Option<u64>,
    pub oldest_frame: Option<u64>,
    /// Requests waiting to be sent (at most [`NACK_QUEUE`]).
    pub nacks: Vec<Missing>,
    /// Datagrams accepted from it.
    pub accepted: u64,
    /// sls packets it got with a packet number it does not expect.
    pub unexpected: Unexpected,
    /// sls packets it dropped as another detector's or another link's.
    pub foreign: Foreign,
}

impl Source {
    /// A source whose first datagram is guessed to be local module `module`'s first cell of
    /// slot 0 (where a ring starting at frame 0 puts it); `window` is `(size, lag)` of its
    /// loss window (rdaq sources only).
    pub fn new(kind: SourceKind, module: u16, module_id: u16, grid: &Grid, window: Option<(u32, u32)>) -> Self {
        let first = match kind {
            SourceKind::Rdaq => 0,
            SourceKind::Sls { first_cell, .. } => first_cell,
            SourceKind::SlsByHeader { port, grid } => port * grid.packets,
        };
        let window = window.filter(|_| kind == SourceKind::Rdaq).map(|(size, lag)| LossWindow::new(size, lag));
        Source {
            kind,
            module,
            module_id,
            next: Some((0, module as u32 * grid.cells_per_module + first)),
            window,
            peer: None,
            last_data: None,
            flushed: false,
            newest_frame: None,
            oldest_frame: None,
            nacks: Vec::with_capacity(NACK_QUEUE),
            accepted: 0,
            unexpected: Unexpected::default(),
            foreign: Foreign::default(),
        }
    }

    /// Whether this source still has frame `frame` to come: it is sending that frame or older
    /// ones (newest not past `frame`) and was heard from within `silence`. A module that is
    /// only late (a busy machine running its thread slowly, in the middle of the frame or
    /// before it) must not have its frame expired; one that went silent, or went on to later
    /// frames, may.
    pub fn on_its_way_to(&self, frame: u64, now: Instant, silence: Duration) -> bool {
        self.newest_frame.is_some_and(|n| n <= frame) && self.last_data.is_some_and(|t| now.duration_since(t) < silence)
    }

    /// Queues a request; false (and nothing queued) when the queue is full.
    pub fn request(&mut self, m: Missing) -> bool {
        if self.nacks.len() >= NACK_QUEUE {
            return false;
        }
        self.nacks.push(m);
        true
    }

    /// The channel went quiet: everything below the window's head that has not arrived is
    /// lost; queue requests for it.
    pub fn flush_window(&mut self, counters: &mut Counters, losses: &mut Vec<Loss>) {
        let Some(w) = self.window.as_mut() else { return };
        let (nacks, module) = (&mut self.nacks, self.module_id);
        w.flush(|a, b| declare_lost(counters, losses, nacks, module, a, b));
    }

    /// Forgets the channel's history (a new acquisition).
    pub fn reset(&mut self) {
        if let Some(w) = self.window.as_mut() {
            w.reset();
        }
        self.nacks.clear();
        self.last_data = None;
        self.flushed = false;
        self.newest_frame = None;
        self.oldest_frame = None;
        self.accepted = 0;
        self.unexpected = Unexpected::default();
        self.foreign = Foreign::default();
    }
}

/// The packet number of an sls header that was decoded before (so is long enough).
pub(crate) fn sls_packet_number(hdr: &[u8]) -> u32 {
    hdr.get(12..16).and_then(|b| b.try_into().ok()).map_or(u32::MAX, u32::from_le_bytes)
}

/// Records a run of lost sequence numbers: counted, reported, and queued as a request. A
/// burst is declared one number per arrival as the head moves on, so a run that continues
/// the previous one extends it.
pub(crate) fn declare_lost(counters: &mut Counters, losses: &mut Vec<Loss>, nacks: &mut Vec<Missing>, module: u16, a: u32, b: u32) {
    counters.seq_missing += b.wrapping_sub(a) as u64;
    if let Some(l) = losses.last_mut().filter(|l| l.module == module && l.end == a) {
        l.end = b;
    } else if losses.len() < LOSS_LOG {
        losses.push(Loss { module, start: a, end: b });
    } else {
        counters.loss_reports_dropped += 1;
    }
    if let Some(Missing::Seq { end, .. }) = nacks.last_mut().filter(|m| matches!(m, Missing::Seq { end, .. } if *end == a)) {
        *end = b;
    } else if nacks.len() < NACK_QUEUE {
        nacks.push(Missing::Seq { start: a, end: b });
    } else {
        counters.nack_ranges_dropped += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::PortGrid;

    #[test]
    fn header_rows_and_columns_name_module_and_port() {
        // EIGER: 2 x 2 ports per module, a 2-module-wide detector (e.g. 4 modules, 2 x 2)
        let g = PortGrid { det_type: 1, payload: 1024, packets: 256, port_rows: 2, port_cols: 2, module_cols: 2 };
        assert_eq!(g.locate(0, 0), Some((0, 0)));
        assert_eq!(g.locate(1, 0), Some((0, 2)), "bottom half-module, left");
        assert_eq!(g.locate(0, 3), Some((1, 1)));
        assert_eq!(g.locate(3, 2), Some((3, 2)));
        assert_eq!(g.locate(0, 4), None, "past the grid's width");
        assert_eq!(g.module_bytes(), 4 * 256 * 1024);
    }
}
