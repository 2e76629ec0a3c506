//! What the topology's detector sends: JUNGFRAU modules as rdaq datagrams into the
//! receivers' buffers (the emulated detector daemon's default), or a described detector's
//! own sls packets placed by their header (EIGER, `detector.name`), each module on one data
//! port per port of its description. A detector's own packets go where its ports were
//! configured, frame after frame: every module has one receiver for the whole run.

use rdaq_detector::description::{Description, Place};
use rdaq_detector::MODULE_BYTES;
use rdaq_proto::telegram::NativeRequest;

use crate::topology::{Topology, TopologyError, TransferMode};

/// What each module sends, as the receivers must hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sends {
    /// Bytes of one module frame in a receiver's slot.
    pub module_bytes: u64,
    /// Data ports per module.
    pub ports: usize,
    /// The described detector's settings, for the receivers' buffer requests and the
    /// detector's check (none: rdaq datagrams).
    pub native: Option<NativeRequest>,
}

impl Sends {
    /// What `t`'s detector sends; errors name the field.
    pub fn of(t: &Topology) -> Result<Sends, TopologyError> {
        let d = &t.detector;
        let bad =
            |field: &str, why: String| TopologyError::Detector(format!("detector.{field}: {why}"));
        let name = d.name.as_deref().unwrap_or("jungfrau");
        let desc = Description::load(name).map_err(|e| bad("name", e.to_string()))?;
        if desc.ports.place != Place::Header {
            // placed by packet number: JUNGFRAU, whose emulated modules send rdaq datagrams
            if d.bit_depth.is_some() || d.link.is_some() {
                return Err(bad("bit_depth", format!("bit_depth and link are settings of a detector placed by header; {} sends 16-bit rdaq datagrams", desc.name)));
            }
            return Ok(Sends {
                module_bytes: MODULE_BYTES as u64,
                ports: 1,
                native: None,
            });
        }
        let wire = desc.wire(d.bit_depth, d.link.as_deref()).map_err(|e| bad(e.field, e.why))?;
        let tx = &t.transfer;
        let one_receiver_per_module = match tx.mode {
            TransferMode::Spatial => true,
            TransferMode::Broadcast => false,
            TransferMode::Temporal => t.participants().len() == 1,
            TransferMode::SpatialTemporal => tx.groups == 1,
        };
        if !one_receiver_per_module {
            return Err(TopologyError::Detector(format!(
                "transfer.mode: {} sends each module's packets to the ports it was configured with, frame after frame; \
                 use spatial (or one receiver)",
                desc.name
            )));
        }
        if tx.roce_mtu.is_some() || tx.checksum {
            return Err(TopologyError::Detector(format!("transfer: roce_mtu and checksum are settings of rdaq datagrams; {} sends its own packets", desc.name)));
        }
        let text = Description::text(name).map_err(|e| bad("name", e.to_string()))?;
        let native = NativeRequest {
            detector: text,
            interfaces: 1,
            read_rows: 512,
            bit_depth: Some(wire.bits),
            link: Some(wire.link.clone()),
            gap_pixels: false,
            module_cols: d.module_cols,
        };
        Ok(Sends {
            module_bytes: wire.module_bytes() as u64,
            ports: wire.ports,
            native: Some(native),
        })
    }

    /// Whether a detector that says it sends `native` in module frames of `module_bytes`
    /// sends what the topology says; otherwise what differs.
    pub fn agrees(&self, native: Option<&NativeRequest>, module_bytes: u64) -> Result<(), String> {
        let same = match (&self.native, native) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                let (da, db) = (
                    Description::named_or_text(&a.detector).ok(),
                    Description::named_or_text(&b.detector).ok(),
                );
                da.is_some()
                    && da == db
                    && (a.bit_depth, &a.link, a.module_cols)
                        == (b.bit_depth, &b.link, b.module_cols)
            }
            _ => false,
        };
        if same && module_bytes == self.module_bytes {
            return Ok(());
        }
        Err(format!("the topology's detector sends {} in module frames of {} bytes; the detector sends {} in module frames of {module_bytes} bytes", what(self.native.as_ref()), self.module_bytes, what(native)))
    }
}

/// What a detector sends, in words.
fn what(n: Option<&NativeRequest>) -> String {
    match n {
        None => "JUNGFRAU rdaq datagrams".into(),
        Some(n) => {
            let name = Description::named_or_text(&n.detector)
                .map_or_else(|_| "an unreadable description".into(), |d| d.name);
            format!(
                "{name} packets of {} bits on link {}, {} module(s) per row",
                n.bit_depth.unwrap_or(0),
                n.link.as_deref().unwrap_or("?"),
                n.module_cols
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Plan;
    use rdaq_proto::telegram::{BufferMap, LocalBufferInfo, TELEGRAM_VERSION};

    fn topo(detector: &str, mode: &str, receivers: usize) -> String {
        let mut s =
            format!("[detector]\nmodules = 2\n{detector}\n\n[transfer]\nmode = \"{mode}\"\n");
        for i in 0..receivers {
            s += &format!("\n[[receivers]]\nname = \"dr{i}\"\ncontrol = \"10.0.0.{}:7000\"\ndata = \"10.0.0.{}\"\ndata_port = 50000\nmemory_mib = 64\n", i + 1, i + 1);
        }
        s
    }

    #[test]
    fn an_eiger_sends_its_ports_of_its_bit_depth_to_one_receiver_per_module() {
        let t =
            Topology::from_toml(&topo("name = \"eiger\"\nbit_depth = 12", "spatial", 2)).unwrap();
        let s = Sends::of(&t).unwrap();
        assert_eq!((s.module_bytes, s.ports), (1024 * 512 * 3 / 2, 4));
        let n = s.native.clone().unwrap();
        assert_eq!(
            (n.bit_depth, n.link.as_deref()),
            (Some(12), Some("10g")),
            "the description's fastest link"
        );
        let jf = Sends::of(&Topology::from_toml(&topo("", "temporal", 2)).unwrap()).unwrap();
        assert_eq!(
            (jf.module_bytes, jf.ports, jf.native),
            (rdaq_detector::MODULE_BYTES as u64, 1, None)
        );
        assert!(s.agrees(Some(&n), s.module_bytes).is_ok());
        let other = s
            .agrees(
                Some(&NativeRequest {
                    bit_depth: Some(16),
                    ..n.clone()
                }),
                1 << 20,
            )
            .unwrap_err();
        assert!(
            other.contains("12 bits") && other.contains("16 bits"),
            "{other}"
        );
        assert!(s
            .agrees(None, 1 << 20)
            .unwrap_err()
            .contains("JUNGFRAU rdaq datagrams"));

        // each module's route names its receiver's four ports
        let plan = Plan::new(&t).unwrap();
        let maps: Vec<BufferMap> = plan
            .buffer_requests(&t)
            .iter()
            .enumerate()
            .map(|(i, (_, r))| {
                assert_eq!(r.native.as_ref(), Some(&n));
                let base = 50000 + 10 * i as u16;
                let buffers = (0..r.slots as u32)
                    .map(|id| LocalBufferInfo {
                        id,
                        key: 1,
                        size: r.module_bytes,
                        va: 0,
                    })
                    .collect();
                BufferMap {
                    version: TELEGRAM_VERSION,
                    modules: 1,
                    module_bytes: r.module_bytes,
                    payload_bytes: 4096,
                    data_ports: (base..base + 4).collect(),
                    buffers,
                    checksum: false,
                    roce: Vec::new(),
                }
            })
            .collect();
        let dtps = plan.module_dtps(&t, &maps).unwrap();
        assert_eq!(dtps[1].routes.len(), 1);
        assert_eq!(dtps[1].routes[0].ports, vec![50010, 50011, 50012, 50013]);
        assert_eq!(dtps[1].routes[0].receiver, "dr1");
    }

    #[test]
    fn a_native_detector_is_refused_where_its_modules_would_change_receiver() {
        for (detector, mode, receivers, field) in [
            ("name = \"eiger\"", "temporal", 2, "transfer.mode"),
            ("name = \"eiger\"", "broadcast", 1, "transfer.mode"),
            (
                "name = \"eiger\"\nbit_depth = 24",
                "spatial",
                2,
                "detector.bit_depth",
            ),
            (
                "name = \"eiger\"\nlink = \"100g\"",
                "spatial",
                2,
                "detector.link",
            ),
            ("name = \"nosuch\"", "spatial", 2, "detector.name"),
            ("bit_depth = 16", "temporal", 2, "detector.bit_depth"),
        ] {
            let e = Topology::from_toml(&topo(detector, mode, receivers))
                .and_then(|t| Sends::of(&t).map(|_| ()))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(field), "{detector} {mode}: {e}");
        }
        assert!(
            Topology::from_toml(&topo("name = \"eiger\"", "temporal", 1)).and_then(|t| Sends::of(&t)).is_ok(),
            "one receiver holds every module for the whole run"
        );
    }
}
