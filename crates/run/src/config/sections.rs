//! The sections of the configuration, one struct each, with the defaults of `rdaq run`
//! (the emulated detector).

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use serde::{Deserialize, Serialize};

/// Where an acquisition's frames come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Source {
    /// The emulated detector, run in this process (`rdaq run`): its calibration is known.
    #[default]
    Emulated,
    /// A detector outside this process (`rdaq receive`, the receiver daemon): a real one,
    /// PSI's virtual one, or `rdaq emulate`.
    Remote,
}

/// The sample's rotation: a rotation series turns it about omega by `omega_increment_deg`
/// per image; 0 means stills (no goniometer in the files).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Goniometer {
    pub omega_start_deg: f64,
    pub omega_increment_deg: f64,
}

impl Goniometer {
    /// The rotation the files describe; `None` for stills.
    pub fn rotation(&self) -> Option<rdaq_sink::Rotation> {
        (self.omega_increment_deg != 0.0).then_some(rdaq_sink::Rotation { start_deg: self.omega_start_deg, increment_deg: self.omega_increment_deg })
    }
}

/// The Stream V2 publisher (docs/stream.md).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Stream {
    /// ZeroMQ endpoint to bind; "none" publishes nothing.
    pub endpoint: String,
    /// "push" (consumers share the images round-robin) or "pub" (each subscriber sees all).
    pub socket: String,
    /// Images queued at most before the policy applies.
    pub hwm: i32,
    /// "drop" (acquisition never waits for the stream; dropped images are counted) or
    /// "block" (nothing dropped; a slow consumer slows the acquisition, counted as waits).
    pub policy: String,
    /// ZeroMQ PUB endpoint of the live preview (`rdaq preview --from`); "none": off.
    pub preview: String,
    /// Preview images per second.
    pub preview_hz: f64,
}

impl Default for Stream {
    fn default() -> Self {
        Stream {
            endpoint: "tcp://127.0.0.1:31001".into(),
            socket: "push".into(),
            hwm: 100,
            policy: "drop".into(),
            preview: "tcp://127.0.0.1:31002".into(),
            preview_hz: 2.0,
        }
    }
}

impl Stream {
    /// This stream with each default endpoint whose port another process holds (a second
    /// acquisition on this host) moved to a free port of the same address, and what to say
    /// about it: two runs on one host both stream, the second where its summary says. An
    /// endpoint the configuration names stays as it is (its start fails when taken).
    pub fn off_busy_defaults(&self) -> (Stream, Vec<String>) {
        let d = Stream::default();
        let mut s = self.clone();
        let mut moved = Vec::new();
        for (field, e, default) in [("stream.endpoint", &mut s.endpoint, d.endpoint), ("stream.preview", &mut s.preview, d.preview)] {
            if let Some(free) = (*e == default).then(|| free_port_if_taken(&default)).flatten() {
                moved.push(format!("{field}: {default} is taken (another acquisition on this host?): this run uses a free port instead, named in its summary"));
                *e = free;
            }
        }
        (s, moved)
    }

    /// The publisher's settings; `None` when the stream is off.
    pub fn config(&self) -> anyhow::Result<Option<rdaq_stream::StreamConfig>> {
        use rdaq_stream::{Policy, SocketKind};
        if self.endpoint == "none" {
            return Ok(None);
        }
        let socket = match self.socket.as_str() {
            "push" => SocketKind::Push,
            "pub" => SocketKind::Pub,
            s => bail!("stream.socket must be \"push\" or \"pub\", not {s:?}"),
        };
        let policy = match self.policy.as_str() {
            "drop" => Policy::Drop,
            "block" => Policy::Block,
            p => bail!("stream.policy must be \"drop\" or \"block\", not {p:?}"),
        };
        if self.hwm < 1 {
            bail!("stream.hwm must be at least 1, not {}", self.hwm);
        }
        Ok(Some(rdaq_stream::StreamConfig { endpoint: self.endpoint.clone(), socket, hwm: self.hwm, policy }))
    }

    /// The preview publisher's settings and its period; `None` when the preview is off.
    pub fn preview_config(&self) -> anyhow::Result<Option<(rdaq_stream::StreamConfig, Duration)>> {
        if self.preview == "none" {
            return Ok(None);
        }
        if !(self.preview_hz > 0.0 && self.preview_hz.is_finite()) {
            bail!("stream.preview_hz must be positive, not {}", self.preview_hz);
        }
        let cfg = rdaq_stream::StreamConfig { endpoint: self.preview.clone(), socket: rdaq_stream::SocketKind::Pub, hwm: 4, policy: rdaq_stream::Policy::Drop };
        Ok(Some((cfg, Duration::from_secs_f64(1.0 / self.preview_hz))))
    }
}

/// Whether another process listens on the TCP address of `endpoint` (`tcp://host:port`).
/// `tcp://ADDRESS:0` (a port the system picks when the stream binds) when another process
/// holds the port of the TCP `endpoint`; `None` when it is free or not a TCP address.
pub fn free_port_if_taken(endpoint: &str) -> Option<String> {
    let addr = endpoint.strip_prefix("tcp://").and_then(|a| a.parse::<std::net::SocketAddr>().ok())?;
    let taken = std::net::TcpListener::bind(addr).is_err_and(|e| e.kind() == std::io::ErrorKind::AddrInUse);
    taken.then(|| format!("tcp://{}", std::net::SocketAddr::new(addr.ip(), 0)))
}

/// Online processing of JUNGFRAU frames (docs/processing.md).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Process {
    /// "jungfrau": convert, track the pedestal on dark frames, find spots, veto, compress;
    /// "spots": a counting detector's (EIGER's) counts as they come, with the spots found
    /// and the veto (`threshold_photons` in counts); "raw": write the raw words (a
    /// described detector's counts); "auto": "jungfrau" where the calibration is known (the
    /// emulated detector in this process, or `calibration` given), "raw" otherwise.
    pub mode: String,
    /// Where conversion, spot finding and pedestal tracking run: "cpu", or "gpu" (a CUDA
    /// device; the CPU workers then compress). Raw runs have no processing to move.
    pub backend: String,
    /// Frames on the GPU at once (1..=32; each holds one frame's device buffers, about 32
    /// bytes a pixel), shared by the workers.
    pub gpu_lanes: usize,
    /// GPU workers that may process a signal frame on the CPU (conversion, spots, the
    /// veto) when every lane is busy, instead of waiting for one (0: none).
    pub gpu_cpu_workers: usize,
    /// Pixels written: "kev" (float32), "photons16" or "photons32" (counts, int16/int32), or
    /// "auto": int16 counts when every count the calibration can give fits, else int32.
    pub output: String,
    /// The invalid gain code 10: "error", "g0" or "g2".
    pub invalid_gain: String,
    /// Calibration file: rdaq's (`rdaq process pedestal`, a pedestal run), or a pedestal file
    /// of PSI's tools (jungfrau_utils' layout: its pedestals and bad pixels, the gains of
    /// `gain_maps` or typical ones); "emulated": the emulated detector's own calibration (of
    /// `detector.seed`); empty: the emulated detector's own in `rdaq run`, none for a
    /// detector outside this process.
    pub calibration: PathBuf,
    /// The largest share (0 to 1) of a module's pixels a calibration file may mask: a file
    /// that masks more is refused at start (1: any is taken).
    pub max_masked: f64,
    /// PSI's gain map files, one per module in module order (`gainMaps_M<id>.bin`): they
    /// replace the calibration's gains; the pedestals stay the calibration's.
    pub gain_maps: Vec<PathBuf>,
    /// The detector runs in fixed high gain: G0's gains are the gain maps' HG0 map (and G0's
    /// pedestal a PSI pedestal file's HG0 pedestal).
    pub hg0: bool,
    /// Dark frames in the pedestal's running window, and how often (in dark frames, once
    /// the window is full) the converters take the tracked G0 pedestal.
    pub pedestal_window: u32,
    pub pedestal_publish: u32,
    /// The spot finder: "local" (local SNR), or "peakfinder8" (a counting detector's
    /// counts, `process.mode = "spots"`: its ADC threshold `threshold_photons` counts,
    /// minimum SNR `snr`, `min_pixels` to `max_pixels` pixels, background ring
    /// `local_bg_radius`, radii from the beam centre).
    pub finder: String,
    /// peakfinder8's local background radius in pixels.
    pub local_bg_radius: i32,
    /// Spot finder: threshold in photons, SNR, box half-size (local SNR), pixels per spot.
    pub threshold_photons: f32,
    pub snr: f32,
    pub box_half: usize,
    pub min_pixels: u32,
    pub max_pixels: u32,
    /// A frame is a hit with at least this many spots; with `veto`, other signal frames
    /// are not written.
    pub min_spots: usize,
    pub veto: bool,
    /// Spots kept per frame in the file (all are counted).
    pub max_spots: usize,
    /// Chunk codec: "lz4" or "zstd" (at zstd_level).
    pub codec: String,
    pub zstd_level: i32,
    /// Process workers, each taking a signal frame through conversion, spot finding, the
    /// veto and compression on one core; raw frames: assembly and compression (0: the
    /// thread budget's, [`crate::budget`]).
    pub workers: usize,
    /// Pedestal bands: stages that each track their part of every dark frame's pixels
    /// (0: the thread budget's share for the dark frames, at least 1).
    pub pedestal_bands: usize,
    /// CPUs to pin the process workers and then the pedestal bands to, in order (empty: not
    /// pinned).
    pub cpus: Vec<usize>,
    /// Frames queued per worker: the process (or assemble) workers take from one shared ring
    /// of `workers x ring_frames` frames; each pedestal band and the writer has a ring of its
    /// own of `ring_frames`.
    pub ring_frames: usize,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
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
#[derive(Clone, Debug, Deserialize, Serialize)]
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
    /// The consumer (writing, processing) waits this long per frame: a consumer slower than
    /// the detector, to test a full ring.
    pub consumer_delay_ms: f64,
    /// Emulated module `slow_module` takes `slow_ms` longer for every frame (0: none): a
    /// module thread that a busy machine runs less often than the others.
    pub slow_module: u16,
    pub slow_ms: f64,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Detector {
    /// The detector: "jungfrau" (emulated in `rdaq run` as modules sending rdaq
    /// datagrams), or a detector placed by its packets' header (a shipped description,
    /// "eiger", or a description file: docs/detectors.md), whose own packets `rdaq run`
    /// emulates with a counting pattern and `rdaq receive` takes.
    pub name: String,
    /// A detector placed by header: the pixel bit depth and the link it sends (default:
    /// the description's).
    pub bit_depth: Option<u32>,
    pub link: Option<String>,
    /// Modules (JUNGFRAU: 1024 x 512 pixels each).
    pub modules: u16,
    /// Modules per row of the module grid (fast axis); modules fill rows in order.
    pub module_cols: u16,
    /// Gap pixels between modules along the fast (x) and slow (y) axes.
    pub gap_x: usize,
    pub gap_y: usize,
    /// Seed of the synthetic frames: same seed, same bytes.
    pub seed: u64,
    pub photon_energy_kev: f64,
    /// The detector's distance from the sample, in metres, and where the direct beam meets
    /// it, in pixels (fast x, slow y; none: the image's centre), for the files.
    pub distance_m: f64,
    pub beam_center_x: Option<f64>,
    pub beam_center_y: Option<f64>,
    /// How the detector's frames are triggered, for the files: internal, external (each
    /// trigger signal starts a trigger's frames) or gate (the signal's length is each
    /// frame's exposure).
    pub trigger_mode: String,
    pub background_photons: f64,
    pub spots_per_frame: f64,
    /// Fraction of signal frames with a crystal in the beam (Bragg spots).
    pub hit_fraction: f64,
    /// Beam chopper: `chopper_dark` dark frames then `chopper_signal` signal frames,
    /// repeating from frame 0 (chopper_dark = 0: no chopper).
    pub chopper_dark: u32,
    pub chopper_signal: u32,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Emulator {
    pub frames: u64,
    /// Frames per second; 0 sends as fast as possible.
    pub rate_hz: f64,
    /// Use UDP generic segmentation offload where the kernel has it.
    pub gso: bool,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Network {
    /// Receiver data address.
    pub bind: IpAddr,
    /// First data port (module m uses port + m); 0 lets the kernel choose free ports.
    pub data_port: u16,
    /// Payload bytes per datagram.
    pub payload_bytes: u32,
    pub recv_buffer_mib: usize,
    /// Datagrams per receive call.
    pub batch: usize,
    /// Receive engine: "recvmmsg", "io_uring" or "af_xdp".
    pub engine: String,
    /// Pin the receive thread to this CPU (none: not pinned).
    pub recv_cpu: Option<usize>,
    /// Longest the receiver lets datagrams gather between two reads of a running stream
    /// (fewer wake-ups for slow streams, at most this much latency; 0: read at once).
    pub coalesce_ms: f64,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
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

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Output {
    pub dir: PathBuf,
    /// Files are `<name>_master.h5`, `<name>_data_000001.h5`, ... and `<name>_manifest.csv`.
    pub name: String,
    /// Images per data file (default 1000, as Dectris detectors write them).
    pub images_per_file: usize,
    /// Exit 0 even if frames were lost or incomplete.
    pub tolerate_loss: bool,
    /// Replace the files of an earlier run of the same name (default: number this run,
    /// `<name>_000002`, and keep the earlier files).
    pub overwrite: bool,
}

impl Default for Detector {
    fn default() -> Self {
        Detector {
            name: "jungfrau".into(),
            bit_depth: None,
            link: None,
            modules: 2,
            module_cols: 1,
            gap_x: rdaq_detector::geometry::DEFAULT_GAP_X,
            gap_y: rdaq_detector::geometry::DEFAULT_GAP_Y,
            seed: 1,
            photon_energy_kev: 12.4,
            distance_m: 0.1,
            beam_center_x: None,
            beam_center_y: None,
            trigger_mode: "internal".into(),
            background_photons: 0.01,
            spots_per_frame: 30.0,
            hit_fraction: 0.5,
            chopper_dark: 1,
            chopper_signal: 1,
        }
    }
}

impl Default for Process {
    fn default() -> Self {
        Process {
            mode: "auto".into(),
            output: "auto".into(),
            invalid_gain: "error".into(),
            calibration: PathBuf::new(),
            max_masked: 0.1,
            gain_maps: Vec::new(),
            hg0: false,
            pedestal_window: 128,
            pedestal_publish: 32,
            finder: "local".into(),
            local_bg_radius: 3,
            threshold_photons: 0.5,
            snr: 3.0,
            box_half: 15,
            min_pixels: 4,
            max_pixels: 200,
            min_spots: 10,
            veto: true,
            max_spots: 500,
            codec: "lz4".into(),
            zstd_level: 3,
            backend: "cpu".into(),
            gpu_lanes: 8,
            gpu_cpu_workers: 0,
            workers: 0,
            pedestal_bands: 0,
            cpus: Vec::new(),
            ring_frames: 4,
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
        let coalesce = rdaq_receiver::ReceiverConfig::default().coalesce;
        Network { bind: IpAddr::from([127, 0, 0, 1]), data_port: 0, payload_bytes: 8192, recv_buffer_mib: 64, batch: 64, engine: "recvmmsg".into(), recv_cpu: None, coalesce_ms: coalesce.as_secs_f64() * 1e3 }
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
            consumer_delay_ms: 0.0,
            slow_module: 0,
            slow_ms: 0.0,
        }
    }
}

impl Faults {
    /// The consumer's wait per frame (zero: none).
    pub fn consumer_delay(&self) -> Duration {
        Duration::from_secs_f64(self.consumer_delay_ms.max(0.0) / 1e3)
    }

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
            slow: (self.slow_ms > 0.0)
                .then(|| rdaq_emulator::Slow { module: self.slow_module, per_frame: Duration::from_secs_f64(self.slow_ms / 1e3) }),
            ..Default::default()
        };
        (!f.is_clean()).then_some(f)
    }
}

impl Default for Output {
    fn default() -> Self {
        Output {
            dir: PathBuf::from("out"),
            name: "rdaq_run".into(),
            images_per_file: rdaq_sink::IMAGES_PER_FILE,
            tolerate_loss: false,
            overwrite: false,
        }
    }
}

/// The sample, as the files name it.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sample {
    /// `/entry/sample/name` (empty: not written).
    pub name: String,
}
