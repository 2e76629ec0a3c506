//! Retransmission requests (NACKs): a receiver asks a module's controller to send datagrams
//! again. A NACK travels back on the data channel it is about (from the receiver's data port
//! to the address the data came from) and names missing datagrams in the controller's own
//! terms, in one of two forms:
//!
//! - a sequence range of the channel (what the receiver's loss window found missing), or
//! - a range of datagram indices within one module frame (what a frame's packet bitmap
//!   still lacks when the channel has gone quiet, where the window cannot see a gap).
//!
//! Layout (little-endian): magic `RDNK`, version u8, reserved u8 (0), module u16, count u16,
//! reserved u16 (0), then `count` entries of 16 bytes: frame u64 ([`SEQ_RANGE`] for a
//! sequence range), start u32, end u32 (exclusive; for sequences `end - start` wraps).

use thiserror::Error;

pub const NACK_MAGIC: [u8; 4] = *b"RDNK";
pub const NACK_VERSION: u8 = 1;
pub const NACK_HEADER_LEN: usize = 12;
pub const NACK_ENTRY_LEN: usize = 16;
/// Entries per NACK: keeps a NACK within one 1500-byte Ethernet frame.
pub const NACK_MAX_ENTRIES: usize = 80;
/// The frame value that marks an entry as a sequence range.
pub const SEQ_RANGE: u64 = u64::MAX;

/// One entry of a NACK.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Missing {
    /// Sequence numbers `start..end` of the channel (wrapping).
    Seq { start: u32, end: u32 },
    /// Datagrams `start..end` of module frame `frame` on this channel.
    Frame { frame: u64, start: u32, end: u32 },
}

#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum NackError {
    #[error("NACK of {0} bytes is malformed")]
    Length(usize),
    #[error("bad NACK magic or version")]
    Magic,
    #[error("NACK entry {0} has an empty or reversed range")]
    EmptyRange(usize),
}

/// Writes a NACK for `module` with `entries` (at most [`NACK_MAX_ENTRIES`]) into `out`;
/// returns its length. Never allocates.
pub fn encode(module: u16, entries: &[Missing], out: &mut [u8; NACK_HEADER_LEN + NACK_MAX_ENTRIES * NACK_ENTRY_LEN]) -> usize {
    assert!(entries.len() <= NACK_MAX_ENTRIES, "at most {NACK_MAX_ENTRIES} entries per NACK");
    out[0..4].copy_from_slice(&NACK_MAGIC);
    out[4] = NACK_VERSION;
    out[5] = 0;
    out[6..8].copy_from_slice(&module.to_le_bytes());
    out[8..10].copy_from_slice(&(entries.len() as u16).to_le_bytes());
    out[10..12].copy_from_slice(&[0, 0]);
    for (i, e) in entries.iter().enumerate() {
        let (frame, start, end) = match *e {
            Missing::Seq { start, end } => (SEQ_RANGE, start, end),
            Missing::Frame { frame, start, end } => (frame, start, end),
        };
        let b = &mut out[NACK_HEADER_LEN + i * NACK_ENTRY_LEN..][..NACK_ENTRY_LEN];
        b[0..8].copy_from_slice(&frame.to_le_bytes());
        b[8..12].copy_from_slice(&start.to_le_bytes());
        b[12..16].copy_from_slice(&end.to_le_bytes());
    }
    NACK_HEADER_LEN + entries.len() * NACK_ENTRY_LEN
}

/// Checks a NACK and returns its module and entries (an iterator over the buffer).
pub fn decode(b: &[u8]) -> Result<(u16, impl Iterator<Item = Missing> + '_), NackError> {
    if b.len() < NACK_HEADER_LEN {
        return Err(NackError::Length(b.len()));
    }
    if b[0..4] != NACK_MAGIC || b[4] != NACK_VERSION || b[5] != 0 || b[10..12] != [0, 0] {
        return Err(NackError::Magic);
    }
    let module = u16::from_le_bytes([b[6], b[7]]);
    let count = u16::from_le_bytes([b[8], b[9]]) as usize;
    if count > NACK_MAX_ENTRIES || b.len() != NACK_HEADER_LEN + count * NACK_ENTRY_LEN {
        return Err(NackError::Length(b.len()));
    }
    let entry = |i: usize| {
        let e = &b[NACK_HEADER_LEN + i * NACK_ENTRY_LEN..][..NACK_ENTRY_LEN];
        let frame = u64::from_le_bytes(e[0..8].try_into().expect("8 bytes"));
        let start = u32::from_le_bytes(e[8..12].try_into().expect("4 bytes"));
        let end = u32::from_le_bytes(e[12..16].try_into().expect("4 bytes"));
        if frame == SEQ_RANGE {
            Missing::Seq { start, end }
        } else {
            Missing::Frame { frame, start, end }
        }
    };
    for i in 0..count {
        let empty = match entry(i) {
            Missing::Seq { start, end } => start == end,
            Missing::Frame { start, end, .. } => start >= end,
        };
        if empty {
            return Err(NackError::EmptyRange(i));
        }
    }
    Ok((module, (0..count).map(entry)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_missing() -> impl Strategy<Value = Missing> {
        prop_oneof![
            (any::<u32>(), 1u32..1000).prop_map(|(s, n)| Missing::Seq { start: s, end: s.wrapping_add(n) }),
            (0u64..u64::MAX, 0u32..1000, 1u32..1000).prop_map(|(f, s, n)| Missing::Frame { frame: f, start: s, end: s + n }),
        ]
    }

    proptest! {
        #[test]
        fn roundtrip(module: u16, entries in proptest::collection::vec(arb_missing(), 0..=NACK_MAX_ENTRIES)) {
            let mut buf = [0u8; NACK_HEADER_LEN + NACK_MAX_ENTRIES * NACK_ENTRY_LEN];
            let n = encode(module, &entries, &mut buf);
            let (m, got) = decode(&buf[..n]).unwrap();
            prop_assert_eq!(m, module);
            prop_assert_eq!(got.collect::<Vec<_>>(), entries);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok((_, it)) = decode(&bytes) {
                prop_assert!(it.count() <= NACK_MAX_ENTRIES);
            }
        }
    }

    #[test]
    fn malformed_is_refused() {
        let mut buf = [0u8; NACK_HEADER_LEN + NACK_MAX_ENTRIES * NACK_ENTRY_LEN];
        let n = encode(3, &[Missing::Frame { frame: 7, start: 2, end: 5 }], &mut buf);
        assert!(decode(&buf[..n - 1]).is_err());
        let mut bad = buf;
        bad[0] = b'X';
        assert_eq!(decode(&bad[..n]).err(), Some(NackError::Magic));
        let n = encode(3, &[Missing::Frame { frame: 7, start: 5, end: 5 }], &mut buf);
        assert_eq!(decode(&buf[..n]).err(), Some(NackError::EmptyRange(0)));
    }
}
