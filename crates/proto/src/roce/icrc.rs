//! The invariant CRC that ends every RoCEv2 packet: CRC-32 (as Ethernet's: reflected
//! 0xEDB88320, initial value and final inversion all ones) over a dummy 8-byte LRH of ones,
//! the IP header with the fields routers change masked to ones, the UDP header with its
//! checksum masked, the BTH with its byte 4 (FECN, BECN, reserved) masked, and everything
//! after it up to the ICRC. On the wire it is least-significant byte first. Computed with
//! crc32fast (carry-less multiplication where the CPU has it).

use crc32fast::Hasher;

use super::headers::BTH_LEN;

pub const ICRC_LEN: usize = 4;
pub const IPV4_HEADER_LEN: usize = 20;
pub const IPV6_HEADER_LEN: usize = 40;
pub const UDP_HEADER_LEN: usize = 8;

const DUMMY_LRH: [u8; 8] = [0xFF; 8];

/// ICRC of a packet over IPv4 (a 20-byte header, no options): `ip` and `udp` as on the
/// wire, `rest` from the BTH up to (not including) the ICRC.
pub fn icrc_ipv4(ip: &[u8; IPV4_HEADER_LEN], udp: &[u8; UDP_HEADER_LEN], rest: &[u8]) -> u32 {
    icrc_ipv4_parts(ip, udp, &[rest])
}

/// [`icrc_ipv4`] of a packet that lies in several buffers (a multi-buffer AF_XDP frame):
/// `rest` is the concatenation of `parts`, whose first holds at least the BTH.
pub fn icrc_ipv4_parts(ip: &[u8; IPV4_HEADER_LEN], udp: &[u8; UDP_HEADER_LEN], parts: &[&[u8]]) -> u32 {
    let mut ip = *ip;
    ip[1] = 0xFF; // type of service
    ip[8] = 0xFF; // time to live
    ip[10] = 0xFF; // header checksum
    ip[11] = 0xFF;
    over(&ip, udp, parts)
}

/// ICRC of a packet over IPv6 (a 40-byte header, no extension headers).
pub fn icrc_ipv6(ip: &[u8; IPV6_HEADER_LEN], udp: &[u8; UDP_HEADER_LEN], rest: &[u8]) -> u32 {
    let mut ip = *ip;
    ip[0] |= 0x0F; // traffic class (low nibble of byte 0, high of byte 1) and flow label
    ip[1] = 0xFF;
    ip[2] = 0xFF;
    ip[3] = 0xFF;
    ip[7] = 0xFF; // hop limit
    over(&ip, udp, &[rest])
}

fn over(ip: &[u8], udp: &[u8; UDP_HEADER_LEN], rest: &[&[u8]]) -> u32 {
    let mut udp = *udp;
    udp[6] = 0xFF; // checksum
    udp[7] = 0xFF;
    let mut h = Hasher::new();
    h.update(&DUMMY_LRH);
    h.update(ip);
    h.update(&udp);
    for (i, part) in rest.iter().enumerate() {
        match part.get(..BTH_LEN).filter(|_| i == 0) {
            Some(bth) => {
                let mut bth: [u8; BTH_LEN] = bth.try_into().expect("BTH_LEN bytes");
                bth[4] = 0xFF;
                h.update(&bth);
                h.update(&part[BTH_LEN..]);
            }
            None => h.update(part),
        }
    }
    h.finalize()
}

/// Writes `icrc` as the wire has it (least-significant byte first).
pub fn put(icrc: u32, out: &mut [u8; ICRC_LEN]) {
    *out = icrc.to_le_bytes();
}

/// The ICRC as the wire has it in `b`.
pub fn get(b: &[u8; ICRC_LEN]) -> u32 {
    u32::from_le_bytes(*b)
}
