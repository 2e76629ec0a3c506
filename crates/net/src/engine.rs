//! The receive-engine interface placement drives without knowing which engine is below: the
//! caller names where the payload of each next datagram of a data channel should land, the
//! engine receives a batch and tells, for each datagram, its header, length, source, channel
//! and where its payload landed ([`Batch`]).
//!
//! - `recvmmsg`: one system call per batch per socket, the kernel copies into the landings.
//! - `io_uring`: a linked chain of `recvmsg` requests per batch, one system call.
//! - `af_xdp`: an XDP program steers the data ports into AF_XDP sockets; frames land in
//!   UMEM and the engine copies each payload once, into the landing. What the program leaves
//!   to the kernel (IP fragments of datagrams larger than the MTU) reaches the data sockets,
//!   which the engine also reads, at most every [`KERNEL_PATH_EVERY`]: nothing sent to a data
//!   port stays unread.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::batch::Batch;
use crate::recv::{MmsgReceiver, RecvStats};
use crate::uring::UringReceiver;
use crate::xdp::{XdpError, XdpReceiver, XdpSpec};

/// Which engine receives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum EngineKind {
    #[default]
    Recvmmsg,
    IoUring,
    AfXdp,
}

impl EngineKind {
    pub const ALL: [EngineKind; 3] = [EngineKind::Recvmmsg, EngineKind::IoUring, EngineKind::AfXdp];

    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Recvmmsg => "recvmmsg",
            EngineKind::IoUring => "io_uring",
            EngineKind::AfXdp => "af_xdp",
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        EngineKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| format!("unknown engine {s:?} (recvmmsg, io_uring or af_xdp)"))
    }
}

/// What an engine receives on.
pub struct EngineSpec<'a> {
    /// The bound, non-blocking data sockets, one per channel. The socket engines read them;
    /// AF_XDP keeps them bound (so the ports stay the receiver's) and reads the interface.
    pub sockets: &'a [UdpSocket],
    /// The address the sockets are bound to (AF_XDP: it names the interface).
    pub bind: IpAddr,
    pub batch: usize,
    pub hdr_len: usize,
    pub landing_len: usize,
    /// Kernel-side buffering per channel (socket buffer) or per queue (AF_XDP UMEM).
    pub buffer_bytes: usize,
    /// Be a RoCEv2 target (AF_XDP only): one queue pair per channel.
    pub roce: Option<crate::xdp::RoceSpec>,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{engine} engine: {source}")]
    Io { engine: EngineKind, source: io::Error },
    #[error(transparent)]
    Xdp(#[from] XdpError),
    #[error("RoCEv2 needs whole frames (the CRC covers the IP header): use the af_xdp engine, not {0}")]
    RoceNeedsXdp(EngineKind),
}

/// A receive engine of any kind.
pub enum Engine {
    Recvmmsg { rx: MmsgReceiver, fds: Vec<OwnedFd>, queue: usize },
    IoUring { rx: UringReceiver, queue: usize },
    AfXdp { x: XdpReceiver, kernel: KernelPath },
}

/// The data sockets beside AF_XDP: queues after the interface's.
pub struct KernelPath {
    rx: MmsgReceiver,
    fds: Vec<OwnedFd>,
    /// The datagrams of the last call came this way.
    last: Option<usize>,
    /// When each socket was last read.
    polled: Vec<Instant>,
}

/// How often the AF_XDP engine reads the data sockets for what its program passed on.
pub const KERNEL_PATH_EVERY: Duration = Duration::from_millis(1);

fn dup_all(sockets: &[UdpSocket]) -> io::Result<Vec<OwnedFd>> {
    sockets.iter().map(|s| s.try_clone().map(OwnedFd::from)).collect()
}

impl Engine {
    pub fn open(kind: EngineKind, spec: &EngineSpec<'_>) -> Result<Engine, EngineError> {
        let io = |source| EngineError::Io { engine: kind, source };
        if spec.roce.is_some() && kind != EngineKind::AfXdp {
            return Err(EngineError::RoceNeedsXdp(kind));
        }
        Ok(match kind {
            EngineKind::Recvmmsg => Engine::Recvmmsg { rx: MmsgReceiver::new(spec.batch, spec.hdr_len, spec.landing_len), fds: dup_all(spec.sockets).map_err(io)?, queue: 0 },
            EngineKind::IoUring => {
                let rx = UringReceiver::new(dup_all(spec.sockets).map_err(io)?, spec.batch, spec.hdr_len, spec.landing_len).map_err(io)?;
                Engine::IoUring { rx, queue: 0 }
            }
            EngineKind::AfXdp => {
                let ports = spec.sockets.iter().map(|s| s.local_addr().map(|a| a.port())).collect::<io::Result<Vec<_>>>().map_err(io)?;
                let x = XdpSpec { bind: spec.bind, ports, batch: spec.batch, hdr_len: spec.hdr_len, landing_len: spec.landing_len, umem_bytes: spec.buffer_bytes, roce: spec.roce.clone() };
                let kernel = KernelPath { rx: MmsgReceiver::new(spec.batch, spec.hdr_len, spec.landing_len), fds: dup_all(spec.sockets).map_err(io)?, last: None, polled: vec![Instant::now(); spec.sockets.len()] };
                Engine::AfXdp { x: XdpReceiver::open(&x)?, kernel }
            }
        })
    }

    pub fn kind(&self) -> EngineKind {
        match self {
            Engine::Recvmmsg { .. } => EngineKind::Recvmmsg,
            Engine::IoUring { .. } => EngineKind::IoUring,
            Engine::AfXdp { .. } => EngineKind::AfXdp,
        }
    }

    /// What ran, for the summary: the engine, and for AF_XDP the interface and mode.
    pub fn describe(&self) -> String {
        match self {
            Engine::AfXdp { x, .. } => format!("af_xdp ({})", x.describe()),
            e => e.kind().to_string(),
        }
    }

    /// Queues read in turn: a socket each for the socket engines; for AF_XDP an interface
    /// queue each, then the data sockets.
    pub fn queues(&self) -> usize {
        match self {
            Engine::Recvmmsg { fds, .. } => fds.len(),
            Engine::IoUring { rx, .. } => rx.queues(),
            Engine::AfXdp { x, kernel } => x.queues() + kernel.fds.len(),
        }
    }

    /// The one channel queue `q` serves, or `None` when it serves all (an AF_XDP queue).
    pub fn serves(&self, q: usize) -> Option<usize> {
        match self {
            Engine::AfXdp { x, .. } => q.checked_sub(x.queues()),
            _ => Some(q),
        }
    }

    /// File descriptors to poll for readiness, one per queue.
    pub fn pollfds(&self) -> Vec<libc::pollfd> {
        let fd = |fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        match self {
            Engine::Recvmmsg { fds, .. } => fds.iter().map(|f| fd(f.as_raw_fd())).collect(),
            Engine::IoUring { rx, .. } => rx.fds().map(fd).collect(),
            Engine::AfXdp { x, kernel } => (0..x.queues()).map(|q| fd(x.fd(q))).chain(kernel.fds.iter().map(|f| fd(f.as_raw_fd()))).collect(),
        }
    }

    pub fn batch(&self) -> usize {
        match self {
            Engine::Recvmmsg { rx, .. } => rx.batch(),
            Engine::IoUring { rx, .. } => rx.batch().batch(),
            Engine::AfXdp { x, .. } => x.batch(),
        }
    }

    pub fn stats(&self) -> RecvStats {
        match self {
            Engine::Recvmmsg { rx, .. } => rx.stats,
            Engine::IoUring { rx, .. } => rx.batch().stats,
            Engine::AfXdp { x, kernel } => {
                let k = kernel.rx.stats;
                RecvStats { datagrams: x.stats.datagrams + k.datagrams, bytes: x.stats.bytes + k.bytes, syscalls: k.syscalls, oversized: x.stats.oversized + k.oversized }
            }
        }
    }

    /// The RoCEv2 responder's counters, when the engine is a RoCEv2 target.
    pub fn roce_stats(&self) -> Option<crate::xdp::RoceStats> {
        match self {
            Engine::AfXdp { x, .. } => x.roce_stats(),
            _ => None,
        }
    }

    /// Datagrams dropped below the engine: AF_XDP's ring and fill-queue drops and frames it
    /// could not read (the socket engines' drops are the sockets', read by the caller).
    pub fn drops_below(&self) -> u64 {
        match self {
            Engine::AfXdp { x, .. } => x.kernel_drops() + x.malformed,
            _ => 0,
        }
    }

    /// Receives up to one batch from `queue` without blocking; returns how many datagrams
    /// arrived. `land(channel)` is called once per datagram that may arrive, in order for
    /// each channel, and names where its payload should land (`None`: internal scratch).
    ///
    /// # Safety
    /// Every pointer `land` returns must be valid for writes of `landing_len` bytes during
    /// the call, and for reads until the next call or the engine's drop ([`Batch::payload`]
    /// reads it); nothing else may write that memory in that time.
    pub unsafe fn recv(&mut self, queue: usize, mut land: impl FnMut(usize) -> Option<*mut u8>) -> io::Result<usize> {
        match self {
            Engine::Recvmmsg { rx, fds, queue: q } => {
                *q = queue;
                rx.recv(fds[queue].as_raw_fd(), |_| land(queue))
            }
            Engine::IoUring { rx, queue: q } => {
                *q = queue;
                rx.recv(queue, |_| land(queue))
            }
            Engine::AfXdp { x, kernel } => match queue.checked_sub(x.queues()) {
                None => {
                    kernel.last = None;
                    x.recv(queue, land)
                }
                Some(ch) => {
                    kernel.last = Some(ch);
                    let now = Instant::now();
                    if now.duration_since(kernel.polled[ch]) < KERNEL_PATH_EVERY {
                        kernel.rx.clear();
                        return Ok(0);
                    }
                    kernel.polled[ch] = now;
                    kernel.rx.recv(kernel.fds[ch].as_raw_fd(), |_| land(ch))
                }
            },
        }
    }

    /// The channel datagram `i` of the last call was sent to.
    pub fn channel(&self, i: usize) -> usize {
        match self {
            Engine::Recvmmsg { queue, .. } | Engine::IoUring { queue, .. } => *queue,
            Engine::AfXdp { x, kernel } => kernel.last.unwrap_or_else(|| x.channel(i)),
        }
    }

    /// The batch of the last call: the AF_XDP engine's own, or its kernel path's.
    fn last(&self) -> &dyn Batch {
        match self {
            Engine::Recvmmsg { rx, .. } => rx,
            Engine::IoUring { rx, .. } => rx.batch(),
            Engine::AfXdp { kernel, .. } if kernel.last.is_some() => &kernel.rx,
            Engine::AfXdp { x, .. } => x,
        }
    }
}

impl Batch for Engine {
    fn count(&self) -> usize {
        self.last().count()
    }
    fn header(&self, i: usize) -> &[u8] {
        self.last().header(i)
    }
    fn datagram_len(&self, i: usize) -> usize {
        self.last().datagram_len(i)
    }
    fn truncated(&self, i: usize) -> bool {
        self.last().truncated(i)
    }
    fn source(&self, i: usize) -> Option<SocketAddr> {
        self.last().source(i)
    }
    fn payload(&self, i: usize) -> &[u8] {
        self.last().payload(i)
    }
}
