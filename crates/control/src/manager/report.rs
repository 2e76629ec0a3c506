//! What an acquisition came to, as the manager reports it: each receiver's stop, the frames
//! complete and lost, the epochs of DTPs, the joined master, and the lines printed at the end.

use std::collections::BTreeMap;
use std::path::PathBuf;

use rdaq_manager::{Epoch, Reported};
use rdaq_proto::events::Event;
use serde::Serialize;

use crate::receiver::StopAnswer;

#[derive(Serialize, Default)]
pub(crate) struct ReceiverReport {
    pub(crate) alive: bool,
    pub(crate) frames_complete: u64,
    pub(crate) frames_incomplete: u64,
    pub(crate) frames_discarded: u64,
    pub(crate) output: Option<PathBuf>,
    pub(crate) frames_written: u64,
    /// Frames it refused whole because its ring was full (its consumer was behind).
    pub(crate) frames_refused: u64,
    /// Frames it received after writing failed, and why writing failed.
    pub(crate) frames_not_saved: u64,
    pub(crate) write_error: Option<String>,
    /// Why its processing stopped (a worker of its graph panicked).
    pub(crate) stage_failure: Option<String>,
    pub(crate) counters: serde_json::Value,
    pub(crate) events_dropped: u64,
    /// Its processing report (none: it wrote raw frames).
    pub(crate) processing: Option<serde_json::Value>,
    /// A dead receiver: the frames recovered from its files (they are in the master, but
    /// count as lost: the receiver never confirmed them), or why none were.
    pub(crate) recovered: Option<Recovery>,
}

/// What became of a dead receiver's files.
#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Recovery {
    Frames(u64),
    Failed(String),
}

#[derive(Serialize)]
pub(crate) struct Report {
    pub(crate) topology: PathBuf,
    pub(crate) mode: String,
    pub(crate) frames_expected: u64,
    /// The frames asked for, when an operator stopped the run before the detector sent them
    /// all (`frames_expected` is then what it started).
    pub(crate) stopped_early_of: Option<u64>,
    pub(crate) frames_complete: u64,
    /// Frames sent to a receiver that died, or never reported by a receiver they were sent to.
    pub(crate) frames_lost: Vec<u64>,
    /// Frames some receiver finished incomplete (missing data marked or discarded).
    pub(crate) frames_incomplete: Vec<u64>,
    pub(crate) epochs: Vec<Epoch>,
    pub(crate) receivers: BTreeMap<String, ReceiverReport>,
    /// One master over every receiver's data files, in frame order (none: see
    /// `master_note`).
    pub(crate) master: Option<PathBuf>,
    pub(crate) master_note: Option<String>,
    /// The receivers' processing counts summed (none: raw frames).
    pub(crate) processing: Option<serde_json::Value>,
    pub(crate) detector: serde_json::Value,
    pub(crate) modules: Vec<serde_json::Value>,
    pub(crate) elapsed_s: f64,
}

/// What the receivers said at the end.
pub(crate) struct Gathered {
    pub(crate) receivers: BTreeMap<String, ReceiverReport>,
    pub(crate) reported: Reported,
}

impl Report {
    /// Whether data was lost: frames not complete, or a receiver did not save some (its
    /// writing or its processing failed).
    pub(crate) fn lost(&self) -> bool {
        self.frames_complete < self.frames_expected || self.receivers.values().any(|r| r.write_error.is_some() || r.stage_failure.is_some() || r.frames_not_saved > 0)
    }
}

impl Gathered {
    /// Notes a receiver's frame event.
    pub(crate) fn note(&mut self, e: Event) {
        match e {
            Event::FrameComplete { receiver, frame, .. } => {
                self.reported.complete.insert((receiver, frame));
            }
            Event::FrameIncomplete { frame, .. } => {
                self.reported.incomplete.insert(frame);
            }
            _ => {}
        }
    }
}

impl ReceiverReport {
    pub(crate) fn from_stop(v: StopAnswer) -> ReceiverReport {
        ReceiverReport {
            alive: true,
            frames_complete: v.frames_complete,
            frames_incomplete: v.frames_incomplete,
            frames_discarded: v.frames_discarded,
            output: v.output,
            frames_written: v.frames_written,
            frames_refused: v.frames_refused,
            frames_not_saved: v.frames_not_saved,
            write_error: v.write_error,
            stage_failure: v.stage_failure,
            counters: v.counters,
            events_dropped: 0,
            processing: v.processing,
            recovered: None,
        }
    }

    /// A dead receiver's series at `master` made whole (as `rdaq recover` does), so that
    /// joining takes the frames it had written; nothing where its files are not readable
    /// from here. Recovery refuses a series whose files a process still holds (a receiver
    /// that stopped answering but still runs) and says so; the caller only asks for a
    /// receiver of this host, where that is seen.
    pub(crate) fn recover(&mut self, name: &str, master: Option<&PathBuf>) {
        let Some(master) = master.filter(|m| m.exists()) else { return };
        match rdaq_sink::recover::recover(master) {
            Ok(r) => {
                tracing::warn!(receiver = name, frames = r.frames, master = %master.display(), "recovered the dead receiver's files");
                self.output = Some(master.clone());
                self.frames_written = r.frames;
                self.recovered = Some(Recovery::Frames(r.frames));
            }
            Err(e) => {
                tracing::error!(receiver = name, "cannot recover the dead receiver's files: {e}");
                self.recovered = Some(Recovery::Failed(e.to_string()));
            }
        }
    }
}

/// The name of the master over every receiver's files, in `--out`.
pub(crate) const JOINED: &str = "acquisition_master.h5";

/// Writes `out`, one master over the receivers' series, when their files are visible from
/// here and hold whole frames (temporal receivers); otherwise says why not.
pub(crate) fn join_outputs(out: &std::path::Path, receivers: &BTreeMap<String, ReceiverReport>, overwrite: bool) -> Result<PathBuf, String> {
    let masters: Vec<PathBuf> = receivers.values().filter_map(|r| r.output.clone()).collect();
    match rdaq_sink::join::join(out, &masters, overwrite) {
        Ok(j) => {
            tracing::info!(master = %out.display(), frames = j.frames, data_files = j.data_files, "joined the receivers' files");
            Ok(out.to_path_buf())
        }
        Err(e) => {
            tracing::info!("no joined master: {e}");
            Err(e.to_string())
        }
    }
}

/// The detector's answers to its runs' stops: one run's as it is, several summed (the
/// elapsed time too).
pub(crate) fn sum_stops(mut stops: Vec<serde_json::Value>) -> serde_json::Value {
    if stops.len() == 1 {
        return stops.pop().expect("one");
    }
    let mut sum = serde_json::Map::new();
    for (k, v) in stops.iter().flat_map(|s| s.as_object().into_iter().flatten()) {
        let add = |old: Option<&serde_json::Value>| match (old, v) {
            (Some(o), v) if o.is_u64() && v.is_u64() => serde_json::json!(o.as_u64().unwrap_or(0) + v.as_u64().unwrap_or(0)),
            (Some(o), v) => serde_json::json!(o.as_f64().unwrap_or(0.0) + v.as_f64().unwrap_or(0.0)),
            (None, v) => v.clone(),
        };
        let new = add(sum.get(k));
        sum.insert(k.clone(), new);
    }
    serde_json::Value::Object(sum)
}

/// What each module said it sent, from its end-of-transfer event.
pub(crate) fn module_ends(det_events: &[Event]) -> Vec<serde_json::Value> {
    det_events
        .iter()
        .filter_map(|e| match e {
            Event::EndOfTransfer { module, frames, datagrams } => Some(serde_json::json!({ "module": module, "frames": frames, "datagrams": datagrams })),
            _ => None,
        })
        .collect()
}

pub(crate) fn print_report(report: &Report, report_file: &std::path::Path) {
    println!("---- rdaq manage report ----");
    println!(
        "frames     : {} complete of {}, {} lost, {} incomplete",
        report.frames_complete,
        report.frames_expected,
        report.frames_lost.len(),
        report.frames_incomplete.len()
    );
    for (name, r) in &report.receivers {
        println!("receiver {name:<8}: {} complete, {} incomplete, {} discarded, {} refused (ring full){}", r.frames_complete, r.frames_incomplete, r.frames_discarded, r.frames_refused, if r.alive { "" } else { " (DEAD)" });
        if let Some(Recovery::Frames(n)) = &r.recovered {
            println!("receiver {name:<8}: {n} frames recovered from its files (in the master, counted lost)");
        }
        for e in [&r.write_error, &r.stage_failure].into_iter().flatten() {
            println!("receiver {name:<8}: {e}; {} frames not saved", r.frames_not_saved);
        }
    }
    if let Some(p) = &report.processing {
        let n = |k: &str| p[k].as_u64().unwrap_or(0);
        println!("processing : {} dark, {} signal frames, {} hits, {} vetoed, {} spots, {} written", n("dark_frames"), n("signal_frames"), n("hits"), n("vetoed"), n("spots_found"), n("frames_written"));
    }
    for e in &report.epochs {
        println!("from frame {:>6}: {:?} ({})", e.from_frame, e.receivers, e.reason);
    }
    if let Some(m) = &report.master {
        println!("master     : {} (every receiver's frames, in order)", m.display());
    }
    println!("report     : {}", report_file.display());
}
