//! Whole Ethernet frames in and out of one interface (an `AF_PACKET` raw socket), and the
//! link-layer addresses they need: RoCEv2 packets carry a CRC over their IP and UDP headers,
//! which a UDP socket neither lets a sender write nor a receiver read.

use std::io;
use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// The most frames one [`RawSocket::send_batch`] call takes.
pub const MAX_SEND_BATCH: usize = 64;
const ETH_P_IP: u16 = 0x0800;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

/// An `AF_PACKET` socket bound to one interface, for IPv4 frames. Sends block (the kernel's
/// send buffer is the queue); receives never do.
pub struct RawSocket {
    fd: OwnedFd,
    /// Frames the kernel refused to take (`ENOBUFS`: the interface's queue was full).
    pub refused: u64,
}

impl RawSocket {
    /// Opens a socket on interface `ifindex` (needs `CAP_NET_RAW`). Frames it sends go through
    /// the queueing discipline, where captures (tcpdump, tshark) see them; frames sent on the
    /// interface by anyone are not read back.
    pub fn open(ifindex: u32, send_buffer: usize) -> io::Result<RawSocket> {
        // SAFETY: plain socket creation; the descriptor is owned below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, ETH_P_IP.to_be() as libc::c_int) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let one: libc::c_int = 1;
        setsockopt(fd.as_raw_fd(), libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, one)?;
        let size = send_buffer.min(i32::MAX as usize) as libc::c_int;
        if setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, size).is_err() {
            setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, size)?;
        }
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value to fill in.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ETH_P_IP.to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll and the length says so.
        let rc = unsafe { libc::bind(fd.as_raw_fd(), (&sll as *const libc::sockaddr_ll).cast(), std::mem::size_of::<libc::sockaddr_ll>() as u32) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RawSocket { fd, refused: 0 })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Sends frames `0..n` (`frame(i)` gives each whole, Ethernet header first) on the
    /// interface, in order; returns how many the kernel took (the rest were refused and are
    /// counted in [`RawSocket::refused`]: a lost frame, as on a wire).
    pub fn send_batch<'a>(&mut self, n: usize, frame: impl Fn(usize) -> &'a [u8]) -> io::Result<usize> {
        let (mut sent, mut refused) = (0, 0);
        let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_SEND_BATCH];
        // SAFETY: mmsghdr is plain data; all-zero is a valid value.
        let mut msgs: [libc::mmsghdr; MAX_SEND_BATCH] = unsafe { std::mem::zeroed() };
        while sent < n {
            let k = (n - sent).min(MAX_SEND_BATCH);
            for j in 0..k {
                let f = frame(sent + j);
                iov[j] = libc::iovec { iov_base: f.as_ptr() as *mut libc::c_void, iov_len: f.len() };
                msgs[j].msg_hdr.msg_iov = &mut iov[j];
                msgs[j].msg_hdr.msg_iovlen = 1;
            }
            // SAFETY: `msgs[..k]` point at `iov[..k]`, which point at frames borrowed for 'a,
            // alive during the call; the kernel only reads them.
            let rc = unsafe { libc::sendmmsg(self.fd.as_raw_fd(), msgs.as_mut_ptr(), k as u32, 0) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::ENOBUFS) => {
                        // the frame at the head was refused: it is lost, the rest go on
                        refused += 1;
                        sent += 1;
                        continue;
                    }
                    Some(libc::EINTR) => continue,
                    _ => return Err(e),
                }
            }
            sent += rc as usize;
        }
        self.refused += refused as u64;
        Ok(sent - refused)
    }

    /// Reads one waiting frame into `buf`; `None` when none waits. A frame longer than
    /// `buf` is returned cut to its length.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
        let rc = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if rc >= 0 {
            return Ok(Some(rc as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        }
    }
}

fn setsockopt(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: the option value is one c_int, and the length says so.
    let rc = unsafe { libc::setsockopt(fd, level, name, (&value as *const libc::c_int).cast(), std::mem::size_of::<libc::c_int>() as u32) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The hardware address of interface `name`.
pub fn mac_address(name: &str) -> io::Result<[u8; 6]> {
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("interface name {name} is too long")));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: plain socket creation; closed below through OwnedFd.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `s` is a fresh descriptor nothing else owns.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: SIOCGIFHWADDR reads the name from and writes the address into `req`.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFHWADDR filled the address member of the union.
    let data = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
    Ok(std::array::from_fn(|i| data[i] as u8))
}

/// The hardware address of the neighbour `ip` (on the link, or the gateway towards it), as
/// the kernel's neighbour table has it after resolving it: a datagram to the discard port
/// makes the kernel resolve the address, then the table is read until it appears.
pub fn neighbour_mac(ip: Ipv4Addr, wait: Duration) -> io::Result<[u8; 6]> {
    let until = Instant::now() + wait;
    let probe = UdpSocket::bind("0.0.0.0:0")?;
    probe.connect((ip, 9))?;
    loop {
        if let Some(mac) = arp_entry(ip)? {
            return Ok(mac);
        }
        if Instant::now() >= until {
            return Err(io::Error::new(io::ErrorKind::TimedOut, format!("the hardware address of {ip} was not resolved within {wait:?} (is it on a reachable link?)")));
        }
        let _ = probe.send(&[0]);
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `ip`'s complete entry in the calling thread's namespace's neighbour table.
fn arp_entry(ip: Ipv4Addr) -> io::Result<Option<[u8; 6]>> {
    // thread-self: a thread that entered another network namespace reads that namespace's table
    let table = std::fs::read_to_string("/proc/thread-self/net/arp")?;
    Ok(table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let complete = f.get(2).and_then(|fl| u32::from_str_radix(fl.trim_start_matches("0x"), 16).ok()).is_some_and(|fl| fl & 0x2 != 0);
        (f.first() == Some(&ip.to_string().as_str()) && complete).then(|| parse_mac(f.get(3)?)).flatten()
    }))
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let b: Vec<u8> = s.split(':').map(|x| u8::from_str_radix(x, 16)).collect::<Result<_, _>>().ok()?;
    b.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::parse_mac;

    #[test]
    fn reads_a_mac() {
        assert_eq!(parse_mac("02:00:0a:63:00:02"), Some([2, 0, 10, 99, 0, 2]));
        assert_eq!(parse_mac("02:00"), None);
    }
}
