//! The acquisition service's worker: carries out, one at a time, what the service's state
//! machine answered to the API. A dataset's first trigger configures the system and starts
//! the receivers on the dataset's files; each trigger runs the detector over its frames and
//! waits until the receivers have taken them; the last trigger (or a cancel) stops the
//! receivers, joins their files into the dataset's master and keeps the report as the
//! dataset's summary. A failure stops what it can and puts the service in `error`.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use axum::http::StatusCode;
use rdaq_manager::service::Send;
use rdaq_manager::TransferMode;

use super::service::SharedHub;
use super::{Files, Names, Running, Session};
use crate::http::{lock, ApiError};

/// How long the receivers may go without taking a frame, after the detector sent its
/// last, before the trigger counts as done anyway (what is missing is then reported as
/// incomplete or lost when the dataset ends).
const SETTLE: Duration = Duration::from_secs(3);

/// What the API hands the worker.
pub(super) enum Work {
    /// Send this trigger's frames (opening the dataset's files at its first).
    Trigger(Send),
    /// Close the dataset's files (a cancel or disarm between triggers).
    Close,
    /// Ctrl-C: close what is open and stop.
    Quit,
}

/// The service needs every frame whole in one receiver's files, to join them into one
/// master per dataset.
pub(super) fn check_topology(s: &Session) -> anyhow::Result<()> {
    if s.t.transfer.mode != TransferMode::Temporal && s.plan.receivers.len() > 1 {
        bail!("transfer.mode: the acquisition service writes one master per dataset over whole frames: use a temporal topology, or one receiver");
    }
    Ok(())
}

/// The files the manager writes for dataset `prefix` in `dir`.
fn dataset_files(dir: &Path, prefix: &str) -> Files {
    let f = |suffix: &str| dir.join(format!("{prefix}_{suffix}"));
    Files { report: f("report.json"), events: f("events.jsonl"), manifest: f("manifest.csv"), master: f("master.h5"), overwrite: false }
}

/// Why an arm's directory or files cannot be used.
pub(super) enum DirError {
    /// Outside the data root, through a link, or not a directory.
    Path(anyhow::Error),
    /// A file of the dataset exists.
    Exists(anyhow::Error),
}

impl DirError {
    pub fn answer(self) -> ApiError {
        match self {
            DirError::Path(e) => ApiError(StatusCode::BAD_REQUEST, format!("{e:#}")),
            DirError::Exists(e) => ApiError(StatusCode::CONFLICT, format!("{e:#}; choose another prefix or directory")),
        }
    }
}

/// Makes dataset directory `rel` under `root` (never through a link), and refuses a dataset
/// whose files (the manager's in `dir`, and the receivers' `<prefix>_<name>_master.h5`
/// there) exist.
pub(super) fn prepare_directory(root: &Path, rel: &Path, dir: &Path, prefix: &str, receivers: &[String]) -> Result<(), DirError> {
    rdaq_run::outputs::make_subdirectory("directory", root, rel).map_err(DirError::Path)?;
    let f = dataset_files(dir, prefix);
    let mut paths = vec![f.report, f.events, f.manifest, f.master];
    paths.extend(receivers.iter().map(|name| dir.join(format!("{prefix}_{name}_master.h5"))));
    rdaq_run::outputs::refuse_existing(paths.iter().map(PathBuf::as_path), false).map_err(DirError::Exists)
}

/// The dataset whose files are open: the acquisition, where its files go, and the frames
/// asked for so far.
struct Open {
    run: Running,
    files: Files,
    asked: u64,
}

pub(super) struct Worker<'a> {
    s: Session<'a>,
    hub: SharedHub,
    open: Option<Open>,
}

impl<'a> Worker<'a> {
    pub fn new(s: Session<'a>, hub: SharedHub) -> Worker<'a> {
        Worker { s, hub, open: None }
    }

    /// Carries out the work the API hands over, until Ctrl-C.
    pub fn run(mut self, rx: mpsc::Receiver<Work>) {
        for w in rx {
            match w {
                Work::Trigger(send) => self.trigger(&send),
                Work::Close => self.close(),
                Work::Quit => break,
            }
        }
        if self.open.is_some() {
            tracing::warn!("stopping: the dataset under way is closed as cancelled");
            let _ = lock(&self.hub.service).cancel();
            self.close();
        }
    }

    fn trigger(&mut self, send: &Send) {
        if let Err(e) = self.send_frames(send) {
            self.fail(e);
            return;
        }
        if lock(&self.hub.service).trigger_done() {
            self.close();
        }
    }

    /// Opens the dataset at its first trigger, sends the trigger's frames and waits until
    /// the receivers took them (or a cancel).
    fn send_frames(&mut self, send: &Send) -> anyhow::Result<()> {
        if self.open.is_none() {
            self.open = Some(self.open_dataset()?);
        }
        {
            let service = lock(&self.hub.service);
            if service.is_closing() {
                return Ok(());
            }
            lock(&self.hub.board).stop_requested = false;
        }
        let open = self.open.as_mut().expect("opened above");
        let rate = if send.period_s > 0.0 { 1.0 / send.period_s } else { 0.0 };
        self.s.send(&mut open.run, send.first_frame, send.frames, rate)?;
        open.asked += send.frames;
        if lock(&self.hub.board).stop_requested {
            // a cancel, or the dashboard's stop (one more cancel asks nothing)
            let _ = lock(&self.hub.service).cancel();
            return Ok(());
        }
        let target = open.run.frames;
        self.settle(target);
        Ok(())
    }

    /// Starts the receivers on the armed dataset's files.
    fn open_dataset(&self) -> anyhow::Result<Open> {
        let d = lock(&self.hub.service).dataset().cloned().context("no dataset armed")?;
        let r = &d.request;
        let dir = d.master.parent().context("the master has a directory")?;
        let files = dataset_files(dir, &r.prefix);
        {
            let mut b = lock(&self.hub.board);
            b.to_writer.clear();
            b.processing.clear();
            b.frames = r.frames_per_trigger.saturating_mul(r.triggers);
            b.report = None;
            b.lost = None;
        }
        let sections = if r.process { self.s.sections.clone() } else { None };
        let names = Names { prefix: Some(r.prefix.clone()), directory: (!r.directory.is_empty()).then(|| r.directory.clone()), overwrite: false, sections };
        tracing::info!(dataset = d.number, master = %d.master.display(), frames = r.frames_per_trigger, triggers = r.triggers, "dataset opened");
        let run = self.s.begin(&names)?;
        Ok(Open { run, files, asked: 0 })
    }

    /// Waits until the receivers have taken `target` frames of the dataset (dark, vetoed or
    /// written), a cancel comes, or they take none for [`SETTLE`].
    fn settle(&self, target: u64) {
        let step = Duration::from_millis(self.s.a.heartbeat_ms.clamp(10, 20));
        let (mut best, mut since) = (0, Instant::now());
        loop {
            let done = self.receivers_done();
            if done >= target || lock(&self.hub.service).is_closing() {
                return;
            }
            if done > best {
                (best, since) = (done, Instant::now());
            } else if since.elapsed() > SETTLE {
                tracing::warn!(taken = done, sent = target, "the receivers took no frame for {SETTLE:?}: going on (what is missing shows in the report)");
                return;
            }
            std::thread::sleep(step);
        }
    }

    /// Frames the live receivers took in this dataset; notes what they said on the board.
    fn receivers_done(&self) -> u64 {
        let Some(open) = &self.open else { return 0 };
        let mut done = 0;
        for &r in &open.run.w.live {
            let spec = &self.s.t.receivers[r];
            let answer = self.s.heartbeat.get::<serde_json::Value>(spec.control, "/status").ok();
            self.s.note_status(&spec.name, answer.as_ref());
            done += answer.map_or(0, |v| v["frames_done"].as_u64().unwrap_or(0));
        }
        done
    }

    /// Stops the receivers, joins their files and ends the dataset with its report; a
    /// dataset without its master puts the service in `error`.
    fn close(&mut self) {
        lock(&self.hub.board).to_writer.clear();
        let Some(open) = self.open.take() else {
            lock(&self.hub.service).closed(serde_json::Value::Null);
            return;
        };
        match self.finish(open) {
            Ok((summary, None)) => lock(&self.hub.service).closed(summary),
            Ok((summary, Some(why))) => {
                let mut s = lock(&self.hub.service);
                s.closed(summary);
                s.fail(format!("the dataset's master was not written: {why}"));
            }
            Err(e) => lock(&self.hub.service).fail(format!("{e:#}")),
        }
    }

    /// The report of the dataset open, written beside its files; and why it has no master,
    /// if it has none.
    fn finish(&self, open: Open) -> anyhow::Result<(serde_json::Value, Option<String>)> {
        let report = self.s.end(open.run, &open.files, open.asked)?;
        let lost = report.lost();
        self.s.publish(&report, lost, &open.files)?;
        let written = report.receivers.values().map(|r| r.frames_written).sum();
        lock(&self.hub.service).written(written);
        let no_master = report.master.is_none().then(|| report.master_note.clone().unwrap_or_default());
        tracing::info!(frames_complete = report.frames_complete, frames_expected = report.frames_expected, written, lost, "dataset closed");
        Ok((serde_json::to_value(&report)?, no_master))
    }

    /// A trigger failed: the receivers are stopped (their files kept) and the service
    /// says why.
    fn fail(&mut self, e: anyhow::Error) {
        let reason = format!("{e:#}");
        tracing::error!("dataset failed: {reason}");
        lock(&self.hub.board).to_writer.clear();
        if let Some(open) = self.open.take() {
            if let Err(e) = self.s.end(open.run, &open.files, open.asked) {
                tracing::warn!("closing the failed dataset: {e:#}");
            }
        }
        lock(&self.hub.service).fail(reason);
    }
}
