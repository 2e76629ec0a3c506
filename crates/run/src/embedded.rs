//! An acquisition embedded in a program (Python's `rdaq.Acquisition`, librdaq's
//! `rdaq_acquisition_*`): `rdaq run`'s (the emulated detector in this process) or `rdaq
//! receive`'s (a detector outside, [`crate::receive`]), started in a thread of its own, its
//! processed frames (or a counting detector's frames with their spots) handed to the program
//! as they are written ([`crate::graph::deliver`]). The
//! bindings only turn their arguments into the configuration and the source.

use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{bail, Context};
use crossbeam_channel::{Receiver, Sender};
use rdaq_detector::Geometry;
use rdaq_emulator::Control;

use crate::config::Config;
use crate::graph::deliver::{Processed, WAITING};
use crate::receive;
use crate::remote::{self, Source};
use crate::summary::Summary;

/// A running embedded acquisition.
pub struct Embedded {
    /// The processed frames, in the order they are written; disconnected at the end.
    pub frames: Receiver<Processed>,
    /// The acquisition's thread, which returns its summary.
    pub run: JoinHandle<anyhow::Result<Summary>>,
    /// Its `stop` ends the acquisition early (as Ctrl-C ends `rdaq run`).
    pub control: Arc<Control>,
    /// The image the frames make.
    pub geometry: Geometry,
    /// The data ports a detector outside sends to (empty for the emulated detector).
    pub ports: Vec<u16>,
}

/// Starts the acquisition `cfg` (checked) describes, of `source` (none: the emulated
/// detector); it must process its frames, for those are what it hands out.
pub fn start(cfg: Config, source: Option<Source>) -> anyhow::Result<Embedded> {
    let (tx, frames) = crossbeam_channel::bounded(WAITING);
    let control = Arc::new(Control::default());
    let (run, geometry, ports) = match source {
        Some(s) => start_remote(cfg, s, control.clone(), tx)?,
        None => start_emulated(cfg, control.clone(), tx)?,
    };
    Ok(Embedded { frames, run, control, geometry, ports })
}

type Started = (JoinHandle<anyhow::Result<Summary>>, Geometry, Vec<u16>);

/// `rdaq run`'s acquisition, its processed frames to `tx`.
fn start_emulated(cfg: Config, control: Arc<Control>, tx: Sender<Processed>) -> anyhow::Result<Started> {
    // a JUNGFRAU's processed frames, or a counting detector's counts with their spots
    let counted = cfg.process.mode == "spots" && cfg.described()?.is_some();
    if !cfg.processing() && !counted {
        bail!("process.mode: an embedded acquisition hands out processed frames (or a counting detector's with process.mode = \"spots\"); raw frames come from a receiver of their own (rdaq.Receiver, rdaq_receiver_open)");
    }
    let g = cfg.geometry().expect("checked");
    let run = std::thread::Builder::new()
        .name("rdaq-acquisition".into())
        .spawn(move || crate::emulated::run_delivering(&cfg, control, Arc::default(), &indicatif::ProgressBar::hidden(), Some(tx)))
        .context("cannot start the acquisition")?;
    Ok((run, g, Vec::new()))
}

/// `rdaq receive`'s acquisition of what `source` sends, its processed frames to `tx`; the
/// series is `<output.dir>/<output.name>_master.h5`.
fn start_remote(cfg: Config, source: Source, control: Arc<Control>, tx: Sender<Processed>) -> anyhow::Result<Started> {
    let mut setup = remote::setup(&source, &cfg)?;
    if !setup.chain.deliver_to(tx) {
        bail!("process: an embedded acquisition hands out processed frames: give a JUNGFRAU's calibration (process.calibration), or process.mode = \"spots\" for a counting detector; raw frames come from a receiver of their own");
    }
    let g = setup.chain.geometry;
    let out = cfg.output.dir.join(format!("{}_master.h5", cfg.output.name));
    std::fs::create_dir_all(&cfg.output.dir).with_context(|| format!("cannot create {}", cfg.output.dir.display()))?;
    let receiving = receive::start(setup, &cfg, Some(&out))?;
    let ports = receiving.rx.ports().to_vec();
    let run = std::thread::Builder::new()
        .name("rdaq-acquisition".into())
        .spawn(move || receiving.run(&indicatif::ProgressBar::hidden(), receive::Ending::default(), &control).map(|r| r.summary))
        .context("cannot start the acquisition")?;
    Ok((run, g, ports))
}
