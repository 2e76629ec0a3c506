//! An acquisition's plan from its configuration: what the files say of it and, when its
//! frames are processed, the processing graph's settings with the calibration it starts from.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use rdaq_detector::Geometry;
use rdaq_process::Calibration;
use rdaq_proto::telegram::{BufferMap, ModuleDtp};
use rdaq_sink::NxmxMeta;

use crate::calibration::{calibration, calibration_of};
use crate::config::Config;
use crate::graph;

/// What the files say of an acquisition of the image `g` ([`Config::file_meta`]) and, when
/// it is processed, the graph's settings with the calibration it starts from: of the whole
/// detector (`ids` none: [`calibration`]), or of the detector's modules `ids` the image holds
/// ([`calibration_of`]).
pub fn plan(cfg: &Config, g: Geometry, ids: Option<&[u16]>) -> anyhow::Result<(NxmxMeta, Option<graph::Setup>)> {
    if cfg.process.mode == "spots" {
        anyhow::bail!("process.mode = \"spots\" finds the spots in a counting detector's counts; a JUNGFRAU's frames are converted first: process.mode = \"jungfrau\" (or \"auto\" with its calibration)");
    }
    let calibration = match (cfg.processing(), ids) {
        (false, _) => None,
        (true, None) => Some(calibration(cfg, g)?),
        (true, Some(ids)) => Some(calibration_of(cfg, g, ids)?),
    };
    let meta = cfg.file_meta(g, calibration.as_ref())?;
    let processing = calibration.map(|c| processing_setup(cfg, &meta, c)).transpose()?;
    Ok((meta, processing))
}

/// The local-SNR spot finder's settings of the configuration (its threshold in keV).
pub fn finder_params(cfg: &Config) -> rdaq_process::spots::LocalSnrParams {
    finder_params_in(cfg, cfg.detector.photon_energy_kev as f32)
}

/// The finder's settings for images in a unit of which a photon is `per_photon` (keV: the
/// photon energy; a counting detector's counts: 1).
pub fn finder_params_in(cfg: &Config, per_photon: f32) -> rdaq_process::spots::LocalSnrParams {
    let p = &cfg.process;
    rdaq_process::spots::LocalSnrParams { threshold: p.threshold_photons * per_photon, snr: p.snr, box_half: p.box_half, min_pixels: p.min_pixels, max_pixels: p.max_pixels }
}

/// The processing graph's settings from the configuration, the file's pixel type and the
/// calibration to start with.
pub fn processing_setup(cfg: &Config, meta: &NxmxMeta, calibration: Calibration) -> anyhow::Result<graph::Setup> {
    let p = &cfg.process;
    let g = meta.geometry;
    let e = cfg.detector.photon_energy_kev as f32;
    Ok(graph::Setup {
        geometry: g,
        calibration: Arc::new(calibration),
        invalid: rdaq_process::InvalidGain::parse(&p.invalid_gain)?,
        chopper: cfg.chopper(),
        photon_kev: e,
        pixel: meta.pixel,
        codec: meta.codec,
        finder: finder_params(cfg),
        min_spots: p.min_spots,
        veto: p.veto,
        window: p.pedestal_window,
        publish: p.pedestal_publish,
        workers: cfg.workers(),
        pedestal_bands: cfg.pedestal_bands(),
        cpus: p.cpus.clone(),
        ring_frames: p.ring_frames,
        consumer_delay: cfg.faults.consumer_delay(),
        gpu: if p.backend == "gpu" { Some(graph::GpuBackend::Device(rdaq_gpu::probe().map_err(|e| anyhow::anyhow!("process.backend = \"gpu\": {e}"))?)) } else { None },
        gpu_lanes: p.gpu_lanes,
        gpu_cpu_workers: p.gpu_cpu_workers,
        sent: None,
        board: Arc::default(),
        deliver: None,
        canned: None,
    })
}
/// What the files say of a series of the emulated detector beyond [`Config::file_meta`]:
/// the frames it sends and its period.
pub fn emulated_series(cfg: &Config, meta: &mut NxmxMeta) {
    let frame_time = cfg.rate().map_or(0.0, |r| 1.0 / r);
    // behind a gate the exposure is the gate's, not known here
    let count_time = if meta.trigger_mode == "gate" { 0.0 } else { frame_time };
    (meta.frame_time_s, meta.count_time_s) = (frame_time, count_time);
    meta.number_of_images = Some(cfg.emulator.frames);
}

/// Hand configuration of one receiver: module m sends every frame to its port there.
pub fn single_receiver_dtps(map: &BufferMap, data: IpAddr) -> Vec<ModuleDtp> {
    (0..map.modules).map(|m| ModuleDtp::single(map, m, SocketAddr::new(data, map.data_ports[m as usize]))).collect()
}
