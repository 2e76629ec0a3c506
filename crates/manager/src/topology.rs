//! The topology file (TOML): the detector, the data receivers and the transfer mode. Every
//! inconsistency is found before anything starts, with an error that names the field.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use rdaq_detector::geometry::MAX_GAP;
use rdaq_detector::Geometry;
use serde::Deserialize;
use thiserror::Error;

/// Frames a receiver must be able to hold at once, at the least.
pub const MIN_SLOTS: u64 = 2;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    pub detector: DetectorSpec,
    #[serde(default)]
    pub receivers: Vec<ReceiverSpec>,
    #[serde(default)]
    pub transfer: TransferSpec,
    /// Online processing in every receiver: the `[process]` section of the run
    /// configuration (rdaq.example.toml), checked by the manager's runtime; none: the
    /// receivers write raw frames.
    #[serde(default)]
    pub process: Option<toml::Table>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetectorSpec {
    /// The detector: a shipped description ("jungfrau", the default, whose emulated modules
    /// send rdaq datagrams; "eiger") or a description file. A detector placed by header
    /// sends its own packets ([`crate::sends`]).
    #[serde(default)]
    pub name: Option<String>,
    /// A detector placed by header: its pixel bit depth and link (default: the
    /// description's).
    #[serde(default)]
    pub bit_depth: Option<u32>,
    #[serde(default)]
    pub link: Option<String>,
    pub modules: u16,
    /// Control API of the detector (the emulator daemon), for `rdaq manage`.
    #[serde(default)]
    pub control: Option<SocketAddr>,
    /// Modules per grid row (fast axis); default 1 (modules stacked along the slow axis).
    #[serde(default = "rdaq_detector::geometry::default_module_cols")]
    pub module_cols: u16,
    #[serde(default = "rdaq_detector::geometry::default_gap_x")]
    pub gap_x: usize,
    #[serde(default = "rdaq_detector::geometry::default_gap_y")]
    pub gap_y: usize,
    /// What the processing needs of the detector, as in the run configuration's
    /// `[detector]` (default there): the photon energy, the seed of the emulated detector's
    /// calibration, the beam chopper.
    #[serde(default)]
    pub photon_energy_kev: Option<f64>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub chopper_dark: Option<u32>,
    #[serde(default)]
    pub chopper_signal: Option<u32>,
}

fn one() -> u16 {
    1
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiverSpec {
    pub name: String,
    /// Control API address (HTTP).
    pub control: SocketAddr,
    /// Data address the modules send to.
    pub data: IpAddr,
    /// First data port; the receiver uses one port per module it serves from here on
    /// (0: ports chosen by the receiver's kernel, reported in its buffer map).
    pub data_port: u16,
    /// Memory for frame buffers.
    pub memory_mib: u64,
    /// The Stream V2 endpoint its acquisitions publish on ("none": off); default
    /// [`ReceiverSpec::default_stream`], so that receivers sharing a host do not clash.
    #[serde(default)]
    pub stream: Option<String>,
    /// The live preview endpoint its acquisitions publish on (`rdaq preview --from`);
    /// default none.
    #[serde(default)]
    pub preview: Option<String>,
}

/// The first receiver's default Stream V2 port (the `rdaq run` default); receiver k of the
/// topology gets this plus 2k (the port after each is left for a preview).
pub const FIRST_STREAM_PORT: u16 = 31001;

impl ReceiverSpec {
    /// The default stream endpoint of the `k`-th receiver of a topology.
    pub fn default_stream(k: usize) -> String {
        format!("tcp://127.0.0.1:{}", FIRST_STREAM_PORT as usize + 2 * k)
    }
}

/// How frames and modules are spread over receivers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TransferMode {
    /// Whole frames round-robin over the receivers (PERCIVAL's backend).
    #[default]
    Temporal,
    /// Modules split over the receivers; every receiver sees every frame.
    Spatial,
    /// Every receiver gets everything.
    Broadcast,
    /// Receivers in `groups` groups: frames round-robin over the groups, modules split
    /// within a group.
    SpatialTemporal,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransferSpec {
    #[serde(default)]
    pub mode: TransferMode,
    /// Receivers taking part, by name; default all.
    #[serde(default)]
    pub receivers: Option<Vec<String>>,
    /// Groups for spatial-temporal.
    #[serde(default = "one")]
    pub groups: u16,
    #[serde(default = "payload")]
    pub payload_bytes: u32,
    /// Every rdaq datagram carries a CRC32C of header and payload, verified by the receivers.
    #[serde(default)]
    pub checksum: bool,
    /// Send RoCEv2 RDMA WRITEs with this path MTU instead of rdaq datagrams (the receivers
    /// run the AF_XDP engine: `rdaq receive --serve ... --engine af_xdp`).
    #[serde(default)]
    pub roce_mtu: Option<u32>,
}

fn payload() -> u32 {
    8192
}

impl Default for TransferSpec {
    fn default() -> Self {
        TransferSpec { mode: TransferMode::default(), receivers: None, groups: 1, payload_bytes: payload(), checksum: false, roce_mtu: None }
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum TopologyError {
    #[error("topology file: {0}")]
    Parse(crate::tomldoc::TomlError),
    #[error("detector.modules must be at least 1")]
    NoModules,
    #[error("detector.module_cols {cols} does not divide detector.modules {modules} into whole rows")]
    Geometry { modules: u16, cols: u16 },
    #[error("receivers: at least one data receiver is needed")]
    NoReceivers,
    #[error("receivers: the name {0:?} is used twice")]
    DuplicateName(String),
    #[error("receivers.{0}.{1}: endpoint {2} is used by another stream or preview on its host")]
    DuplicateStream(String, &'static str, String),
    #[error("receivers.{0}.control: address {1} is used by another receiver")]
    DuplicateControl(String, SocketAddr),
    #[error("receivers.{0}.data_port: ports {1}..{2} on {3} overlap another receiver's")]
    DuplicateData(String, u16, u16, IpAddr),
    #[error("receivers.{0}.data_port: ports {1}.. run past 65535")]
    PortRange(String, u16),
    #[error("transfer.receivers: unknown receiver {0:?}")]
    UnknownReceiver(String),
    #[error("transfer.receivers: {0:?} is listed twice")]
    ReceiverListedTwice(String),
    #[error("transfer.groups: {receivers} receivers cannot form {groups} equal groups")]
    Groups { receivers: usize, groups: u16 },
    #[error("transfer: {receivers} receivers per group for {modules} modules; spatial modes need at most one receiver per module")]
    TooManyReceivers { receivers: usize, modules: u16 },
    #[error("transfer.payload_bytes must be 1..={max}, not {0}", max = rdaq_proto::MAX_PAYLOAD)]
    Payload(u32),
    /// What the detector sends does not fit (the message names the field).
    #[error("{0}")]
    Detector(String),
    #[error("receiver {0} answered with a buffer map that does not match its buffer request")]
    BadBufferMap(String),
    #[error("receivers.{name}.memory_mib: {memory_mib} MiB holds {slots} frames of {slot_mib:.1} MiB for this plan; it needs at least {MIN_SLOTS}")]
    BuffersTooSmall { name: String, memory_mib: u64, slots: u64, slot_mib: f64 },
}

impl Topology {
    /// Parses and checks a topology.
    pub fn from_toml(text: &str) -> Result<Topology, TopologyError> {
        let t: Topology = crate::tomldoc::parse(text).map_err(TopologyError::Parse)?;
        t.check()?;
        Ok(t)
    }

    pub fn geometry(&self) -> Geometry {
        let d = &self.detector;
        Geometry::new(d.modules, d.module_cols, d.gap_x, d.gap_y).expect("checked")
    }

    /// The receivers taking part, in transfer order (indices into `receivers`).
    pub fn participants(&self) -> Vec<usize> {
        match &self.transfer.receivers {
            None => (0..self.receivers.len()).collect(),
            Some(names) => names.iter().map(|n| self.receivers.iter().position(|r| &r.name == n).expect("checked")).collect(),
        }
    }

    /// Everything that can be checked without talking to anyone, plan sizes included.
    pub fn check(&self) -> Result<(), TopologyError> {
        let d = &self.detector;
        if d.modules == 0 {
            return Err(TopologyError::NoModules);
        }
        if Geometry::new(d.modules, d.module_cols, d.gap_x, d.gap_y).is_none() {
            return Err(TopologyError::Geometry { modules: d.modules, cols: d.module_cols });
        }
        if d.gap_x.max(d.gap_y) > MAX_GAP {
            return Err(TopologyError::Detector(format!("detector.gap_x and gap_y must be at most {MAX_GAP} pixels (a module's width), not {} and {}", d.gap_x, d.gap_y)));
        }
        if self.receivers.is_empty() {
            return Err(TopologyError::NoReceivers);
        }
        let mut names = HashSet::new();
        let mut controls = HashSet::new();
        for r in &self.receivers {
            if !names.insert(r.name.as_str()) {
                return Err(TopologyError::DuplicateName(r.name.clone()));
            }
            if !controls.insert(r.control) {
                return Err(TopologyError::DuplicateControl(r.name.clone(), r.control));
            }
        }
        self.check_streams()?;
        let p = self.transfer.payload_bytes;
        if p == 0 || p as usize > rdaq_proto::MAX_PAYLOAD {
            return Err(TopologyError::Payload(p));
        }
        if let Some(list) = &self.transfer.receivers {
            let mut seen = HashSet::new();
            for n in list {
                if !names.contains(n.as_str()) {
                    return Err(TopologyError::UnknownReceiver(n.clone()));
                }
                if !seen.insert(n.as_str()) {
                    return Err(TopologyError::ReceiverListedTwice(n.clone()));
                }
            }
        }
        Ok(())
    }
}

impl Topology {
    /// Each receiver's Stream V2 endpoint ("none": off), as given or by default.
    pub fn streams(&self) -> Vec<String> {
        self.receivers.iter().enumerate().map(|(k, r)| r.stream.clone().unwrap_or_else(|| ReceiverSpec::default_stream(k))).collect()
    }

    /// Each receiver's preview endpoint ("none": off, the default).
    pub fn previews(&self) -> Vec<String> {
        self.receivers.iter().map(|r| r.preview.clone().unwrap_or_else(|| "none".into())).collect()
    }

    /// No two streams or previews of one host (the receivers' control address) publish on
    /// the same endpoint: two TCP endpoints on one port clash whatever their addresses (a
    /// wildcard bind takes the port on every address).
    fn check_streams(&self) -> Result<(), TopologyError> {
        let mut seen = HashSet::new();
        let endpoints = self.streams().into_iter().map(|e| ("stream", e)).zip(self.previews().into_iter().map(|e| ("preview", e)));
        for (r, (stream, preview)) in self.receivers.iter().zip(endpoints) {
            for (field, e) in [stream, preview] {
                let key = match e.strip_prefix("tcp://").and_then(|a| a.rsplit_once(':')) {
                    Some((_, port)) if port != "0" => format!("tcp port {port}"),
                    _ => e.clone(),
                };
                if e != "none" && !seen.insert((r.control.ip(), key)) {
                    return Err(TopologyError::DuplicateStream(r.name.clone(), field, e));
                }
            }
        }
        Ok(())
    }
}
