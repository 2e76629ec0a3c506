//! A receiver's configuration and the rules of the formats it takes: what arrives on the
//! data ports (rdaq datagrams, native sls packets, RoCEv2 WRITEs), how many data channels
//! and sources that makes per module, and the checks a configuration must pass before
//! anything is bound. The receive loop that applies them is in [`crate::engine`].

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use rdaq_net::engine::{EngineError, EngineKind};
use rdaq_proto::sls::{JUNGFRAU_PACKETS_PER_FRAME, JUNGFRAU_PACKET_PAYLOAD};
use rdaq_proto::telegram::BufferRequest;
use thiserror::Error;

use crate::frame::IncompletePolicy;
use crate::grid::Grid;
use crate::source::{PortGrid, SourceKind};

/// The most datagrams one read may take: what both a `recvmmsg` call and placement's batch
/// space hold.
pub const MAX_BATCH: usize = min(rdaq_net::recv::MAX_BATCH, crate::placement::MAX_BATCH);

const fn min(a: usize, b: usize) -> usize {
    if a < b {
        a
    } else {
        b
    }
}

/// What arrives on the data ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// rdaq datagrams; module `m` sends to `data_port + m`.
    Rdaq,
    /// Native JUNGFRAU packets; interface `i` of module `m` sends to
    /// `data_port + m * interfaces + i`, each carrying `128 / interfaces` packets per frame.
    /// `rows` is the partial readout (`readnrows`): the detector reads out that many rows
    /// around the module's centre (512: all of them), and a frame is that many rows high.
    /// (With `data_port` 0 every port is chosen by the kernel: see [`Receiver::ports`].)
    Sls { interfaces: u8, rows: u16 },
    /// RoCEv2 RDMA WRITEs to UDP port 4791 (AF_XDP engine only): module `m` writes through
    /// its own RC queue pair (parameters in the buffer map), `mtu` payload bytes per packet;
    /// the frames are numbered from `first_frame`, `frame_stride` apart (1; n for one of n
    /// receivers of a temporal plan). A software RoCEv2 target: see
    /// `rdaq_net::roce::responder`.
    Roce { mtu: u32, first_frame: u64, frame_stride: u64 },
    /// Native sls packets placed by their header (EIGER, and detectors described with
    /// "header" placement; see [`PortGrid`]): each module has `grid.ports()` data ports,
    /// port `p` of module `m` at `data_port + m * ports + p` (any of them may carry any
    /// port's packets).
    SlsByHeader(PortGrid),
}

/// Path MTUs a RoCEv2 queue pair may have.
/// The longest a frame may wait for its missing datagrams, and the longest a stop lingers
/// (a minute: far beyond any retransmission), so that an acquisition's end never waits on a
/// frame for days.
pub const MAX_FRAME_TIMEOUT: Duration = Duration::from_secs(60);

pub const ROCE_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

impl Format {
    /// Native JUNGFRAU packets of a full readout on `interfaces` interfaces.
    pub fn sls(interfaces: u8) -> Format {
        Format::Sls { interfaces, rows: JUNGFRAU_ROWS }
    }
}

/// Pixel rows of a JUNGFRAU module, and rows per packet (one interface).
pub const JUNGFRAU_ROWS: u16 = 512;
const ROWS_PER_PACKET: u32 = 4;

/// The sources of one JUNGFRAU module read out `rows` rows around its centre on
/// `interfaces` interfaces: interface `i` sends the packets of rows `i * 512 / interfaces ..`,
/// numbered from 0 on each interface, and a partial readout sends only the packets of the
/// rows read (numbered as in a full frame). Cells follow the rows read, in order.
pub fn sls_sources(module: u16, interfaces: u8, rows: u16) -> Vec<SourceKind> {
    let per_if = JUNGFRAU_PACKETS_PER_FRAME / interfaces as u32;
    let lo = (JUNGFRAU_ROWS - rows) as u32 / 2 / ROWS_PER_PACKET;
    let hi = lo + rows as u32 / ROWS_PER_PACKET;
    (0..interfaces as u32)
        .map(|i| {
            let (a, b) = (lo.max(i * per_if), hi.min((i + 1) * per_if));
            SourceKind::Sls { module, first_cell: a - lo, first_packet: a - i * per_if, packets: b.saturating_sub(a) }
        })
        .collect()
}

/// Retransmission requests (rdaq channels): when and how often the receiver asks a module's
/// controller for what it lacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NackConfig {
    /// A frame that has had nothing new for this long is asked for what it lacks, and a
    /// channel quiet for this long has its loss window flushed.
    pub quiet: Duration,
    /// Between two requests for the same frame.
    pub interval: Duration,
    /// Requests per frame before the receiver waits for the frame timeout.
    pub retries: u32,
    /// Requests per second, all channels together (a token bucket with a tenth of a second
    /// of burst): a receiver losing everything must not flood its senders.
    pub rate: u32,
}

impl Default for NackConfig {
    fn default() -> Self {
        NackConfig { quiet: Duration::from_millis(20), interval: Duration::from_millis(50), retries: 10, rate: 20_000 }
    }
}

#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    pub format: Format,
    /// The receive engine (`recvmmsg` by default).
    pub engine: EngineKind,
    pub bind: IpAddr,
    pub data_port: u16,
    pub modules: u16,
    /// Global ids of the modules, in slot order (empty: 0..modules). A receiver of a
    /// spatial plan holds some of the detector's modules.
    pub module_ids: Vec<u16>,
    pub module_bytes: u64,
    /// rdaq datagram payload size (the packet cell); fixed at 8192 for sls.
    pub payload_bytes: u32,
    /// Frame slots (local buffers) in the ring.
    pub slots: usize,
    /// Socket receive buffer per data port.
    pub recv_buffer: usize,
    /// Datagrams per recvmmsg call.
    pub batch: usize,
    /// An incomplete frame is finished this long after its first datagram.
    pub frame_timeout: Duration,
    pub policy: IncompletePolicy,
    /// Id of the first local buffer.
    pub buffer_base: u32,
    /// Derive the access keys from this seed instead of the system's randomness.
    pub key_seed: Option<u64>,
    /// Land payloads at the predicted destination (off: every payload is copied from scratch).
    pub predict: bool,
    /// The longest the receive thread lets datagrams gather in the socket buffers between
    /// two reads of a running stream (see [`crate::coalesce`]; zero: read as soon as data
    /// is there). A slow stream then costs one wake-up per about two batches instead of one
    /// per datagram, at the price of at most this much latency.
    pub coalesce: Duration,
    /// After `stop`, keep receiving until no datagram came for this long.
    pub linger: Duration,
    /// Stop by itself after this many frames finished or refused.
    pub frames: Option<u64>,
    /// Pin the receive thread to this CPU.
    pub cpu: Option<usize>,
    /// rdaq datagrams carry the CRC32C extension, verified here (and must carry it).
    pub checksum: bool,
    /// Accept datagrams only from these addresses (empty: from any).
    pub sources: Vec<IpAddr>,
    /// Loss window per rdaq channel: `(size, lag)` in sequence numbers.
    pub loss_window: (u32, u32),
    /// Ask for retransmission of what is lost (`None`: only detect and report it).
    pub nack: Option<NackConfig>,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        ReceiverConfig {
            format: Format::Rdaq,
            engine: EngineKind::Recvmmsg,
            bind: IpAddr::from([127, 0, 0, 1]),
            data_port: 50000,
            modules: 1,
            module_ids: Vec::new(),
            module_bytes: (512 * 1024 * 2) as u64,
            payload_bytes: 8192,
            slots: 64,
            recv_buffer: 64 << 20,
            batch: 64,
            frame_timeout: Duration::from_millis(500),
            policy: IncompletePolicy::Keep,
            buffer_base: 1,
            key_seed: None,
            predict: true,
            coalesce: Duration::from_millis(4),
            linger: Duration::from_millis(200),
            frames: None,
            cpu: None,
            checksum: false,
            sources: Vec::new(),
            loss_window: (1024, 512),
            nack: Some(NackConfig::default()),
        }
    }
}

#[derive(Debug, Error)]
pub enum ReceiverError {
    #[error("invalid receiver configuration: {0}")]
    Config(String),
    /// Datagrams per read outside what one `recvmmsg` call and placement's batch space take.
    #[error("invalid receiver configuration: batch {batch} must be 1..={max}", max = MAX_BATCH)]
    Batch { batch: usize },
    #[error("cannot allocate the {bytes}-byte frame ring: {source}")]
    Memory { bytes: u64, source: io::Error },
    #[error("cannot bind data port {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("receive failed: {0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl ReceiverConfig {
    /// The configuration that defines what a system manager's buffer request asks for (rdaq
    /// datagrams, or RoCEv2 WRITEs); the rest is the default, to be set by the caller.
    pub fn for_request(req: &BufferRequest) -> ReceiverConfig {
        let format = match req.roce {
            Some(r) => Format::Roce { mtu: r.mtu, first_frame: r.first_frame, frame_stride: r.frame_stride },
            None => Format::Rdaq,
        };
        ReceiverConfig {
            format,
            data_port: req.data_port,
            modules: req.modules.len() as u16,
            module_ids: req.modules.clone(),
            module_bytes: req.module_bytes,
            payload_bytes: req.payload_bytes,
            slots: req.slots as usize,
            checksum: req.checksum,
            ..ReceiverConfig::default()
        }
    }

    /// Checks the configuration as starting a receiver does, before anything is bound or
    /// allocated.
    pub fn validate(&self) -> Result<(), ReceiverError> {
        self.check().map(|_| ())
    }

    pub(crate) fn check(&self) -> Result<(Grid, Vec<(u16, SourceKind)>), ReceiverError> {
        let bad = |m: String| Err(ReceiverError::Config(m));
        if self.modules == 0 {
            return bad("modules must be at least 1".into());
        }
        if self.slots == 0 {
            return bad("slots must be at least 1".into());
        }
        if self.frame_timeout.is_zero() || self.frame_timeout > MAX_FRAME_TIMEOUT || self.linger > MAX_FRAME_TIMEOUT {
            return bad(format!("frame_timeout {:?} and linger {:?} must be above 0 and at most {MAX_FRAME_TIMEOUT:?}", self.frame_timeout, self.linger));
        }
        // SAFETY: sysconf has no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
        if let Some(c) = self.cpu.filter(|&c| c >= cpus) {
            return bad(format!("cpu {c}: the receive thread can run on CPUs 0..{}", cpus - 1));
        }
        if !(1..=MAX_BATCH).contains(&self.batch) {
            return Err(ReceiverError::Batch { batch: self.batch });
        }
        if !self.module_ids.is_empty() {
            let mut ids = self.module_ids.clone();
            ids.sort_unstable();
            ids.dedup();
            if self.module_ids.len() != self.modules as usize || ids.len() != self.module_ids.len() {
                return bad(format!("module_ids {:?} must name {} distinct modules", self.module_ids, self.modules));
            }
        }
        let (cell, sources) = self.sources()?;
        let (size, lag) = self.loss_window;
        if size < 64 || size % 64 != 0 || lag >= size {
            return bad(format!("loss_window ({size}, {lag}): the size must be a positive multiple of 64 and the lag below it"));
        }
        if self.nack.is_some_and(|n| n.rate == 0 || n.retries == 0) {
            return bad("nack rate and retries must be at least 1 (or retransmission off)".into());
        }
        if self.data_port as usize + sources.len() > 65_536 {
            return bad(format!("data ports {}.. run past 65535", self.data_port));
        }
        Ok((Grid::new(self.modules, self.module_bytes, cell), sources))
    }

    /// The packet cell (the bytes each packet's place in a slot takes) and the sockets of
    /// the format: one per module, or per module and port or interface.
    fn sources(&self) -> Result<(u64, Vec<(u16, SourceKind)>), ReceiverError> {
        let bad = |m: String| Err(ReceiverError::Config(m));
        Ok(match self.format {
            Format::Rdaq => {
                if self.payload_bytes == 0 || self.payload_bytes as usize > rdaq_proto::MAX_PAYLOAD {
                    return bad(format!("payload_bytes {} must be 1..={}", self.payload_bytes, rdaq_proto::MAX_PAYLOAD));
                }
                let ports = (0..self.modules).map(|m| (m, SourceKind::Rdaq)).collect();
                (self.payload_bytes as u64, ports)
            }
            Format::Roce { mtu, frame_stride, .. } => {
                if frame_stride == 0 {
                    return bad("RoCEv2 frame stride must be at least 1".into());
                }
                if !ROCE_MTUS.contains(&mtu) {
                    return bad(format!("RoCEv2 path MTU {mtu} must be one of {ROCE_MTUS:?}"));
                }
                if self.engine != EngineKind::AfXdp {
                    return bad(format!("RoCEv2 needs whole frames (the ICRC covers the IP header): use the af_xdp engine, not {}", self.engine));
                }
                if self.checksum {
                    return bad("RoCEv2 packets carry the ICRC; the CRC32C extension is for rdaq datagrams".into());
                }
                let ports = (0..self.modules).map(|m| (m, SourceKind::Rdaq)).collect();
                (mtu as u64, ports)
            }
            Format::Sls { interfaces, rows } => {
                if !(interfaces == 1 || interfaces == 2) {
                    return bad(format!("JUNGFRAU has 1 or 2 interfaces, not {interfaces}"));
                }
                if rows == 0 || rows > JUNGFRAU_ROWS || rows % 8 != 0 {
                    return bad(format!("read rows {rows}: JUNGFRAU reads 8 to 512 rows, a multiple of 8"));
                }
                let want = rows as u64 / ROWS_PER_PACKET as u64 * JUNGFRAU_PACKET_PAYLOAD as u64;
                if self.module_bytes != want {
                    return bad(format!("sls ingest of {rows} rows needs JUNGFRAU module frames of {want} bytes, not {}", self.module_bytes));
                }
                let ports = (0..self.modules).flat_map(|m| sls_sources(m, interfaces, rows).into_iter().map(move |k| (m, k))).collect();
                (JUNGFRAU_PACKET_PAYLOAD as u64, ports)
            }
            Format::SlsByHeader(g) => {
                // a receiver of some of the modules (module_ids) holds part of the grid's rows
                if g.packets == 0 || g.ports() == 0 || g.module_cols == 0 || (self.module_ids.is_empty() && self.modules % g.module_cols != 0) {
                    return bad(format!("port grid {g:?}: packets, ports and modules per row must be at least 1, the modules whole rows"));
                }
                if self.module_bytes != g.module_bytes() {
                    return bad(format!("{} ports of {} packets of {} bytes make module frames of {} bytes, not {}", g.ports(), g.packets, g.payload, g.module_bytes(), self.module_bytes));
                }
                let ports = (0..self.modules).flat_map(|m| (0..g.ports()).map(move |port| (m, SourceKind::SlsByHeader { port, grid: g }))).collect();
                (g.payload as u64, ports)
            }
        })
    }
}

