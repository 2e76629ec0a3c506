//! The worker of the acquisition service over a system of daemons: carries out, one at a
//! time, what the service's state machine answered to the API. A dataset's first trigger
//! configures the system and starts the receivers on the dataset's files; each trigger runs
//! the detector over its frames and waits until the receivers have taken them; the last
//! trigger (or a cancel) stops the receivers, joins their files into the dataset's master
//! and keeps the report as the dataset's summary.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use rdaq_manager::service::Send;
use rdaq_manager::TransferMode;

use crate::manager::{Files, Names, Running, Session};
use crate::http::lock;
use crate::service::{self, Closed, Ready, SharedHub};

/// The service needs every frame whole in one receiver's files, to join them into one
/// master per dataset.
pub(super) fn check_topology(s: &Session) -> anyhow::Result<()> {
    if s.t.transfer.mode != TransferMode::Temporal && s.plan.receivers.len() > 1 {
        bail!("transfer.mode: the acquisition service writes one master per dataset over whole frames: use a temporal topology, or one receiver");
    }
    Ok(())
}

/// The files the manager writes for dataset `prefix` in `dir`.
pub(super) fn dataset_files(dir: &Path, prefix: &str) -> Files {
    let f = |suffix: &str| dir.join(format!("{prefix}_{suffix}"));
    Files { report: f("report.json"), events: f("events.jsonl"), manifest: f("manifest.csv"), master: f("master.h5"), overwrite: false }
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

    /// Opens the dataset at its first trigger, sends the trigger's frames and waits until
    /// the receivers took them (or a cancel).
    fn send_frames(&mut self, send: &Send, ready: &mut Ready) -> anyhow::Result<()> {
        if self.open.is_none() {
            self.open = Some(self.open_dataset()?);
        }
        ready.listening();
        {
            let service = lock(&self.hub.service);
            if service.is_closing() {
                return Ok(());
            }
            lock(&self.s.shared).stop_requested = false;
        }
        let open = self.open.as_mut().expect("opened above");
        let rate = if send.period_s > 0.0 { 1.0 / send.period_s } else { 0.0 };
        open.asked += send.frames;
        self.s.send(&mut open.run, send.first_frame, send.frames, rate)?;
        if lock(&self.s.shared).stop_requested {
            // a cancel, or the dashboard's stop (one more cancel asks nothing)
            let _ = lock(&self.hub.service).cancel();
            return Ok(());
        }
        // what the detector sent is all that can come: the clock runs from now
        let (target, step) = (open.run.frames, Duration::from_millis(self.s.a.heartbeat_ms.clamp(10, 20)));
        self.hub.settle(target, None, step, || Some(self.receivers_done()));
        Ok(())
    }

    /// Starts the receivers on the armed dataset's files.
    fn open_dataset(&self) -> anyhow::Result<Open> {
        let d = lock(&self.hub.service).dataset().cloned().context("no dataset armed")?;
        let r = &d.request;
        let dir = d.master.parent().context("the master has a directory")?;
        let files = dataset_files(dir, &r.prefix);
        {
            let mut b = lock(&self.s.shared);
            b.to_writer.clear();
            b.processing.clear();
            b.frames = r.frames_per_trigger.saturating_mul(r.triggers);
            b.report = None;
            b.lost = None;
        }
        let sections = with_metadata(if r.process { self.s.sections.clone() } else { None }, r.metadata_sections());
        let names = Names { prefix: Some(r.prefix.clone()), directory: (!r.directory.is_empty()).then(|| r.directory.clone()), overwrite: false, sections, times: (r.count_time_s, r.period_s) };
        tracing::info!(dataset = d.number, master = %d.master.display(), frames = r.frames_per_trigger, triggers = r.triggers, "dataset opened");
        let run = self.s.begin(&names)?;
        self.count_from_here(&run);
        Ok(Open { run, files, asked: 0 })
    }

    /// Takes the started receivers' counters as the dataset's zero (nothing was sent yet).
    fn count_from_here(&self, run: &Running) {
        let base = self.look(&run.w.live).into_iter().filter_map(|(name, a)| Some((name, a.map(|v| v["counters"].clone()).filter(|c| !c.is_null())?))).collect();
        lock(&self.s.shared).counters_base = base;
    }

    /// Frames the live receivers took in this dataset.
    fn receivers_done(&self) -> u64 {
        let Some(open) = &self.open else { return 0 };
        self.look(&open.run.w.live).iter().map(|(_, a)| a.as_ref().map_or(0, |v| v["frames_done"].as_u64().unwrap_or(0))).sum()
    }

    /// Each of the receivers' `/status` answer (none: it did not answer), noted on the board.
    fn look(&self, receivers: &[usize]) -> Vec<(String, Option<serde_json::Value>)> {
        let look_at = |r: usize| {
            let spec = &self.s.t.receivers[r];
            let answer = self.s.heartbeat.get::<serde_json::Value>(spec.control, "/status").ok();
            self.s.note_status(&spec.name, answer.as_ref());
            (spec.name.clone(), answer)
        };
        receivers.iter().map(|&r| look_at(r)).collect()
    }
}

impl service::Worker for Worker<'_> {
    fn trigger(&mut self, send: &Send, ready: &mut Ready) -> anyhow::Result<()> {
        self.send_frames(send, ready)
    }

    fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Stops the receivers, joins their files and writes the report beside them.
    fn finish(&mut self) -> anyhow::Result<Closed> {
        let open = self.open.take().context("no dataset open")?;
        self.close(open)
    }

    /// The receivers are stopped, their files kept, joined and reported on as far as they
    /// can be (a dead receiver's recovered).
    fn abandon(&mut self) -> Option<Closed> {
        let open = self.open.take()?;
        self.close(open).map_err(|e| tracing::warn!("closing the failed dataset: {e:#}")).ok()
    }
}

impl Worker<'_> {
    /// Ends the dataset `open`: the receivers stopped, their files joined, the report
    /// written and shown.
    fn close(&mut self, open: Open) -> anyhow::Result<Closed> {
        lock(&self.s.shared).to_writer.clear();
        let report = self.s.end(open.run, &open.files, open.asked)?;
        let lost = report.lost();
        self.s.publish(&report, lost, &open.files)?;
        let written = report.receivers.values().map(|r| r.frames_written).sum();
        lock(&self.hub.service).written(written);
        // a dataset that wrote no frame (cancelled at once, every frame vetoed) has no master
        let no_master = (report.master.is_none() && written > 0).then(|| report.master_note.clone().unwrap_or_default());
        tracing::info!(frames_complete = report.frames_complete, frames_expected = report.frames_expected, written, lost, "dataset closed");
        Ok(Closed { summary: serde_json::to_value(&report)?, frames_lost: Some(report.frames_lost.len() as u64), no_master })
    }
}

/// The receivers' configuration sections with the dataset's metadata over them; none when
/// there is neither.
fn with_metadata(sections: Option<toml::Table>, metadata: toml::Table) -> Option<toml::Table> {
    if metadata.is_empty() {
        return sections;
    }
    let mut all = sections.unwrap_or_default();
    rdaq_run::config::merge(&mut all, metadata);
    Some(all)
}
