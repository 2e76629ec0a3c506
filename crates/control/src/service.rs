//! The acquisition service: configured once, then datasets that a control system arms,
//! triggers, cancels and follows through an HTTP API, as many as it likes, without a
//! restart. Two entry points serve it, with the same API and the same state machine
//! ([`rdaq_manager::service`]):
//!
//! - `rdaq manage --data-root DIR --serve ADDR`: a system of daemons, its detector triggered
//!   by the manager ([`system`]);
//! - `rdaq receive --data-root DIR --serve ADDR`: one receiver of a detector that something
//!   else triggers ([`receive`]).
//!
//! The HTTP side ([`api`]) reads requests into the state machine and hands what it answers
//! to a [`Worker`], which does the slow part (starting receivers, waiting for frames,
//! closing files) on a thread of its own, one step at a time; a [`Backend`] tells the API
//! what the acquisition under way shows.

mod api;
pub mod receive;
pub mod system;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::http::StatusCode;
use rdaq_manager::service::{ArmRequest, Send, Service};

pub use api::{Acquisition, ErrorAnswer, Image, Live, Triggered};
use crate::auth::Access;
use crate::http::{lock, ApiError};

/// What the API reads of the acquisition under way, and how it stops one.
pub(crate) trait Backend: std::marker::Send + Sync + 'static {
    /// What the receivers said last, and the frames they handed to the writer in the
    /// dataset whose files are open (0 when none is).
    fn live(&self) -> (Live, u64);
    /// The files of the dataset `req` asks for in `dir` that an arm must find free.
    fn files(&self, dir: &Path, req: &ArmRequest) -> Vec<PathBuf>;
    /// Why this service cannot take the dataset `req` asks for (a field it does not
    /// serve), if it cannot: `(field, why)`.
    fn refuses(&self, req: &ArmRequest) -> Option<(&'static str, String)> {
        let _ = req;
        None
    }
    /// Ends the trigger under way early (a cancel, Ctrl-C): the worker then closes the
    /// dataset's files.
    fn stop_trigger(&self);
}

/// Carries out what the state machine answered, one step at a time.
pub(crate) trait Worker {
    /// Takes one trigger's frames, opening the dataset's files at its first; says through
    /// `ready` when the frames may come (the receivers listen), then returns once they are
    /// taken, or a cancel came.
    fn trigger(&mut self, send: &Send, ready: &mut Ready) -> anyhow::Result<()>;
    /// Whether a dataset's files are open.
    fn is_open(&self) -> bool;
    /// Closes the open dataset's files.
    fn finish(&mut self) -> anyhow::Result<Closed>;
    /// After a failure: stops what is open, keeping its files; what closing them came to,
    /// if it got that far.
    fn abandon(&mut self) -> Option<Closed>;
}

/// What closing a dataset's files came to.
pub(crate) struct Closed {
    /// The summary (report) written beside the master.
    pub(crate) summary: serde_json::Value,
    /// Frames asked for that are not in the files at all, when known.
    pub(crate) frames_lost: Option<u64>,
    /// Why the dataset has no complete master, if it has none.
    pub(crate) no_master: Option<String>,
}

/// What the API hands the worker.
enum Work {
    /// Take this trigger's frames (opening the dataset's files at its first).
    Trigger(Send, Ready),
    /// Close the dataset's files (a cancel or disarm between triggers).
    Close,
    /// Ctrl-C: close what is open and stop.
    Quit,
}

/// The answer `POST /trigger` waits for: the trigger's frames may come (or why not).
pub(crate) struct Ready(Option<tokio::sync::oneshot::Sender<Result<(), String>>>);

impl Ready {
    /// The receivers listen: the trigger's frames may come.
    pub(crate) fn listening(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(Ok(()));
        }
    }

    /// The trigger failed before its frames could come.
    fn failed(&mut self, why: &str) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(Err(why.to_string()));
        }
    }
}

/// What the handlers share with the worker.
pub(crate) struct Hub {
    pub(crate) service: Mutex<Service>,
    backend: Arc<dyn Backend>,
    work: Mutex<mpsc::Sender<Work>>,
    root: PathBuf,
    image: Image,
    /// Calls of the service's API it refused (4xx), each logged with its reason.
    refused: AtomicU64,
}

pub(crate) type SharedHub = Arc<Hub>;

impl Hub {
    fn send(&self, w: Work) {
        // the worker lives as long as the process serves
        let _ = lock(&self.work).send(w);
    }

    /// Waits, looking every `step`, until `taken()` (the frames the receivers took in the
    /// dataset) reaches `target`, `taken()` says the acquisition ended (`None`), the
    /// dataset is closing, or frames stop coming: none for [`SETTLE`], counted from the
    /// start, or with `from`, once more than `from` came (before, a detector that something
    /// else triggers is waited for as long as it takes).
    pub(crate) fn settle(&self, target: u64, from: Option<u64>, step: Duration, mut taken: impl FnMut() -> Option<u64>) {
        let (mut best, mut since) = (0, Instant::now());
        loop {
            let Some(done) = taken() else { return };
            if done >= target || lock(&self.service).is_closing() {
                return;
            }
            if done > best {
                (best, since) = (done, Instant::now());
            } else if from.is_none_or(|f| done > f) && since.elapsed() > SETTLE {
                tracing::warn!(taken = done, expected = target, "no frame taken for {SETTLE:?}: the trigger counts as done (what is missing shows in the dataset's summary)");
                return;
            }
            std::thread::sleep(step);
        }
    }
}

/// How long a trigger's frames may stop coming before it counts as done anyway: a frame
/// lost for good never comes (the dataset's summary reports it).
const SETTLE: Duration = Duration::from_secs(3);

/// Where and what a service serves.
pub(crate) struct Serving {
    pub(crate) addr: SocketAddr,
    pub(crate) access: Arc<Access>,
    /// The data root, absolute (see [`data_root`]).
    pub(crate) root: PathBuf,
    pub(crate) image: Image,
    pub(crate) backend: Arc<dyn Backend>,
    /// Routes served beside the service's (a dashboard), and their description.
    pub(crate) extra: axum::Router,
    pub(crate) extra_described: Vec<crate::openapi::Described>,
    /// Who serves, for the logs ("manage", "receive").
    pub(crate) what: &'static str,
}

/// Serves the service's API, and carries out its datasets with the worker `make` gives
/// until Ctrl-C (which ends a dataset under way as a cancel does).
pub(crate) fn serve<W: Worker>(s: Serving, make: impl FnOnce(SharedHub) -> W) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::channel();
    let (quit, backend) = (tx.clone(), s.backend.clone());
    ctrlc::set_handler(move || {
        backend.stop_trigger();
        let _ = quit.send(Work::Quit);
    })?;
    let hub = Arc::new(Hub { service: Mutex::new(Service::new(s.root.clone())), backend: s.backend, work: Mutex::new(tx), root: s.root, image: s.image, refused: AtomicU64::new(0) });
    let app = api::router(hub.clone(), &s.extra_described).merge(s.extra);
    crate::http::serve_in_background(s.addr, app, s.what, s.access)?;
    tracing::info!(data_root = %hub.root.display(), "acquisition service ready: POST /arm, then /trigger");
    run(&hub, rx, &mut make(hub.clone()));
    Ok(())
}

/// The worker's loop: each step the API handed over, in order, until Ctrl-C; a dataset
/// open then is closed as cancelled.
fn run(hub: &Hub, rx: mpsc::Receiver<Work>, w: &mut impl Worker) {
    for job in rx {
        match job {
            Work::Trigger(send, mut ready) => {
                let made = if w.is_open() { Ok(()) } else { make_directory(hub) };
                if let Err(e) = made.and_then(|()| w.trigger(&send, &mut ready)) {
                    fail(hub, w, e, &mut ready);
                    continue;
                }
                ready.listening();
                if lock(&hub.service).trigger_done() {
                    close(hub, w);
                }
            }
            Work::Close => close(hub, w),
            Work::Quit => break,
        }
    }
    if w.is_open() {
        tracing::warn!("stopping: the dataset under way is closed as cancelled");
        let _ = lock(&hub.service).cancel();
        close(hub, w);
    }
}

/// Makes the directory of the dataset armed (its first trigger is starting).
fn make_directory(hub: &Hub) -> anyhow::Result<()> {
    let rel = lock(&hub.service).dataset().map(|d| PathBuf::from(&d.request.directory)).context("no dataset armed")?;
    rdaq_run::outputs::make_subdirectory("directory", &hub.root, &rel).map(|_| ())
}

/// Closes the dataset's files and ends it with its summary; a dataset without its master
/// puts the service in `error`.
fn close(hub: &Hub, w: &mut impl Worker) {
    if !w.is_open() {
        lock(&hub.service).closed(serde_json::Value::Null, None);
        return;
    }
    match w.finish() {
        Ok(c) => {
            let mut s = lock(&hub.service);
            s.closed(c.summary, c.frames_lost);
            if let Some(why) = c.no_master {
                s.fail(format!("the dataset's master was not written: {why}"));
            }
        }
        Err(e) => lock(&hub.service).fail(format!("{e:#}")),
    }
}

/// A trigger failed: what is open stops (its files kept), the service and then the
/// trigger's caller say why; in that order, so that a caller that reads the state after its
/// refused trigger finds the error.
fn fail(hub: &Hub, w: &mut impl Worker, e: anyhow::Error, ready: &mut Ready) {
    let reason = format!("{e:#}");
    tracing::error!("dataset failed: {reason}");
    let closed = w.abandon();
    {
        let mut s = lock(&hub.service);
        if let Some(c) = closed {
            s.ended_with(c.summary, c.frames_lost);
        }
        s.fail(reason.clone());
    }
    ready.failed(&reason);
}

/// How long `POST /trigger` waits for the worker to say the frames may come (a receiver
/// starts in well under a second; this only bounds a stuck one).
const READY_WAIT: Duration = Duration::from_secs(60);

/// The service's data root, made if missing, as an absolute path without links.
pub(crate) fn data_root(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("--data-root: cannot create {}", dir.display()))?;
    dir.canonicalize().with_context(|| format!("--data-root: {}", dir.display()))
}

/// Why an arm's directory or files cannot be used.
enum DirError {
    /// Outside the data root, through a link, or not a directory.
    Path(anyhow::Error),
    /// A file of the dataset exists (or is a link).
    Exists(rdaq_sink::ClaimError),
}

impl DirError {
    fn answer(self) -> ApiError {
        match self {
            DirError::Path(e) => ApiError(StatusCode::BAD_REQUEST, format!("{e:#}")),
            DirError::Exists(rdaq_sink::ClaimError::Exists(p)) => ApiError(StatusCode::CONFLICT, format!("{} exists: the service never overwrites data; choose another prefix or directory", p.display())),
            DirError::Exists(e) => ApiError(StatusCode::CONFLICT, e.to_string()),
        }
    }
}

/// Checks dataset directory `rel` under `root` (never through a link; made at the first
/// trigger, so that an arm dropped leaves nothing), and refuses a dataset whose files
/// (`files` there) exist.
fn prepare_directory(root: &Path, rel: &Path, files: &[PathBuf]) -> Result<(), DirError> {
    rdaq_run::outputs::check_subdirectory("directory", root, rel).map_err(DirError::Path)?;
    rdaq_run::outputs::refuse_existing(files.iter().map(PathBuf::as_path), false).map_err(DirError::Exists)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdaq_manager::service::State;

    struct NoBackend;

    impl Backend for NoBackend {
        fn live(&self) -> (Live, u64) {
            (Live::default(), 0)
        }
        fn files(&self, _: &Path, _: &ArmRequest) -> Vec<PathBuf> {
            Vec::new()
        }
        fn stop_trigger(&self) {}
    }

    /// A worker whose receivers cannot start; it meets the test at `abandon` twice: once
    /// on arriving, once more when the test holds the service.
    struct Failing<'a>(&'a std::sync::Barrier);

    impl Worker for Failing<'_> {
        fn trigger(&mut self, _: &Send, _: &mut Ready) -> anyhow::Result<()> {
            anyhow::bail!("Address already in use")
        }
        fn is_open(&self) -> bool {
            false
        }
        fn finish(&mut self) -> anyhow::Result<Closed> {
            unreachable!("nothing is opened")
        }
        fn abandon(&mut self) -> Option<Closed> {
            self.0.wait();
            self.0.wait();
            None
        }
    }

    #[test]
    fn a_failed_trigger_is_answered_only_after_the_state_says_error() {
        let root = std::env::temp_dir().join(format!("rdaq-service-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let (tx, rx) = mpsc::channel();
        let hub = Hub { service: Mutex::new(Service::new(root.clone())), backend: Arc::new(NoBackend), work: Mutex::new(tx.clone()), root: root.clone(), image: Image { height: 1, width: 1 }, refused: AtomicU64::new(0) };
        let req: ArmRequest = serde_json::from_str(r#"{"frames_per_trigger": 1, "prefix": "x", "directory": "d"}"#).unwrap();
        let send = {
            let mut s = lock(&hub.service);
            s.arm(req).unwrap();
            s.trigger().unwrap()
        };
        let (ready_tx, mut ready_rx) = tokio::sync::oneshot::channel();
        tx.send(Work::Trigger(send, Ready(Some(ready_tx)))).unwrap();
        tx.send(Work::Quit).unwrap();
        let met = std::sync::Barrier::new(2);
        std::thread::scope(|scope| {
            scope.spawn(|| run(&hub, rx, &mut Failing(&met)));
            met.wait();
            // while the service is held, the worker cannot say the trigger failed yet
            let held = lock(&hub.service);
            met.wait();
            std::thread::sleep(Duration::from_millis(200));
            assert!(ready_rx.try_recv().is_err(), "answered before the state was written");
            drop(held);
        });
        let why = ready_rx.try_recv().expect("the worker answered").unwrap_err();
        assert!(why.contains("Address already in use"), "{why}");
        let s = lock(&hub.service);
        assert_eq!(s.state(), State::Error);
        assert!(s.error().unwrap().contains("Address already in use"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
