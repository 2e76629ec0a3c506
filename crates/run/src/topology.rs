//! A run of a whole plan in one process (`rdaq run --topology`): every receiver of the
//! plan, each writing its own NXmx file of raw frames, fed by the emulated modules as the
//! plan routes them. Each receiver's summary counts the frames the plan sends to it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use indicatif::ProgressBar;
use rdaq_detector::Geometry;
use rdaq_emulator::Control;
use rdaq_manager::{Plan, Topology};
use rdaq_proto::telegram::{BufferMap, ModuleDtp};
use rdaq_receiver::{FrameSet, Receiver, ReceiverConfig};
use rdaq_sink::{NxmxMeta, NxmxWriter};

use crate::config::Config;
use crate::consume::{consume, Sinks};
use crate::run::write_manifest;
use crate::summary::{Expected, Summary};
use crate::outputs;

/// One receiver of the plan and the part of the image it holds (its file is beside it).
struct Station {
    name: String,
    rx: Receiver,
    geometry: Geometry,
}

/// Runs every receiver of the topology file `path` in this process. Returns each
/// receiver's name and summary (not yet printed), and what the modules sent.
pub fn run(cfg: &Config, path: &Path, control: Arc<Control>) -> anyhow::Result<(Vec<(String, Summary)>, rdaq_emulator::EmulatorReport)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let t = Topology::from_toml(&text).with_context(|| format!("invalid topology {}", path.display()))?;
    let plan = Plan::new(&t).with_context(|| format!("invalid topology {}", path.display()))?;
    if cfg.processing() {
        eprintln!("rdaq run --topology: receivers write raw frames (the processing graph runs in single-receiver runs)");
    }
    std::fs::create_dir_all(&cfg.output.dir).with_context(|| format!("cannot create {}", cfg.output.dir.display()))?;
    let manifest = cfg.output.dir.join(format!("{}_manifest.csv", cfg.output.name));
    let masters = plan.receivers.iter().map(|rp| cfg.output.dir.join(format!("{}_master.h5", t.receivers[rp.receiver].name)));
    let files: Vec<PathBuf> = masters.flat_map(|m| outputs::series_files(&m)).collect();
    outputs::refuse_existing(files.iter().chain([&manifest]).map(PathBuf::as_path), cfg.output.overwrite)?;
    let (mut stations, mut writers) = start_stations(cfg, &t, &plan)?;
    let maps: Vec<BufferMap> = stations.iter().map(|s| s.rx.buffer_map().clone()).collect();
    let dtps = plan.module_dtps(&t, &maps)?;
    eprintln!("rdaq run: {} modules -> {} receivers ({:?} mode), {} frames", t.detector.modules, stations.len(), t.transfer.mode, cfg.emulator.frames);
    let start = Instant::now();
    let (emu, consumed) = std::thread::scope(|s| {
        let consumers: Vec<_> = stations
            .iter()
            .zip(writers.iter_mut())
            .map(|(st, w)| {
                let (rx, g) = (&st.rx, st.geometry);
                s.spawn(move || consume(rx, Sinks { geometry: g, writer: Some(w), stream: None, sent: None, board: None, decoder: None }, &ProgressBar::hidden(), None, |_| {}))
            })
            .collect();
        let emu = rdaq_emulator::run(&cfg.emulator(t.detector.modules), &dtps, control);
        for st in &stations {
            st.rx.stop();
        }
        (emu, consumers.into_iter().map(|c| c.join().expect("consumer thread panicked")).collect::<Vec<_>>())
    });
    let elapsed = start.elapsed();
    let emu = emu?;
    write_manifest(&manifest, &emu.manifest, cfg.output.overwrite)?;
    let mut sums = Vec::new();
    for ((mut st, w), stats) in stations.drain(..).zip(writers).zip(consumed) {
        let counters = st.rx.join()?;
        let mut stats = stats?;
        let path = outputs::close(w, &mut stats)?;
        let expected = Expected::Frames(frames_sent_to(&st.name, &dtps, cfg.emulator.frames));
        sums.push((st.name.clone(), Summary::for_receiver(expected, &counters, &st.rx.outcome(), &stats, elapsed, path.as_deref())));
    }
    Ok((sums, emu))
}

/// Starts every receiver of the plan and creates its file.
fn start_stations(cfg: &Config, t: &Topology, plan: &Plan) -> anyhow::Result<(Vec<Station>, Vec<NxmxWriter>)> {
    let full = t.geometry();
    let frame_time = cfg.rate().map_or(0.0, |r| 1.0 / r);
    let (mut stations, mut writers) = (Vec::new(), Vec::new());
    for (rp, (r, req)) in plan.receivers.iter().zip(plan.buffer_requests(t)) {
        let spec = &t.receivers[r];
        let rx = Receiver::start(cfg.tune(ReceiverConfig { bind: spec.data, ..ReceiverConfig::for_request(&req) })?)
            .with_context(|| format!("starting receiver {}", spec.name))?;
        let geometry = rp.geometry(full);
        let h5 = cfg.output.dir.join(format!("{}_master.h5", spec.name));
        let meta = NxmxMeta { images_per_file: cfg.output.images_per_file, ..NxmxMeta::jungfrau(geometry, cfg.detector.photon_energy_kev, frame_time) };
        writers.push(NxmxWriter::create(&h5, &meta, cfg.output.overwrite)?);
        stations.push(Station { name: spec.name.clone(), rx, geometry });
    }
    Ok((stations, writers))
}

/// The frames of `0..frames` the plan's modules send (some of) to receiver `name`.
fn frames_sent_to(name: &str, dtps: &[ModuleDtp], frames: u64) -> FrameSet {
    let mut expected = FrameSet::default();
    for f in 0..frames {
        let mut to = false;
        dtps.iter().for_each(|d| d.destinations(f, |r, _| to |= d.routes[r].receiver == name));
        if to {
            expected.insert(f);
        }
    }
    expected
}
