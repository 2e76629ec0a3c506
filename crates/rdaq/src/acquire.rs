//! The options every acquiring command shares (`rdaq run`, `rdaq receive`): each one sets a
//! field of the one configuration (`rdaq_run::config::Config`, the sections of
//! rdaq.example.toml), over the file of `--config`, over the command's defaults.

use std::path::PathBuf;

use clap::Args;
use rdaq_run::config::Config;

#[derive(Args)]
pub struct AcquireArgs {
    /// TOML configuration; every field has a default (see rdaq.example.toml). The options
    /// below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Detector modules (detector.modules; rdaq run: 2, rdaq receive: 1).
    #[arg(long)]
    modules: Option<u16>,
    /// Images per data file (output.images_per_file, default 1000).
    #[arg(long)]
    images_per_file: Option<usize>,
    /// Write the raw words, no processing (process.mode = "raw").
    #[arg(long)]
    raw: bool,
    /// The detector's calibration (process.calibration): a file of `rdaq process pedestal`
    /// (docs/processing.md), or "emulated" for the emulated detector's own. With it, a
    /// JUNGFRAU's frames are processed (process.mode = "auto").
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// Photon energy in keV (detector.photon_energy_kev): photon counts and the files' beam.
    #[arg(long)]
    photon_energy_kev: Option<f64>,
    /// Where the processing stages run: cpu or gpu (process.backend).
    #[arg(long)]
    backend: Option<String>,
    /// Stream V2 endpoint to publish on (stream.endpoint, default tcp://127.0.0.1:31001, this host only; "none": off).
    #[arg(long)]
    stream: Option<String>,
    /// When stream consumers are slower: "drop" images (default) or "block" the acquisition.
    #[arg(long)]
    stream_policy: Option<String>,
    /// Live preview endpoint (stream.preview; rdaq run: tcp://127.0.0.1:31002, rdaq receive: none;
    /// "none": off).
    #[arg(long)]
    preview: Option<String>,
    /// Receive engine: recvmmsg, io_uring or af_xdp (network.engine; AF_XDP needs the
    /// address of an interface: docs/transport.md).
    #[arg(long)]
    engine: Option<String>,
    /// Pin the receive thread to this CPU (network.recv_cpu).
    #[arg(long)]
    recv_cpu: Option<usize>,
    /// Exit 0 even if frames were lost or incomplete (output.tolerate_loss).
    #[arg(long)]
    tolerate_loss: bool,
    /// Replace existing output files (output.overwrite; default: refuse them, or number the
    /// run in rdaq run).
    #[arg(long)]
    overwrite: bool,
    /// Write the summary as JSON here too.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
}

impl AcquireArgs {
    /// The configuration: `base` (the command's defaults), the `--config` file over it, and
    /// these options over both. Not yet checked.
    pub fn config(&self, base: Config) -> anyhow::Result<Config> {
        let mut cfg = match &self.config {
            Some(p) => Config::load_over(base, p)?,
            None => base,
        };
        set(&mut cfg.detector.modules, self.modules);
        set(&mut cfg.output.images_per_file, self.images_per_file);
        set(&mut cfg.detector.photon_energy_kev, self.photon_energy_kev);
        set(&mut cfg.process.calibration, self.calibration.clone());
        set(&mut cfg.process.backend, self.backend.clone());
        set(&mut cfg.stream.endpoint, self.stream.clone());
        set(&mut cfg.stream.policy, self.stream_policy.clone());
        set(&mut cfg.stream.preview, self.preview.clone());
        set(&mut cfg.network.engine, self.engine.clone());
        if self.recv_cpu.is_some() {
            cfg.network.recv_cpu = self.recv_cpu;
        }
        if self.raw {
            cfg.process.mode = "raw".into();
        }
        cfg.output.tolerate_loss |= self.tolerate_loss;
        cfg.output.overwrite |= self.overwrite;
        Ok(cfg)
    }
}

/// Sets `field` to the option's value, when it was given.
pub fn set<T>(field: &mut T, option: Option<T>) {
    if let Some(v) = option {
        *field = v;
    }
}
