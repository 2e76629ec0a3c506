//! The receive engine: `recvmmsg` batches where each datagram is scattered into two places,
//! its header into a small array owned here and its payload straight into memory the caller
//! names (the landing). A receiver that predicts the destination of the next datagrams (the
//! next unfilled packet slots of the frame in progress) has in-order data placed by the
//! kernel's one copy; a wrong prediction costs one move in user space, nothing more.
//! Without a landing the payload goes to internal scratch, which is the bare receive loop.

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;

/// Counters of one receive engine.
#[derive(Clone, Copy, Debug, Default)]
pub struct RecvStats {
    pub datagrams: u64,
    pub bytes: u64,
    pub syscalls: u64,
    /// Datagrams longer than header + landing: cut by the kernel, never placed.
    pub oversized: u64,
}

/// The most datagrams one `recvmmsg` call reads (the kernel's `UIO_MAXIOV`).
pub const MAX_BATCH: usize = 1024;

pub struct MmsgReceiver {
    batch: usize,
    /// Datagrams the last call received.
    received: usize,
    hdr_len: usize,
    landing_len: usize,
    headers: Vec<u8>,
    scratch: Vec<u8>,
    iov: Vec<[libc::iovec; 2]>,
    msgs: Vec<libc::mmsghdr>,
    names: Vec<libc::sockaddr_storage>,
    landed: Vec<*mut u8>,
    pub stats: RecvStats,
}

// SAFETY: the raw pointers held between calls are either into this struct's own vectors or
// landings whose validity the caller guaranteed for the call; nothing is shared across threads.
unsafe impl Send for MmsgReceiver {}

impl MmsgReceiver {
    /// `batch` datagrams per call (1..=[`MAX_BATCH`]), each at most `hdr_len + landing_len`
    /// bytes.
    pub fn new(batch: usize, hdr_len: usize, landing_len: usize) -> Self {
        assert!((1..=MAX_BATCH).contains(&batch), "batch {batch} must be 1..={MAX_BATCH}");
        MmsgReceiver {
            batch,
            received: 0,
            hdr_len,
            landing_len,
            headers: vec![0; batch * hdr_len],
            scratch: vec![0; batch * landing_len],
            iov: vec![[libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2]; batch],
            // SAFETY: all-zero is a valid mmsghdr.
            msgs: vec![unsafe { std::mem::zeroed() }; batch],
            // SAFETY: all-zero is a valid sockaddr_storage (family AF_UNSPEC).
            names: vec![unsafe { std::mem::zeroed() }; batch],
            landed: vec![std::ptr::null_mut(); batch],
            stats: RecvStats::default(),
        }
    }

    pub fn batch(&self) -> usize {
        self.batch
    }

    pub fn landing_len(&self) -> usize {
        self.landing_len
    }

    /// Receives up to one batch without blocking; returns how many datagrams arrived.
    /// `land(i)` names where the payload of the i-th datagram of the batch should land,
    /// or `None` for internal scratch.
    ///
    /// # Safety
    /// Every pointer returned by `land` must be valid for writes of [`Self::landing_len`]
    /// bytes during the call, and for reads until the next call or the receiver's drop
    /// ([`Self::payload`] reads it); nothing else may write that memory in that time.
    pub unsafe fn recv(&mut self, fd: RawFd, land: impl FnMut(usize) -> Option<*mut u8>) -> io::Result<usize> {
        self.prepare(land);
        let rc = libc::recvmmsg(fd, self.msgs.as_mut_ptr(), self.batch as u32, libc::MSG_DONTWAIT, std::ptr::null_mut());
        self.stats.syscalls += 1;
        if rc < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
                _ => Err(e),
            };
        }
        self.complete(rc as usize);
        Ok(rc as usize)
    }

    /// Names the landing of each datagram of the next call and resets the message headers.
    ///
    /// # Safety
    /// As [`Self::recv`], for the pointers `land` returns.
    pub(crate) unsafe fn prepare(&mut self, mut land: impl FnMut(usize) -> Option<*mut u8>) {
        self.received = 0;
        for i in 0..self.batch {
            let dst = land(i).unwrap_or_else(|| self.scratch.as_mut_ptr().add(i * self.landing_len));
            self.landed[i] = dst;
            self.iov[i] = [
                libc::iovec { iov_base: self.headers.as_mut_ptr().add(i * self.hdr_len).cast(), iov_len: self.hdr_len },
                libc::iovec { iov_base: dst.cast(), iov_len: self.landing_len },
            ];
            let m = &mut self.msgs[i];
            m.msg_hdr.msg_iov = self.iov[i].as_mut_ptr();
            m.msg_hdr.msg_iovlen = 2;
            m.msg_hdr.msg_name = (&mut self.names[i] as *mut libc::sockaddr_storage).cast();
            m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            m.msg_hdr.msg_flags = 0;
            m.msg_len = 0;
        }
    }

    /// The message header of datagram `i`, for an engine that receives into it (io_uring).
    pub(crate) fn msghdr(&mut self, i: usize) -> *mut libc::msghdr {
        &mut self.msgs[i].msg_hdr
    }

    /// Records the length of datagram `i` as an engine other than `recvmmsg` received it.
    pub(crate) fn set_len(&mut self, i: usize, len: u32) {
        self.msgs[i].msg_len = len;
    }

    /// Forgets the last call's datagrams (a call that did not read).
    pub(crate) fn clear(&mut self) {
        self.received = 0;
    }

    /// Counts the first `n` datagrams of the prepared batch as received.
    pub(crate) fn complete(&mut self, n: usize) {
        self.received = n;
        self.stats.datagrams += n as u64;
        for m in &self.msgs[..n] {
            self.stats.bytes += m.msg_len as u64;
            if m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                self.stats.oversized += 1;
            }
        }
    }

    /// Header bytes of datagram `i` of the last batch (shorter than the header length when
    /// the datagram was).
    #[inline]
    pub fn header(&self, i: usize) -> &[u8] {
        let len = (self.msgs[i].msg_len as usize).min(self.hdr_len);
        &self.headers[i * self.hdr_len..i * self.hdr_len + len]
    }

    /// Length of datagram `i` as received (header + payload).
    #[inline]
    pub fn datagram_len(&self, i: usize) -> usize {
        self.msgs[i].msg_len as usize
    }

    /// Whether datagram `i` was longer than header + landing and so was cut.
    #[inline]
    pub fn truncated(&self, i: usize) -> bool {
        self.msgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0
    }

    /// The address datagram `i` came from.
    pub fn source(&self, i: usize) -> Option<SocketAddr> {
        sockaddr(&self.names[i], self.msgs[i].msg_hdr.msg_namelen)
    }

    /// Datagrams the last call received.
    pub fn received(&self) -> usize {
        self.received
    }

    /// The payload of datagram `i` of the last call, where it landed.
    #[inline]
    pub fn payload(&self, i: usize) -> &[u8] {
        assert!(i < self.received, "datagram {i} of a call that received {}", self.received);
        let len = (self.msgs[i].msg_len as usize).saturating_sub(self.hdr_len).min(self.landing_len);
        // SAFETY: datagram i was received by the last call, so `landed[i]` is the scratch or
        // the caller's landing it was given, which `recv`'s contract keeps readable for
        // `landing_len >= len` bytes until the next call; the kernel wrote those `len` bytes.
        unsafe { std::slice::from_raw_parts(self.landed[i], len) }
    }
}

impl crate::batch::Batch for MmsgReceiver {
    fn count(&self) -> usize {
        self.received()
    }
    fn header(&self, i: usize) -> &[u8] {
        MmsgReceiver::header(self, i)
    }
    fn datagram_len(&self, i: usize) -> usize {
        MmsgReceiver::datagram_len(self, i)
    }
    fn truncated(&self, i: usize) -> bool {
        MmsgReceiver::truncated(self, i)
    }
    fn source(&self, i: usize) -> Option<SocketAddr> {
        MmsgReceiver::source(self, i)
    }
    fn payload(&self, i: usize) -> &[u8] {
        MmsgReceiver::payload(self, i)
    }
}

/// The socket address in `ss` as the kernel filled it (IPv4 or IPv6).
pub fn sockaddr(ss: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    match ss.ss_family as i32 {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, and it is large enough.
            let a = unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::new(ip.into(), u16::from_be(a.sin_port)))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::new(ip.into(), u16::from_be(a.sin6_port)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::send::BatchSender;
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    #[test]
    fn gso_batches_arrive_in_order_and_land_where_told() {
        let (rx, _) = crate::socket::bind_receiver("127.0.0.1:0".parse().unwrap(), 8 << 20).unwrap();
        let dest = rx.local_addr().unwrap();
        let mut tx = BatchSender::connect("127.0.0.1:0".parse().unwrap(), dest, true, 4 << 20).unwrap();
        let n = 100;
        let headers: Vec<[u8; 8]> = (0..n as u64).map(|i| i.to_le_bytes()).collect();
        let payloads: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; if i == n - 1 { 100 } else { 1000 }]).collect();
        tx.send(n, |i| (&headers[i][..], &payloads[i][..])).unwrap();
        assert_eq!(tx.stats.datagrams, n as u64);

        let mut dest_mem = vec![0u8; n * 1000];
        let mut rxe = MmsgReceiver::new(16, 8, 1000);
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_secs(5);
        while got < n && Instant::now() < deadline {
            let base = dest_mem.as_mut_ptr();
            let first = got;
            // SAFETY: each landing is a distinct 1000-byte slot inside dest_mem.
            let k = unsafe { rxe.recv(rx.as_raw_fd(), |i| (first + i < n).then(|| base.add((first + i) * 1000))) }.unwrap();
            for i in 0..k {
                let seq = u64::from_le_bytes(rxe.header(i).try_into().unwrap()) as usize;
                assert_eq!(seq, first + i, "in order on loopback");
                assert_eq!(rxe.datagram_len(i), 8 + payloads[seq].len());
                assert_eq!(rxe.source(i), Some(tx.local_addr().unwrap()));
            }
            got += k;
        }
        assert_eq!(got, n);
        for i in 0..n {
            assert!(dest_mem[i * 1000..i * 1000 + payloads[i].len()].iter().all(|&b| b == i as u8));
        }
    }
}
