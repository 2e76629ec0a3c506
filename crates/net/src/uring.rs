//! The io_uring receive engine: each batch is a chain of `recvmsg` requests, one per
//! datagram, each naming its own landing (header into the engine's array, payload where the
//! caller says), submitted and reaped with one system call. The requests do not wait
//! (`MSG_DONTWAIT`) and are linked, so the first that finds the socket empty ends the chain:
//! a batch is the datagrams that were there, as with `recvmmsg`. The data sockets are
//! registered with the ring (fixed files), which saves a file lookup per request.
//!
//! Not used, and why: multishot receive and provided buffers let the kernel choose the
//! buffer, so a payload could not land in the slot the receiver predicted; registered
//! buffers serve fixed reads and writes, not `recvmsg`; SQ polling spends a core on polling,
//! which a 2-core receiver cannot spare (see docs/transport.md).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use io_uring::{opcode, squeue, types, IoUring};

use crate::recv::MmsgReceiver;

pub struct UringReceiver {
    ring: IoUring,
    /// The message headers, landings and counters: the same as the `recvmmsg` engine's.
    msgs: MmsgReceiver,
    fds: Vec<OwnedFd>,
}

impl UringReceiver {
    /// A ring for batches of `batch` datagrams from `fds` (registered as fixed files, queue
    /// `q` being `fds[q]`), each at most `hdr_len + landing_len` bytes.
    pub fn new(fds: Vec<OwnedFd>, batch: usize, hdr_len: usize, landing_len: usize) -> io::Result<UringReceiver> {
        let ring = IoUring::builder().build(batch.next_power_of_two() as u32)?;
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        ring.submitter().register_files(&raw)?;
        Ok(UringReceiver { ring, msgs: MmsgReceiver::new(batch, hdr_len, landing_len),  fds })
    }

    pub fn batch(&self) -> &MmsgReceiver {
        &self.msgs
    }

    pub fn queues(&self) -> usize {
        self.fds.len()
    }

    pub fn fds(&self) -> impl Iterator<Item = i32> + '_ {
        self.fds.iter().map(|f| f.as_raw_fd())
    }

    /// Receives up to one batch from queue `q` without blocking; returns how many datagrams
    /// arrived.
    ///
    /// # Safety
    /// As [`MmsgReceiver::recv`], for the pointers `land` returns.
    pub unsafe fn recv(&mut self, q: usize, land: impl FnMut(usize) -> Option<*mut u8>) -> io::Result<usize> {
        let batch = self.msgs.batch();
        self.msgs.prepare(land);
        {
            let mut sq = self.ring.submission();
            for i in 0..batch {
                let link = if i + 1 < batch { squeue::Flags::IO_LINK } else { squeue::Flags::empty() };
                let e = opcode::RecvMsg::new(types::Fixed(q as u32), self.msgs.msghdr(i)).flags(libc::MSG_DONTWAIT as u32).build().flags(link).user_data(i as u64);
                // SAFETY: the message header, its iovecs, the name and the landings stay valid
                // until the completions are reaped below, before this function returns.
                sq.push(&e).expect("the ring holds a whole batch");
            }
        }
        self.msgs.stats.syscalls += 1;
        if let Err(e) = self.ring.submit_and_wait(batch) {
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
            self.ring.submit_and_wait(batch)?;
        }
        self.reap(batch)
    }

    /// Takes the batch's completions: the datagrams received before the first empty read.
    fn reap(&mut self, batch: usize) -> io::Result<usize> {
        let (mut n, mut seen, mut first_err) = (0, 0, None);
        while seen < batch {
            let Some(c) = self.ring.completion().next() else {
                // the rest of the chain is still being cancelled
                self.ring.submit_and_wait(1)?;
                continue;
            };
            seen += 1;
            let i = c.user_data() as usize;
            if c.result() >= 0 && i == n {
                self.msgs.set_len(i, c.result() as u32);
                n += 1;
            } else if c.result() < 0 && first_err.is_none() {
                first_err = Some(-c.result());
            }
        }
        self.msgs.complete(n);
        match first_err {
            Some(e) if n == 0 && e != libc::EAGAIN && e != libc::ECANCELED && e != libc::EINTR => Err(io::Error::from_raw_os_error(e)),
            _ => Ok(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Batch;
    use std::net::UdpSocket;
    use std::time::{Duration, Instant};

    #[test]
    fn an_empty_socket_returns_at_once_and_datagrams_land_where_told() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut u = UringReceiver::new(vec![rx.try_clone().unwrap().into()], 8, 4, 100).unwrap();
        let t = Instant::now();
        // SAFETY: no landing named: everything lands in the engine's scratch.
        assert_eq!(unsafe { u.recv(0, |_| None) }.unwrap(), 0);
        assert!(t.elapsed() < Duration::from_secs(5), "an empty read must not wait for data");
        for k in 0..3u8 {
            tx.send_to(&[k, k, k, k, 10 + k, 20 + k], rx.local_addr().unwrap()).unwrap();
        }
        let mut land = vec![0u8; 3 * 100];
        let base = land.as_mut_ptr();
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_secs(5);
        while got < 3 && Instant::now() < deadline {
            let first = got;
            // SAFETY: each landing is a distinct 100-byte part of `land`, which outlives the call.
            got += unsafe { u.recv(0, |i| (first + i < 3).then(|| base.add((first + i) * 100))) }.unwrap();
            for i in 0..u.batch().count() {
                let k = (first + i) as u8;
                assert_eq!(u.batch().header(i), [k, k, k, k]);
                assert_eq!(u.batch().payload(i), [10 + k, 20 + k]);
                assert_eq!(u.batch().source(i), Some(tx.local_addr().unwrap()));
            }
        }
        assert_eq!(got, 3);
        assert_eq!(&land[100..102], &[11, 21], "the second payload landed in the second landing");
    }
}
