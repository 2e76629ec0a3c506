//! Telegrams: the documents a data receiver and the detector modules exchange to agree on
//! where data goes. This hand configuration needs one: the receiver's buffer map.

use serde::{Deserialize, Serialize};

/// Version of the telegram schema; bumped on incompatible changes.
pub const TELEGRAM_VERSION: u32 = 1;

/// A registered local buffer: what a sender needs to address it (like an RDMA MR's
/// address and R_Key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalBufferInfo {
    pub id: u32,
    pub key: u32,
    pub size: u64,
}

/// The buffers of one data receiver and the layout it expects in each: one frame slot per
/// buffer, module `m` at byte `m * module_bytes`, cut into datagrams of `payload_bytes`.
/// Frame `f` goes to `buffers[f % buffers.len()]` (temporal ring).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferMap {
    pub version: u32,
    pub modules: u16,
    pub module_bytes: u64,
    pub payload_bytes: u32,
    /// UDP port of each data channel: module `m` sends rdaq datagrams to `data_ports[m]`;
    /// for native JUNGFRAU ingest, interface `i` of module `m` to `data_ports[m * interfaces + i]`.
    pub data_ports: Vec<u16>,
    pub buffers: Vec<LocalBufferInfo>,
}

impl BufferMap {
    /// The buffer frame `frame` goes to.
    pub fn buffer_for(&self, frame: u64) -> &LocalBufferInfo {
        &self.buffers[(frame % self.buffers.len() as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_roundtrip_and_ring() {
        let m = BufferMap {
            version: TELEGRAM_VERSION,
            modules: 2,
            module_bytes: 1 << 20,
            payload_bytes: 8192,
            data_ports: vec![50000, 50001],
            buffers: (0..3).map(|i| LocalBufferInfo { id: i, key: 100 + i, size: 2 << 20 }).collect(),
        };
        let j = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<BufferMap>(&j).unwrap(), m);
        assert_eq!(m.buffer_for(4).id, 1);
    }
}
