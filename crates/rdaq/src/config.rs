//! The TOML configuration of `rdaq run`: every field has a default, unknown fields are
//! errors that name the field, and values are checked before anything starts.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub detector: Detector,
    pub emulator: Emulator,
    pub network: Network,
    pub receiver: ReceiverCfg,
    pub reliability: Reliability,
    pub faults: Faults,
    pub output: Output,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Reliability {
    /// Every rdaq datagram carries a CRC32C of header and payload, verified by the receiver
    /// (corrupted datagrams are dropped and asked for again).
    pub checksum: bool,
    /// The receiver asks the modules to resend what was lost.
    pub retransmit: bool,
    /// Memory per module for the frames it can resend.
    pub history_mib: u64,
    /// Loss window per data channel, in sequence numbers, and how far behind the newest a
    /// missing one counts as lost.
    pub loss_window: u32,
    pub loss_lag: u32,
    /// A frame with nothing new for this long is asked for what it lacks; again every
    /// interval, at most `nack_retries` times.
    pub nack_quiet_ms: u64,
    pub nack_interval_ms: u64,
    pub nack_retries: u32,
}

/// Faults injected into the emulator's sending (for tests; all zero: none).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    pub seed: u64,
    pub loss: f64,
    pub burst: f64,
    pub reorder: f64,
    pub duplicate: f64,
    pub delay: f64,
    pub delay_ms: f64,
    pub corrupt: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Detector {
    /// JUNGFRAU modules (1024 x 512 pixels each).
    pub modules: u16,
    /// Modules per row of the module grid (fast axis); modules fill rows in order.
    pub module_cols: u16,
    /// Gap pixels between modules along the fast (x) and slow (y) axes.
    pub gap_x: usize,
    pub gap_y: usize,
    /// Seed of the synthetic frames: same seed, same bytes.
    pub seed: u64,
    pub photon_energy_kev: f64,
    pub background_photons: f64,
    pub spots_per_frame: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Emulator {
    pub frames: u64,
    /// Frames per second; 0 sends as fast as possible.
    pub rate_hz: f64,
    /// Use UDP generic segmentation offload where the kernel has it.
    pub gso: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Network {
    /// Receiver data address.
    pub bind: IpAddr,
    /// First data port (module m uses port + m); 0 lets the kernel choose free ports.
    pub data_port: u16,
    /// Payload bytes per datagram.
    pub payload_bytes: u32,
    pub recv_buffer_mib: usize,
    /// Datagrams per recvmmsg call.
    pub batch: usize,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReceiverCfg {
    /// Memory for the frame ring; the slot count is this over the frame size.
    pub ring_mib: usize,
    /// An incomplete frame is finished this long after its first datagram.
    pub frame_timeout_ms: u64,
    /// "keep": hand on incomplete frames with missing pixels marked; "discard": drop them.
    pub policy: String,
    /// Land payloads at their predicted destination (no user-space copy for in-order data).
    pub predict: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Output {
    pub dir: PathBuf,
    /// Files are `<name>.h5` and `<name>_manifest.csv`.
    pub name: String,
    /// Exit 0 even if frames were lost or incomplete.
    pub tolerate_loss: bool,
}

impl Default for Detector {
    fn default() -> Self {
        Detector {
            modules: 2,
            module_cols: 1,
            gap_x: rdaq_detector::geometry::DEFAULT_GAP_X,
            gap_y: rdaq_detector::geometry::DEFAULT_GAP_Y,
            seed: 1,
            photon_energy_kev: 12.4,
            background_photons: 0.01,
            spots_per_frame: 30.0,
        }
    }
}

impl Default for Emulator {
    fn default() -> Self {
        Emulator { frames: 1000, rate_hz: 100.0, gso: true }
    }
}

impl Default for Network {
    fn default() -> Self {
        Network { bind: IpAddr::from([127, 0, 0, 1]), data_port: 0, payload_bytes: 8192, recv_buffer_mib: 64, batch: 64 }
    }
}

impl Default for ReceiverCfg {
    fn default() -> Self {
        ReceiverCfg { ring_mib: 512, frame_timeout_ms: 500, policy: "keep".into(), predict: true }
    }
}

impl Default for Reliability {
    fn default() -> Self {
        let n = rdaq_receiver::engine::NackConfig::default();
        Reliability {
            checksum: false,
            retransmit: true,
            history_mib: 64,
            loss_window: 1024,
            loss_lag: 512,
            nack_quiet_ms: n.quiet.as_millis() as u64,
            nack_interval_ms: n.interval.as_millis() as u64,
            nack_retries: n.retries,
        }
    }
}

impl Default for Faults {
    fn default() -> Self {
        let f = rdaq_emulator::FaultConfig::default();
        Faults {
            seed: f.seed,
            loss: f.loss,
            burst: f.burst,
            reorder: f.reorder,
            duplicate: f.duplicate,
            delay: f.delay,
            delay_ms: f.delay_time.as_secs_f64() * 1e3,
            corrupt: f.corrupt,
        }
    }
}

impl Faults {
    /// The emulator's fault configuration; `None` when no fault is asked for.
    pub fn config(&self) -> Option<rdaq_emulator::FaultConfig> {
        let f = rdaq_emulator::FaultConfig {
            seed: self.seed,
            loss: self.loss,
            burst: self.burst,
            reorder: self.reorder,
            duplicate: self.duplicate,
            delay: self.delay,
            delay_time: Duration::from_secs_f64(self.delay_ms.max(0.0) / 1e3),
            corrupt: self.corrupt,
            ..Default::default()
        };
        (!f.is_clean()).then_some(f)
    }
}

impl Default for Output {
    fn default() -> Self {
        Output { dir: PathBuf::from("out"), name: "rdaq_run".into(), tolerate_loss: false }
    }
}

const MAX_PAYLOAD: u32 = rdaq_proto::MAX_PAYLOAD as u32;

impl Config {
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let cfg: Config = toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.message().trim()))
            .with_context(|| format!("invalid configuration {}", path.display()))?;
        Ok(cfg)
    }

    pub fn check(&self) -> anyhow::Result<()> {
        if self.detector.modules == 0 || self.detector.modules > 64 {
            bail!("detector.modules must be 1..=64, not {}", self.detector.modules);
        }
        if self.geometry().is_none() {
            bail!("detector.module_cols {} must divide detector.modules {} into whole rows", self.detector.module_cols, self.detector.modules);
        }
        if !(self.detector.photon_energy_kev > 0.0) {
            bail!("detector.photon_energy_kev must be positive");
        }
        if !(self.emulator.rate_hz >= 0.0) || !self.emulator.rate_hz.is_finite() {
            bail!("emulator.rate_hz must be 0 (as fast as possible) or positive");
        }
        if self.network.payload_bytes == 0 || self.network.payload_bytes > MAX_PAYLOAD {
            bail!("network.payload_bytes must be 1..={MAX_PAYLOAD}, not {}", self.network.payload_bytes);
        }
        if self.network.batch == 0 || self.network.batch > 1024 {
            bail!("network.batch must be 1..=1024, not {}", self.network.batch);
        }
        if self.slots() < 2 {
            bail!("receiver.ring_mib {} holds fewer than 2 frames of {} MiB", self.receiver.ring_mib, self.frame_bytes() >> 20);
        }
        self.policy()?;
        let r = &self.reliability;
        if r.loss_window < 64 || r.loss_window % 64 != 0 || r.loss_lag >= r.loss_window {
            bail!("reliability.loss_window {} must be a multiple of 64 and larger than reliability.loss_lag {}", r.loss_window, r.loss_lag);
        }
        if r.retransmit && (r.nack_retries == 0 || r.history_mib == 0) {
            bail!("reliability.nack_retries and reliability.history_mib must be at least 1 with retransmission on");
        }
        if let Some(f) = self.faults.config() {
            f.check().map_err(anyhow::Error::msg)?;
        }
        if self.output.name.is_empty() || self.output.name.contains('/') {
            bail!("output.name must be a plain file name, not {:?}", self.output.name);
        }
        Ok(())
    }

    pub fn geometry(&self) -> Option<rdaq_detector::Geometry> {
        let d = &self.detector;
        rdaq_detector::Geometry::new(d.modules, d.module_cols, d.gap_x, d.gap_y)
    }

    pub fn frame_bytes(&self) -> usize {
        self.detector.modules as usize * rdaq_detector::MODULE_BYTES
    }

    pub fn slots(&self) -> usize {
        (self.receiver.ring_mib << 20) / self.frame_bytes()
    }

    pub fn policy(&self) -> anyhow::Result<rdaq_receiver::IncompletePolicy> {
        parse_policy(&self.receiver.policy).context("receiver.policy")
    }

    pub fn frame_timeout(&self) -> Duration {
        Duration::from_millis(self.receiver.frame_timeout_ms)
    }

    pub fn rate(&self) -> Option<f64> {
        (self.emulator.rate_hz > 0.0).then_some(self.emulator.rate_hz)
    }

    /// `base` with this configuration's network and receiver settings.
    pub fn tune(&self, base: rdaq_receiver::ReceiverConfig) -> anyhow::Result<rdaq_receiver::ReceiverConfig> {
        Ok(rdaq_receiver::ReceiverConfig {
            recv_buffer: self.network.recv_buffer_mib << 20,
            batch: self.network.batch,
            frame_timeout: self.frame_timeout(),
            policy: self.policy()?,
            predict: self.receiver.predict,
            linger: Duration::from_millis(300).max(self.frame_timeout()),
            checksum: self.reliability.checksum,
            loss_window: (self.reliability.loss_window, self.reliability.loss_lag),
            nack: self.reliability.retransmit.then(|| rdaq_receiver::engine::NackConfig {
                quiet: Duration::from_millis(self.reliability.nack_quiet_ms),
                interval: Duration::from_millis(self.reliability.nack_interval_ms),
                retries: self.reliability.nack_retries,
                ..Default::default()
            }),
            ..base
        })
    }

    /// The emulator for `modules` modules with this configuration's frames, rate and data.
    pub fn emulator(&self, modules: u16) -> rdaq_emulator::EmulatorConfig {
        rdaq_emulator::EmulatorConfig {
            modules,
            frames: self.emulator.frames,
            rate_hz: self.rate(),
            gso: self.emulator.gso,
            synth: self.synth(),
            history_bytes: if self.reliability.retransmit { self.reliability.history_mib << 20 } else { 0 },
            faults: self.faults.config(),
            ..Default::default()
        }
    }

    pub fn synth(&self) -> rdaq_detector::SynthConfig {
        rdaq_detector::SynthConfig {
            seed: self.detector.seed,
            photon_energy_kev: self.detector.photon_energy_kev as f32,
            background_photons: self.detector.background_photons,
            spots_per_frame: self.detector.spots_per_frame,
            ..Default::default()
        }
    }
}

pub fn parse_policy(s: &str) -> anyhow::Result<rdaq_receiver::IncompletePolicy> {
    match s {
        "keep" => Ok(rdaq_receiver::IncompletePolicy::Keep),
        "discard" => Ok(rdaq_receiver::IncompletePolicy::Discard),
        other => bail!("policy must be \"keep\" or \"discard\", not {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_files_are_checked() {
        Config::default().check().unwrap();
        let c: Config = toml::from_str("[emulator]\nframes = 5\n").unwrap();
        assert_eq!((c.emulator.frames, c.detector.modules), (5, 2));
        let e = toml::from_str::<Config>("[emulator]\nframez = 5\n").unwrap_err();
        assert!(e.to_string().contains("framez"), "{e}");
        let mut c = Config::default();
        c.receiver.policy = "maybe".into();
        assert!(format!("{:#}", c.check().unwrap_err()).contains("receiver.policy"));
        let mut c = Config::default();
        c.receiver.ring_mib = 2;
        assert!(c.check().unwrap_err().to_string().contains("ring_mib"));
    }

    #[test]
    fn the_example_file_shows_the_defaults() {
        let c: Config = toml::from_str(include_str!("../../../rdaq.example.toml")).unwrap();
        c.check().unwrap();
        let d = Config::default();
        assert_eq!(format!("{c:?}"), format!("{d:?}"));
    }
}
