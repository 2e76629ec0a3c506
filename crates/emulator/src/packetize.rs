//! Cuts a module frame into rdaq datagrams for one destination buffer: module `m`'s bytes
//! at the route's offset in the buffer, datagrams of `payload_bytes`; the last datagram of
//! a module frame carries the LAST flag and the frame number as immediate value. One
//! packetizer per data channel (module to receiver), which owns that channel's sequence.

use rdaq_proto::datagram::{checksum, Flags, Header, CHECKSUM_LEN, HEADER_LEN};
use rdaq_proto::telegram::LocalBufferInfo;

/// Header bytes of a datagram with the checksum extension.
pub const MAX_HEADER: usize = HEADER_LEN + CHECKSUM_LEN;

pub struct Packetizer {
    module: u16,
    module_bytes: u64,
    payload_bytes: u64,
    checksum: bool,
    seq: u32,
    first_seq: u32,
    count: usize,
    headers: Vec<[u8; MAX_HEADER]>,
}

impl Packetizer {
    /// With `checksum`, every datagram carries the CRC32C extension.
    pub fn new(module: u16, module_bytes: u64, payload_bytes: u32, checksum: bool) -> Self {
        let n = module_bytes.div_ceil(payload_bytes as u64) as usize;
        Packetizer {
            module,
            module_bytes,
            payload_bytes: payload_bytes as u64,
            checksum,
            seq: 0,
            first_seq: 0,
            count: n,
            headers: vec![[0; MAX_HEADER]; n],
        }
    }

    fn header_len(&self) -> usize {
        if self.checksum {
            MAX_HEADER
        } else {
            HEADER_LEN
        }
    }

    /// Writes the headers of frame `frame` (whose bytes are `module_frame`, needed for the
    /// checksums) into `buf` at `offset`; returns the datagram count.
    pub fn frame(&mut self, frame: u64, buf: &LocalBufferInfo, offset: u64, module_frame: &[u8]) -> usize {
        self.first_seq = self.seq;
        let mut headers = std::mem::take(&mut self.headers);
        for (k, hdr) in headers.iter_mut().enumerate() {
            self.encode(frame, buf, offset, k, self.seq, false, module_frame, hdr);
            self.seq = self.seq.wrapping_add(1);
        }
        self.headers = headers;
        self.count
    }

    /// Sequence number of datagram 0 of the current frame.
    pub fn first_seq(&self) -> u32 {
        self.first_seq
    }

    /// Encodes the header of datagram `k` of a frame sent with sequence number `seq` into
    /// `out` (marked as retransmitted if asked); returns the header length.
    #[allow(clippy::too_many_arguments)]
    pub fn encode(
        &self,
        frame: u64,
        buf: &LocalBufferInfo,
        offset: u64,
        k: usize,
        seq: u32,
        retransmit: bool,
        module_frame: &[u8],
        out: &mut [u8; MAX_HEADER],
    ) -> usize {
        let (mb, pb) = (self.module_bytes, self.payload_bytes);
        let last = k + 1 == self.count;
        let rel = k as u64 * pb;
        let mut flags = if last { Flags::LAST.with(Flags::IMM) } else { Flags::empty() };
        if retransmit {
            flags = flags.with(Flags::RETRANSMIT);
        }
        if self.checksum {
            flags = flags.with(Flags::CHECKSUM);
        }
        let h = Header {
            flags,
            module: self.module,
            buffer: buf.id,
            key: buf.key,
            offset: offset + rel,
            length: pb.min(mb - rel) as u32,
            seq,
            frame,
            dataset: 0,
            imm: if last { frame as u32 } else { 0 },
        };
        let head: &mut [u8; HEADER_LEN] = (&mut out[..HEADER_LEN]).try_into().expect("48 bytes");
        h.encode(head);
        if self.checksum {
            let c = checksum(head, self.payload(k, module_frame));
            out[HEADER_LEN..].copy_from_slice(&c.to_le_bytes());
        }
        self.header_len()
    }

    /// Datagrams per module frame.
    pub fn datagrams(&self) -> usize {
        self.count
    }

    /// The payload of datagram `k`: its slice of the module frame.
    pub fn payload<'a>(&self, k: usize, module_frame: &'a [u8]) -> &'a [u8] {
        let pb = self.payload_bytes as usize;
        let start = k * pb;
        &module_frame[start..(start + pb).min(module_frame.len())]
    }

    /// Datagram `k` of the current frame: its header and its slice of the module frame.
    pub fn datagram<'a>(&'a self, k: usize, module_frame: &'a [u8]) -> (&'a [u8], &'a [u8]) {
        (&self.headers[k][..self.header_len()], self.payload(k, module_frame))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_a_module_frame_into_its_cells() {
        let buf = LocalBufferInfo { id: 6, key: 10, size: 40_000, va: 0 };
        let mut p = Packetizer::new(1, 20_000, 8192, false);
        let frame_bytes = vec![0u8; 20_000];
        assert_eq!(p.frame(3, &buf, 20_000, &frame_bytes), 3);
        let mut total = 0;
        for k in 0..3 {
            let (h, payload) = p.datagram(k, &frame_bytes);
            let mut d = h.to_vec();
            d.extend_from_slice(payload);
            let (hdr, pl) = Header::parse(&d).unwrap();
            assert_eq!((hdr.buffer, hdr.key, hdr.module, hdr.frame, hdr.seq), (6, 10, 1, 3, k as u32));
            assert_eq!(hdr.offset, 20_000 + k as u64 * 8192);
            assert_eq!(hdr.flags.contains(Flags::LAST), k == 2);
            total += pl.len();
        }
        assert_eq!(total, 20_000);
    }

    #[test]
    fn checksummed_and_retransmitted_datagrams_parse_and_verify() {
        let buf = LocalBufferInfo { id: 2, key: 9, size: 20_000, va: 0 };
        let mut p = Packetizer::new(0, 20_000, 8192, true);
        let frame_bytes: Vec<u8> = (0..20_000u32).map(|i| (i * 31) as u8).collect();
        p.frame(5, &buf, 0, &frame_bytes);
        p.frame(6, &buf, 0, &frame_bytes);
        assert_eq!(p.first_seq(), 3);
        let mut out = [0u8; MAX_HEADER];
        let hl = p.encode(5, &buf, 0, 2, 2, true, &frame_bytes, &mut out);
        let mut d = out[..hl].to_vec();
        d.extend_from_slice(p.payload(2, &frame_bytes));
        let (h, payload) = Header::parse(&d).unwrap();
        assert!(h.flags.contains(Flags::RETRANSMIT) && h.flags.contains(Flags::CHECKSUM) && h.flags.contains(Flags::LAST));
        assert_eq!((h.seq, h.frame, payload.len()), (2, 5, 20_000 - 2 * 8192));
        let (hdr, payload) = p.datagram(0, &frame_bytes);
        let mut d = [hdr, payload].concat();
        assert!(Header::parse(&d).is_ok());
        d[100] ^= 4;
        assert!(Header::parse(&d).is_err());
    }
}
