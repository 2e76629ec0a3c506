//! The AF_XDP receive engine: an XDP program steers the data ports' UDP datagrams into one
//! AF_XDP socket per receive queue of the interface that holds the receiver's address, and
//! passes everything else to the kernel. Whole Ethernet frames land in UMEM chunks (one per
//! 4 KiB of datagram: multi-buffer); the engine reads the headers there and copies each
//! payload once, into the landing the caller named (the slot's cell when the prediction was
//! right). UDP checksums are not verified on this path (the kernel's stack is bypassed; on a
//! veth pair they are never computed): rdaq datagrams can carry their own CRC32C.
//! IPv4 only.

pub mod packet;
mod program;
mod queue;
mod roce;

use std::net::{IpAddr, SocketAddr, SocketAddrV4};

use thiserror::Error;

pub use program::AttachMode;
pub use roce::{RoceSpec, RoceStats};

use crate::recv::RecvStats;
use program::Steering;
use queue::{XskQueue, CHUNK};
use roce::RoceTarget;

#[derive(Debug, Error)]
pub enum XdpError {
    #[error("the AF_XDP engine's XDP program was not built (rdaq was built without clang and libbpf-dev; run scripts/setup.sh and rebuild)")]
    NotBuilt,
    #[error("AF_XDP engine: {what}: {message}")]
    Bpf { what: &'static str, message: String },
    #[error("AF_XDP engine: {what}: {source}")]
    Os { what: &'static str, source: std::io::Error },
    #[error("AF_XDP engine: {0}")]
    Setup(String),
}

/// Whether this host can run the AF_XDP engine: its XDP program was built into rdaq, and
/// the kernel makes AF_XDP sockets for this process (CAP_NET_RAW). Attaching the program to
/// an interface can still be refused (driver, privileges): `open` says so then.
pub fn available() -> Result<(), XdpError> {
    if !program::built() {
        return Err(XdpError::NotBuilt);
    }
    // SAFETY: socket() with constant arguments; the descriptor is closed right away.
    let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(XdpError::Os { what: "making an AF_XDP socket", source: std::io::Error::last_os_error() });
    }
    // SAFETY: `fd` is the socket just made, closed once.
    unsafe { libc::close(fd) };
    Ok(())
}

/// What the AF_XDP engine receives on.
#[derive(Clone, Debug)]
pub struct XdpSpec {
    /// The receiver's address: the interface that holds it is the one used.
    pub bind: IpAddr,
    /// The data ports, in channel order.
    pub ports: Vec<u16>,
    pub batch: usize,
    pub hdr_len: usize,
    pub landing_len: usize,
    /// UMEM bytes per receive queue (rounded to a power of two of 4 KiB chunks).
    pub umem_bytes: usize,
    /// Receive RoCEv2 WRITEs (UDP port 4791) instead of datagrams on `ports`: a software
    /// RoCEv2 target with one queue pair per channel.
    pub roce: Option<RoceSpec>,
}

/// Per-datagram state of the last call, as [`crate::batch::Batch`] reads it.
struct Slots {
    headers: Vec<u8>,
    lens: Vec<u32>,
    truncated: Vec<bool>,
    sources: Vec<SocketAddrV4>,
    channels: Vec<u16>,
    landed: Vec<*mut u8>,
    scratch: Vec<u8>,
}

pub struct XdpReceiver {
    /// Detached first when dropped: no packet is steered to a socket that is closing.
    _steering: Steering,
    queues: Vec<XskQueue>,
    ifname: String,
    mode: AttachMode,
    ports: Vec<u16>,
    batch: usize,
    hdr_len: usize,
    landing_len: usize,
    slots: Slots,
    received: usize,
    pub stats: RecvStats,
    /// Frames the engine dropped: not IPv4 UDP to a data port, or not whole.
    pub malformed: u64,
    roce: Option<RoceTarget>,
}

// SAFETY: the landing pointers held between calls are the caller's (valid until the next
// call, by `recv`'s contract) or into this struct's own scratch; nothing is shared.
unsafe impl Send for XdpReceiver {}

/// UMEM chunks per queue: at least 1024, at most 2^18 (1 GiB).
fn chunks_for(bytes: usize) -> u32 {
    ((bytes / CHUNK as usize).clamp(1024, 1 << 18) as u32).next_power_of_two()
}

impl XdpReceiver {
    pub fn open(spec: &XdpSpec) -> Result<XdpReceiver, XdpError> {
        let IpAddr::V4(ip) = spec.bind else {
            return Err(XdpError::Setup(format!("{} is not an IPv4 address: the engine reads IPv4 only", spec.bind)));
        };
        let itf = crate::iface::Interface::holding(ip)
            .map_err(|source| XdpError::Os { what: "finding the interface", source })?
            .ok_or_else(|| XdpError::Setup(format!("no interface holds {ip} (AF_XDP receives on the interface of the receiver's address; 0.0.0.0 does not name one)")))?;
        if itf.loopback {
            return Err(XdpError::Setup(format!(
                "{ip} is on the loopback interface {}: AF_XDP needs a network interface (loopback carries a UDP GSO batch as one unsegmented packet); bind to the address of a NIC or veth",
                itf.name
            )));
        }
        let largest = match &spec.roce {
            Some(r) => packet::HEADERS_LEN + rdaq_proto::roce::MAX_HEAD + r.mtu as usize + rdaq_proto::roce::ICRC_LEN,
            None => packet::HEADERS_LEN + spec.hdr_len + spec.landing_len,
        };
        if largest > itf.mtu as usize + 14 {
            return Err(XdpError::Setup(format!(
                "interface {} has MTU {}, below the {}-byte datagrams (IP fragments are left to the kernel): raise it, e.g. `ip link set {} mtu 9000`",
                itf.name, itf.mtu, largest - 14, itf.name
            )));
        }
        let chunks = chunks_for(spec.umem_bytes);
        let queues = (0..itf.rx_queues).map(|q| XskQueue::open(itf.index, q, chunks)).collect::<Result<Vec<_>, _>>()?;
        let fds: Vec<(u32, i32)> = queues.iter().map(|q| (q.queue, q.fd())).collect();
        let steered = if spec.roce.is_some() { vec![rdaq_proto::roce::ROCE_PORT] } else { spec.ports.clone() };
        let roce = spec.roce.as_ref().map(|r| RoceTarget::open(r, itf.index)).transpose()?;
        let steering = Steering::attach(&itf.name, ip, &steered, &fds)?;
        let b = spec.batch;
        Ok(XdpReceiver {
            mode: steering.mode,
            _steering: steering,
            queues,
            ifname: itf.name,
            ports: spec.ports.clone(),
            batch: b,
            hdr_len: spec.hdr_len,
            landing_len: spec.landing_len,
            slots: Slots {
                headers: vec![0; b * spec.hdr_len],
                lens: vec![0; b],
                truncated: vec![false; b],
                sources: vec![SocketAddrV4::new(0.into(), 0); b],
                channels: vec![0; b],
                landed: vec![std::ptr::null_mut(); b],
                scratch: vec![0; b * spec.landing_len],
            },
            received: 0,
            stats: RecvStats::default(),
            malformed: 0,
            roce,
        })
    }

    /// "veth1, 1 queue, native XDP, copy mode": what ran.
    pub fn describe(&self) -> String {
        let copy = if self.queues.iter().all(|q| q.zero_copy) { "zero-copy" } else { "copy mode" };
        let mode = match self.mode {
            AttachMode::Native => "native XDP",
            AttachMode::Generic => "generic XDP",
        };
        let n = self.queues.len();
        format!("{}, {n} queue{}, {mode}, {copy}, multi-buffer", self.ifname, if n == 1 { "" } else { "s" })
    }

    pub fn queues(&self) -> usize {
        self.queues.len()
    }

    pub fn batch(&self) -> usize {
        self.batch
    }

    pub fn fd(&self, queue: usize) -> libc::c_int {
        self.queues[queue].fd()
    }

    /// Frames the kernel dropped on the way into the sockets: no free chunk, or a full
    /// receive ring.
    pub fn kernel_drops(&self) -> u64 {
        self.queues.iter().filter_map(|q| q.statistics()).map(|s| s.rx_dropped + s.rx_ring_full).sum()
    }

    /// Receives up to one batch from `queue` without blocking; returns how many datagrams
    /// were taken. `land(channel)` names where the payload of the next datagram of that
    /// channel should be copied, or `None` for internal scratch.
    ///
    /// # Safety
    /// As [`crate::recv::MmsgReceiver::recv`]: every pointer `land` returns must be valid for
    /// writes of `landing_len` bytes during the call and for reads until the next call.
    pub unsafe fn recv(&mut self, queue: usize, mut land: impl FnMut(usize) -> Option<*mut u8>) -> std::io::Result<usize> {
        if self.roce.is_some() {
            return self.recv_roce(queue, land);
        }
        let XdpReceiver { queues, ports, slots, hdr_len, landing_len, stats, malformed, .. } = self;
        let (hdr_len, landing_len) = (*hdr_len, *landing_len);
        let mut n = 0;
        let (_, torn) = queues[queue].receive(self.batch, |parts| {
            let Some(udp) = packet::parse(parts[0]) else {
                *malformed += 1;
                return;
            };
            let Some(ch) = ports.iter().position(|&p| p == udp.dest_port) else {
                *malformed += 1;
                return;
            };
            let have = parts.iter().map(|p| p.len()).sum::<usize>() - packet::HEADERS_LEN;
            let len = udp.payload_len.min(have);
            let h = len.min(hdr_len);
            gather(parts, packet::HEADERS_LEN, &mut slots.headers[n * hdr_len..n * hdr_len + h]);
            let dst = land(ch).unwrap_or_else(|| slots.scratch.as_mut_ptr().add(n * landing_len));
            let body = (len - h).min(landing_len);
            // SAFETY: `dst` is writable for `landing_len >= body` bytes: the caller's landing
            // by this function's contract, or this datagram's own part of the scratch.
            gather(parts, packet::HEADERS_LEN + h, std::slice::from_raw_parts_mut(dst, body));
            slots.lens[n] = len as u32;
            slots.truncated[n] = len - h > landing_len;
            slots.sources[n] = udp.source;
            slots.channels[n] = ch as u16;
            slots.landed[n] = dst;
            stats.bytes += len as u64;
            stats.oversized += slots.truncated[n] as u64;
            n += 1;
        });
        *malformed += torn;
        self.received = n;
        self.stats.datagrams += n as u64;
        Ok(n)
    }

    /// [`XdpReceiver::recv`] of a RoCEv2 target: each WRITE packet taken becomes the rdaq
    /// datagram it amounts to; the answers due go out at the end.
    ///
    /// # Safety
    /// As [`XdpReceiver::recv`].
    unsafe fn recv_roce(&mut self, queue: usize, mut land: impl FnMut(usize) -> Option<*mut u8>) -> std::io::Result<usize> {
        let XdpReceiver { queues, slots, hdr_len, landing_len, stats, malformed, roce, .. } = self;
        let target = roce.as_mut().expect("a RoCEv2 target");
        let (hdr_len, landing_len) = (*hdr_len, *landing_len);
        let mut n = 0;
        let (_, torn) = queues[queue].receive(self.batch, |parts| {
            let Some(t) = target.take(parts) else { return };
            let len = t.write.len as usize;
            let body = len.min(landing_len);
            slots.headers[n * hdr_len..(n + 1) * hdr_len].copy_from_slice(&t.header[..hdr_len]);
            let dst = land(t.write.qp).unwrap_or_else(|| slots.scratch.as_mut_ptr().add(n * landing_len));
            // SAFETY: `dst` is writable for `landing_len >= body` bytes: the caller's landing
            // by this function's contract, or this datagram's own part of the scratch.
            gather(parts, t.payload_at, std::slice::from_raw_parts_mut(dst, body));
            slots.lens[n] = (hdr_len + len) as u32;
            slots.truncated[n] = len > landing_len;
            slots.sources[n] = SocketAddrV4::new(t.from.src_ip, t.from.src_port);
            slots.channels[n] = t.write.qp as u16;
            slots.landed[n] = dst;
            stats.bytes += len as u64;
            n += 1;
        });
        *malformed += torn;
        target.answer()?;
        self.received = n;
        self.stats.datagrams += n as u64;
        Ok(n)
    }

    /// The RoCEv2 responder's counters (a RoCEv2 target only).
    pub fn roce_stats(&self) -> Option<roce::RoceStats> {
        self.roce.as_ref().map(|r| r.stats())
    }

    /// The data channel datagram `i` of the last call was sent to.
    pub fn channel(&self, i: usize) -> usize {
        self.slots.channels[i] as usize
    }
}

impl crate::batch::Batch for XdpReceiver {
    fn count(&self) -> usize {
        self.received
    }

    fn header(&self, i: usize) -> &[u8] {
        let h = (self.slots.lens[i] as usize).min(self.hdr_len);
        &self.slots.headers[i * self.hdr_len..i * self.hdr_len + h]
    }

    fn datagram_len(&self, i: usize) -> usize {
        self.slots.lens[i] as usize
    }

    fn truncated(&self, i: usize) -> bool {
        self.slots.truncated[i]
    }

    fn source(&self, i: usize) -> Option<SocketAddr> {
        Some(SocketAddr::V4(self.slots.sources[i]))
    }

    fn payload(&self, i: usize) -> &[u8] {
        assert!(i < self.received, "datagram {i} of a call that received {}", self.received);
        let len = (self.slots.lens[i] as usize).saturating_sub(self.hdr_len).min(self.landing_len);
        // SAFETY: datagram i was received by the last call, which copied `len` bytes to
        // `landed[i]`: the scratch or the caller's landing, readable until the next call.
        unsafe { std::slice::from_raw_parts(self.slots.landed[i], len) }
    }
}

/// Copies the packet bytes from offset `from` (counted over all parts) into `dst`.
fn gather(parts: &[&[u8]], mut from: usize, dst: &mut [u8]) {
    let mut at = 0;
    for p in parts {
        if at == dst.len() {
            return;
        }
        if from >= p.len() {
            from -= p.len();
            continue;
        }
        let k = (p.len() - from).min(dst.len() - at);
        dst[at..at + k].copy_from_slice(&p[from..from + k]);
        at += k;
        from = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::gather;

    #[test]
    fn gather_copies_across_buffers() {
        let (a, b, c) = ([0u8, 1, 2, 3], [4u8, 5], [6u8, 7, 8]);
        let parts: [&[u8]; 3] = [&a, &b, &c];
        let mut dst = [0u8; 5];
        gather(&parts, 2, &mut dst);
        assert_eq!(dst, [2, 3, 4, 5, 6]);
        let mut tail = [0u8; 2];
        gather(&parts, 7, &mut tail);
        assert_eq!(tail, [7, 8]);
    }
}
