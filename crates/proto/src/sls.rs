//! The native slsDetectorPackage UDP header (version 2) that a JUNGFRAU module puts in front
//! of every 8192-byte data packet: `struct '<QIIQQHHHHIHBB'`, 48 bytes, little-endian.

use thiserror::Error;

pub const SLS_HEADER_LEN: usize = 48;
/// Pixel bytes per JUNGFRAU packet (4 rows of 1024 16-bit pixels).
pub const JUNGFRAU_PACKET_PAYLOAD: usize = 8192;
/// Packets per module frame on one UDP interface.
pub const JUNGFRAU_PACKETS_PER_FRAME: u32 = 128;
pub const DET_TYPE_JUNGFRAU: u8 = 3;
pub const SLS_HEADER_VERSION: u8 = 2;

/// The detector a header's detType names (slsDetectorPackage's `detectorType`), for
/// messages; `None` for a number it does not define.
pub fn det_type_name(det_type: u8) -> Option<&'static str> {
    const NAMES: [&str; 9] = ["GENERIC", "EIGER", "GOTTHARD", "JUNGFRAU", "CHIPTESTBOARD", "MOENCH", "MYTHEN3", "GOTTHARD2", "XILINX_CHIPTESTBOARD"];
    NAMES.get(det_type as usize).copied()
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SlsHeader {
    pub frame_number: u64,
    /// Exposure length in 100 ns units.
    pub exp_length: u32,
    pub packet_number: u32,
    /// detSpec1: bunch id.
    pub bunch_id: u64,
    /// 10 MHz timestamp.
    pub timestamp: u64,
    pub mod_id: u16,
    /// Row of the module (or, with two interfaces, the interface half) in the detector.
    pub row: u16,
    pub column: u16,
    pub det_spec2: u16,
    /// detSpec3: DAQ info bits.
    pub daq_info: u32,
    pub det_spec4: u16,
    pub det_type: u8,
    pub version: u8,
}

#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum SlsError {
    #[error("packet of {len} bytes is shorter than the {SLS_HEADER_LEN}-byte sls header")]
    Truncated { len: usize },
    #[error("detector type {0} is not JUNGFRAU ({DET_TYPE_JUNGFRAU})")]
    NotJungfrau(u8),
    #[error("unsupported sls header version {0}")]
    BadVersion(u8),
    #[error("packet carries {0} pixel bytes, JUNGFRAU packets carry {JUNGFRAU_PACKET_PAYLOAD}")]
    BadPayload(usize),
    #[error("packet number {packet} out of range 0..{limit}")]
    PacketOutOfRange { packet: u32, limit: u32 },
}

fn field<const N: usize>(b: &[u8; SLS_HEADER_LEN], at: usize) -> [u8; N] {
    let mut w = [0u8; N];
    w.copy_from_slice(&b[at..at + N]);
    w
}

impl SlsHeader {
    /// Decodes the 48 header bytes; no field is checked (see [`SlsHeader::check_jungfrau`]).
    pub fn decode(b: &[u8; SLS_HEADER_LEN]) -> SlsHeader {
        SlsHeader {
            frame_number: u64::from_le_bytes(field(b, 0)),
            exp_length: u32::from_le_bytes(field(b, 8)),
            packet_number: u32::from_le_bytes(field(b, 12)),
            bunch_id: u64::from_le_bytes(field(b, 16)),
            timestamp: u64::from_le_bytes(field(b, 24)),
            mod_id: u16::from_le_bytes(field(b, 32)),
            row: u16::from_le_bytes(field(b, 34)),
            column: u16::from_le_bytes(field(b, 36)),
            det_spec2: u16::from_le_bytes(field(b, 38)),
            daq_info: u32::from_le_bytes(field(b, 40)),
            det_spec4: u16::from_le_bytes(field(b, 44)),
            det_type: b[46],
            version: b[47],
        }
    }

    /// Splits a contiguous packet into header and payload.
    pub fn parse(packet: &[u8]) -> Result<(SlsHeader, &[u8]), SlsError> {
        let hdr: &[u8; SLS_HEADER_LEN] = packet
            .get(..SLS_HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(SlsError::Truncated { len: packet.len() })?;
        Ok((SlsHeader::decode(hdr), &packet[SLS_HEADER_LEN..]))
    }

    /// Checks that this is a JUNGFRAU version-2 packet with a full payload and a packet
    /// number below `packets_per_port` (128 on one interface, 64 on each of two).
    pub fn check_jungfrau(&self, payload_len: usize, packets_per_port: u32) -> Result<(), SlsError> {
        if self.det_type != DET_TYPE_JUNGFRAU {
            return Err(SlsError::NotJungfrau(self.det_type));
        }
        if self.version != SLS_HEADER_VERSION {
            return Err(SlsError::BadVersion(self.version));
        }
        if payload_len != JUNGFRAU_PACKET_PAYLOAD {
            return Err(SlsError::BadPayload(payload_len));
        }
        if self.packet_number >= packets_per_port {
            return Err(SlsError::PacketOutOfRange { packet: self.packet_number, limit: packets_per_port });
        }
        Ok(())
    }

    pub fn encode(&self, out: &mut [u8; SLS_HEADER_LEN]) {
        out[0..8].copy_from_slice(&self.frame_number.to_le_bytes());
        out[8..12].copy_from_slice(&self.exp_length.to_le_bytes());
        out[12..16].copy_from_slice(&self.packet_number.to_le_bytes());
        out[16..24].copy_from_slice(&self.bunch_id.to_le_bytes());
        out[24..32].copy_from_slice(&self.timestamp.to_le_bytes());
        out[32..34].copy_from_slice(&self.mod_id.to_le_bytes());
        out[34..36].copy_from_slice(&self.row.to_le_bytes());
        out[36..38].copy_from_slice(&self.column.to_le_bytes());
        out[38..40].copy_from_slice(&self.det_spec2.to_le_bytes());
        out[40..44].copy_from_slice(&self.daq_info.to_le_bytes());
        out[44..46].copy_from_slice(&self.det_spec4.to_le_bytes());
        out[46] = self.det_type;
        out[47] = self.version;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// First record of `tests/data/sls-jungfrau-virtual/jungfrau_virtual.bin`
    /// (frame 14, packet 0, modId 1234), as printed by its decode.py.
    #[test]
    fn decodes_captured_header() {
        let mut b = [0u8; SLS_HEADER_LEN];
        b[0] = 14;
        b[32..34].copy_from_slice(&1234u16.to_le_bytes());
        b[46] = 3;
        b[47] = 2;
        let h = SlsHeader::decode(&b);
        assert_eq!((h.frame_number, h.packet_number, h.mod_id, h.det_type, h.version), (14, 0, 1234, 3, 2));
        assert_eq!(h.check_jungfrau(8192, 128), Ok(()));
        assert_eq!(h.check_jungfrau(8191, 128), Err(SlsError::BadPayload(8191)));
    }

    proptest! {
        #[test]
        fn roundtrip(fr: u64, el: u32, pn: u32, b1: u64, ts: u64, m: u16, r: u16, c: u16,
                     d2: u16, d3: u32, d4: u16, dt: u8, v: u8) {
            let h = SlsHeader { frame_number: fr, exp_length: el, packet_number: pn, bunch_id: b1,
                timestamp: ts, mod_id: m, row: r, column: c, det_spec2: d2, daq_info: d3,
                det_spec4: d4, det_type: dt, version: v };
            let mut b = [0u8; SLS_HEADER_LEN];
            h.encode(&mut b);
            prop_assert_eq!(SlsHeader::decode(&b), h);
        }

        #[test]
        fn every_check_names_what_is_wrong(
            head in proptest::collection::vec(any::<u8>(), SLS_HEADER_LEN),
            det in prop_oneof![Just(DET_TYPE_JUNGFRAU), any::<u8>()],
            version in prop_oneof![Just(SLS_HEADER_VERSION), any::<u8>()],
            packet in prop_oneof![0u32..128, any::<u32>()],
            payload in prop_oneof![Just(JUNGFRAU_PACKET_PAYLOAD), 0usize..9000],
            cut in proptest::option::of(0usize..SLS_HEADER_LEN),
        ) {
            // random headers whose checked fields are often right, so that each check (and
            // acceptance) is reached
            let mut bytes = head;
            bytes[12..16].copy_from_slice(&packet.to_le_bytes());
            bytes[46] = det;
            bytes[47] = version;
            bytes.resize(SLS_HEADER_LEN + payload, 0xab);
            if let Some(c) = cut {
                bytes.truncate(c);
            }
            let (h, p) = match SlsHeader::parse(&bytes) {
                Ok(hp) => hp,
                Err(SlsError::Truncated { len }) => {
                    prop_assert!(cut.is_some() && len < SLS_HEADER_LEN);
                    return Ok(());
                }
                Err(e) => return Err(TestCaseError::fail(format!("unexpected {e}"))),
            };
            let expected = if det != DET_TYPE_JUNGFRAU {
                Err(SlsError::NotJungfrau(det))
            } else if version != SLS_HEADER_VERSION {
                Err(SlsError::BadVersion(version))
            } else if payload != JUNGFRAU_PACKET_PAYLOAD {
                Err(SlsError::BadPayload(payload))
            } else if packet >= 128 {
                Err(SlsError::PacketOutOfRange { packet, limit: 128 })
            } else {
                Ok(())
            };
            prop_assert_eq!(h.check_jungfrau(p.len(), 128), expected);
        }
    }
}
