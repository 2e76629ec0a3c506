//! The Ethernet, IPv4 and UDP headers in front of a RoCEv2 packet, as a raw sender writes
//! them and a raw receiver reads them: the ICRC covers the IP and UDP headers, so RoCEv2 is
//! sent and received as whole Ethernet frames. IPv4 without options, DF set, UDP checksum 0
//! (RoCEv2 senders may leave it out: the ICRC protects the packet).

use std::net::Ipv4Addr;

use super::headers::{Opcode, ROCE_PORT};
use super::icrc::{IPV4_HEADER_LEN, UDP_HEADER_LEN};
use super::packet::{encode, encoded_len, seal_ipv4, Headers, RoceError};

pub const ETH_HEADER_LEN: usize = 14;
/// Ethernet + IPv4 + UDP.
pub const FRAME_HEADERS_LEN: usize = ETH_HEADER_LEN + IPV4_HEADER_LEN + UDP_HEADER_LEN;
const ETHERTYPE_IPV4: [u8; 2] = [0x08, 0x00];
const TTL: u8 = 64;

/// Who sends a frame to whom.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoints {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src_ip: Ipv4Addr,
    pub dst_ip: Ipv4Addr,
    /// The UDP source port (RoCEv2 uses it for flow entropy; the destination is 4791).
    pub src_port: u16,
}

impl Endpoints {
    /// The same two ends the other way round (for an answer), from the sender's port.
    pub fn reversed(&self, src_port: u16) -> Endpoints {
        Endpoints { src_mac: self.dst_mac, dst_mac: self.src_mac, src_ip: self.dst_ip, dst_ip: self.src_ip, src_port }
    }
}

/// Writes the headers of a frame carrying `udp_payload` bytes (the RoCEv2 packet, ICRC
/// included) from `e`, with IP identification `ident`.
pub fn write_headers(e: &Endpoints, ident: u16, udp_payload: usize, out: &mut [u8; FRAME_HEADERS_LEN]) {
    let (eth, rest) = out.split_at_mut(ETH_HEADER_LEN);
    eth[..6].copy_from_slice(&e.dst_mac);
    eth[6..12].copy_from_slice(&e.src_mac);
    eth[12..14].copy_from_slice(&ETHERTYPE_IPV4);
    let (ip, udp) = rest.split_at_mut(IPV4_HEADER_LEN);
    let total = (IPV4_HEADER_LEN + UDP_HEADER_LEN + udp_payload) as u16;
    ip[0] = 0x45;
    ip[1] = 0;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[4..6].copy_from_slice(&ident.to_be_bytes());
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes());
    ip[8] = TTL;
    ip[9] = 17;
    ip[10..12].fill(0);
    ip[12..16].copy_from_slice(&e.src_ip.octets());
    ip[16..20].copy_from_slice(&e.dst_ip.octets());
    let sum = ipv4_checksum(ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    udp[..2].copy_from_slice(&e.src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&ROCE_PORT.to_be_bytes());
    udp[4..6].copy_from_slice(&((UDP_HEADER_LEN + udp_payload) as u16).to_be_bytes());
    udp[6..8].fill(0);
}

/// Writes a whole frame into `out`: headers from `e` with IP identification `ident`, the
/// packet of `headers` and `payload`, its ICRC; returns its length.
pub fn write_frame(e: &Endpoints, ident: u16, headers: &Headers, payload: &[u8], out: &mut [u8]) -> Result<usize, RoceError> {
    let op = Opcode::from_u8(headers.bth.opcode).ok_or(RoceError::Opcode(headers.bth.opcode))?;
    let len = FRAME_HEADERS_LEN + encoded_len(op, payload.len());
    let have = out.len();
    let (hdr, pkt) = out.get_mut(..len).ok_or(RoceError::Output { have, need: len })?.split_at_mut(FRAME_HEADERS_LEN);
    let hdr: &mut [u8; FRAME_HEADERS_LEN] = hdr.try_into().expect("header bytes");
    write_headers(e, ident, pkt.len(), hdr);
    encode(headers, payload, pkt)?;
    let (ip, udp) = hdr[ETH_HEADER_LEN..].split_at(IPV4_HEADER_LEN);
    seal_ipv4(ip.try_into().expect("20 bytes"), udp.try_into().expect("8 bytes"), pkt);
    Ok(len)
}

/// The one's-complement checksum of an IPv4 header (its checksum field taken as it is).
pub fn ipv4_checksum(ip: &[u8]) -> u16 {
    let mut sum: u32 = ip.chunks(2).map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32).sum();
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// What the headers of a received frame say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeaders<'a> {
    pub ends: Endpoints,
    pub dst_port: u16,
    /// The IP and UDP headers as on the wire (the ICRC covers them).
    pub ip: &'a [u8; IPV4_HEADER_LEN],
    pub udp: &'a [u8; UDP_HEADER_LEN],
    /// UDP payload bytes by the UDP header (the frame may be longer: Ethernet padding).
    pub udp_payload: usize,
}

/// Reads the headers at the start of `frame`; `None` unless it is an unfragmented IPv4 UDP
/// datagram with a 20-byte IP header whose lengths agree.
pub fn parse_headers(frame: &[u8]) -> Option<FrameHeaders<'_>> {
    let h: &[u8; FRAME_HEADERS_LEN] = frame.get(..FRAME_HEADERS_LEN)?.try_into().ok()?;
    let (eth, rest) = h.split_at(ETH_HEADER_LEN);
    let (ip, udp) = rest.split_at(IPV4_HEADER_LEN);
    let ip: &[u8; IPV4_HEADER_LEN] = ip.try_into().ok()?;
    let udp: &[u8; UDP_HEADER_LEN] = udp.try_into().ok()?;
    if eth[12..14] != ETHERTYPE_IPV4 || ip[0] != 0x45 || ip[9] != 17 || u16::from_be_bytes([ip[6], ip[7]]) & 0x3FFF != 0 {
        return None;
    }
    let ip_total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let udp_len = u16::from_be_bytes([udp[4], udp[5]]) as usize;
    if udp_len < UDP_HEADER_LEN || ip_total != IPV4_HEADER_LEN + udp_len {
        return None;
    }
    let mac = |b: &[u8]| -> [u8; 6] { b.try_into().expect("6 bytes") };
    Some(FrameHeaders {
        ends: Endpoints {
            dst_mac: mac(&eth[..6]),
            src_mac: mac(&eth[6..12]),
            src_ip: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
            dst_ip: Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
            src_port: u16::from_be_bytes([udp[0], udp[1]]),
        },
        dst_port: u16::from_be_bytes([udp[2], udp[3]]),
        ip,
        udp,
        udp_payload: udp_len - UDP_HEADER_LEN,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_with_a_valid_ip_checksum() {
        let e = Endpoints {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_ip: Ipv4Addr::new(10, 99, 0, 1),
            dst_ip: Ipv4Addr::new(10, 99, 0, 2),
            src_port: 49152,
        };
        let mut h = [0u8; FRAME_HEADERS_LEN];
        write_headers(&e, 0x1234, 64, &mut h);
        assert_eq!(ipv4_checksum(&h[14..34]), 0, "a header with its checksum sums to zero");
        let p = parse_headers(&h).unwrap();
        assert_eq!((p.ends, p.dst_port, p.udp_payload), (e, ROCE_PORT, 64));
        assert_eq!(p.ends.reversed(7).src_ip, e.dst_ip);
        let mut frag = h;
        frag[20] = 0x20; // more fragments
        assert!(parse_headers(&frag).is_none());
    }

    #[test]
    fn checksum_matches_a_known_header() {
        // the IPv4 header of the hardware capture in docs/formats.md section 5, checksum 0x9161
        let ip = [0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0, 0, 0x0a, 0x00, 0x11, 0x01, 0x0a, 0x00, 0x12, 0x01];
        assert_eq!(ipv4_checksum(&ip), 0x9161);
    }
}
