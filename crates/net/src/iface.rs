//! The network interface that holds an IPv4 address: its name, index, MTU, receive queues
//! and whether it is loopback (for the AF_XDP engine and the tuning checks).

use std::ffi::CStr;
use std::io;
use std::net::Ipv4Addr;

#[derive(Clone, Debug)]
pub struct Interface {
    pub name: String,
    pub index: u32,
    pub mtu: u32,
    pub rx_queues: u32,
    pub loopback: bool,
}

impl Interface {
    /// The interface that holds `ip`, if one does (0.0.0.0 names none).
    pub fn holding(ip: Ipv4Addr) -> io::Result<Option<Interface>> {
        let Some(name) = name_holding(ip)? else { return Ok(None) };
        let c = std::ffi::CString::new(name.clone()).expect("interface names hold no NUL");
        // SAFETY: `c` is a valid NUL-terminated string.
        let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
        if index == 0 {
            return Err(io::Error::last_os_error());
        }
        // ioctls, not /sys: sysfs shows the namespace it was mounted in, not the caller's
        let mtu = ifreq_ioctl(&name, libc::SIOCGIFMTU, None).map_or(1500, |r| r as u32);
        let rx_queues = rx_queues(&name).unwrap_or(1).max(1);
        let loopback = ifreq_ioctl(&name, libc::SIOCGIFFLAGS, None).is_some_and(|f| f & libc::IFF_LOOPBACK != 0);
        Ok(Some(Interface { name, index, mtu, rx_queues, loopback }))
    }
}

fn name_holding(ip: Ipv4Addr) -> io::Result<Option<String>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates the list and stores its head in `list`.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut found = None;
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not freed yet.
        let ifa = unsafe { &*cur };
        // SAFETY: a non-null ifa_addr with family AF_INET points at a sockaddr_in.
        let addr = (!ifa.ifa_addr.is_null() && unsafe { (*ifa.ifa_addr).sa_family } as i32 == libc::AF_INET).then(|| unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() });
        if addr.is_some_and(|a| Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)) == ip) {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            found = Some(unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned());
            break;
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: frees the list getifaddrs allocated; nothing refers to it any more (the name
    // was copied).
    unsafe { libc::freeifaddrs(list) };
    Ok(found)
}

/// `struct ethtool_channels`.
#[repr(C)]
#[derive(Default)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

const ETHTOOL_GCHANNELS: u32 = 0x3c;

/// Receive queues in use (ethtool's channels: rx + combined); `None` when the driver does
/// not say.
fn rx_queues(name: &str) -> Option<u32> {
    let mut ch = EthtoolChannels { cmd: ETHTOOL_GCHANNELS, ..Default::default() };
    ifreq_ioctl(name, libc::SIOCETHTOOL, Some((&mut ch as *mut EthtoolChannels).cast()))?;
    Some(ch.rx_count + ch.combined_count)
}

/// Runs an interface ioctl on a throwaway socket: with `data`, the request points at it,
/// else the result is the ifreq's integer field (MTU, or the flags in its low half).
/// The hardware (MAC) address of interface `name`, as `aa:bb:cc:dd:ee:ff`.
pub fn hardware_address(name: &str) -> Option<String> {
    let req = ifreq_call(name, libc::SIOCGIFHWADDR, None)?;
    // SAFETY: reading the sockaddr member of the union the kernel filled (SIOCGIFHWADDR).
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    Some(sa.sa_data[..6].iter().map(|&b| format!("{:02x}", b as u8)).collect::<Vec<_>>().join(":"))
}

fn ifreq_ioctl(name: &str, request: libc::c_ulong, data: Option<*mut libc::c_void>) -> Option<i32> {
    // SAFETY: reading the integer member of the union the kernel filled (SIOCGIFMTU).
    ifreq_call(name, request, data).map(|req| unsafe { req.ifr_ifru.ifru_mtu })
}

/// The ifreq of interface `name` that the ioctl `request` filled.
fn ifreq_call(name: &str, request: libc::c_ulong, data: Option<*mut libc::c_void>) -> Option<libc::ifreq> {
    // SAFETY: an all-zero ifreq is valid (plain data and a union).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = name.as_bytes();
    if bytes.len() >= req.ifr_name.len() {
        return None;
    }
    for (d, &b) in req.ifr_name.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    if let Some(p) = data {
        req.ifr_ifru.ifru_data = p.cast();
    }
    // SAFETY: a datagram socket to carry the ioctl; closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `req` is a valid ifreq for this request; with `data`, it points at a struct
    // of the size the request expects, alive for the call.
    let rc = unsafe { libc::ioctl(fd, request, &mut req) };
    // SAFETY: `fd` was opened above and is not used after.
    unsafe { libc::close(fd) };
    (rc == 0).then_some(req)
}
