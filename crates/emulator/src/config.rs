//! What an emulator run is asked to do, and what can be wrong with it.

use std::io;
use std::time::Duration;

use rdaq_detector::synth::SynthConfig;
use rdaq_detector::MODULE_BYTES;
use rdaq_proto::telegram::ModuleDtp;
use thiserror::Error;

use crate::faults::FaultConfig;

/// What an emulator run does: how many modules send how many frames, how fast, with what
/// content, how much history they keep for resending, and which faults (testing only).
#[derive(Clone, Debug)]
pub struct EmulatorConfig {
    pub modules: u16,
    pub frames: u64,
    pub first_frame: u64,
    /// Frames per second; `None` sends as fast as possible.
    pub rate_hz: Option<f64>,
    pub gso: bool,
    pub send_buffer: usize,
    pub synth: SynthConfig,
    /// For throughput benchmarks: synthesize this many frames once and send them in turn
    /// (frame `f` carries the content of frame `f % pool`; the manifest records what was
    /// sent). 0: every frame is synthesized (the default; distinct frames).
    pub frame_pool: usize,
    /// Bytes of a module frame. A JUNGFRAU module frame (the default) carries synthetic
    /// detector images; any other (even) size carries a pseudo-random test pattern, which
    /// soak tests use for small frames.
    pub module_bytes: u64,
    /// Memory per module for the retransmission history: the last
    /// `history_bytes / module_bytes` frames can be sent again. 0: no retransmission.
    pub history_bytes: u64,
    /// After the last frame, keep answering retransmission requests until none came for
    /// this long.
    pub linger: Duration,
    /// Spoil the sending on purpose (testing only).
    pub faults: Option<FaultConfig>,
}

/// The slowest frame rate asked of an emulated detector (one frame every 1,000 s).
pub const MIN_RATE_HZ: f64 = 1e-3;
/// The fastest (JUNGFRAU runs at 2 kHz, EIGER at up to 23 kHz; small test frames faster).
pub const MAX_RATE_HZ: f64 = 1e6;

/// Checks a frame rate asked from outside: `None` (as fast as possible) or a finite rate in
/// [`MIN_RATE_HZ`]..=[`MAX_RATE_HZ`], so that the frame period is a duration.
pub fn check_rate(rate_hz: Option<f64>) -> Result<(), String> {
    match rate_hz {
        Some(r) if !(MIN_RATE_HZ..=MAX_RATE_HZ).contains(&r) => Err(format!("the rate must be 0 (as fast as possible) or {MIN_RATE_HZ} to {MAX_RATE_HZ} Hz, not {r}")),
        _ => Ok(()),
    }
}

/// The time one emulated JUNGFRAU module takes to make a frame of `synth` (the best of a
/// few): what bounds the rate of its sender, which makes each frame before sending it.
pub fn frame_make_time(synth: &SynthConfig) -> Duration {
    let mut module = rdaq_detector::ModuleSynth::new(synth.clone(), 0);
    let mut words = vec![0u16; MODULE_BYTES / 2];
    (0..3u64)
        .map(|f| {
            let t = std::time::Instant::now();
            module.frame(f, &mut words);
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
        .max(Duration::from_nanos(1))
}

impl EmulatorConfig {
    /// Checks what decides how long the run takes: its rate ([`check_rate`]) and its last
    /// frame ([`EmulatorConfig::last_frame`]).
    pub fn check(&self) -> Result<(), EmulatorError> {
        check_rate(self.rate_hz).map_err(EmulatorError::Config)?;
        self.last_frame().map(drop)
    }

    /// The frame after the last one sent; frame numbers are 64-bit, so a run that would
    /// pass 2^64 is refused (it would never end).
    pub fn last_frame(&self) -> Result<u64, EmulatorError> {
        self.first_frame.checked_add(self.frames).ok_or_else(|| EmulatorError::Config(format!("first_frame {} + frames {} is past the last frame number, 2^64 - 1", self.first_frame, self.frames)))
    }
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        EmulatorConfig {
            modules: 1,
            frames: 100,
            first_frame: 0,
            rate_hz: Some(100.0),
            gso: true,
            send_buffer: 8 << 20,
            synth: SynthConfig::default(),
            frame_pool: 0,
            module_bytes: MODULE_BYTES as u64,
            history_bytes: 64 << 20,
            linger: Duration::from_millis(200),
            faults: None,
        }
    }
}

/// Why an emulator run cannot start, or stopped.
#[derive(Debug, Error)]
pub enum EmulatorError {
    /// Not one DTP per module.
    #[error("{dtps} data transfer processes for {want} modules")]
    ModuleCount { dtps: usize, want: u16 },
    /// A DTP expects module frames of another size than the emulator makes.
    #[error("module {module}: the DTP expects {dtp}-byte module frames; the emulator makes {made}-byte frames")]
    ModuleBytes { module: u16, dtp: u64, made: u64 },
    /// A setting out of range (the message names it).
    #[error("invalid emulator configuration: {0}")]
    Config(String),
    /// A DTP that sends nowhere.
    #[error("module {module}: the DTP has no route, or a route without buffers")]
    NoRoute { module: u16 },
    /// The DTPs are not in module order.
    #[error("DTP {position} is for module {module}: DTPs must come in module order")]
    ModuleOrder { position: u16, module: u16 },
    /// A DTP update that does not apply from a later frame than the previous one.
    #[error("a DTP update must apply from a later frame than the last one, not from {from_frame}")]
    UpdateOrder { from_frame: u64 },
    /// A DTP update for frames a module has already started.
    #[error("a DTP update from frame {from_frame} comes too late: frames up to {frontier} have started")]
    UpdateTooLate { from_frame: u64, frontier: u64 },
    /// Sending failed.
    #[error("module {module}: {source}")]
    Send { module: u16, source: io::Error },
}

/// Checks that `dtps` is one DTP per module, in module order, each with routes to buffers,
/// the module frame size the emulator makes and a payload size a datagram can carry.
pub fn check_dtps(modules: u16, module_bytes: u64, dtps: &[ModuleDtp]) -> Result<(), EmulatorError> {
    if dtps.len() != modules as usize {
        return Err(EmulatorError::ModuleCount { dtps: dtps.len(), want: modules });
    }
    for (m, d) in dtps.iter().enumerate() {
        if d.module != m as u16 {
            return Err(EmulatorError::ModuleOrder { position: m as u16, module: d.module });
        }
        if d.module_bytes != module_bytes {
            return Err(EmulatorError::ModuleBytes { module: m as u16, dtp: d.module_bytes, made: module_bytes });
        }
        if d.routes.is_empty() || d.routes.iter().any(|r| r.buffers.is_empty()) {
            return Err(EmulatorError::NoRoute { module: m as u16 });
        }
        if d.payload_bytes == 0 || d.payload_bytes as usize > rdaq_proto::MAX_PAYLOAD {
            return Err(EmulatorError::Config(format!("module {m}: payload_bytes {} must be 1..={}", d.payload_bytes, rdaq_proto::MAX_PAYLOAD)));
        }
    }
    Ok(())
}
