//! The XDP program that steers a receiver's data ports into its AF_XDP sockets
//! (`bpf/steer.c`, compiled by the build script), loaded and attached with aya.

use std::net::Ipv4Addr;
use std::os::fd::RawFd;

use aya::maps::{Array, HashMap, XskMap};
use aya::programs::{Xdp, XdpFlags};
use aya::Ebpf;

use super::XdpError;

#[cfg(rdaq_xdp_program)]
static OBJECT: Option<&[u8]> = Some(aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/steer.o")));
#[cfg(not(rdaq_xdp_program))]
static OBJECT: Option<&[u8]> = None;

/// How the program runs on the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// In the driver, before any socket buffer exists.
    Native,
    /// In the kernel's generic path (loopback, drivers without XDP).
    Generic,
}

/// The attached program; detached when dropped.
pub struct Steering {
    _ebpf: Ebpf,
    pub mode: AttachMode,
}

/// Whether the XDP program was built into rdaq.
pub(super) fn built() -> bool {
    OBJECT.is_some()
}

impl Steering {
    /// Attaches the program to `ifname`, steering UDP to `dest` (any when unspecified) on
    /// `ports` into the sockets of `queues` (receive queue, AF_XDP socket).
    pub fn attach(ifname: &str, dest: Ipv4Addr, ports: &[u16], queues: &[(u32, RawFd)]) -> Result<Steering, XdpError> {
        let object = OBJECT.ok_or(XdpError::NotBuilt)?;
        let bpf = |what: &'static str| move |e: &dyn std::fmt::Display| XdpError::Bpf { what, message: e.to_string() };
        let mut ebpf = Ebpf::load(object).map_err(|e| bpf("loading the program")(&e))?;
        {
            let mut xsks: XskMap<_> = ebpf.map_mut("xsks").ok_or(XdpError::NotBuilt)?.try_into().map_err(|e| bpf("the socket map")(&e))?;
            for &(q, fd) in queues {
                xsks.set(q, fd, 0).map_err(|e| bpf("registering an AF_XDP socket")(&e))?;
            }
        }
        {
            let mut map: HashMap<_, u16, u32> = ebpf.map_mut("ports").ok_or(XdpError::NotBuilt)?.try_into().map_err(|e| bpf("the port map")(&e))?;
            for (ch, &p) in ports.iter().enumerate() {
                map.insert(p, ch as u32, 0).map_err(|e| bpf("registering a data port")(&e))?;
            }
        }
        {
            let mut d: Array<_, u32> = ebpf.map_mut("dest").ok_or(XdpError::NotBuilt)?.try_into().map_err(|e| bpf("the address map")(&e))?;
            d.set(0, u32::from_ne_bytes(dest.octets()), 0).map_err(|e| bpf("setting the address")(&e))?;
        }
        let prog: &mut Xdp = ebpf.program_mut("rdaq_steer").ok_or(XdpError::NotBuilt)?.try_into().map_err(|e| bpf("the program")(&e))?;
        prog.load().map_err(|e| bpf("verifying the program")(&e))?;
        let mode = match prog.attach(ifname, XdpFlags::DRV_MODE) {
            Ok(_) => AttachMode::Native,
            Err(native) => match prog.attach(ifname, XdpFlags::SKB_MODE) {
                Ok(_) => AttachMode::Generic,
                Err(e) => return Err(XdpError::Bpf { what: "attaching to the interface", message: format!("{native}; generic mode: {e}") }),
            },
        };
        Ok(Steering { _ebpf: ebpf, mode })
    }
}
