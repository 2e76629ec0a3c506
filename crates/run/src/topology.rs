//! A run of a whole plan in one process (`rdaq run --topology`): every receiver of the
//! plan, fed by the emulated modules as the plan routes them, takes its frames through the
//! acquisition's chain ([`crate::acquisition`]: processed with the emulated detector's
//! calibration of the modules it holds, or raw) into its own NXmx series. Each receiver's
//! summary counts the frames the plan sends to it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use indicatif::ProgressBar;
use rdaq_emulator::Control;
use rdaq_manager::{Plan, Topology};
use rdaq_proto::telegram::{BufferMap, ModuleDtp};
use rdaq_receiver::{FrameSet, Receiver, ReceiverConfig};
use rdaq_sink::NxmxWriter;

use crate::acquisition::{self, Chain, Sinks};
use crate::config::Config;
use crate::graph::ProcessReport;
use crate::outputs::write_manifest;
use crate::summary::{Expected, Summary};
use crate::outputs;

/// One receiver of the plan.
struct Station {
    name: String,
    rx: Receiver,
}

/// Runs every receiver of the topology file `path` in this process. Returns each
/// receiver's name and summary (not yet printed), and what the modules sent.
pub fn run(cfg: &Config, path: &Path, control: Arc<Control>) -> anyhow::Result<(Vec<(String, Summary)>, rdaq_emulator::EmulatorReport)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let t = Topology::from_toml(&text).with_context(|| format!("invalid topology {}", path.display()))?;
    let plan = Plan::new(&t).with_context(|| format!("invalid topology {}", path.display()))?;
    if plan.sends.native.is_some() {
        anyhow::bail!("{}: detector.name: rdaq run --topology emulates JUNGFRAU modules sending rdaq datagrams; a detector's own packets go through rdaq manage and the daemons", path.display());
    }
    std::fs::create_dir_all(&cfg.output.dir).with_context(|| format!("cannot create {}", cfg.output.dir.display()))?;
    let manifest = cfg.output.dir.join(format!("{}_manifest.csv", cfg.output.name));
    let masters = plan.receivers.iter().map(|rp| cfg.output.dir.join(format!("{}_master.h5", t.receivers[rp.receiver].name)));
    let files: Vec<PathBuf> = masters.flat_map(|m| outputs::series_files(&m)).collect();
    outputs::refuse_existing(files.iter().chain([&manifest]).map(PathBuf::as_path), cfg.output.overwrite)?;
    let (mut stations, parts): (Vec<Station>, Vec<(Chain, Sinks)>) = start_stations(cfg, &t, &plan)?.into_iter().unzip();
    let maps: Vec<BufferMap> = stations.iter().map(|s| s.rx.buffer_map().clone()).collect();
    let dtps = plan.module_dtps(&t, &maps)?;
    let what = if cfg.processing() { "processed" } else { "raw" };
    eprintln!("rdaq run: {} modules -> {} receivers ({:?} mode), {} frames, {what}", t.detector.modules, stations.len(), t.transfer.mode, cfg.emulator.frames);
    let start = Instant::now();
    let (emu, outcomes) = std::thread::scope(|s| {
        let consumers: Vec<_> = stations.iter().zip(parts).map(|(st, (chain, sinks))| {
            let rx = &st.rx;
            s.spawn(move || acquisition::consume(rx, chain, sinks, &ProgressBar::hidden(), None, |_| {}))
        }).collect();
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
    for (mut st, outcome) in stations.drain(..).zip(outcomes) {
        let counters = st.rx.join()?;
        let o = outcome?;
        let expected = Expected::Frames(frames_sent_to(&st.name, &dtps, cfg.emulator.frames));
        let mut sum = Summary::for_receiver(expected, &counters, &st.rx.outcome(), &o.consumed, elapsed, o.h5.as_deref());
        sum.processing = o.processed.map(|p| ProcessReport { calibration: None, ..p });
        sum.threads = Some(o.threads);
        sums.push((st.name.clone(), sum));
    }
    Ok((sums, emu))
}

/// Starts every receiver of the plan, creates its file and sets up its chain (processed
/// with the emulated detector's calibration of the modules it holds, when processing).
fn start_stations(cfg: &Config, t: &Topology, plan: &Plan) -> anyhow::Result<Vec<(Station, (Chain, Sinks))>> {
    let full = t.geometry();
    let mut stations = Vec::new();
    for (rp, (r, req)) in plan.receivers.iter().zip(plan.buffer_requests(t)) {
        let spec = &t.receivers[r];
        let rx = Receiver::start(cfg.tune(ReceiverConfig { bind: spec.data, ..ReceiverConfig::for_request(&req) })?)
            .with_context(|| format!("starting receiver {}", spec.name))?;
        let geometry = rp.geometry(full);
        let (mut meta, processing) = crate::plan::plan(cfg, geometry, Some(&rp.modules))?;
        crate::plan::emulated_series(cfg, &mut meta);
        let h5 = cfg.output.dir.join(format!("{}_master.h5", spec.name));
        let writer = NxmxWriter::create(&h5, &meta, cfg.output.overwrite)?;
        let chain = Chain::new(cfg, geometry, processing, spec.name.clone());
        stations.push((Station { name: spec.name.clone(), rx }, (chain, Sinks { writer: Some(writer), stream: None })));
    }
    Ok(stations)
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
