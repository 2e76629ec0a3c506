//! Two network namespaces joined by a veth pair: a second host for tests and benchmarks on
//! one machine, and the interface AF_XDP needs (loopback has no driver-mode XDP). Created
//! with `ip`, removed with the namespaces when dropped. Threads join a side with
//! [`VethPair::enter`]; sockets they open, and threads they start, live there.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Sender side and receiver side of the pair.
pub struct VethPair {
    pub sender_ns: String,
    pub receiver_ns: String,
    pub sender_ip: Ipv4Addr,
    pub receiver_ip: Ipv4Addr,
    /// The receiver side's interface (where AF_XDP attaches).
    pub receiver_if: String,
    pub sender_if: String,
}

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output().map_err(|e| io::Error::new(e.kind(), format!("running ip: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())))
    }
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl VethPair {
    /// Creates the namespaces and the pair with `mtu` on both ends (9000 holds 8 KiB
    /// datagrams whole). Needs root and iproute2; the error says which is missing.
    pub fn create(tag: &str, mtu: u32) -> io::Result<VethPair> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "network namespaces need root"));
        }
        let id = format!("{}{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let (a, b) = (format!("rdaq-{tag}-{id}-s"), format!("rdaq-{tag}-{id}-r"));
        let (ia, ib) = (format!("rq{id}s"), format!("rq{id}r"));
        let pair = VethPair { sender_ns: a.clone(), receiver_ns: b.clone(), sender_ip: Ipv4Addr::new(10, 99, 0, 1), receiver_ip: Ipv4Addr::new(10, 99, 0, 2), receiver_if: ib.clone(), sender_if: ia.clone() };
        ip(&["netns", "add", &a])?;
        ip(&["netns", "add", &b])?;
        let mtu = mtu.to_string();
        ip(&["link", "add", &ia, "netns", &a, "mtu", &mtu, "type", "veth", "peer", "name", &ib, "netns", &b, "mtu", &mtu])?;
        for (ns, itf, addr) in [(&a, &ia, "10.99.0.1/24"), (&b, &ib, "10.99.0.2/24")] {
            ip(&["-n", ns, "addr", "add", addr, "dev", itf])?;
            ip(&["-n", ns, "link", "set", itf, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(pair)
    }

    /// Gives the sender side one more address (a second host on the same link).
    pub fn add_sender_ip(&self, addr: Ipv4Addr) -> io::Result<()> {
        ip(&["-n", &self.sender_ns, "addr", "add", &format!("{addr}/24"), "dev", &self.sender_if])
    }

    /// Moves the calling thread into namespace `ns` (threads it starts later follow).
    pub fn enter(ns: &str) -> io::Result<()> {
        let f = std::fs::File::open(format!("/run/netns/{ns}"))?;
        // SAFETY: setns on a namespace file descriptor affects the calling thread only.
        if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        // deleting a namespace deletes the veth end in it, and with it the peer
        let _ = ip(&["netns", "del", &self.sender_ns]);
        let _ = ip(&["netns", "del", &self.receiver_ns]);
    }
}
