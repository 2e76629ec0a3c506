//! The data transfer process of one module, as configured by hand from a receiver's buffer
//! map: frame `f` goes to buffer `f % buffers`, module `m`'s bytes at `m * module_bytes`,
//! cut into datagrams of `payload_bytes`; the last datagram of a module frame carries the
//! LAST flag and the frame number as immediate value.

use rdaq_proto::datagram::{Flags, Header, HEADER_LEN};
use rdaq_proto::telegram::BufferMap;

pub struct Packetizer {
    map: BufferMap,
    module: u16,
    seq: u32,
    headers: Vec<[u8; HEADER_LEN]>,
}

impl Packetizer {
    pub fn new(map: &BufferMap, module: u16) -> Self {
        let n = map.module_bytes.div_ceil(map.payload_bytes as u64) as usize;
        Packetizer { map: map.clone(), module, seq: 0, headers: vec![[0; HEADER_LEN]; n] }
    }

    /// Writes the headers of frame `frame`; returns the number of datagrams.
    pub fn frame(&mut self, frame: u64) -> usize {
        let buf = *self.map.buffer_for(frame);
        let (mb, pb) = (self.map.module_bytes, self.map.payload_bytes as u64);
        let n = self.headers.len();
        for (k, hdr) in self.headers.iter_mut().enumerate() {
            let last = k + 1 == n;
            let rel = k as u64 * pb;
            let h = Header {
                flags: if last { Flags::LAST.with(Flags::IMM) } else { Flags::empty() },
                module: self.module,
                buffer: buf.id,
                key: buf.key,
                offset: self.module as u64 * mb + rel,
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

    /// Datagram `k` of the current frame: its header and its slice of the module frame.
    pub fn datagram<'a>(&'a self, k: usize, module_frame: &'a [u8]) -> (&'a [u8], &'a [u8]) {
        let pb = self.map.payload_bytes as usize;
        let start = k * pb;
        let end = (start + pb).min(module_frame.len());
        (&self.headers[k][..], &module_frame[start..end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdaq_proto::telegram::{LocalBufferInfo, TELEGRAM_VERSION};

    #[test]
    fn cuts_a_module_frame_into_its_cells() {
        let map = BufferMap {
            version: TELEGRAM_VERSION,
            modules: 2,
            module_bytes: 20_000,
            payload_bytes: 8192,
            data_ports: vec![1, 2],
            buffers: vec![LocalBufferInfo { id: 5, key: 9, size: 40_000 }, LocalBufferInfo { id: 6, key: 10, size: 40_000 }],
        };
        let mut p = Packetizer::new(&map, 1);
        let frame_bytes = vec![0u8; 20_000];
        assert_eq!(p.frame(3), 3);
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
