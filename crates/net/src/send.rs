//! The send engine: `sendmmsg` batches of header + payload datagrams, grouped into UDP GSO
//! super-datagrams where the kernel supports `UDP_SEGMENT` (one skb walks the stack for up
//! to 64 KiB of datagrams). Payloads are sent from where they lie (a two-entry iovec per
//! datagram), never copied in user space.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use crate::socket;

/// Largest UDP payload over IPv4: the bound on one GSO super-datagram.
const MAX_UDP_PAYLOAD: usize = 65_507;
/// Kernel limit on segments per GSO send (UDP_MAX_SEGMENTS).
const MAX_GSO_SEGMENTS: usize = 64;
/// mmsghdr entries per sendmmsg call.
const MAX_MSGS: usize = 64;

/// Counters of one sender.
#[derive(Clone, Copy, Debug, Default, derive_more::AddAssign)]
pub struct SendStats {
    pub datagrams: u64,
    pub bytes: u64,
    pub syscalls: u64,
    /// Sends refused because nothing listened at the destination (ICMP port unreachable).
    pub refused: u64,
    /// Sends retried because the socket buffer was full.
    pub retries: u64,
}


#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct CmsgBuf([u8; 32]);

/// A connected UDP sender.
pub struct BatchSender {
    sock: UdpSocket,
    gso: bool,
    iov: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
    cmsgs: Vec<CmsgBuf>,
    pub stats: SendStats,
}

// SAFETY: the raw pointers inside `iov`, `msgs` and `cmsgs` are only meaningful during one
// `send` call, which rebuilds them from borrowed data; between calls they dangle unused.
unsafe impl Send for BatchSender {}

impl BatchSender {
    /// Binds to `local` (port 0 for any), connects to `dest`, enables GSO when asked and
    /// available, and sizes the send buffer.
    pub fn connect(local: SocketAddr, dest: SocketAddr, want_gso: bool, send_buffer: usize) -> io::Result<Self> {
        let sock = UdpSocket::bind(local)?;
        sock.connect(dest)?;
        socket::set_send_buffer(&sock, send_buffer)?;
        let gso = want_gso && socket::gso_supported(&sock);
        Ok(BatchSender {
            sock,
            gso,
            iov: Vec::with_capacity(2 * MAX_MSGS * MAX_GSO_SEGMENTS),
            // SAFETY: mmsghdr is a plain C struct for which all-zero is a valid value.
            msgs: vec![unsafe { std::mem::zeroed() }; MAX_MSGS],
            cmsgs: vec![CmsgBuf([0; 32]); MAX_MSGS],
            stats: SendStats::default(),
        })
    }

    pub fn gso(&self) -> bool {
        self.gso
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// The socket, for polling: the peer may answer on it (retransmission requests).
    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }

    /// Reads one datagram the peer sent back, without blocking; `None` when there is none
    /// (or the peer's port was unreachable).
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: `buf` is valid for writes of its length.
        let rc = unsafe { libc::recv(self.sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if rc >= 0 {
            return Ok(Some(rc as usize));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) | Some(libc::ECONNREFUSED) => Ok(None),
            _ => Err(e),
        }
    }

    /// Sends `n` datagrams, datagram `i` being `part(i) = (header, payload)`, in order.
    /// Blocks until the kernel has taken all of them.
    pub fn send<'a>(&mut self, n: usize, mut part: impl FnMut(usize) -> (&'a [u8], &'a [u8])) -> io::Result<()> {
        let mut i = 0;
        while i < n {
            self.iov.clear();
            let mut nmsgs = 0;
            let mut counts = [0usize; MAX_MSGS];
            while i < n && nmsgs < MAX_MSGS {
                // One message: datagram i, then with GSO the following datagrams of the same
                // size (the last one of a message may be shorter), up to 64 KiB in all.
                let (h, p) = part(i);
                let seg = h.len() + p.len();
                let max_segs = if self.gso { (MAX_UDP_PAYLOAD / seg.max(1)).clamp(1, MAX_GSO_SEGMENTS) } else { 1 };
                let mut cur = (h, p);
                let mut count = 0;
                loop {
                    let len = cur.0.len() + cur.1.len();
                    self.iov.push(iovec(cur.0));
                    self.iov.push(iovec(cur.1));
                    self.stats.bytes += len as u64;
                    count += 1;
                    i += 1;
                    if i >= n || count >= max_segs || len < seg {
                        break;
                    }
                    cur = part(i);
                    if cur.0.len() + cur.1.len() > seg {
                        break;
                    }
                }
                self.build_msg(nmsgs, count, seg);
                counts[nmsgs] = count;
                nmsgs += 1;
            }
            self.flush(nmsgs, &counts)?;
        }
        Ok(())
    }

    /// Points message `m` at the last `count` datagrams pushed to `iov`.
    fn build_msg(&mut self, m: usize, count: usize, seg: usize) {
        let start = self.iov.len() - 2 * count;
        let msg = &mut self.msgs[m];
        // SAFETY: an all-zero mmsghdr is valid (null pointers, zero lengths).
        *msg = unsafe { std::mem::zeroed() };
        // SAFETY: start + 2 * count == iov.len(), so the pointer stays inside `iov`; it stays
        // valid until `flush` returns because `iov` has enough reserved capacity and is not
        // reallocated before then.
        msg.msg_hdr.msg_iov = unsafe { self.iov.as_mut_ptr().add(start) };
        msg.msg_hdr.msg_iovlen = 2 * count;
        if self.gso && count > 1 {
            let buf = &mut self.cmsgs[m];
            // SAFETY: `buf` is 8-aligned and 32 bytes, more than CMSG_SPACE(2) = 24; the
            // header and the u16 segment size are written inside it.
            unsafe {
                let space = libc::CMSG_SPACE(2) as usize;
                msg.msg_hdr.msg_control = buf.0.as_mut_ptr().cast();
                msg.msg_hdr.msg_controllen = space;
                let c = libc::CMSG_FIRSTHDR(&msg.msg_hdr);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = libc::UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg as u16);
            }
        }
    }

    fn flush(&mut self, nmsgs: usize, counts: &[usize]) -> io::Result<()> {
        let mut done = 0;
        while done < nmsgs {
            // SAFETY: msgs[done..nmsgs] point into `iov` and `cmsgs`, alive and unchanged
            // for the duration of the call; the payloads they point to are borrowed by the
            // caller of `send`.
            let rc = unsafe {
                libc::sendmmsg(self.sock.as_raw_fd(), self.msgs.as_mut_ptr().add(done), (nmsgs - done) as u32, 0)
            };
            self.stats.syscalls += 1;
            if rc >= 0 {
                for &c in &counts[done..done + rc as usize] {
                    self.stats.datagrams += c as u64;
                }
                done += rc as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ECONNREFUSED) => self.stats.refused += 1,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) | Some(libc::EINTR) => {
                    self.stats.retries += 1;
                    std::thread::yield_now();
                }
                _ => return Err(e),
            }
        }
        Ok(())
    }
}

fn iovec(b: &[u8]) -> libc::iovec {
    libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() }
}
