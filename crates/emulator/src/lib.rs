//! Emulated detector modules. Each module runs a RASHPA controller (RC) in its own thread:
//! it synthesizes its frames ([`rdaq_detector::synth`]), sends each to the destinations its
//! data transfer process names ([`ModuleDtp`]), cut into rdaq datagrams ([`packetize`]) and
//! paced over the frame period (or as fast as possible), and records a manifest of what it
//! sent. It keeps the frames it sent in a bounded history (the sender's memory) and resends
//! what receivers ask for ([`rdaq_proto::nack`]); [`faults`] can spoil its sending on purpose.
//! [`described`] emulates a detector described as data (EIGER) with its native packets.
//! The modules share a [`trigger`]: none runs more than [`TRIGGER_LEAD`] frames ahead of the
//! slowest, as real modules on one trigger signal.

#![forbid(unsafe_code)]

pub mod clock;
pub mod config;
pub mod control;
mod controller;
pub mod described;
pub mod faults;
mod history;
mod link;
pub mod packetize;
pub mod report;
mod roce;
pub mod trigger;

use std::sync::Arc;
use std::time::Instant;

use rdaq_proto::telegram::ModuleDtp;

pub use config::{check_dtps, EmulatorConfig, EmulatorError};
pub use control::Control;
pub use faults::{Fate, FaultConfig, FaultStats, Faults, Slow};
pub use packetize::{Packetizer, MAX_HEADER};
pub use report::{manifest_csv, EmulatorReport, ManifestEntry, RetransmitStats};
pub use trigger::Trigger;

/// Frames a module may run ahead of the slowest module of the detector.
pub const TRIGGER_LEAD: u64 = 2;

/// Runs every module's RC to completion (or until `control.stop`); `dtps[m]` is module
/// `m`'s data transfer process from the first frame on (later ones through
/// [`Control::update`]).
pub fn run(cfg: &EmulatorConfig, dtps: &[ModuleDtp], control: Arc<Control>) -> Result<EmulatorReport, EmulatorError> {
    config::check_dtps(cfg.modules, cfg.module_bytes, dtps)?;
    if cfg.module_bytes == 0 || cfg.module_bytes % 2 != 0 {
        return Err(EmulatorError::Config(format!("module_bytes {} must be even and positive", cfg.module_bytes)));
    }
    cfg.check()?;
    if let Some(f) = &cfg.faults {
        f.check().map_err(EmulatorError::Config)?;
        if f.slow.is_some_and(|s| s.module >= cfg.modules) {
            return Err(EmulatorError::Config(format!("faults: the slow module must be below {}", cfg.modules)));
        }
    }
    {
        // updates made before the start for later frames stay
        let mut plans = control.plans.write().unwrap_or_else(|e| e.into_inner());
        plans.retain(|(from, _)| *from > cfg.first_frame);
        plans.insert(0, (cfg.first_frame, Arc::new(dtps.to_vec())));
    }
    let start = Instant::now();
    let trigger = Arc::new(Trigger::new(cfg.modules, TRIGGER_LEAD));
    let handles: Vec<_> = (0..cfg.modules)
        .map(|m| {
            let (cfg, control, trigger) = (cfg.clone(), control.clone(), trigger.clone());
            std::thread::Builder::new()
                .name(format!("rdaq-rc{m}"))
                .spawn(move || {
                    let r = controller::run_module(&cfg, m, start, &control, &trigger);
                    trigger.leave(m);
                    r
                })
                .expect("spawn an RC thread")
        })
        .collect();
    let mut report = EmulatorReport::default();
    for h in handles {
        let r = h.join().expect("RC thread panicked")?;
        report.manifest.extend(r.manifest);
        report.sent += r.sent;
        report.gso = r.gso;
        report.late_frames += r.late_frames;
        report.held_back += r.held_back;
        report.refused_in_frames += r.refused_in_frames;
        report.roce_refused += r.roce_refused;
        report.retransmit += r.retransmit;
        report.faults += r.faults;
    }
    report.manifest.sort_by_key(|e| (e.frame, e.module));
    report.elapsed = start.elapsed();
    Ok(report)
}
