//! UDP socket setup shared by the send and receive engines.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

fn setsockopt_int(sock: &UdpSocket, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: the fd is open for the lifetime of `sock`; the option value is a plain int
    // whose pointer and size are passed together.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn getsockopt_int(sock: &UdpSocket, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: as above; the kernel writes at most `len` bytes into `value`.
    let rc = unsafe {
        libc::getsockopt(sock.as_raw_fd(), level, name, (&mut value as *mut libc::c_int).cast(), &mut len)
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Asks for a receive buffer of `bytes`: `SO_RCVBUFFORCE` when allowed (root), else
/// `SO_RCVBUF` (capped by `net.core.rmem_max`). Returns the size the kernel granted.
pub fn set_recv_buffer(sock: &UdpSocket, bytes: usize) -> io::Result<usize> {
    let want = bytes.min(i32::MAX as usize / 2) as libc::c_int;
    if setsockopt_int(sock, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, want).is_err() {
        setsockopt_int(sock, libc::SOL_SOCKET, libc::SO_RCVBUF, want)?;
    }
    Ok(getsockopt_int(sock, libc::SOL_SOCKET, libc::SO_RCVBUF)? as usize)
}

/// Like [`set_recv_buffer`] for the send buffer.
pub fn set_send_buffer(sock: &UdpSocket, bytes: usize) -> io::Result<usize> {
    let want = bytes.min(i32::MAX as usize / 2) as libc::c_int;
    if setsockopt_int(sock, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, want).is_err() {
        setsockopt_int(sock, libc::SOL_SOCKET, libc::SO_SNDBUF, want)?;
    }
    Ok(getsockopt_int(sock, libc::SOL_SOCKET, libc::SO_SNDBUF)? as usize)
}

/// Datagrams the kernel dropped on this socket for lack of buffer space (`SO_RXQ_OVFL` is
/// per-packet; this reads the socket's drop counter from /proc instead, which needs no cmsg).
pub fn kernel_drops(sock: &UdpSocket) -> Option<u64> {
    let local = sock.local_addr().ok()?;
    let port = format!("{:04X}", local.port());
    let table = if local.is_ipv4() { "/proc/net/udp" } else { "/proc/net/udp6" };
    let text = std::fs::read_to_string(table).ok()?;
    // columns: sl local_address rem_address st tx_queue:rx_queue tr tm->when retrnsmt uid
    //          timeout inode ref pointer drops
    text.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let local_port = cols.get(1)?.rsplit(':').next()?;
        (local_port == port).then(|| cols.last()?.parse().ok()).flatten()
    })
}

/// Binds a receive socket: non-blocking, with the requested buffer.
pub fn bind_receiver(addr: SocketAddr, recv_buffer: usize) -> io::Result<(UdpSocket, usize)> {
    let sock = UdpSocket::bind(addr)?;
    sock.set_nonblocking(true)?;
    let granted = set_recv_buffer(&sock, recv_buffer)?;
    Ok((sock, granted))
}

/// Whether the kernel accepts `UDP_SEGMENT` (generic segmentation offload) on this socket.
pub fn gso_supported(sock: &UdpSocket) -> bool {
    setsockopt_int(sock, libc::SOL_UDP, libc::UDP_SEGMENT, 0).is_ok()
}

/// Waits until one of `fds` is readable or `timeout_ms` passes; returns how many are.
pub fn wait_readable(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    for p in fds.iter_mut() {
        p.events = libc::POLLIN;
        p.revents = 0;
    }
    // SAFETY: `fds` is a valid, exclusively borrowed array of pollfd of the given length.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(0) } else { Err(e) };
    }
    Ok(rc as usize)
}

/// A pollfd for a socket.
pub fn pollfd(sock: &UdpSocket) -> libc::pollfd {
    libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLIN, revents: 0 }
}

/// Pins the calling thread to one CPU (benchmarks pin sender and receiver apart).
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes inside it; sched_setaffinity(0) acts
    // on the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// CPU time (user + system) the calling thread has used.
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Times the calling thread has given up the CPU to wait (voluntary context switches): its
/// wake-ups, each of which costs CPU of its own.
pub fn thread_waits() -> u64 {
    // SAFETY: an all-zero rusage is valid (plain integers).
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage struct for the calling thread into `ru`.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    ru.ru_nvcsw as u64
}
