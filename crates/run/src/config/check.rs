//! The configuration's values checked before anything starts, section by section: every
//! size, count, time and rate bounded by what a detector needs and what this machine has,
//! each error one line naming the field.

use anyhow::{bail, Context};

use rdaq_proto::metadata::{self, MAX_PHOTON_KEV, MIN_PHOTON_KEV};

use super::{Config, Source};

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

/// [`seconds_arg`], or 0: off.
pub fn seconds_or_off_arg(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v == 0.0 => Ok(0.0),
        _ => seconds_arg(s),
    }
}

/// Reads a photon energy in keV from the command line (clap's `value_parser`): finite and
/// within the energies a detector of this kind is used at.
pub fn photon_kev_arg(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a photon energy in keV"))?;
    metadata::photon_energy("", v).map(|()| v).map_err(|_| format!("{s} keV: give a photon energy of {MIN_PHOTON_KEV} to {MAX_PHOTON_KEV} keV"))
}

const MAX_FRAME_TIMEOUT_MS: u64 = rdaq_receiver::config::MAX_FRAME_TIMEOUT.as_millis() as u64;
/// Spots kept per frame in the files, and frames each process worker holds, at most.
const MAX_SPOTS: usize = 100_000;
/// peakfinder8's background ring, at most (its reference uses a few pixels).
const MAX_BG_RADIUS: i32 = 64;
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

    /// Checks every section; the first wrong value is the error, naming its field.
    pub fn check(&self) -> anyhow::Result<()> {
        // the sizes first: the geometry and the buffers are made of them
        self.check_sizes()?;
        self.check_detector()?;
        self.check_outputs()?;
        self.check_backend()?;
        self.check_emulator()?;
        self.check_network()?;
        self.check_receiver()?;
        self.check_reliability()?;
        self.check_faults()?;
        self.check_process()?;
        crate::outputs::plain_name("output.name", &self.output.name)
    }

    fn check_detector(&self) -> anyhow::Result<()> {
        let d = &self.detector;
        if d.modules == 0 || d.modules > 64 {
            bail!("detector.modules must be 1..=64, not {}", d.modules);
        }
        if self.geometry().is_none() {
            bail!("detector.module_cols {} must divide detector.modules {} into whole rows", d.module_cols, d.modules);
        }
        let m = |r: Result<(), (&str, String)>| r.map_err(|(field, why)| anyhow::anyhow!("{field}: {why}"));
        m(metadata::photon_energy("detector.photon_energy_kev", d.photon_energy_kev))?;
        m(metadata::distance("detector.distance_m", d.distance_m))?;
        for (field, v) in [("detector.beam_center_x", d.beam_center_x), ("detector.beam_center_y", d.beam_center_y)] {
            m(v.map_or(Ok(()), |px| metadata::beam_center(field, px)))?;
        }
        m(metadata::sample_name("sample.name", &self.sample.name))?;
        m(metadata::trigger_mode("detector.trigger_mode", &d.trigger_mode))?;
        if self.described()?.is_none() && (d.bit_depth.is_some() || d.link.is_some()) {
            bail!("detector.bit_depth and detector.link are settings of a detector placed by header (detector.name), not of JUNGFRAU");
        }
        if !(0.0..=1.0).contains(&d.hit_fraction) {
            bail!("detector.hit_fraction must be in 0..=1, not {}", d.hit_fraction);
        }
        if d.chopper_dark > 0 && d.chopper_signal == 0 {
            bail!("detector.chopper_signal must be at least 1 with a chopper (only dark frames otherwise)");
        }
        Ok(())
    }

    fn check_emulator(&self) -> anyhow::Result<()> {
        if self.emulator.frames == 0 {
            bail!("emulator.frames must be at least 1");
        }
        if self.emulator.rate_hz != 0.0 {
            rdaq_emulator::config::check_rate(Some(self.emulator.rate_hz)).map_err(|e| anyhow::anyhow!("emulator.rate_hz: {e}"))?;
        }
        Ok(())
    }

    fn check_network(&self) -> anyhow::Result<()> {
        let n = &self.network;
        if n.payload_bytes == 0 || n.payload_bytes > MAX_PAYLOAD {
            bail!("network.payload_bytes must be 1..={MAX_PAYLOAD}, not {}", n.payload_bytes);
        }
        if !(1..=rdaq_receiver::engine::MAX_BATCH).contains(&n.batch) {
            bail!("network.batch must be 1..={}, not {}", rdaq_receiver::engine::MAX_BATCH, n.batch);
        }
        if let Err(e) = n.engine.parse::<rdaq_receiver::EngineKind>() {
            bail!("network.engine: {e}");
        }
        if !(0.0..=100.0).contains(&n.coalesce_ms) {
            bail!("network.coalesce_ms must be 0 to 100, not {}", n.coalesce_ms);
        }
        Ok(())
    }

    fn check_receiver(&self) -> anyhow::Result<()> {
        if !(1..=MAX_FRAME_TIMEOUT_MS).contains(&self.receiver.frame_timeout_ms) {
            bail!("receiver.frame_timeout_ms must be 1 to {MAX_FRAME_TIMEOUT_MS}, not {}", self.receiver.frame_timeout_ms);
        }
        if self.slots() < 2 {
            bail!("receiver.ring_mib {} holds fewer than 2 frames of {} MiB", self.receiver.ring_mib, self.frame_bytes() >> 20);
        }
        self.policy()?;
        Ok(())
    }

    fn check_reliability(&self) -> anyhow::Result<()> {
        let r = &self.reliability;
        if r.loss_window < 64 || r.loss_window % 64 != 0 || r.loss_lag >= r.loss_window {
            bail!("reliability.loss_window {} must be a multiple of 64 and larger than reliability.loss_lag {}", r.loss_window, r.loss_lag);
        }
        if r.retransmit && (r.nack_retries == 0 || r.history_mib == 0) {
            bail!("reliability.nack_retries and reliability.history_mib must be at least 1 with retransmission on");
        }
        Ok(())
    }

    fn check_faults(&self) -> anyhow::Result<()> {
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
        Ok(())
    }

    fn check_process(&self) -> anyhow::Result<()> {
        let p = &self.process;
        if !["auto", "jungfrau", "spots", "raw"].contains(&p.mode.as_str()) {
            bail!("process.mode must be \"auto\", \"jungfrau\", \"spots\" or \"raw\", not {:?}", p.mode);
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
        match p.finder.as_str() {
            "local" => {}
            "peakfinder8" if p.mode != "spots" => bail!("process.finder = \"peakfinder8\" finds spots in a counting detector's counts (process.mode = \"spots\"); a JUNGFRAU's graph finds them with \"local\" (rdaq process spots --finder peakfinder8 offline)"),
            "peakfinder8" if !(1..=MAX_BG_RADIUS).contains(&p.local_bg_radius) => bail!("process.local_bg_radius must be 1 to {MAX_BG_RADIUS} pixels, not {}", p.local_bg_radius),
            "peakfinder8" => {}
            f => bail!("process.finder must be \"local\" or \"peakfinder8\", not {f:?}"),
        }
        if !(p.threshold_photons.is_finite() && p.threshold_photons > 0.0) || !(p.snr.is_finite() && p.snr >= 0.0) || p.min_pixels == 0 || p.max_pixels < p.min_pixels {
            bail!("process: threshold_photons must be positive, snr not negative, and 1 <= min_pixels <= max_pixels");
        }
        let side = self.geometry().map_or(usize::MAX, |g| g.height().min(g.width()));
        if p.box_half >= side {
            bail!("process.box_half must be less than the image's smaller side ({side}), not {}", p.box_half);
        }
        if !(1..=MAX_GPU_LANES).contains(&p.gpu_lanes) {
            bail!("process.gpu_lanes must be 1..={MAX_GPU_LANES}, not {}", p.gpu_lanes);
        }
        if p.ring_frames == 0 {
            bail!("process.ring_frames must be at least 1");
        }
        if !(0.0..=1.0).contains(&p.max_masked) {
            bail!("process.max_masked must be 0 to 1 (a share of a module's pixels), not {}", p.max_masked);
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if let Some(c) = p.cpus.iter().find(|&&c| c >= cpus) {
            bail!("process.cpus: CPU {c} is not one of this machine's 0..{}", cpus - 1);
        }
        Ok(())
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
        for (field, n) in [("process.workers", p.workers), ("process.pedestal_bands", p.pedestal_bands), ("process.gpu_cpu_workers", p.gpu_cpu_workers)] {
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
