//! `rdaq receive --data-root DIR --serve ADDR`: the acquisition service of one receiver, for a
//! detector that something else triggers (its own control software, the beamline's timing
//! system). Configured once from `rdaq receive`'s options (the detector's packets, the
//! ports, the calibration); each dataset is one acquisition of `rdaq receive`'s chain
//! ([`rdaq_run::receive`]) into `<data_root>/<directory>/<prefix>_master.h5`, with the
//! summary `rdaq receive` prints in `<prefix>_summary.json` beside it.
//!
//! A dataset's first `POST /trigger` starts the receiver and answers once its ports listen:
//! the detector may send from then on. The receiver takes frames as they come until it has
//! `frames_per_trigger x triggers` of them (`triggers` 0: until disarm). A trigger is done
//! when the frames up to its last have been taken, or when, after some of them, none came
//! for a few seconds (what is missing shows in the summary; [`super::Hub::settle`]); before
//! its first frame the service waits as long as the detector does, until a cancel.
//!
//! With `--sls-detector`, the service drives the detector itself ([`rdaq_run::drive`]):
//! each trigger, once the receiver listens, sets the detector's frames, period, exposure and
//! trigger mode from the arm and starts it, and the trigger is done when the detector says
//! so and the datagrams in flight have landed. A pedestal dataset (the arm's `pedestal`)
//! takes the raw dark frames (a driven detector runs PSI's procedure: dynamic, forced G1,
//! forced G2) into `<prefix>_calibration.h5`, and the datasets after it are processed with
//! that calibration.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use axum::extract::State;
use indicatif::ProgressBar;
use rdaq_emulator::Control;
use rdaq_detector::Geometry;
use rdaq_manager::service::{ArmRequest, Dataset, Send};
use rdaq_run::board::Board;
use rdaq_run::config::Config;
use rdaq_run::drive::{Ask, Drive, Driver, LANDED, PATIENCE};
use rdaq_run::receive::Received;
use rdaq_run::remote::{self, Source};

use super::{Backend, Closed, Image, Live, Ready, Serving, SharedHub};
use crate::auth::Access;
use crate::dashboard::process_view;
use crate::http::lock;
use crate::openapi::{Described, Method};

/// How often a trigger's wait looks at the frames taken.
const POLL: Duration = Duration::from_millis(10);

/// What `rdaq receive` configured the service with.
pub struct Options {
    /// The receiver's name (its metrics' label).
    pub name: String,
    pub addr: SocketAddr,
    pub access: Access,
    pub data_root: PathBuf,
    /// The detector's packets (its frame count is each dataset's).
    pub source: Source,
    /// The detector the service drives for each trigger, if any.
    pub driver: Driver,
    pub config: Config,
    /// The detector's exposure per image, for the files (0: unknown).
    pub count_time_s: f64,
}

/// Serves the acquisition service of one receiver until Ctrl-C. The configuration is
/// checked once, here: the detector's packets, the calibration, the ports' settings.
pub fn serve(o: Options) -> anyhow::Result<()> {
    if o.source.detector.is_none() && o.source.format != "sls" {
        bail!("--data-root: the service of one receiver takes a detector's native packets (--format sls, or --detector NAME); rdaq datagrams and RoCEv2 WRITEs need their senders told each acquisition's buffers: use `rdaq manage --data-root` for those");
    }
    let root = super::data_root(&o.data_root)?;
    let setup = remote::setup(&o.source, &o.config)?;
    for note in &setup.notes {
        tracing::info!("{note}");
    }
    let g = setup.chain.geometry;
    let image = Image { height: g.height(), width: g.width() };
    drop(setup);
    let shown = Arc::new(Shown { showing: Mutex::default(), driven: o.driver.sls_detector.is_some() });
    let access = Arc::new(o.access);
    let scraped = Arc::new(Scraped { name: o.name, shown: shown.clone(), access: access.clone() });
    let extra = axum::Router::new().route("/metrics", axum::routing::get(metrics)).with_state(scraped);
    let metrics = Described { path: "/metrics", method: Method::Get, summary: "The receiver's counters in the dataset under way (or the last), OpenMetrics text", answers: "application/openmetrics-text" };
    let serving = Serving { addr: o.addr, access, root, image, backend: shown.clone(), extra, extra_described: vec![metrics], what: "receive" };
    let (source, config, count_time_s, driver) = (o.source, o.config, o.count_time_s, o.driver);
    super::serve(serving, |hub| Datasets { hub, shown, source, config, count_time_s, driver, open: None })
}

/// What `GET /metrics` shows: the receiver's counters in the dataset under way (or the
/// last), by its name.
struct Scraped {
    name: String,
    shown: Arc<Shown>,
    access: Arc<Access>,
}

async fn metrics(State(s): State<Arc<Scraped>>) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    let mut m = crate::metrics::Scrape::new("receiver", &s.name);
    if let Some(board) = lock(&s.shown.showing).board.clone() {
        m.receiver(&board.receiver().unwrap_or_default(), &board);
    }
    m.counter("api_refused", "Control calls refused for a missing or wrong token", s.access.refused());
    m.answer()
}

/// A dataset's master, and its summary beside it.
fn dataset_files(dir: &Path, prefix: &str) -> (PathBuf, PathBuf) {
    (dir.join(format!("{prefix}_master.h5")), dir.join(format!("{prefix}_summary.json")))
}

/// The calibration a pedestal dataset records.
fn calibration_file(dir: &Path, prefix: &str) -> PathBuf {
    dir.join(format!("{prefix}_calibration.h5"))
}

/// What the API shows of the dataset under way (or the last): its acquisition's board, and
/// while its files are open, what stops it; and whether the service drives the detector.
struct Shown {
    showing: Mutex<Showing>,
    driven: bool,
}

#[derive(Default)]
struct Showing {
    board: Option<Arc<Board>>,
    /// Set while the dataset's files are open.
    stop: Option<Arc<Control>>,
}

impl Backend for Shown {
    fn live(&self) -> (Live, u64) {
        let shown = lock(&self.showing);
        let Some(board) = &shown.board else { return (Live::default(), 0) };
        let counters = board.receiver();
        let live = Live {
            processing: process_view(board),
            datagrams_dropped: counters.map_or(0, |c| c.dropped_total()),
            frames_incomplete: counters.map_or(0, |c| c.frames_incomplete),
            threads: board.threads(),
        };
        let to_writer = if shown.stop.is_some() { board.frames_done().1 } else { 0 };
        (live, to_writer)
    }

    /// The series (the master and its first data file), the summary, and a pedestal's
    /// calibration.
    fn files(&self, dir: &Path, req: &ArmRequest) -> Vec<PathBuf> {
        let (master, summary) = dataset_files(dir, &req.prefix);
        let mut files = rdaq_run::outputs::series_files(&master).to_vec();
        files.push(summary);
        if req.pedestal {
            files.push(calibration_file(dir, &req.prefix));
        }
        files
    }

    /// A driven detector's pedestal takes three stages of as many frames.
    fn refuses(&self, req: &ArmRequest) -> Option<(&'static str, String)> {
        (self.driven && req.pedestal && !req.frames_per_trigger.is_multiple_of(3))
            .then(|| ("frames_per_trigger", format!("{} for a pedestal of the driven detector: three gain stages of as many frames, a multiple of 3", req.frames_per_trigger)))
    }

    fn stop_trigger(&self) {
        if let Some(stop) = &lock(&self.showing).stop {
            stop.stop.store(true, Ordering::Relaxed);
        }
    }
}

/// The dataset whose files are open: its acquisition's thread, what it shows, what stops
/// it, and where its summary goes.
struct Open {
    thread: JoinHandle<anyhow::Result<Received>>,
    board: Arc<Board>,
    stop: Arc<Control>,
    closing: Closing,
}

/// What closing a dataset writes: its summary, and a pedestal dataset's calibration (with
/// the configuration and image it was taken with).
struct Closing {
    summary: PathBuf,
    calibration: Option<(PathBuf, Config, Geometry)>,
}

/// The worker: one acquisition of `rdaq receive`'s chain per dataset.
struct Datasets {
    hub: SharedHub,
    shown: Arc<Shown>,
    source: Source,
    config: Config,
    count_time_s: f64,
    driver: Driver,
    open: Option<Open>,
}

/// What an acquisition's thread says once its receiver listens.
struct Listening {
    board: Arc<Board>,
    ports: Vec<u16>,
    engine: String,
    geometry: Geometry,
}

impl Datasets {
    /// Starts the armed dataset's acquisition on a thread of its own; returns once its
    /// receiver listens.
    fn open_dataset(&self) -> anyhow::Result<Open> {
        let d = lock(&self.hub.service).dataset().cloned().context("no dataset armed")?;
        let dir = d.master.parent().context("the master has a directory")?;
        let summary = dataset_files(dir, &d.request.prefix).1;
        let (source, cfg) = self.configured(&d)?;
        let stop = Arc::new(Control::default());
        let (tx, rx) = mpsc::sync_channel(1);
        // the arm's exposure, else the one the service was started with
        let count_time_s = if d.request.count_time_s > 0.0 { d.request.count_time_s } else { self.count_time_s };
        let (master, period_s, halt, pedestal, thread_cfg) = (d.master.clone(), d.request.period_s, stop.clone(), d.request.pedestal, cfg.clone());
        let thread = std::thread::Builder::new()
            .name("rdaq-dataset".into())
            .spawn(move || acquire(&source, &thread_cfg, &master, (count_time_s, period_s), pedestal, &halt, tx))?;
        // the thread says whether it listens before anything else it does
        let l = rx.recv().map_err(|_| anyhow::anyhow!("the dataset's acquisition panicked before its receiver listened"))??;
        *lock(&self.shown.showing) = Showing { board: Some(l.board.clone()), stop: Some(stop.clone()) };
        tracing::info!(dataset = d.number, master = %d.master.display(), frames = d.request.frames_per_trigger, triggers = d.request.triggers, pedestal, ports = ?l.ports, engine = l.engine, "dataset opened: the receiver listens");
        let calibration = pedestal.then(|| (calibration_file(dir, &d.request.prefix), cfg, l.geometry));
        Ok(Open { thread, board: l.board, stop, closing: Closing { summary, calibration } })
    }

    /// The source and configuration of dataset `d`: its frame count, processing on or off.
    fn configured(&self, d: &Dataset) -> anyhow::Result<(Source, Config)> {
        let r = &d.request;
        let mut cfg = Config::with_sections(self.config.clone(), r.metadata_sections()).context("the arm's metadata")?;
        // a pedestal run takes the raw words
        if !r.process || r.pedestal {
            cfg.process.mode = "raw".into();
        }
        // bounded where the arm was read: at most 2^50
        let frames = (r.triggers > 0).then(|| r.frames_per_trigger * r.triggers);
        Ok((Source { frames, ..self.source.clone() }, cfg))
    }

    /// Stops the open dataset's acquisition and waits for its end.
    fn stop(&mut self) -> Option<(anyhow::Result<Received>, Closing)> {
        let open = self.open.take()?;
        open.stop.stop.store(true, Ordering::Relaxed);
        let done = open.thread.join().unwrap_or_else(|_| Err(anyhow::anyhow!("the dataset's acquisition panicked")));
        lock(&self.shown.showing).stop = None;
        Some((done, open.closing))
    }

    /// What the driven detector is asked for in the trigger `send` of the armed dataset.
    fn ask(&self, send: &Send) -> anyhow::Result<Ask> {
        let d = lock(&self.hub.service).dataset().cloned().context("no dataset armed")?;
        let r = &d.request;
        let trigger = r.trigger_mode.clone().unwrap_or_else(|| self.config.detector.trigger_mode.clone());
        Ask::of(&self.config, &self.source, send.frames, (send.period_s, r.count_time_s), r.pedestal, trigger)
    }

    /// Records a pedestal dataset's calibration, and takes it for the datasets after.
    fn keep_calibration(&mut self, received: &Received, (path, cfg, g): (PathBuf, Config, Geometry)) -> anyhow::Result<PathBuf> {
        let run = received.pedestal_run.as_ref().context("the pedestal dataset recorded no pedestal run")?;
        for line in rdaq_run::pedestal::save(&cfg, g, run, &path, false)? {
            tracing::info!("{line}");
        }
        self.config.process.calibration = path.clone();
        tracing::info!(calibration = %path.display(), "the datasets from now on are processed with this calibration");
        Ok(path)
    }
}

/// Waits for the trigger's frames (as [`super::Hub::settle`]); with a driven detector, the
/// trigger is also done once the detector has said it is finished and the datagrams in
/// flight have landed.
fn take_trigger(hub: &SharedHub, open: &Open, send: &Send, finished: Option<(Arc<AtomicBool>, Duration)>) {
    let mut heard = (0u64, Instant::now());
    let taken = || {
        if open.thread.is_finished() || open.stop.stop.load(Ordering::Relaxed) {
            return None;
        }
        let done = open.board.frames_done().0;
        if done != heard.0 {
            heard = (done, Instant::now());
        }
        let landed = finished.as_ref().is_some_and(|(f, grace)| f.load(Ordering::Acquire) && heard.1.elapsed() >= *grace);
        (!landed).then_some(done)
    };
    hub.settle(send.first_frame + send.frames, Some(send.first_frame), POLL, taken);
}

/// An acquisition's thread: starts the receiver on the dataset's files, says so through
/// `started`, and takes the frames until the receiver has its count or `stop`.
fn acquire(source: &Source, cfg: &Config, master: &Path, (count_time_s, period_s): (f64, f64), pedestal: bool, stop: &Control, started: mpsc::SyncSender<anyhow::Result<Listening>>) -> anyhow::Result<Received> {
    let mut geometry = None;
    let receiving = remote::setup(source, cfg).and_then(|mut setup| {
        (setup.meta.count_time_s, setup.meta.frame_time_s) = (count_time_s, period_s);
        if pedestal {
            setup.chain.pedestal_run = Some(rdaq_run::pedestal::start(&setup.chain)?);
        }
        geometry = Some(setup.chain.geometry);
        rdaq_run::receive::start(setup, cfg, Some(master))
    });
    let receiving = match receiving {
        Ok(r) => r,
        Err(e) => {
            let _ = started.send(Err(e));
            bail!("the receiver did not start");
        }
    };
    let geometry = geometry.expect("set before the receiver started");
    let l = Listening { board: receiving.board(), ports: receiving.rx.ports().to_vec(), engine: receiving.rx.engine().to_string(), geometry };
    let _ = started.send(Ok(l));
    receiving.run(&ProgressBar::hidden(), rdaq_run::receive::Ending::default(), stop)
}

impl super::Worker for Datasets {
    fn trigger(&mut self, send: &Send, ready: &mut Ready) -> anyhow::Result<()> {
        if self.open.is_none() {
            self.open = Some(self.open_dataset()?);
        }
        let drive = match &self.driver.sls_detector {
            Some(_) => self.driver.command(&self.ask(send)?)?.map(Drive::start).transpose()?,
            None => None,
        };
        ready.listening();
        let open = self.open.as_ref().expect("opened above");
        let finished = drive.as_ref().map(|d| (d.ended(), self.config.frame_timeout() + LANDED));
        take_trigger(&self.hub, open, send, finished);
        let stopped = open.stop.stop.load(Ordering::Relaxed);
        if stopped {
            // a cancel, or Ctrl-C (one more cancel asks nothing)
            let _ = lock(&self.hub.service).cancel();
        }
        // a cancelled trigger stops the detector at once; one that has its frames lets it end
        drive.map(|d| d.finish(if stopped { Duration::ZERO } else { PATIENCE })).transpose()?;
        Ok(())
    }

    fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Stops the receiver (it has its frames, or the dataset ends early) and writes the
    /// summary beside the master.
    fn finish(&mut self) -> anyhow::Result<Closed> {
        let cancelled = lock(&self.hub.service).is_cancelling();
        let (done, closing) = self.stop().context("no dataset open")?;
        let received = done?;
        let sum = &received.summary;
        // of a known count, a cancelled dataset's frames after the cancel were not waited for;
        // frames received but not saved (writing or processing failed) are not in the files
        let frames_lost = (!cancelled || sum.frames_expected.is_none()).then(|| sum.frames_lost() + sum.frames_not_saved);
        sum.write_json(&closing.summary, false)?;
        lock(&self.hub.service).written(sum.frames_written);
        tracing::info!(frames_complete = sum.frames_complete, frames_expected = ?sum.frames_expected, written = sum.frames_written, frames_lost = ?frames_lost, datagrams_dropped = sum.datagrams_dropped, "dataset closed");
        let mut summary = serde_json::to_value(sum)?;
        if let Some(c) = closing.calibration {
            summary["calibration"] = self.keep_calibration(&received, c)?.display().to_string().into();
        }
        Ok(Closed { summary, frames_lost, no_master: sum.write_error.clone() })
    }

    /// The receiver is stopped, its files kept.
    fn abandon(&mut self) -> Option<Closed> {
        if let Some((Err(e), _)) = self.stop() {
            tracing::warn!("closing the failed dataset: {e:#}");
        }
        None
    }
}
