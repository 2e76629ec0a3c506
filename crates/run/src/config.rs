//! The TOML configuration of every acquisition (`rdaq run`, `rdaq receive`, the receiver
//! daemon, a topology's `[process]`, Python's `Acquisition`): every field has a default
//! (the entry point's: [`Config::default`] for the emulated detector, [`Config::remote`] for
//! one outside this process), a file sets some fields over it, unknown fields are errors
//! that name the field, and values are checked before anything starts.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub detector: Detector,
    pub emulator: Emulator,
    pub network: Network,
    pub receiver: ReceiverCfg,
    pub reliability: Reliability,
    pub faults: Faults,
    pub process: Process,
    pub output: Output,
    pub stream: Stream,
    pub goniometer: Goniometer,
    /// Where the frames come from; set by the entry point, not in the file.
    #[serde(skip)]
    pub source: Source,
}

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
    /// "raw": write the raw words; "auto": "jungfrau" where the calibration is known (the
    /// emulated detector in this process, or `calibration` given), "raw" otherwise.
    pub mode: String,
    /// Where conversion, spot finding and pedestal tracking run: "cpu", or "gpu" (a CUDA
    /// device; the CPU workers then compress). Raw runs have no processing to move.
    pub backend: String,
    /// Frames on the GPU at once (1..=32; each holds one frame's device buffers, about 32
    /// bytes a pixel), shared by the workers.
    pub gpu_lanes: usize,
    /// Pixels written: "kev" (float32), "photons16" or "photons32" (counts, int16/int32), or
    /// "auto": int16 counts when every count the calibration can give fits, else int32.
    pub output: String,
    /// The invalid gain code 10: "error", "g0" or "g2".
    pub invalid_gain: String,
    /// Calibration file; "emulated": the emulated detector's own calibration (of
    /// `detector.seed`); empty: the emulated detector's own in `rdaq run`, none for a
    /// detector outside this process.
    pub calibration: PathBuf,
    /// PSI's gain map files, one per module in module order (`gainMaps_M<id>.bin`): they
    /// replace the calibration's gains; the pedestals stay the calibration's.
    pub gain_maps: Vec<PathBuf>,
    /// The detector runs in fixed high gain: G0's gains are the gain maps' HG0 map.
    pub hg0: bool,
    /// Dark frames in the pedestal's running window, and how often (in dark frames, once
    /// the window is full) the converters take the tracked G0 pedestal.
    pub pedestal_window: u32,
    pub pedestal_publish: u32,
    /// Local-SNR spot finder: threshold in photons, SNR, box half-size, pixels per spot.
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
    /// Frames each stage worker's input ring holds.
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
            gain_maps: Vec::new(),
            hg0: false,
            pedestal_window: 128,
            pedestal_publish: 32,
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

const MAX_PAYLOAD: u32 = rdaq_proto::MAX_PAYLOAD as u32;

pub use rdaq_detector::geometry::MAX_GAP;
/// Synthetic Bragg spots per module frame, and mean background photons per pixel, at most.
const MAX_SPOTS_PER_FRAME: f64 = 10_000.0;
const MAX_BACKGROUND: f64 = 10_000.0;
/// Threads of one kind per CPU, at most.
const THREADS_PER_CPU: usize = 4;

/// The longest time a command line gives in seconds (a timeout, an idle time): 30 days.
pub const MAX_SECONDS: f64 = 30.0 * 86_400.0;

/// Reads a time in seconds from the command line (clap's `value_parser`): a finite number
/// above 0 and at most [`MAX_SECONDS`], so that it is a duration and every wait ends.
pub fn seconds_arg(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if v > 0.0 && v <= MAX_SECONDS {
        Ok(v)
    } else {
        Err(format!("{s} s: give a time above 0 and at most {MAX_SECONDS} s (30 days)"))
    }
}

/// Reads a photon energy in keV from the command line (clap's `value_parser`): finite and
/// within the energies a detector of this kind is used at.
pub fn photon_kev_arg(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a photon energy in keV"))?;
    if (MIN_PHOTON_KEV..=MAX_PHOTON_KEV).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s} keV: give a photon energy of {MIN_PHOTON_KEV} to {MAX_PHOTON_KEV} keV"))
    }
}

const MAX_FRAME_TIMEOUT_MS: u64 = rdaq_receiver::config::MAX_FRAME_TIMEOUT.as_millis() as u64;
/// Photon energies a detector of this kind is used at (JUNGFRAU: 2-25 keV), with room.
const MIN_PHOTON_KEV: f64 = 0.1;
const MAX_PHOTON_KEV: f64 = 200.0;
/// Spots kept per frame in the files, and frames each process worker holds, at most.
const MAX_SPOTS: usize = 100_000;
const MAX_RING_FRAMES: usize = 4096;
/// The most frames on a GPU at once (each holds a frame's device buffers: 570 MB for a 16M).
const MAX_GPU_LANES: usize = 32;

/// This machine's memory in MiB (from /proc/meminfo; unknown: no bound).
pub fn physical_mib() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = text.lines().find_map(|l| l.strip_prefix("MemTotal:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    kib.map_or(u64::MAX, |k| k >> 10)
}

impl Config {
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        Config::load_over(Config::default(), path)
    }

    /// The defaults of an acquisition of a detector outside this process (`rdaq receive`,
    /// the receiver daemon): one module, the slsDetectorPackage's first data port (50001), a
    /// 256 MiB ring, no beam chopper (every frame a signal frame unless told), no preview.
    pub fn remote() -> Config {
        let mut c = Config { source: Source::Remote, ..Config::default() };
        c.detector.modules = 1;
        (c.detector.chopper_dark, c.detector.chopper_signal) = (0, 1);
        c.network.data_port = 50001;
        c.receiver.ring_mib = 256;
        c.stream.preview = "none".into();
        c
    }

    /// The configuration file `path` over `base` (an entry point's defaults): the fields the
    /// file sets replace the base's, the others keep it. Errors name the file, the field
    /// and its line.
    pub fn load_over(base: Config, path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        Config::parse_over(base, &text, &path.display().to_string())
    }

    /// The configuration text `text` (named `origin` in errors) over `base`, as
    /// [`Config::load_over`] takes a file's.
    pub fn parse_over(base: Config, text: &str, origin: &str) -> anyhow::Result<Config> {
        let invalid = || format!("invalid configuration {origin}");
        // every error is found on the text alone, where its line is known
        rdaq_manager::tomldoc::parse::<Config>(text).with_context(invalid)?;
        let file: toml::Table = text.parse().with_context(invalid)?;
        Config::with_sections(base, file).with_context(invalid)
    }

    /// `sections` (tables of this configuration's fields, as a file has them) over `base`.
    /// An error names the field.
    pub fn with_sections(base: Config, sections: toml::Table) -> anyhow::Result<Config> {
        let mut doc = toml::Table::try_from(&base).context("the base configuration")?;
        merge(&mut doc, sections);
        let merged: Config = serde_path_to_error::deserialize(toml::Value::Table(doc)).map_err(|e| anyhow::anyhow!("{}: {}", e.path(), e.inner().to_string().trim()))?;
        Ok(Config { source: base.source, ..merged })
    }

    /// What the files say of an acquisition with this configuration, the detector image
    /// `geometry` and (when processing) its `calibration`: the pixel type, the codec and
    /// spot lists, the beam, the images per file, the rotation. What only the source knows
    /// (the number of images, the exposure and the period) is left unknown.
    pub fn file_meta(&self, geometry: rdaq_detector::Geometry, calibration: Option<&rdaq_process::Calibration>) -> anyhow::Result<rdaq_sink::NxmxMeta> {
        let mut meta = rdaq_sink::NxmxMeta::jungfrau(geometry, self.detector.photon_energy_kev, 0.0);
        meta.pixel = self.pixel_type(calibration)?;
        meta.images_per_file = self.output.images_per_file;
        meta.rotation = self.goniometer.rotation();
        if self.processing() {
            meta.codec = rdaq_process::bitshuffle::Codec::parse(&self.process.codec, self.process.zstd_level)?;
            meta.max_spots = self.process.max_spots;
        }
        Ok(meta)
    }

    /// The processing backend: "cpu", or "gpu" where this machine has one (a one-line error
    /// naming what is missing otherwise).
    fn check_backend(&self) -> anyhow::Result<()> {
        match self.process.backend.as_str() {
            "cpu" => Ok(()),
            "gpu" => rdaq_gpu::probe().map(drop).map_err(|e| anyhow::anyhow!("process.backend = \"gpu\": {e}")),
            b => bail!("process.backend must be \"cpu\" or \"gpu\", not {b:?}"),
        }
    }

    /// The files, the stream and what they say about the sample.
    fn check_outputs(&self) -> anyhow::Result<()> {
        let (stream, preview) = (self.stream.config()?, self.stream.preview_config()?);
        if (stream.is_some() || preview.is_some()) && self.processing() && self.process.codec != "lz4" {
            bail!("stream: Stream V2 carries bitshuffle-LZ4 images only; set process.codec = \"lz4\", or stream.endpoint and stream.preview = \"none\"");
        }
        if !(self.goniometer.omega_start_deg.is_finite() && self.goniometer.omega_increment_deg.is_finite()) {
            bail!("goniometer.omega_start_deg and omega_increment_deg must be finite");
        }
        if self.output.images_per_file == 0 {
            bail!("output.images_per_file must be at least 1");
        }
        Ok(())
    }

    pub fn check(&self) -> anyhow::Result<()> {
        if self.detector.modules == 0 || self.detector.modules > 64 {
            bail!("detector.modules must be 1..=64, not {}", self.detector.modules);
        }
        self.check_sizes()?;
        if self.geometry().is_none() {
            bail!("detector.module_cols {} must divide detector.modules {} into whole rows", self.detector.module_cols, self.detector.modules);
        }
        if !(MIN_PHOTON_KEV..=MAX_PHOTON_KEV).contains(&self.detector.photon_energy_kev) {
            bail!("detector.photon_energy_kev must be {MIN_PHOTON_KEV} to {MAX_PHOTON_KEV} keV, not {}", self.detector.photon_energy_kev);
        }
        if self.described()?.is_none() && (self.detector.bit_depth.is_some() || self.detector.link.is_some()) {
            bail!("detector.bit_depth and detector.link are settings of a detector placed by header (detector.name), not of JUNGFRAU");
        }
        self.check_outputs()?;
        self.check_backend()?;
        if self.emulator.frames == 0 {
            bail!("emulator.frames must be at least 1");
        }
        if self.emulator.rate_hz != 0.0 {
            rdaq_emulator::config::check_rate(Some(self.emulator.rate_hz)).map_err(|e| anyhow::anyhow!("emulator.rate_hz: {e}"))?;
        }
        if self.network.payload_bytes == 0 || self.network.payload_bytes > MAX_PAYLOAD {
            bail!("network.payload_bytes must be 1..={MAX_PAYLOAD}, not {}", self.network.payload_bytes);
        }
        if !(1..=rdaq_receiver::engine::MAX_BATCH).contains(&self.network.batch) {
            bail!("network.batch must be 1..={}, not {}", rdaq_receiver::engine::MAX_BATCH, self.network.batch);
        }
        if let Err(e) = self.network.engine.parse::<rdaq_receiver::EngineKind>() {
            bail!("network.engine: {e}");
        }
        if !(1..=MAX_FRAME_TIMEOUT_MS).contains(&self.receiver.frame_timeout_ms) {
            bail!("receiver.frame_timeout_ms must be 1 to {MAX_FRAME_TIMEOUT_MS}, not {}", self.receiver.frame_timeout_ms);
        }
        if !(0.0..=100.0).contains(&self.network.coalesce_ms) {
            bail!("network.coalesce_ms must be 0 to 100, not {}", self.network.coalesce_ms);
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
        // the times first: the emulator's fault configuration makes durations of them
        for (name, ms) in [("delay_ms", self.faults.delay_ms), ("consumer_delay_ms", self.faults.consumer_delay_ms), ("slow_ms", self.faults.slow_ms)] {
            if !(0.0..=10_000.0).contains(&ms) {
                bail!("faults.{name} must be 0 to 10000, not {ms}");
            }
        }
        if let Some(f) = self.faults.config() {
            f.check().map_err(anyhow::Error::msg)?;
        }
        if self.faults.slow_ms > 0.0 && self.faults.slow_module >= self.detector.modules {
            bail!("faults.slow_module {} must be a module of the detector (below {})", self.faults.slow_module, self.detector.modules);
        }
        let p = &self.process;
        if !["auto", "jungfrau", "raw"].contains(&p.mode.as_str()) {
            bail!("process.mode must be \"auto\", \"jungfrau\" or \"raw\", not {:?}", p.mode);
        }
        if p.hg0 && p.gain_maps.is_empty() {
            bail!("process.hg0 takes the HG0 map of process.gain_maps: give the gain maps too");
        }
        if self.processing() && p.calibration.as_os_str().is_empty() && self.source == Source::Remote {
            bail!("process.mode = \"jungfrau\": a detector outside this process needs its calibration: process.calibration (--calibration FILE; \"emulated\" for rdaq emulate's own), or process.mode = \"raw\"");
        }
        self.pixel_type(None)?;
        rdaq_process::InvalidGain::parse(&p.invalid_gain).context("process.invalid_gain")?;
        rdaq_process::bitshuffle::Codec::parse(&p.codec, p.zstd_level).context("process.codec")?;
        if p.pedestal_window == 0 || p.pedestal_publish == 0 {
            bail!("process.pedestal_window and process.pedestal_publish must be at least 1");
        }
        if !(p.threshold_photons > 0.0) || !(p.snr >= 0.0) || p.min_pixels == 0 || p.max_pixels < p.min_pixels {
            bail!("process: threshold_photons must be positive, snr not negative, and 1 <= min_pixels <= max_pixels");
        }
        if !(1..=MAX_GPU_LANES).contains(&p.gpu_lanes) {
            bail!("process.gpu_lanes must be 1..={MAX_GPU_LANES}, not {}", p.gpu_lanes);
        }
        if p.ring_frames == 0 {
            bail!("process.ring_frames must be at least 1");
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if let Some(c) = p.cpus.iter().find(|&&c| c >= cpus) {
            bail!("process.cpus: CPU {c} is not one of this machine's 0..{}", cpus - 1);
        }
        if !(0.0..=1.0).contains(&self.detector.hit_fraction) {
            bail!("detector.hit_fraction must be in 0..=1, not {}", self.detector.hit_fraction);
        }
        if self.detector.chopper_dark > 0 && self.detector.chopper_signal == 0 {
            bail!("detector.chopper_signal must be at least 1 with a chopper (only dark frames otherwise)");
        }
        crate::outputs::plain_name("output.name", &self.output.name)
    }

    /// Every size, count and dimension that memory or threads are made of, bounded by what
    /// a detector needs and what this machine has, so a wrong number is a one-line error
    /// naming the field, never an allocation abort.
    fn check_sizes(&self) -> anyhow::Result<()> {
        let (d, p) = (&self.detector, &self.process);
        for (field, gap) in [("detector.gap_x", d.gap_x), ("detector.gap_y", d.gap_y)] {
            if gap > MAX_GAP {
                bail!("{field} {gap} must be at most {MAX_GAP} pixels (a module's width)");
            }
        }
        if !(0.0..=MAX_SPOTS_PER_FRAME).contains(&d.spots_per_frame) {
            bail!("detector.spots_per_frame must be 0 to {MAX_SPOTS_PER_FRAME} (per module frame), not {}", d.spots_per_frame);
        }
        if !(0.0..=MAX_BACKGROUND).contains(&d.background_photons) {
            bail!("detector.background_photons must be 0 to {MAX_BACKGROUND} (mean photons per pixel), not {}", d.background_photons);
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        for (field, n) in [("process.workers", p.workers), ("process.pedestal_bands", p.pedestal_bands)] {
            if n > THREADS_PER_CPU * cpus {
                bail!("{field} {n} must be at most {} ({THREADS_PER_CPU} per CPU of this machine's {cpus}); 0 chooses", THREADS_PER_CPU * cpus);
            }
        }
        if p.max_spots > MAX_SPOTS || p.ring_frames > MAX_RING_FRAMES {
            bail!("process.max_spots must be at most {MAX_SPOTS} and process.ring_frames at most {MAX_RING_FRAMES}, not {} and {}", p.max_spots, p.ring_frames);
        }
        let memory = physical_mib();
        let history = self.reliability.history_mib.saturating_mul(self.detector.modules as u64);
        if self.reliability.retransmit && history > memory / 2 {
            bail!("reliability.history_mib {} for each of {} modules is more than half of this machine's {memory} MiB", self.reliability.history_mib, self.detector.modules);
        }
        if self.receiver.ring_mib as u64 > memory / 2 {
            bail!("receiver.ring_mib {} is more than half of this machine's {memory} MiB", self.receiver.ring_mib);
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

    /// How this acquisition shares the cores ([`crate::budget`]): the receiver, the writer
    /// and in `rdaq run` the emulated modules' senders run busy; the process workers and the
    /// pedestal bands get the cores left, as configured or chosen.
    pub fn thread_budget(&self) -> crate::budget::ThreadBudget {
        use crate::budget::{Asked, Busy, ThreadBudget};
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let senders = if self.source == Source::Emulated { self.detector.modules as usize } else { 0 };
        let busy = Busy { receivers: 1, writers: 1, senders };
        let dark = ThreadBudget::dark_share(self.detector.chopper_dark, self.detector.chopper_signal);
        let asked = Asked { workers: self.process.workers, bands: self.process.pedestal_bands };
        ThreadBudget::share(cores, busy, dark, self.processing(), asked)
    }

    /// The process workers (or the raw chain's assemble workers) of the thread budget.
    pub fn workers(&self) -> usize {
        self.thread_budget().workers
    }

    /// The workers that assemble and compress raw frames: the process workers' count and
    /// rings.
    pub fn raw_workers(&self) -> crate::consume::Workers {
        crate::consume::Workers { count: self.workers(), ring_frames: self.process.ring_frames }
    }

    /// The pedestal bands of the thread budget (at least one).
    pub fn pedestal_bands(&self) -> usize {
        self.thread_budget().bands.max(1)
    }

    pub fn rate(&self) -> Option<f64> {
        (self.emulator.rate_hz > 0.0).then_some(self.emulator.rate_hz)
    }

    /// `base` with this configuration's network and receiver settings.
    pub fn tune(&self, base: rdaq_receiver::ReceiverConfig) -> anyhow::Result<rdaq_receiver::ReceiverConfig> {
        Ok(rdaq_receiver::ReceiverConfig {
            recv_buffer: self.network.recv_buffer_mib << 20,
            batch: self.network.batch,
            cpu: self.network.recv_cpu,
            engine: self.network.engine.parse().map_err(|e: String| anyhow::anyhow!("network.engine: {e}"))?,
            coalesce: Duration::from_secs_f64(self.network.coalesce_ms / 1e3),
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
            chopper: self.chopper(),
            hit_fraction: self.detector.hit_fraction,
            ..Default::default()
        }
    }

    pub fn chopper(&self) -> rdaq_detector::Chopper {
        rdaq_detector::Chopper { dark: self.detector.chopper_dark, signal: self.detector.chopper_signal }
    }

    /// Whether the frames go through the processing graph: process.mode "jungfrau", or
    /// "auto" for a JUNGFRAU whose calibration is known.
    pub fn processing(&self) -> bool {
        match self.process.mode.as_str() {
            "jungfrau" => true,
            "auto" => self.jungfrau() && (self.source == Source::Emulated || !self.process.calibration.as_os_str().is_empty()),
            _ => false,
        }
    }

    /// Whether the detector is JUNGFRAU (`detector.name`).
    pub fn jungfrau(&self) -> bool {
        self.detector.name.eq_ignore_ascii_case("jungfrau")
    }

    /// The description of a detector other than JUNGFRAU (`detector.name`), which must be
    /// placed by its packets' header; `None` for JUNGFRAU.
    pub fn described(&self) -> anyhow::Result<Option<rdaq_detector::Description>> {
        if self.jungfrau() {
            return Ok(None);
        }
        let d = rdaq_detector::Description::load(&self.detector.name).map_err(|e| anyhow::anyhow!("detector.name: {e}"))?;
        if d.ports.place != rdaq_detector::description::Place::Header {
            bail!("detector.name: {} is placed by packet number; \"jungfrau\" is the JUNGFRAU rdaq emulates and takes (rdaq receive --format sls for its own packets)", d.name);
        }
        Ok(Some(d))
    }

    /// Whether the processing converts with the emulated detector's own calibration.
    pub fn emulated_calibration(&self) -> bool {
        let c = &self.process.calibration;
        c.as_os_str() == "emulated" || (c.as_os_str().is_empty() && self.source == Source::Emulated)
    }

    /// What the file's pixels hold.
    /// The file's pixel type; for "auto", from the calibration in use: int16 photon counts
    /// when the largest energy it converts to is at most 32766 photons (the largest count
    /// below the saturation marker), int32 otherwise or without a calibration.
    pub fn pixel_type(&self, calibration: Option<&rdaq_process::Calibration>) -> anyhow::Result<rdaq_sink::PixelType> {
        use rdaq_sink::PixelType;
        if !self.processing() {
            return Ok(PixelType::Raw);
        }
        Ok(match self.process.output.as_str() {
            "kev" => PixelType::Kev,
            "photons16" => PixelType::Photons16,
            "photons32" => PixelType::Photons32,
            "auto" => match calibration {
                Some(c) if (c.max_kev() / self.detector.photon_energy_kev as f32).round() <= (i16::MAX - 1) as f32 => PixelType::Photons16,
                _ => PixelType::Photons32,
            },
            o => bail!("process.output must be \"auto\", \"kev\", \"photons16\" or \"photons32\", not {o:?}"),
        })
    }
}

/// Puts the tables and values of `over` into `doc`, table by table.
fn merge(doc: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (doc.get_mut(&k), v) {
            (Some(toml::Value::Table(d)), toml::Value::Table(o)) => merge(d, o),
            (_, v) => {
                doc.insert(k, v);
            }
        }
    }
}

pub fn parse_policy(s: &str) -> anyhow::Result<rdaq_receiver::IncompletePolicy> {
    s.parse().map_err(anyhow::Error::msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_output_is_int16_only_where_every_count_fits() {
        use rdaq_sink::PixelType;
        let px = 4;
        let cal = |g2: f32| rdaq_process::Calibration { pedestal: [vec![1000.0; px], vec![1000.0; px], vec![1000.0; px]], gain: [vec![40.0; px], vec![-1.5; px], vec![g2; px]], mask: vec![0; px] };
        let mut c = Config::default();
        c.detector.photon_energy_kev = 12.4;
        // G2: (16383 - 1000) / 0.1 = 153830 keV, 12406 photons: fits
        assert_eq!(c.pixel_type(Some(&cal(-0.1))).unwrap(), PixelType::Photons16);
        // ... at 2 keV, 76915 photons: it does not
        c.detector.photon_energy_kev = 2.0;
        assert_eq!(c.pixel_type(Some(&cal(-0.1))).unwrap(), PixelType::Photons32);
        // a masked pixel's range does not count
        let mut masked = cal(-0.01);
        masked.gain[2][0] = -0.1;
        masked.mask = vec![0, 1, 1, 1];
        c.detector.photon_energy_kev = 12.4;
        assert_eq!(c.pixel_type(Some(&masked)).unwrap(), PixelType::Photons16);
        assert_eq!(c.pixel_type(None).unwrap(), PixelType::Photons32);
    }

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
    fn a_wrong_type_names_the_field() {
        let dir = std::env::temp_dir().join(format!("rdaq-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("bad.toml");
        std::fs::write(&p, "[detector]\nmodules = \"two\"\n").unwrap();
        let e = format!("{:#}", Config::load(&p).unwrap_err());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(e.contains("bad.toml") && e.contains("detector.modules (line 2, column 11)"), "{e}");
    }

    #[test]
    fn the_example_file_shows_the_defaults() {
        let c: Config = toml::from_str(include_str!("../../../rdaq.example.toml")).unwrap();
        c.check().unwrap();
        let d = Config::default();
        assert_eq!(format!("{c:?}"), format!("{d:?}"));
    }

    #[test]
    fn a_file_sets_its_fields_over_the_entry_points_defaults() {
        let dir = std::env::temp_dir().join(format!("rdaq-config-over-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.toml");
        std::fs::write(&p, "[process]\nveto = false\n[detector]\nmodules = 3\n").unwrap();
        let c = Config::load_over(Config::remote(), &p).unwrap();
        assert_eq!((c.process.veto, c.detector.modules), (false, 3), "the file's fields");
        assert_eq!((c.network.data_port, c.detector.chopper_dark, c.stream.preview.as_str()), (50001, 0, "none"), "the base's others");
        assert_eq!(c.source, Source::Remote);
        std::fs::write(&p, "[process]\nveto = \"no\"\n").unwrap();
        let e = format!("{:#}", Config::load_over(Config::remote(), &p).unwrap_err());
        assert!(e.contains("process.veto (line 2"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn stream_settings_are_checked_by_name() {
        let mut c = Config::default();
        c.stream.policy = "sometimes".into();
        assert!(format!("{:#}", c.check().unwrap_err()).contains("stream.policy"));
        let mut c = Config::default();
        c.stream.hwm = 0;
        assert!(format!("{:#}", c.check().unwrap_err()).contains("stream.hwm"));
        let mut c = Config::default();
        c.process.codec = "zstd".into();
        assert!(format!("{:#}", c.check().unwrap_err()).contains("bitshuffle-LZ4"));
        c.stream.endpoint = "none".into();
        assert!(c.check().is_err(), "the preview is a stream too");
        c.stream.preview = "none".into();
        c.check().unwrap();
        let mut c = Config::default();
        c.stream.preview_hz = 0.0;
        assert!(format!("{:#}", c.check().unwrap_err()).contains("stream.preview_hz"));
        let mut c = Config::default();
        c.output.images_per_file = 0;
        assert!(format!("{:#}", c.check().unwrap_err()).contains("output.images_per_file"));
    }
}

#[cfg(test)]
mod sizes {
    use super::*;
    use proptest::prelude::*;

    /// Small values and any value of the type, up to its maximum.
    fn size() -> impl Strategy<Value = usize> {
        prop_oneof![0..4096usize, any::<usize>()]
    }

    proptest! {
        /// Whatever number a file or a request gives, the configuration is refused with one
        /// line, or what it makes memory and threads of is bounded.
        #[test]
        fn every_size_is_bounded_where_it_is_read(
            gap_x in size(), gap_y in size(), workers in size(), bands in size(), max_spots in size(), ring_frames in size(),
            ring_mib in size(), history_mib in prop_oneof![0..4096u64, any::<u64>()], spots in prop_oneof![0.0..20_000.0, any::<f64>()],
            background in prop_oneof![0.0..20_000.0, any::<f64>()],
            modules in 1u16..=64,
        ) {
            let mut c = Config::default();
            (c.detector.gap_x, c.detector.gap_y, c.detector.modules, c.detector.module_cols) = (gap_x, gap_y, modules, 1);
            (c.detector.spots_per_frame, c.detector.background_photons) = (spots, background);
            (c.process.workers, c.process.pedestal_bands, c.process.max_spots, c.process.ring_frames) = (workers, bands, max_spots, ring_frames);
            (c.receiver.ring_mib, c.reliability.history_mib) = (ring_mib, history_mib);
            match c.check() {
                Err(e) => prop_assert!(!format!("{e:#}").contains('\n'), "one line: {e:#}"),
                Ok(()) => {
                    let g = c.geometry().unwrap();
                    prop_assert!(g.width() <= 1024 + 2 * MAX_GAP && g.height() <= 64 * (512 + MAX_GAP));
                    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
                    prop_assert!(c.workers() <= THREADS_PER_CPU * cpus.max(1) && c.pedestal_bands() <= THREADS_PER_CPU * cpus.max(1));
                    prop_assert!(c.process.max_spots <= MAX_SPOTS && c.process.ring_frames <= MAX_RING_FRAMES);
                    prop_assert!((c.receiver.ring_mib as u64) <= physical_mib() / 2);
                    prop_assert!(c.reliability.history_mib * modules as u64 <= physical_mib() / 2);
                    prop_assert!((0.0..=MAX_SPOTS_PER_FRAME).contains(&c.detector.spots_per_frame));
                }
            }
        }
    }
}
