//! The rdaq datagram: a 48-byte little-endian header followed by the payload.
//!
//! Like an RDMA WRITE, the datagram names where its payload goes (local buffer id, access
//! key, byte offset) so the receiver only has to check and place it. See `docs/protocol.md`
//! for the byte layout and the rules a receiver applies.

use thiserror::Error;

/// Header length in bytes; the payload starts right after it (or after the checksum
/// extension when [`Flags::CHECKSUM`] is set).
pub const HEADER_LEN: usize = 48;
/// Length of the checksum extension that follows the header when [`Flags::CHECKSUM`] is set.
pub const CHECKSUM_LEN: usize = 4;
/// Largest payload: a UDP datagram over IPv4 (65,507 bytes) less the header and the
/// checksum extension.
pub const MAX_PAYLOAD: usize = 65_507 - HEADER_LEN - CHECKSUM_LEN;
/// The four magic bytes at offset 0.
pub const MAGIC: [u8; 4] = *b"RDAQ";
/// The header version this crate encodes and accepts.
pub const VERSION: u8 = 1;

/// Header flag bits (byte 5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flags(u8);

impl Flags {
    /// Last datagram of a data block (the block of one dataset in one data slice).
    pub const LAST: Flags = Flags(1 << 0);
    /// The `imm` field carries an immediate value (delivered with the completion event).
    pub const IMM: Flags = Flags(1 << 1);
    /// Sent again in answer to a retransmission request.
    pub const RETRANSMIT: Flags = Flags(1 << 2);
    /// A CRC32C of the header and the payload follows the header ([`checksum`]).
    pub const CHECKSUM: Flags = Flags(1 << 3);
    const KNOWN: u8 = 0b1111;

    pub const fn empty() -> Self {
        Flags(0)
    }
    pub const fn bits(self) -> u8 {
        self.0
    }
    pub const fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
    #[must_use]
    pub const fn with(self, other: Flags) -> Self {
        Flags(self.0 | other.0)
    }
    /// Flags from wire bits; `None` if a reserved bit is set.
    pub const fn from_bits(bits: u8) -> Option<Self> {
        if bits & !Self::KNOWN == 0 {
            Some(Flags(bits))
        } else {
            None
        }
    }
}

/// The decoded header of an rdaq datagram.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Header {
    pub flags: Flags,
    /// Data channel: the detector module that sent it.
    pub module: u16,
    /// Local buffer id on the receiver.
    pub buffer: u32,
    /// Access key of that buffer (like an RDMA R_Key).
    pub key: u32,
    /// Byte offset of the payload in the buffer.
    pub offset: u64,
    /// Payload length in bytes.
    pub length: u32,
    /// Per-channel sequence number, wraps at 2^32 (see [`crate::seq`]).
    pub seq: u32,
    /// Data slice (frame) number.
    pub frame: u64,
    /// Dataset id (0 = image data).
    pub dataset: u16,
    /// Immediate value, meaningful when [`Flags::IMM`] is set.
    pub imm: u32,
}

/// Why a datagram was rejected by [`Header::decode`].
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("datagram of {len} bytes is shorter than the {HEADER_LEN}-byte header")]
    Truncated { len: usize },
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    #[error("unsupported version {0}")]
    BadVersion(u8),
    #[error("reserved flag bits set: {0:#04x}")]
    ReservedFlags(u8),
    #[error("reserved field is {0:#06x}, must be 0")]
    ReservedField(u16),
    #[error("header declares {declared} payload bytes, datagram carries {actual}")]
    LengthMismatch { declared: u32, actual: usize },
    #[error("offset {offset} + length {length} overflows")]
    OffsetOverflow { offset: u64, length: u32 },
    #[error("checksum mismatch")]
    BadChecksum,
}

/// CRC32C (Castagnoli) of a datagram's 48 header bytes followed by its payload: the value
/// of the checksum extension, written little-endian. Covering the header too means a flipped
/// bit in the buffer, key or offset is caught as surely as one in the data.
#[inline]
pub fn checksum(header: &[u8; HEADER_LEN], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(header), payload)
}

#[inline(always)]
fn u16_at(b: &[u8; HEADER_LEN], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}
#[inline(always)]
fn u32_at(b: &[u8; HEADER_LEN], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}
#[inline(always)]
fn u64_at(b: &[u8; HEADER_LEN], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

impl Header {
    /// Decodes and checks a header. `datagram_len` is the length of the whole datagram
    /// (header + payload) as received; the declared payload length must match it exactly,
    /// so truncated and padded datagrams are both rejected.
    pub fn decode(b: &[u8; HEADER_LEN], datagram_len: usize) -> Result<Header, DecodeError> {
        if datagram_len < HEADER_LEN {
            return Err(DecodeError::Truncated { len: datagram_len });
        }
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != MAGIC {
            return Err(DecodeError::BadMagic(magic));
        }
        if b[4] != VERSION {
            return Err(DecodeError::BadVersion(b[4]));
        }
        let flags = Flags::from_bits(b[5]).ok_or(DecodeError::ReservedFlags(b[5]))?;
        let reserved = u16_at(b, 42);
        if reserved != 0 {
            return Err(DecodeError::ReservedField(reserved));
        }
        let h = Header {
            flags,
            module: u16_at(b, 6),
            buffer: u32_at(b, 8),
            key: u32_at(b, 12),
            offset: u64_at(b, 16),
            length: u32_at(b, 24),
            seq: u32_at(b, 28),
            frame: u64_at(b, 32),
            dataset: u16_at(b, 40),
            imm: u32_at(b, 44),
        };
        let actual = datagram_len.saturating_sub(h.header_len());
        if h.length as usize != actual || datagram_len < h.header_len() {
            return Err(DecodeError::LengthMismatch { declared: h.length, actual });
        }
        if h.offset.checked_add(h.length as u64).is_none() {
            return Err(DecodeError::OffsetOverflow { offset: h.offset, length: h.length });
        }
        Ok(h)
    }

    /// Bytes before the payload: the header, and the checksum extension if flagged.
    #[inline]
    pub fn header_len(&self) -> usize {
        if self.flags.contains(Flags::CHECKSUM) {
            HEADER_LEN + CHECKSUM_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Splits a contiguous datagram into its checked header and payload, verifying the
    /// checksum when the datagram carries one.
    pub fn parse(datagram: &[u8]) -> Result<(Header, &[u8]), DecodeError> {
        let hdr: &[u8; HEADER_LEN] = datagram
            .get(..HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(DecodeError::Truncated { len: datagram.len() })?;
        let h = Header::decode(hdr, datagram.len())?;
        let payload = &datagram[h.header_len()..];
        if h.flags.contains(Flags::CHECKSUM) {
            let stored = u32::from_le_bytes(datagram[HEADER_LEN..HEADER_LEN + CHECKSUM_LEN].try_into().expect("4 bytes"));
            if stored != checksum(hdr, payload) {
                return Err(DecodeError::BadChecksum);
            }
        }
        Ok((h, payload))
    }

    /// Writes the header into `out`; never allocates.
    pub fn encode(&self, out: &mut [u8; HEADER_LEN]) {
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = VERSION;
        out[5] = self.flags.bits();
        out[6..8].copy_from_slice(&self.module.to_le_bytes());
        out[8..12].copy_from_slice(&self.buffer.to_le_bytes());
        out[12..16].copy_from_slice(&self.key.to_le_bytes());
        out[16..24].copy_from_slice(&self.offset.to_le_bytes());
        out[24..28].copy_from_slice(&self.length.to_le_bytes());
        out[28..32].copy_from_slice(&self.seq.to_le_bytes());
        out[32..40].copy_from_slice(&self.frame.to_le_bytes());
        out[40..42].copy_from_slice(&self.dataset.to_le_bytes());
        out[42..44].copy_from_slice(&0u16.to_le_bytes());
        out[44..48].copy_from_slice(&self.imm.to_le_bytes());
    }

    /// End of the payload in the buffer (checked by [`Header::decode`] not to overflow).
    #[inline]
    pub fn end(&self) -> u64 {
        self.offset + self.length as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_header() -> impl Strategy<Value = Header> {
        (
            0u8..16,
            any::<u16>(),
            any::<u32>(),
            any::<u32>(),
            0u64..(1 << 40),
            0u32..9000,
            any::<u32>(),
            any::<u64>(),
            any::<u16>(),
            any::<u32>(),
        )
            .prop_map(|(f, module, buffer, key, offset, length, seq, frame, dataset, imm)| Header {
                flags: Flags::from_bits(f).unwrap(),
                module,
                buffer,
                key,
                offset,
                length,
                seq,
                frame,
                dataset,
                imm,
            })
    }

    fn datagram(h: &Header) -> Vec<u8> {
        let mut v: Vec<u8> = (0..h.header_len() + h.length as usize).map(|i| (i * 7) as u8).collect();
        let hdr: &mut [u8; HEADER_LEN] = (&mut v[..HEADER_LEN]).try_into().unwrap();
        h.encode(hdr);
        if h.flags.contains(Flags::CHECKSUM) {
            let hdr: [u8; HEADER_LEN] = v[..HEADER_LEN].try_into().unwrap();
            let c = checksum(&hdr, &v[HEADER_LEN + CHECKSUM_LEN..]);
            v[HEADER_LEN..HEADER_LEN + CHECKSUM_LEN].copy_from_slice(&c.to_le_bytes());
        }
        v
    }

    proptest! {
        #[test]
        fn roundtrip(h in arb_header()) {
            let d = datagram(&h);
            let (g, payload) = Header::parse(&d).unwrap();
            prop_assert_eq!(g, h);
            prop_assert_eq!(payload.len(), h.length as usize);
        }

        #[test]
        fn truncated_or_padded_is_rejected(h in arb_header(), cut in 1usize..64, pad in 1usize..64) {
            let d = datagram(&h);
            let short = &d[..d.len().saturating_sub(cut)];
            prop_assert!(Header::parse(short).is_err());
            let mut long = d.clone();
            long.extend(std::iter::repeat(0).take(pad));
            let is_mismatch = matches!(Header::parse(&long), Err(DecodeError::LengthMismatch { .. }));
            prop_assert!(is_mismatch);
        }

        #[test]
        fn damaged_datagrams_never_panic_and_parse_only_when_consistent(
            h in arb_header(),
            damage in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
            cut in proptest::option::of(any::<prop::sample::Index>()),
        ) {
            // a real datagram with a few bytes changed and perhaps cut short: every check of
            // the parser is reached, and an undamaged one parses
            let mut bytes = datagram(&h);
            for (at, x) in &damage {
                let i = at.index(bytes.len());
                bytes[i] ^= x;
            }
            if let Some(c) = cut {
                bytes.truncate(c.index(bytes.len()));
            }
            match Header::parse(&bytes) {
                Ok((got, p)) => {
                    prop_assert_eq!(p.len(), got.length as usize);
                    prop_assert_eq!(&bytes[..4], &MAGIC);
                }
                Err(_) => prop_assert!(!damage.iter().all(|(_, x)| *x == 0) || cut.is_some(), "an undamaged datagram parses"),
            }
        }

        #[test]
        fn any_flip_in_checked_bytes_is_detected(h in arb_header(), bit in 0usize..48) {
            // magic (0..4), version (4), reserved flags (5, bits 4..7), reserved field (42..44)
            let mut d = datagram(&h);
            if bit < 5 || bit == 42 || bit == 43 {
                d[bit] ^= 1;
                prop_assert!(Header::parse(&d).is_err());
            }
        }

        #[test]
        fn with_a_checksum_any_single_bit_flip_is_detected(
            h in arb_header(), pos in any::<prop::sample::Index>(), bit in 0u8..8,
        ) {
            let h = Header { flags: h.flags.with(Flags::CHECKSUM), length: h.length % 2000, ..h };
            let mut d = datagram(&h);
            prop_assert!(Header::parse(&d).is_ok());
            let at = pos.index(d.len());
            d[at] ^= 1 << bit;
            prop_assert!(Header::parse(&d).is_err());
        }
    }

    #[test]
    fn typed_errors() {
        let h = Header { length: 4, ..Default::default() };
        let mut d = datagram(&h);
        assert_eq!(Header::parse(&d[..10]), Err(DecodeError::Truncated { len: 10 }));
        d[0] = b'X';
        assert!(matches!(Header::parse(&d), Err(DecodeError::BadMagic(_))));
        d[0] = b'R';
        d[4] = 9;
        assert_eq!(Header::parse(&d), Err(DecodeError::BadVersion(9)));
        d[4] = VERSION;
        d[5] = 0x80;
        assert_eq!(Header::parse(&d), Err(DecodeError::ReservedFlags(0x80)));
        d[5] = Flags::CHECKSUM.bits();
        assert!(matches!(Header::parse(&d), Err(DecodeError::LengthMismatch { .. })), "no room for the extension");
        d[5] = 0;
        d[16..24].copy_from_slice(&(u64::MAX - 1).to_le_bytes());
        assert!(matches!(Header::parse(&d), Err(DecodeError::OffsetOverflow { .. })));
    }

    #[test]
    fn layout_is_stable() {
        let h = Header {
            flags: Flags::LAST.with(Flags::IMM),
            module: 0x0102,
            buffer: 0x03040506,
            key: 0x0708090a,
            offset: 0x1112131415161718,
            length: 0,
            seq: 0x21222324,
            frame: 0x3132333435363738,
            dataset: 0x4142,
            imm: 0x51525354,
        };
        let mut b = [0u8; HEADER_LEN];
        h.encode(&mut b);
        let expect = concat!(
            "52444151", "01", "03", "0201", "06050403", "0a090807", "1817161514131211",
            "00000000", "24232221", "3837363534333231", "4241", "0000", "54535251"
        );
        assert_eq!(hex(&b), expect);
    }

    #[test]
    fn checksum_golden_vector() {
        // CRC32C check value of RFC 3720 (iSCSI): "123456789" -> 0xe3069283
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        // header and payload are one stream: the CRC of their concatenation
        let whole: Vec<u8> = (0..100u8).collect();
        let h: [u8; HEADER_LEN] = whole[..HEADER_LEN].try_into().unwrap();
        assert_eq!(checksum(&h, &whole[HEADER_LEN..]), bitwise_crc32c(&whole));
    }

    /// The textbook bit-at-a-time CRC32C (reflected polynomial 0x82f63b78), as an oracle.
    fn bitwise_crc32c(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= b as u32;
            for _ in 0..8 {
                crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82f6_3b78 } else { crc >> 1 };
            }
        }
        !crc
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
