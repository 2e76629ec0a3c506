//! Telegrams: the documents the system manager, the data receivers and the detector modules
//! exchange to agree on where data goes: a receiver's buffer map, and a module's data
//! transfer process (DTP).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// Version of the telegram schema; bumped on incompatible changes.
pub const TELEGRAM_VERSION: u32 = 1;

/// A registered local buffer: what a sender needs to address it (like an RDMA MR's
/// address and R_Key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalBufferInfo {
    pub id: u32,
    pub key: u32,
    pub size: u64,
    /// The buffer's virtual address, which RoCEv2 WRITEs name (as an RDMA MR's address);
    /// 0 for receivers of rdaq datagrams, which name buffers by id.
    #[serde(default)]
    pub va: u64,
}

/// The RDMA connection of one module's queue pair with a receiver: what connection setup
/// exchanges (the receiver chooses both queue pair numbers and the first PSN).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoceQp {
    /// The receiver's queue pair: the module's packets name it.
    pub qpn: u32,
    /// The module's queue pair: the receiver's ACKs name it.
    pub peer_qpn: u32,
    pub start_psn: u32,
    /// Path MTU: payload bytes of every packet but the last of a message (256..=4096, a
    /// power of two).
    pub mtu: u32,
    /// The first frame the module writes (the receiver numbers the frames from it).
    pub first_frame: u64,
    /// How far apart the frames the module writes to this receiver are (1; n for one of n
    /// receivers of a temporal plan).
    #[serde(default = "one")]
    pub frame_stride: u64,
}

fn one() -> u64 {
    1
}

/// What a system manager asks of a RoCEv2 receiver beside the buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoceRequest {
    pub mtu: u32,
    pub first_frame: u64,
    pub frame_stride: u64,
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
    /// The receiver requires the CRC32C extension on every rdaq datagram.
    #[serde(default)]
    pub checksum: bool,
    /// A RoCEv2 receiver: module `m` writes through queue pair `roce[m]` to UDP port 4791.
    #[serde(default)]
    pub roce: Vec<RoceQp>,
}

impl BufferMap {
    /// The buffer frame `frame` goes to.
    pub fn buffer_for(&self, frame: u64) -> &LocalBufferInfo {
        &self.buffers[(frame % self.buffers.len() as u64) as usize]
    }
}

/// A data receiver's capabilities, published on its control API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiverTelegram {
    pub version: u32,
    pub name: String,
    /// Address the modules send data to.
    pub data: std::net::IpAddr,
    /// Memory it may register as local buffers.
    pub memory_bytes: u64,
    /// Receive engines it can run.
    pub engines: Vec<String>,
    pub max_payload_bytes: u32,
}

/// A detector's capabilities, published on its control API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DetectorTelegram {
    pub version: u32,
    pub name: String,
    pub modules: u16,
    pub module_bytes: u64,
    /// Links (UDP sources) per module.
    pub links_per_module: u16,
    pub max_payload_bytes: u32,
    /// Highest frame rate it can produce per module, measured when it started (frame
    /// synthesis is the limit of the emulator).
    pub max_rate_hz: f64,
    /// The detector's own packets it sends, as a receiver's buffer request names them
    /// (none: rdaq datagrams).
    #[serde(default)]
    pub native: Option<NativeRequest>,
}

/// What the system manager asks a receiver to define: frame slots holding the given modules
/// (global ids, in slot order), one data port per module from `data_port` on (0: any).
/// The receiver answers with its [`BufferMap`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BufferRequest {
    pub version: u32,
    pub modules: Vec<u16>,
    pub module_bytes: u64,
    pub payload_bytes: u32,
    pub slots: u64,
    pub data_port: u16,
    /// Require the CRC32C extension on every rdaq datagram.
    #[serde(default)]
    pub checksum: bool,
    /// Receive RoCEv2 WRITEs instead of rdaq datagrams.
    #[serde(default)]
    pub roce: Option<RoceRequest>,
    /// Receive a detector's native sls packets instead of rdaq datagrams.
    #[serde(default)]
    pub native: Option<NativeRequest>,
}

/// A detector that sends its own packets (slsDetectorPackage's), not rdaq datagrams: a
/// JUNGFRAU placed by packet number (`interfaces` per module, `read_rows` rows read out), or
/// a detector placed by its header's row and column (EIGER, a described detector), each
/// module on its ports from the request's `data_port` on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NativeRequest {
    /// A shipped description's name ("jungfrau", "eiger", ...) or a description's TOML
    /// text; never a path (a receiver reads no file a request names).
    pub detector: String,
    /// JUNGFRAU: UDP interfaces per module.
    #[serde(default = "one_u8")]
    pub interfaces: u8,
    /// JUNGFRAU: the rows each module reads out (`readnrows`).
    #[serde(default = "full_rows")]
    pub read_rows: u16,
    /// A detector placed by header: its pixel bit depth and link (default: the
    /// description's), chip gap pixels, and the detector's modules per row, which its
    /// header's column counts in.
    #[serde(default)]
    pub bit_depth: Option<u32>,
    #[serde(default)]
    pub link: Option<String>,
    #[serde(default)]
    pub gap_pixels: bool,
    #[serde(default = "one_u16")]
    pub module_cols: u16,
}

fn one_u8() -> u8 {
    1
}

fn one_u16() -> u16 {
    1
}

fn full_rows() -> u16 {
    512
}

/// One way out of a module: a receiver's data port, its buffers, and where in each buffer
/// this module's data goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    pub receiver: String,
    pub data: SocketAddr,
    /// A detector's own packets: port `p` of the module goes to `ports[p]` at `data`'s
    /// address (empty: rdaq datagrams to `data`).
    #[serde(default)]
    pub ports: Vec<u16>,
    pub buffers: Vec<LocalBufferInfo>,
    /// Byte offset of this module's frame in each buffer.
    pub offset: u64,
    /// Ring position of this route's first frame: a re-plan continues each receiver's ring
    /// where the previous plan left it, so no frame lands in a slot still in use.
    #[serde(default)]
    pub ring_start: u64,
    /// Datagrams on this route carry the CRC32C extension (the receiver's map says so).
    #[serde(default)]
    pub checksum: bool,
    /// RoCEv2 WRITEs through this queue pair instead of rdaq datagrams.
    #[serde(default)]
    pub roce: Option<RoceQp>,
}

/// A module's data transfer process, for frames from `from_frame` on: with
/// `j = f - from_frame`, frame `f` goes through route `j % routes` at ring position
/// `k = ring_start + j / routes`, into buffer `k % buffers`; with `broadcast`, through every
/// route at ring position `ring_start + j`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleDtp {
    pub version: u32,
    pub module: u16,
    #[serde(default)]
    pub from_frame: u64,
    pub module_bytes: u64,
    pub payload_bytes: u32,
    pub broadcast: bool,
    pub routes: Vec<Route>,
}

impl ModuleDtp {
    /// The hand configuration of a single receiver: module `module` of `map`, every frame
    /// to that receiver at `data` (the ring rule of [`BufferMap::buffer_for`]).
    pub fn single(map: &BufferMap, module: u16, data: SocketAddr) -> ModuleDtp {
        ModuleDtp {
            version: TELEGRAM_VERSION,
            module,
            from_frame: 0,
            module_bytes: map.module_bytes,
            payload_bytes: map.payload_bytes,
            broadcast: false,
            routes: vec![Route {
                receiver: "receiver".into(),
                data,
                ports: Vec::new(),
                buffers: map.buffers.clone(),
                offset: module as u64 * map.module_bytes,
                ring_start: 0,
                checksum: map.checksum,
                roce: map.roce.get(module as usize).copied(),
            }],
        }
    }

    /// Calls `f(route index, buffer)` for each destination of frame `frame` (none before
    /// `from_frame`).
    pub fn destinations(&self, frame: u64, mut f: impl FnMut(usize, &LocalBufferInfo)) {
        let n = self.routes.len() as u64;
        if n == 0 || frame < self.from_frame {
            return;
        }
        let j = frame - self.from_frame;
        let pick = |r: usize, k: u64| {
            let route = &self.routes[r];
            let b = &route.buffers;
            (!b.is_empty()).then(|| &b[((route.ring_start + k) % b.len() as u64) as usize])
        };
        if self.broadcast {
            for r in 0..n as usize {
                if let Some(b) = pick(r, j) {
                    f(r, b);
                }
            }
        } else {
            let r = (j % n) as usize;
            if let Some(b) = pick(r, j / n) {
                f(r, b);
            }
        }
    }

    /// Each route's receiver and the ring position its next frame would take if this DTP
    /// stopped at frame `until` (exclusive): where a following plan continues that ring.
    pub fn ring_next(&self, until: u64) -> Vec<(&str, u64)> {
        let n = self.routes.len() as u64;
        let frames = until.saturating_sub(self.from_frame);
        self.routes
            .iter()
            .enumerate()
            .map(|(r, route)| {
                let count = if self.broadcast { frames } else { (frames + n - 1 - r as u64) / n };
                (route.receiver.as_str(), route.ring_start + count)
            })
            .collect()
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
            buffers: (0..3).map(|i| LocalBufferInfo { id: i, key: 100 + i, size: 2 << 20, va: 0 }).collect(),
            checksum: true,
            roce: Vec::new(),
        };
        let j = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<BufferMap>(&j).unwrap(), m);
        assert_eq!(m.buffer_for(4).id, 1);
        let dtp = ModuleDtp::single(&m, 1, "127.0.0.1:5".parse().unwrap());
        let mut got = Vec::new();
        dtp.destinations(4, |r, b| got.push((r, b.id)));
        assert_eq!(got, vec![(0, 1)]);
        assert_eq!(dtp.routes[0].offset, 1 << 20);
    }

    #[test]
    fn dtp_round_robin_and_broadcast() {
        let bufs = |base: u32| (0..3).map(|i| LocalBufferInfo { id: base + i, key: 0, size: 1, va: 0 }).collect();
        let route = |n: &str, base| Route { receiver: n.into(), data: "127.0.0.1:1".parse().unwrap(), ports: Vec::new(), buffers: bufs(base), offset: 0, ring_start: 0, checksum: false, roce: None };
        let mut dtp = ModuleDtp {
            version: TELEGRAM_VERSION,
            module: 0,
            from_frame: 0,
            module_bytes: 1,
            payload_bytes: 1,
            broadcast: false,
            routes: vec![route("a", 10), route("b", 20)],
        };
        let dest = |d: &ModuleDtp, f| {
            let mut v = Vec::new();
            d.destinations(f, |r, b| v.push((r, b.id)));
            v
        };
        assert_eq!(dest(&dtp, 0), vec![(0, 10)]);
        assert_eq!(dest(&dtp, 1), vec![(1, 20)]);
        assert_eq!(dest(&dtp, 7), vec![(1, 20)], "frame 7 is b's 4th frame: buffer 3 % 3 = 0");
        assert_eq!(dtp.ring_next(7), vec![("a", 4), ("b", 3)], "a got 0,2,4,6; b got 1,3,5");
        // a re-plan from frame 7 that continues b's ring
        let mut next = dtp.clone();
        next.from_frame = 7;
        next.routes = vec![Route { ring_start: 3, ..dtp.routes[1].clone() }];
        assert_eq!(dest(&next, 6), vec![]);
        assert_eq!(dest(&next, 7), vec![(0, 20)], "ring position 3 of 3 buffers");
        assert_eq!(dest(&next, 8), vec![(0, 21)]);
        dtp.broadcast = true;
        assert_eq!(dest(&dtp, 4), vec![(0, 11), (1, 21)]);
        assert_eq!(dtp.ring_next(5), vec![("a", 5), ("b", 5)]);
    }
}
