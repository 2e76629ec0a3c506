//! RoCEv2 codecs against the golden vectors of docs/formats.md section 5: a CNP captured from a
//! ConnectX-4 Lx NIC, and RC WRITE_ONLY and WRITE_ONLY_WITH_IMM packets whose ICRCs the
//! Linux software RoCE driver's algorithm gives; property tests of encode and parse.

use proptest::prelude::*;
use rdaq_proto::roce::{self, Aeth, AethKind, Bth, Headers, Opcode, Reth};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn the_icrc_of_a_hardware_cnp_matches_the_capture() {
    let frame = [hex("e41d2dab2bc27cfe90643b32080045c2003c718c4000401191610a0011010a001201000012b700280000"), hex("8100ffff4000011800000000"), vec![0; 16], hex("82fd002a")].concat();
    let ip: [u8; 20] = frame[14..34].try_into().unwrap();
    let udp: [u8; 8] = frame[34..42].try_into().unwrap();
    let rest = &frame[42..frame.len() - 4];
    let wire = u32::from_le_bytes(frame[frame.len() - 4..].try_into().unwrap());
    assert_eq!(roce::icrc_ipv4(&ip, &udp, rest), wire);
    // the masked fields do not change it: a router rewrote TTL, TOS and the checksum
    let mut routed = ip;
    routed[1] ^= 0x3c;
    routed[8] -= 3;
    routed[10] ^= 0x55;
    assert_eq!(roce::icrc_ipv4(&routed, &udp, rest), wire);
    // the rest does
    let mut other = ip;
    other[15] ^= 1;
    assert_ne!(roce::icrc_ipv4(&other, &udp, rest), wire);
}

#[test]
fn the_ipv6_icrc_ignores_what_routers_change_and_nothing_else() {
    // no IPv6 golden vector exists: check the masking the ICRC defines for IPv6
    let mut ip = [0u8; 40];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&40u16.to_be_bytes());
    ip[6] = 17;
    ip[7] = 64;
    ip[8..24].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    ip[24..40].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    let udp = [0xc0, 0, 0x12, 0xb7, 0, 40, 0, 0];
    let rest = [hex("0a00ffff0000001180000100"), vec![7; 24]].concat();
    let c = roce::icrc_ipv6(&ip, &udp, &rest);
    let mut routed = ip;
    routed[0] = 0x6b; // traffic class and flow label
    routed[1] = 0x12;
    routed[3] = 0x99;
    routed[7] = 3; // hop limit
    let mut udp_routed = udp;
    udp_routed[6] = 0x12; // UDP checksum
    assert_eq!(roce::icrc_ipv6(&routed, &udp_routed, &rest), c);
    for at in [4, 6, 9, 39] {
        let mut other = ip;
        other[at] ^= 1;
        assert_ne!(roce::icrc_ipv6(&other, &udp, &rest), c, "byte {at} of the IPv6 header is covered");
    }
    let mut v = ip;
    v[0] = 0x70;
    assert_ne!(roce::icrc_ipv6(&v, &udp, &rest), c, "the version nibble is covered");
}

/// IPv4 and UDP headers of a 10.99.0.1 -> 10.99.0.2 packet, UDP 49152 -> 4791, as in the
/// golden vectors (the checksums are masked by the ICRC, so left zero).
fn headers_for(packet_len: usize) -> ([u8; 20], [u8; 8]) {
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + 8 + packet_len) as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&[10, 99, 0, 1]);
    ip[16..20].copy_from_slice(&[10, 99, 0, 2]);
    let mut udp = [0u8; 8];
    udp[0..2].copy_from_slice(&49152u16.to_be_bytes());
    udp[2..4].copy_from_slice(&roce::ROCE_PORT.to_be_bytes());
    udp[4..6].copy_from_slice(&((8 + packet_len) as u16).to_be_bytes());
    (ip, udp)
}

fn golden(opcode: Opcode, solicited: bool, psn: u32, va: u64, imm: Option<u32>, icrc_wire: &str) {
    let payload: Vec<u8> = (0..32).collect();
    let h = Headers {
        bth: Bth { opcode: opcode as u8, solicited, mig_req: false, pad: 0, pkey: 0xFFFF, fecn: false, becn: false, dest_qp: 0x11, ack_req: true, psn },
        reth: Some(Reth { va, rkey: 0x1234, len: 32 }),
        imm,
        aeth: None,
    };
    let mut buf = [0u8; 128];
    let n = roce::encode(&h, &payload, &mut buf).unwrap();
    let (ip, udp) = headers_for(n);
    roce::seal_ipv4(&ip, &udp, &mut buf[..n]);
    assert_eq!(buf[n - 4..n], hex(icrc_wire)[..], "{opcode:?}");
    let p = roce::parse(&buf[..n]).unwrap();
    assert_eq!((p.opcode, p.headers, p.payload), (opcode, h, &payload[..]));
    assert!(p.icrc_ok_ipv4(&ip, &udp, &buf[..n]));
    let mut flipped = buf;
    flipped[n - 10] ^= 0x40;
    let q = roce::parse(&flipped[..n]).unwrap();
    assert!(!q.icrc_ok_ipv4(&ip, &udp, &flipped[..n]), "a flipped payload bit fails the ICRC");
}

#[test]
fn write_only_matches_its_golden_icrc() {
    golden(Opcode::WriteOnly, false, 0x100, 0x0000_7f00_0000_1000, None, "f0c386ca");
}

#[test]
fn write_only_with_immediate_matches_its_golden_icrc() {
    golden(Opcode::WriteOnlyImm, true, 0x101, 0x0000_7f00_0000_2000, Some(0xdead_beef), "9a1bd366");
}

#[test]
fn acks_and_naks_round_trip() {
    for kind in [AethKind::Ack { credits: 31 }, AethKind::Nak { code: roce::headers::NAK_PSN_SEQUENCE_ERROR }, AethKind::Rnr { timer: 7 }] {
        let h = Headers {
            bth: Bth { opcode: Opcode::Ack as u8, solicited: false, mig_req: false, pad: 0, pkey: 0xFFFF, fecn: false, becn: false, dest_qp: 0xabcdef, ack_req: false, psn: 0xFF_FFFF },
            reth: None,
            imm: None,
            aeth: Some(Aeth { kind, msn: 0x12_3456 }),
        };
        let mut buf = [0u8; 64];
        let n = roce::encode(&h, &[], &mut buf).unwrap();
        assert_eq!(n, 12 + 4 + 4);
        assert_eq!(roce::parse(&buf[..n]).unwrap().headers, h);
    }
}

#[test]
fn payloads_are_padded_to_four_bytes_and_the_pad_is_not_payload() {
    let h = Headers { bth: Bth { opcode: Opcode::WriteMiddle as u8, solicited: false, mig_req: false, pad: 0, pkey: 0xFFFF, fecn: false, becn: false, dest_qp: 1, ack_req: false, psn: 5 }, reth: None, imm: None, aeth: None };
    let mut buf = [0u8; 64];
    let n = roce::encode(&h, &[1, 2, 3, 4, 5], &mut buf).unwrap();
    assert_eq!(n, 12 + 8 + 4);
    assert_eq!(buf[1] >> 4 & 3, 3, "pad count 3 in the BTH");
    assert_eq!(roce::parse(&buf[..n]).unwrap().payload, &[1, 2, 3, 4, 5]);
}

#[test]
fn bad_packets_are_refused_by_reason() {
    use roce::RoceError::*;
    assert!(matches!(roce::parse(&[0u8; 10]), Err(Short { .. })));
    let mut b = [0u8; 40];
    b[0] = 0x0A; // WRITE_ONLY needs a RETH: 12 + 16 + 4
    assert!(matches!(roce::parse(&b[..20]), Err(Short { need: 32, .. })));
    b[1] = 0x01;
    assert_eq!(roce::parse(&b), Err(Version));
    b[1] = 0;
    b[0] = 0x81;
    assert_eq!(roce::parse(&b), Err(Opcode(0x81)));
    b[0] = 0x08; // WRITE_LAST with pad 3 and 1 payload byte
    b[1] = 0x30;
    assert!(matches!(roce::parse(&b[..12 + 1 + 4]), Err(Pad { pad: 3, payload: 1 })));
    b[0] = 0x11;
    b[1] = 0;
    b[12] = 0x40; // reserved AETH syndrome
    assert_eq!(roce::parse(&b[..20]), Err(Aeth));
    let h = Headers { bth: Bth::parse(&[0x08, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1]).unwrap(), reth: None, imm: None, aeth: None };
    assert!(matches!(roce::encode(&h, &[0; 100], &mut [0u8; 50]), Err(Output { need: 116, .. })));
}

fn opcode() -> impl Strategy<Value = Opcode> {
    prop::sample::select(vec![
        Opcode::SendFirst, Opcode::SendMiddle, Opcode::SendLast, Opcode::SendLastImm, Opcode::SendOnly, Opcode::SendOnlyImm,
        Opcode::WriteFirst, Opcode::WriteMiddle, Opcode::WriteLast, Opcode::WriteLastImm, Opcode::WriteOnly, Opcode::WriteOnlyImm, Opcode::Ack,
    ])
}

proptest! {
    #[test]
    fn encode_then_parse_gives_the_packet_back(op in opcode(), se: bool, qp in 0u32..1 << 24, psn in 0u32..1 << 24, ack: bool,
                                               va: u64, rkey: u32, len: u32, imm: u32, msn in 0u32..1 << 24, credits in 0u8..32,
                                               payload in prop::collection::vec(any::<u8>(), 0..300)) {
        let payload = if op == Opcode::Ack { Vec::new() } else { payload };
        let h = Headers {
            bth: Bth { opcode: op as u8, solicited: se, mig_req: false, pad: ((4 - payload.len() % 4) % 4) as u8, pkey: 0xFFFF, fecn: false, becn: false, dest_qp: qp, ack_req: ack, psn },
            reth: op.has_reth().then_some(Reth { va, rkey, len }),
            imm: op.has_imm().then_some(imm),
            aeth: op.has_aeth().then_some(Aeth { kind: AethKind::Ack { credits }, msn }),
        };
        let mut buf = vec![0u8; 400];
        let n = roce::encode(&h, &payload, &mut buf).unwrap();
        prop_assert_eq!(n, roce::encoded_len(op, payload.len()));
        prop_assert_eq!(n % 4, 0);
        let p = roce::parse(&buf[..n]).unwrap();
        prop_assert_eq!(p.opcode, op);
        prop_assert_eq!(p.headers, h);
        prop_assert_eq!(p.payload, &payload[..]);
    }

    /// The fuzz target of the parser: arbitrary bytes are parsed or refused, never a panic,
    /// and a parsed payload lies inside the input.
    #[test]
    fn arbitrary_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(p) = roce::parse(&b) {
            prop_assert!(p.payload.len() + 16 <= b.len());
        }
    }
}

#[test]
fn icrc_over_several_buffers_equals_the_icrc_over_one() {
    let ip: [u8; 20] = [0x45, 0, 0, 60, 0x12, 0x34, 0x40, 0, 64, 17, 0, 0, 10, 99, 0, 1, 10, 99, 0, 2];
    let udp: [u8; 8] = [0xC0, 0, 0x12, 0xB7, 0, 40, 0, 0];
    let rest: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
    let whole = rdaq_proto::roce::icrc_ipv4(&ip, &udp, &rest);
    for cut in [12, 13, 100, 199] {
        let parts = [&rest[..cut], &rest[cut..]];
        assert_eq!(rdaq_proto::roce::icrc_ipv4_parts(&ip, &udp, &parts), whole, "cut at {cut}");
    }
}
