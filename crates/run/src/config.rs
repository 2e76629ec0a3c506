//! The TOML configuration of every acquisition (`rdaq run`, `rdaq receive`, the receiver
//! daemon, a topology's `[process]`, Python's `Acquisition`): every field has a default
//! (the entry point's: [`Config::default`] for the emulated detector, [`Config::remote`] for
//! one outside this process), a file sets some fields over it, unknown fields are errors
//! that name the field, and values are checked before anything starts.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

mod check;
mod sections;

pub use check::{photon_kev_arg, physical_mib, seconds_arg, seconds_or_off_arg, MAX_GAP, MAX_SECONDS};
pub use sections::*;

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
    pub sample: Sample,
    /// Where the frames come from; set by the entry point, not in the file.
    #[serde(skip)]
    pub source: Source,
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
        self.experiment_into(&mut meta);
        let applied = self.processing();
        if applied {
            meta.codec = rdaq_process::bitshuffle::Codec::parse(&self.process.codec, self.process.zstd_level)?;
            meta.max_spots = self.process.max_spots;
        }
        // raw JUNGFRAU frames keep the settings they would have been processed with
        if applied || self.jungfrau() {
            meta.processing = Some(self.processing_meta(applied));
        }
        Ok(meta)
    }

    /// What the files keep of the processing settings (`applied`: they made the images).
    pub fn processing_meta(&self, applied: bool) -> rdaq_sink::ProcessingMeta {
        let p = &self.process;
        rdaq_sink::ProcessingMeta {
            applied,
            invalid_gain: p.invalid_gain.clone(),
            finder: p.finder.clone(),
            local_bg_radius: (p.finder == "peakfinder8").then_some(p.local_bg_radius),
            threshold_photons: p.threshold_photons,
            snr: p.snr,
            box_half: p.box_half,
            min_pixels: p.min_pixels,
            max_pixels: p.max_pixels,
            veto_min_spots: p.veto.then_some(p.min_spots),
        }
    }


    /// What the configuration says of the experiment, into the files' metadata: the
    /// detector's distance, the beam centre (when given), the sample's name and how the
    /// frames are triggered.
    pub fn experiment_into(&self, meta: &mut rdaq_sink::NxmxMeta) {
        let d = &self.detector;
        meta.detector_distance_m = d.distance_m;
        meta.beam_center = [d.beam_center_x.unwrap_or(meta.beam_center[0]), d.beam_center_y.unwrap_or(meta.beam_center[1])];
        meta.sample_name = self.sample.name.clone();
        meta.trigger_mode = d.trigger_mode.clone();
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
    /// What the start line says of processed frames: to which pixels, and whether the veto
    /// keeps the hits only.
    pub fn processing_said(&self) -> String {
        let p = &self.process;
        let veto = if p.veto { format!("veto on: a signal frame with fewer than {} spots is not written (process.min_spots, process.veto)", p.min_spots) } else { "veto off: every signal frame is written".into() };
        if p.mode == "spots" {
            if p.finder == "peakfinder8" {
                return format!("spots found in the counts (peakfinder8, ADC threshold {} counts, SNR {}, background ring {} pixels), {veto}", p.threshold_photons, p.snr, p.local_bg_radius);
            }
            return format!("spots found in the counts (local SNR, {} counts and SNR {} to be strong), {veto}", p.threshold_photons, p.snr);
        }
        format!("processing to {}, {veto}", p.output)
    }

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
pub fn merge(doc: &mut toml::Table, over: toml::Table) {
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
    fn the_finders_numbers_are_bounded() {
        for (box_half, snr, threshold) in [(1 << 40, 3.0, 0.5), (15, f32::NAN, 0.5), (15, f32::INFINITY, 0.5), (15, 3.0, f32::INFINITY)] {
            let mut c = Config::default();
            (c.process.box_half, c.process.snr, c.process.threshold_photons) = (box_half, snr, threshold);
            let e = format!("{:#}", c.check().unwrap_err());
            assert!(e.contains("box_half") || e.contains("threshold_photons"), "{e}");
        }
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
