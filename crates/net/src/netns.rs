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

// Locally administered; each pair is alone on its link, so every pair may use the same two.
const SENDER_MAC: &str = "02:72:64:61:71:01";
const RECEIVER_MAC: &str = "02:72:64:61:71:02";

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
        ip(&["link", "add", &ia, "netns", &a, "mtu", &mtu, "address", SENDER_MAC, "type", "veth", "peer", "name", &ib, "netns", &b, "mtu", &mtu, "address", RECEIVER_MAC])?;
        for (ns, itf, addr) in [(&a, &ia, "10.99.0.1/24"), (&b, &ib, "10.99.0.2/24")] {
            ip(&["-n", ns, "addr", "add", addr, "dev", itf])?;
            ip(&["-n", ns, "link", "set", itf, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        pair.neighbour(&pair.sender_ns, &pair.sender_if, pair.receiver_ip, RECEIVER_MAC)?;
        pair.neighbour(&pair.receiver_ns, &pair.receiver_if, pair.sender_ip, SENDER_MAC)?;
        Ok(pair)
    }

    /// Gives the sender side one more address (a second host on the same link).
    pub fn add_sender_ip(&self, addr: Ipv4Addr) -> io::Result<()> {
        ip(&["-n", &self.sender_ns, "addr", "add", &format!("{addr}/24"), "dev", &self.sender_if])?;
        self.neighbour(&self.receiver_ns, &self.receiver_if, addr, SENDER_MAC)
    }

    /// A permanent neighbour entry: without it the first datagrams wait for ARP, and on a
    /// busy machine the kernel's small queue of unresolved packets drops all but the last few
    /// of a burst before the reply comes.
    fn neighbour(&self, ns: &str, itf: &str, addr: Ipv4Addr, mac: &str) -> io::Result<()> {
        ip(&["-n", ns, "neigh", "replace", &addr.to_string(), "lladdr", mac, "dev", itf, "nud", "permanent"])
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
