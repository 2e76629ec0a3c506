//! Cuts a module frame into rdaq datagrams for one destination buffer: module `m`'s bytes
//! at the route's offset in the buffer, datagrams of `payload_bytes`; the last datagram of
//! a module frame carries the LAST flag and the frame number as immediate value. One
//! packetizer per data channel (module to receiver), which owns that channel's sequence.

use rdaq_proto::datagram::{Flags, Header, HEADER_LEN};
use rdaq_proto::telegram::LocalBufferInfo;

pub struct Packetizer {
    module: u16,
    module_bytes: u64,
    payload_bytes: u64,
    seq: u32,
    headers: Vec<[u8; HEADER_LEN]>,
}

impl Packetizer {
    pub fn new(module: u16, module_bytes: u64, payload_bytes: u32) -> Self {
        let n = module_bytes.div_ceil(payload_bytes as u64) as usize;
        Packetizer { module, module_bytes, payload_bytes: payload_bytes as u64, seq: 0, headers: vec![[0; HEADER_LEN]; n] }
    }

    /// Writes the headers of frame `frame` into `buf` at `offset`; returns the datagram count.
    pub fn frame(&mut self, frame: u64, buf: &LocalBufferInfo, offset: u64) -> usize {
        let (mb, pb) = (self.module_bytes, self.payload_bytes);
        let n = self.headers.len();
        for (k, hdr) in self.headers.iter_mut().enumerate() {
            let last = k + 1 == n;
            let rel = k as u64 * pb;
            let h = Header {
                flags: if last { Flags::LAST.with(Flags::IMM) } else { Flags::empty() },
                module: self.module,
                buffer: buf.id,
                key: buf.key,
                offset: offset + rel,
                length: pb.min(mb - rel) as u32,
                seq: self.seq,
                frame,
                dataset: 0,
                imm: if last { frame as u32 } else { 0 },
            };
            self.seq = self.seq.wrapping_add(1);
            h.encode(hdr);
        }
        n
    }

    /// Datagrams per module frame.
    pub fn datagrams(&self) -> usize {
        self.headers.len()
    }

    /// Datagram `k` of the current frame: its header and its slice of the module frame.
    pub fn datagram<'a>(&'a self, k: usize, module_frame: &'a [u8]) -> (&'a [u8], &'a [u8]) {
        let pb = self.payload_bytes as usize;
        let start = k * pb;
        let end = (start + pb).min(module_frame.len());
        (&self.headers[k][..], &module_frame[start..end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_a_module_frame_into_its_cells() {
        let buf = LocalBufferInfo { id: 6, key: 10, size: 40_000 };
        let mut p = Packetizer::new(1, 20_000, 8192);
        let frame_bytes = vec![0u8; 20_000];
        assert_eq!(p.frame(3, &buf, 20_000), 3);
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
}
