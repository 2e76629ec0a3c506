//! One AF_XDP socket on one receive queue of an interface, with its own UMEM: the memory the
//! kernel copies (or the NIC writes) whole Ethernet frames into, handed back and forth as
//! 4 KiB chunks through the fill and receive rings (xdpilone).

use std::num::NonZeroU32;
use std::ptr::NonNull;

use xdpilone::xdp::XdpStatisticsV2;
use xdpilone::{DeviceQueue, IfInfo, RingRx, Socket, SocketConfig, Umem, UmemConfig, User};

use super::XdpError;

/// UMEM chunk size: a page, the largest the aligned mode allows without huge pages.
pub const CHUNK: u32 = 4096;
/// `XDP_USE_SG` (multi-buffer): a datagram longer than a chunk arrives as several descriptors.
const XDP_USE_SG: u16 = 1 << 4;
/// `XDP_PKT_CONTD`: more descriptors of this packet follow.
const PKT_CONTD: u32 = 1;
/// The most buffers of one packet: the kernel's `MAX_SKB_FRAGS` + 1 (64 KiB datagrams fit).
pub const MAX_FRAGS: usize = 18;
const SOL_XDP: libc::c_int = 283;
const XDP_OPTIONS: libc::c_int = 8;
const XDP_OPTIONS_ZEROCOPY: u32 = 1;

/// Anonymous memory for the UMEM, unmapped when dropped (after the socket that used it).
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> Result<Mapping, XdpError> {
        // SAFETY: an anonymous private mapping at an address the kernel chooses; no existing
        // memory is affected.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(XdpError::Os { what: "mapping the UMEM", source: std::io::Error::last_os_error() });
        }
        // huge pages where granted (fewer TLB misses when the engine reads the frames), then
        // every page written so that none faults on the receive path
        // SAFETY: advice on, and writes inside, exactly the fresh mapping.
        unsafe {
            libc::madvise(p, len, libc::MADV_HUGEPAGE);
            std::ptr::write_bytes(p.cast::<u8>(), 0, len);
        }
        Ok(Mapping { ptr: NonNull::new(p.cast()).expect("mmap never returns null on success"), len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was created by `Mapping::new` with this length and nothing
        // refers to it any more (the socket that registered it was dropped before).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// An AF_XDP socket bound to one interface queue. Fields drop in order: rings, socket, UMEM
/// registration, then the memory.
pub struct XskQueue {
    rx: RingRx,
    device: DeviceQueue,
    user: User,
    _umem: Umem,
    pub queue: u32,
    pub zero_copy: bool,
    /// Chunks read, to go back to the fill ring (all of them fit: it holds every chunk).
    done: Vec<u64>,
    mapping: Mapping,
}

// SAFETY: the rings and the mapping are used only by the thread that owns the queue; the
// kernel is the only other party, through the ring protocol.
unsafe impl Send for XskQueue {}

impl XskQueue {
    /// Opens a socket on `queue` of interface `ifindex` with `chunks` UMEM chunks (a power of
    /// two), all given to the kernel at once.
    pub fn open(ifindex: u32, queue: u32, chunks: u32) -> Result<XskQueue, XdpError> {
        debug_assert!(chunks.is_power_of_two());
        let mapping = Mapping::new(chunks as usize * CHUNK as usize)?;
        let os = |what: &'static str| move |e: xdpilone::Errno| XdpError::Os { what, source: std::io::Error::from_raw_os_error(e.get_raw()) };
        let config = UmemConfig { fill_size: chunks, complete_size: 64, frame_size: CHUNK, headroom: 0, flags: 0 };
        let area = NonNull::slice_from_raw_parts(mapping.ptr, mapping.len);
        // SAFETY: the area is page-aligned (mmap) and stays mapped while the UMEM lives: the
        // mapping is the last field of XskQueue and so is dropped after the UMEM.
        let umem = unsafe { Umem::new(config, area) }.map_err(os("registering the UMEM"))?;
        let mut info = IfInfo::invalid();
        info.from_ifindex(ifindex).map_err(os("reading the interface"))?;
        info.set_queue(queue);
        let sock = Socket::with_shared(&info, &umem).map_err(os("creating the AF_XDP socket"))?;
        let mut device = umem.fq_cq(&sock).map_err(os("creating the fill ring"))?;
        let cfg = SocketConfig { rx_size: NonZeroU32::new(chunks), tx_size: None, bind_flags: XDP_USE_SG };
        let user = umem.rx_tx(&sock, &cfg).map_err(os("creating the receive ring"))?;
        let rx = user.map_rx().map_err(os("mapping the receive ring"))?;
        {
            let mut fill = device.fill(chunks);
            let given = fill.insert((0..chunks as u64).map(|i| i * CHUNK as u64));
            fill.commit();
            debug_assert_eq!(given, chunks);
        }
        umem.bind(&user).map_err(os("binding to the interface queue (AF_XDP with multi-buffer needs Linux 6.6)"))?;
        let zero_copy = xdp_options(user.as_raw_fd()) & XDP_OPTIONS_ZEROCOPY != 0;
        Ok(XskQueue { rx, device, user, _umem: umem, queue, zero_copy, done: Vec::with_capacity(chunks as usize), mapping })
    }

    pub fn fd(&self) -> libc::c_int {
        self.user.as_raw_fd()
    }

    /// Reads up to `max` whole packets from the receive ring, calling `each` with the bytes of
    /// each packet's buffers in order, then gives their chunks back to the kernel. Returns the
    /// packets read and those dropped whole: more buffers than [`MAX_FRAGS`], or a packet
    /// whose last buffer was missing (the kernel publishes packets whole, so this counts what
    /// should never happen).
    pub fn receive(&mut self, max: usize, mut each: impl FnMut(&[&[u8]])) -> (usize, u64) {
        let XskQueue { rx, device, done, mapping, .. } = self;
        let mut r = rx.receive(u32::MAX);
        let (mut packets, mut dropped) = (0, 0);
        let mut parts: [&[u8]; MAX_FRAGS] = [&[]; MAX_FRAGS];
        let mut n = 0;
        let mut whole = true;
        while packets < max {
            let Some(d) = r.read() else { break };
            let end = (d.addr as usize).saturating_add(d.len as usize);
            if end > mapping.len || n == MAX_FRAGS {
                whole = false;
            } else {
                // SAFETY: in bounds (checked above); the kernel wrote this chunk before it
                // published the descriptor and will not write it again until the chunk is back
                // in the fill ring, which happens below, after `each` is done with it.
                parts[n] = unsafe { std::slice::from_raw_parts(mapping.ptr.as_ptr().add(d.addr as usize), d.len as usize) };
                n += 1;
            }
            done.push(d.addr & !(CHUNK as u64 - 1));
            if d.options & PKT_CONTD != 0 {
                continue;
            }
            if whole {
                each(&parts[..n]);
                packets += 1;
            } else {
                dropped += 1;
            }
            (n, whole) = (0, true);
        }
        dropped += (n > 0) as u64;
        r.release();
        let mut fill = device.fill(done.len() as u32);
        let given = fill.insert(done.iter().copied()) as usize;
        fill.commit();
        done.drain(..given);
        (packets, dropped)
    }

    pub fn statistics(&self) -> Option<XdpStatisticsV2> {
        self.user.statistics_v2().ok()
    }
}

fn xdp_options(fd: libc::c_int) -> u32 {
    let mut flags: u32 = 0;
    let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes (struct xdp_options is one u32) into `flags`.
    let rc = unsafe { libc::getsockopt(fd, SOL_XDP, XDP_OPTIONS, (&mut flags as *mut u32).cast(), &mut len) };
    if rc == 0 {
        flags
    } else {
        0
    }
}
