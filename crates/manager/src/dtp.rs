//! Data transfer processes: which receiver, buffer and offset each module's frame goes to.
//!
//! Receivers that take part are cut into groups (one per receiver in temporal mode, one of
//! all in spatial mode, several in spatial-temporal mode). Frame `f` goes to group
//! `f % groups` (or to every group when broadcasting); within a group, the modules are split
//! into contiguous runs, one per receiver. A receiver stores each frame it gets in its next
//! slot: its `k`-th frame in slot `k % slots`, module runs packed in module order.

use std::net::{IpAddr, SocketAddr};

use rdaq_detector::Geometry;
use rdaq_proto::telegram::{BufferMap, BufferRequest, ModuleDtp, RoceRequest, Route, TELEGRAM_VERSION};

use crate::sends::Sends;
use crate::topology::{Topology, TopologyError, TransferMode, MIN_SLOTS};

/// What one receiver gets under the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceiverPlan {
    /// Index into the topology's receivers.
    pub receiver: usize,
    /// Group index.
    pub group: usize,
    /// The modules it holds, in order; module `modules[i]` at byte `i * module_bytes`.
    pub modules: Vec<u16>,
    /// Frame slots its memory holds.
    pub slots: u64,
    /// Bytes of one module frame in its slots.
    pub module_bytes: u64,
}

impl ReceiverPlan {
    pub fn slot_bytes(&self) -> u64 {
        self.modules.len() as u64 * self.module_bytes
    }

    /// How this receiver assembles its frames: the detector's geometry when it holds every
    /// module, else its modules stacked in one column with the detector's gaps.
    pub fn geometry(&self, detector: Geometry) -> Geometry {
        if self.modules.len() == detector.modules as usize {
            detector
        } else {
            Geometry::new(self.modules.len() as u16, 1, detector.gap_x, detector.gap_y).expect("one column fits any count")
        }
    }
}

/// Where one module frame goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Destination {
    /// Index into the topology's receivers.
    pub receiver: usize,
    /// Slot (local buffer index) on that receiver.
    pub slot: u64,
    /// Byte offset of the module's data in the slot.
    pub offset: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub mode: TransferMode,
    pub receivers: Vec<ReceiverPlan>,
    /// Plan indices (into `receivers`) per group.
    pub groups: Vec<Vec<usize>>,
    /// For each module, per group, the plan index of the receiver holding it.
    holder: Vec<Vec<usize>>,
    /// What each module sends.
    pub sends: Sends,
}

impl Plan {
    pub fn new(t: &Topology) -> Result<Plan, TopologyError> {
        let sends = Sends::of(t)?;
        let parts = t.participants();
        let n = parts.len();
        // `transfer.receivers = []`, or a re-plan with every receiver gone
        if n == 0 {
            return Err(TopologyError::NoReceivers);
        }
        let modules = t.detector.modules;
        let groups = match t.transfer.mode {
            TransferMode::Temporal => n,
            TransferMode::Spatial | TransferMode::Broadcast => 1,
            TransferMode::SpatialTemporal => {
                let g = t.transfer.groups as usize;
                if g == 0 || n % g != 0 {
                    return Err(TopologyError::Groups { receivers: n, groups: t.transfer.groups });
                }
                g
            }
        };
        // broadcast: every receiver is its own group and gets all frames and modules
        let (groups, per_group) = if t.transfer.mode == TransferMode::Broadcast { (n, 1) } else { (groups, n / groups) };
        if per_group > modules as usize {
            return Err(TopologyError::TooManyReceivers { receivers: per_group, modules });
        }
        let mut receivers = Vec::with_capacity(n);
        let mut group_members = vec![Vec::new(); groups];
        let mut holder = vec![vec![0usize; groups]; modules as usize];
        for (i, &r) in parts.iter().enumerate() {
            let (g, k) = (i / per_group, i % per_group);
            // contiguous module runs, sizes differing by at most one
            let lo = (k * modules as usize / per_group) as u16;
            let hi = ((k + 1) * modules as usize / per_group) as u16;
            let mods: Vec<u16> = (lo..hi).collect();
            for &m in &mods {
                holder[m as usize][g] = receivers.len();
            }
            group_members[g].push(receivers.len());
            let slot = mods.len() as u64 * sends.module_bytes;
            receivers.push(ReceiverPlan { receiver: r, group: g, modules: mods, slots: (t.receivers[r].memory_mib << 20) / slot, module_bytes: sends.module_bytes });
        }
        let plan = Plan { mode: t.transfer.mode, receivers, groups: group_members, holder, sends };
        plan.check_receivers(t)?;
        Ok(plan)
    }

    /// Checks what depends on the plan: each receiver's data ports (one per module it
    /// serves, or per port of it) fit and do not overlap another's, and its memory holds
    /// enough frame slots.
    fn check_receivers(&self, t: &Topology) -> Result<(), TopologyError> {
        let mut ranges: Vec<(IpAddr, u32, u32)> = Vec::new();
        for rp in &self.receivers {
            let spec = &t.receivers[rp.receiver];
            let end = spec.data_port as u32 + (rp.modules.len() * self.sends.ports) as u32;
            if end > 65_536 {
                return Err(TopologyError::PortRange(spec.name.clone(), spec.data_port));
            }
            let fixed = spec.data_port != 0;
            if fixed && ranges.iter().any(|(ip, a, b)| *ip == spec.data && (spec.data_port as u32) < *b && *a < end) {
                return Err(TopologyError::DuplicateData(spec.name.clone(), spec.data_port, end as u16, spec.data));
            }
            if fixed {
                ranges.push((spec.data, spec.data_port as u32, end));
            }
            let slot = rp.slot_bytes();
            let slots = (spec.memory_mib << 20) / slot;
            if slots < MIN_SLOTS {
                return Err(TopologyError::BuffersTooSmall {
                    name: spec.name.clone(),
                    memory_mib: spec.memory_mib,
                    slots,
                    slot_mib: slot as f64 / (1u64 << 20) as f64,
                });
            }
        }
        Ok(())
    }

    /// The frames a RoCEv2 receiver of the plan gets from each module, from the first DTP
    /// (frame 0): every frame when broadcasting or with one group, else those of its group.
    fn roce_request(&self, rp: &ReceiverPlan, mtu: u32) -> RoceRequest {
        let n = self.groups.len() as u64;
        if self.mode == TransferMode::Broadcast || n == 1 {
            RoceRequest { mtu, first_frame: 0, frame_stride: 1 }
        } else {
            RoceRequest { mtu, first_frame: rp.group as u64, frame_stride: n }
        }
    }

    /// What each receiver of the plan must define, with its index in the topology.
    pub fn buffer_requests(&self, t: &Topology) -> Vec<(usize, BufferRequest)> {
        self.receivers
            .iter()
            .map(|rp| {
                let req = BufferRequest {
                    version: TELEGRAM_VERSION,
                    modules: rp.modules.clone(),
                    module_bytes: self.sends.module_bytes,
                    payload_bytes: t.transfer.payload_bytes,
                    slots: rp.slots,
                    data_port: t.receivers[rp.receiver].data_port,
                    checksum: t.transfer.checksum,
                    roce: t.transfer.roce_mtu.map(|mtu| self.roce_request(rp, mtu)),
                    native: self.sends.native.clone(),
                };
                (rp.receiver, req)
            })
            .collect()
    }

    /// Each module's DTP from the first frame, from the buffer maps the receivers answered
    /// with (`maps[i]` for plan receiver `i`, as ordered by [`Plan::buffer_requests`]). A
    /// receiver's buffer map is authoritative for its ports, buffers and keys.
    pub fn module_dtps(&self, t: &Topology, maps: &[BufferMap]) -> Result<Vec<ModuleDtp>, TopologyError> {
        self.module_dtps_from(t, maps, 0, |_| 0)
    }

    /// Each module's DTP for frames from `from_frame` on, each receiver's ring continuing at
    /// `ring_start(name)` (see `ModuleDtp::ring_next` of the plan it replaces).
    pub fn module_dtps_from(
        &self,
        t: &Topology,
        maps: &[BufferMap],
        from_frame: u64,
        ring_start: impl Fn(&str) -> u64,
    ) -> Result<Vec<ModuleDtp>, TopologyError> {
        assert_eq!(maps.len(), self.receivers.len(), "one buffer map per plan receiver");
        for (rp, map) in self.receivers.iter().zip(maps) {
            let name = &t.receivers[rp.receiver].name;
            if map.data_ports.len() != rp.modules.len() * self.sends.ports || map.buffers.is_empty() || map.module_bytes != self.sends.module_bytes {
                return Err(TopologyError::BadBufferMap(name.clone()));
            }
        }
        Ok((0..t.detector.modules)
            .map(|m| {
                let routes = (0..self.groups.len())
                    .map(|g| {
                        let pi = self.holder[m as usize][g];
                        let (rp, map) = (&self.receivers[pi], &maps[pi]);
                        let spec = &t.receivers[rp.receiver];
                        let idx = rp.modules.iter().position(|&x| x == m).expect("holder holds the module");
                        let ports = &map.data_ports[idx * self.sends.ports..(idx + 1) * self.sends.ports];
                        Route {
                            receiver: spec.name.clone(),
                            data: SocketAddr::new(spec.data, ports[0]),
                            ports: if self.sends.native.is_some() { ports.to_vec() } else { Vec::new() },
                            buffers: map.buffers.clone(),
                            offset: idx as u64 * self.sends.module_bytes,
                            ring_start: ring_start(&spec.name),
                            checksum: map.checksum,
                            roce: map.roce.get(idx).copied(),
                        }
                    })
                    .collect();
                ModuleDtp {
                    version: TELEGRAM_VERSION,
                    module: m,
                    from_frame,
                    module_bytes: self.sends.module_bytes,
                    payload_bytes: t.transfer.payload_bytes,
                    broadcast: self.mode == TransferMode::Broadcast,
                    routes,
                }
            })
            .collect())
    }

    /// Appends where module `module`'s frame `frame` goes to `out` (several destinations when
    /// broadcasting). `slots` of every receiver must be non-zero (the topology check).
    pub fn destinations(&self, module: u16, frame: u64, out: &mut Vec<Destination>) {
        let g_count = self.groups.len() as u64;
        let groups: std::ops::Range<u64> = if self.mode == TransferMode::Broadcast { 0..g_count } else { frame % g_count..frame % g_count + 1 };
        let k = if self.mode == TransferMode::Broadcast { frame } else { frame / g_count };
        for g in groups {
            let rp = &self.receivers[self.holder[module as usize][g as usize]];
            let idx = rp.modules.iter().position(|&m| m == module).expect("holder holds the module") as u64;
            out.push(Destination { receiver: rp.receiver, slot: k % rp.slots, offset: idx * self.sends.module_bytes });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;

    fn topo(mode: &str, receivers: usize, extra: &str) -> String {
        let mut s = format!("[detector]\nmodules = 4\nmodule_cols = 2\n\n[transfer]\nmode = \"{mode}\"\n{extra}\n");
        for i in 0..receivers {
            s += &format!(
                "\n[[receivers]]\nname = \"dr{i}\"\ncontrol = \"10.0.0.{}:7000\"\ndata = \"10.0.0.{}\"\ndata_port = 50000\nmemory_mib = 64\n",
                i + 1,
                i + 1
            );
        }
        s
    }

    fn all(p: &Plan, frames: u64) -> Vec<(u16, u64, Destination)> {
        let mut out = Vec::new();
        for f in 0..frames {
            for m in 0..4u16 {
                let mut d = Vec::new();
                p.destinations(m, f, &mut d);
                out.extend(d.into_iter().map(|d| (m, f, d)));
            }
        }
        out
    }

    #[test]
    fn temporal_sends_whole_frames_round_robin() {
        let t = Topology::from_toml(&topo("temporal", 2, "")).unwrap();
        let p = Plan::new(&t).unwrap();
        let d = all(&p, 10);
        assert_eq!(d.len(), 40, "each module frame exactly once");
        for (m, f, dst) in d {
            assert_eq!(dst.receiver, (f % 2) as usize);
            assert_eq!(dst.offset, m as u64 * rdaq_detector::MODULE_BYTES as u64);
            assert_eq!(dst.slot, (f / 2) % p.receivers[dst.receiver].slots);
        }
        assert_eq!(p.receivers[0].slots, 16, "64 MiB of 4 MiB frames");
    }

    #[test]
    fn spatial_gives_each_receiver_its_modules() {
        let t = Topology::from_toml(&topo("spatial", 2, "")).unwrap();
        let p = Plan::new(&t).unwrap();
        assert_eq!(p.receivers[0].modules, vec![0, 1]);
        assert_eq!(p.receivers[1].modules, vec![2, 3]);
        for (m, f, dst) in all(&p, 6) {
            assert_eq!(dst.receiver, (m / 2) as usize);
            assert_eq!(dst.offset, (m % 2) as u64 * rdaq_detector::MODULE_BYTES as u64);
            assert_eq!(dst.slot, f % 32);
        }
    }

    #[test]
    fn broadcast_and_spatial_temporal() {
        let t = Topology::from_toml(&topo("broadcast", 3, "")).unwrap();
        let p = Plan::new(&t).unwrap();
        assert_eq!(all(&p, 4).len(), 4 * 4 * 3);
        let t = Topology::from_toml(&topo("spatial-temporal", 4, "groups = 2")).unwrap();
        let p = Plan::new(&t).unwrap();
        for (m, f, dst) in all(&p, 8) {
            let group = (f % 2) as usize;
            assert_eq!(dst.receiver, group * 2 + (m / 2) as usize, "frame {f} module {m}");
        }
    }

    /// The system manager re-plans only when every remaining receiver keeps the buffer
    /// request it has. A RoCEv2 queue pair numbers frames by a counter with the plan's stride,
    /// part of the request, so a temporal RoCEv2 plan is never re-planned over fewer receivers
    /// (the frames of a lost one are lost), while a broadcast one keeps every receiver's frames.
    #[test]
    fn roce_requests_change_exactly_when_a_replan_would_renumber_frames() {
        let requests = |mode: &str, extra: &str| {
            let t = Topology::from_toml(&topo(mode, 3, extra)).unwrap();
            let mut fewer = t.clone();
            fewer.transfer.receivers = Some(vec!["dr0".into(), "dr1".into()]);
            let of = |t: &Topology| Plan::new(t).unwrap().buffer_requests(t).into_iter().take(2).map(|(_, r)| r).collect::<Vec<_>>();
            (of(&t), of(&fewer))
        };
        let (three, two) = requests("temporal", "roce_mtu = 4096");
        assert_eq!(three.iter().map(|r| r.roce.unwrap().frame_stride).collect::<Vec<_>>(), [3, 3]);
        assert!(three.iter().zip(&two).all(|(a, b)| a != b), "a temporal RoCEv2 re-plan would change every request");
        let (three, two) = requests("temporal", "");
        assert_eq!(three, two, "without RoCEv2 the remaining receivers keep their buffers");
        let (three, two) = requests("broadcast", "roce_mtu = 4096");
        assert_eq!(three, two, "broadcast receivers get every frame before and after");
    }

    #[test]
    fn the_example_topology_is_valid() {
        let t = Topology::from_toml(include_str!("../../../topology.example.toml")).unwrap();
        let p = Plan::new(&t).unwrap();
        assert_eq!((t.detector.modules, p.receivers.len(), p.receivers[0].slots), (8, 2, 128));
        assert_eq!((t.geometry().width(), t.geometry().height()), (2 * 1024 + 8, 4 * 512 + 3 * 36));
    }

    #[test]
    fn streams_and_previews_of_one_host_do_not_share_an_endpoint() {
        let one_host = topo("temporal", 2, "").replace("10.0.0.2:7000", "10.0.0.1:7001");
        assert!(Topology::from_toml(&one_host).is_ok(), "the default streams differ");
        let clash = one_host.replacen("memory_mib = 64\n", "memory_mib = 64\npreview = \"tcp://*:31003\"\n", 1);
        let e = Topology::from_toml(&clash).unwrap_err().to_string();
        assert!(e.starts_with("receivers.dr1.stream: endpoint tcp://127.0.0.1:31003"), "dr0's preview (every address) takes dr1's default stream's port: {e}");
        let own = one_host.replacen("memory_mib = 64\n", "memory_mib = 64\npreview = \"tcp://127.0.0.1:31001\"\n", 1);
        let e = Topology::from_toml(&own).unwrap_err().to_string();
        assert!(e.starts_with("receivers.dr0.preview"), "{e}");
        let t = Topology::from_toml(&one_host.replacen("memory_mib = 64\n", "memory_mib = 64\npreview = \"tcp://127.0.0.1:31002\"\n", 1)).unwrap();
        assert_eq!(t.previews(), ["tcp://127.0.0.1:31002", "none"]);
    }

    #[test]
    fn bad_topologies_are_refused_with_the_field() {
        use TopologyError as E;
        // what the document says, then what the plan of it needs
        let bad = |s: &str| Topology::from_toml(s).and_then(|t| Plan::new(&t).map(|_| ())).unwrap_err();
        assert_eq!(bad(&topo("temporal", 0, "")), E::NoReceivers);
        assert!(matches!(bad(&topo("spatial-temporal", 3, "groups = 2")), E::Groups { .. }));
        assert!(matches!(bad(&topo("spatial", 5, "")), E::TooManyReceivers { .. }));
        assert_eq!(bad(&topo("temporal", 2, "receivers = [\"dr0\", \"dr9\"]")), E::UnknownReceiver("dr9".into()));
        for mode in ["temporal", "spatial", "broadcast", "spatial-temporal"] {
            assert_eq!(bad(&topo(mode, 2, "receivers = []")), E::NoReceivers, "{mode}: an empty list of receivers taking part");
        }
        assert!(matches!(bad(&topo("sideways", 2, "")), E::Parse(_)));
        let dup = topo("temporal", 2, "").replace("10.0.0.2:7000", "10.0.0.1:7000");
        assert!(matches!(bad(&dup), E::DuplicateControl(..)));
        let dup = topo("temporal", 2, "").replace("data = \"10.0.0.2\"", "data = \"10.0.0.1\"");
        assert!(matches!(bad(&dup), E::DuplicateData(..)));
        let small = topo("temporal", 2, "").replace("memory_mib = 64", "memory_mib = 6");
        let e = bad(&small);
        assert!(e.to_string().contains("receivers.dr0.memory_mib"), "{e}");
        // spatial needs only 2 modules per receiver: 6 MiB holds 3 frames of 2 MiB
        assert!(Plan::new(&Topology::from_toml(&topo("spatial", 2, "").replace("memory_mib = 64", "memory_mib = 6")).unwrap()).is_ok());
        let geo = topo("temporal", 1, "").replace("module_cols = 2", "module_cols = 3");
        assert!(matches!(bad(&geo), E::Geometry { .. }));
        let unknown = topo("temporal", 1, "").replace("[detector]", "[detector]\nmodulez = 3");
        assert!(matches!(bad(&unknown), E::Parse(m) if m.to_string().contains("modulez")));
    }
}
