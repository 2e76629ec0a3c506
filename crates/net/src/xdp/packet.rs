//! The Ethernet, IPv4 and UDP headers in front of a datagram that AF_XDP hands over whole.
//! Sans I/O: the XDP program already let through only unfragmented IPv4 UDP with a 20-byte
//! IP header; this checks again what user space relies on and reads the addresses.

use std::net::{Ipv4Addr, SocketAddrV4};

/// Ethernet + IPv4 (no options) + UDP.
pub const HEADERS_LEN: usize = 14 + 20 + 8;

/// What the headers say of one datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Udp {
    pub source: SocketAddrV4,
    pub dest_port: u16,
    /// UDP payload length from the UDP header (the frame may be longer: Ethernet padding).
    pub payload_len: usize,
}

/// Reads the headers at the start of `frame` (its first buffer); `None` when it is not an
/// unfragmented IPv4 UDP datagram with a plain IP header, or too short to hold one.
pub fn parse(frame: &[u8]) -> Option<Udp> {
    let h = frame.get(..HEADERS_LEN)?;
    let (eth, ip, udp) = (&h[..14], &h[14..34], &h[34..42]);
    if eth[12..14] != [0x08, 0x00] || ip[0] != 0x45 || ip[9] != 17 || u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
        return None;
    }
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let udp_len = u16::from_be_bytes([udp[4], udp[5]]) as usize;
    Some(Udp {
        source: SocketAddrV4::new(src, u16::from_be_bytes([udp[0], udp[1]])),
        dest_port: u16::from_be_bytes([udp[2], udp[3]]),
        payload_len: udp_len.checked_sub(8)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(flags_frag: u16, proto: u8, udp_len: u16) -> Vec<u8> {
        let mut f = vec![0u8; HEADERS_LEN + 4];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[20..22].copy_from_slice(&flags_frag.to_be_bytes());
        f[23] = proto;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[34..36].copy_from_slice(&4000u16.to_be_bytes());
        f[36..38].copy_from_slice(&50000u16.to_be_bytes());
        f[38..40].copy_from_slice(&udp_len.to_be_bytes());
        f
    }

    #[test]
    fn reads_addresses_and_length() {
        let u = parse(&frame(0x4000, 17, 12)).unwrap();
        assert_eq!(u.source, SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 4000));
        assert_eq!((u.dest_port, u.payload_len), (50000, 4));
    }

    #[test]
    fn refuses_fragments_other_protocols_and_short_frames() {
        assert_eq!(parse(&frame(0x2000, 17, 12)), None, "more fragments");
        assert_eq!(parse(&frame(0x0001, 17, 12)), None, "a later fragment");
        assert_eq!(parse(&frame(0, 6, 12)), None, "TCP");
        assert_eq!(parse(&frame(0, 17, 4)), None, "UDP length below its header");
        assert_eq!(parse(&frame(0, 17, 12)[..40]), None, "cut headers");
    }
}
