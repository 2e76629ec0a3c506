//! The acquisition service's state machine, sans I/O: a system configured once, then many
//! acquisitions, as a control system drives a detector (areaDetector's Acquire, Bluesky's
//! stage / trigger / unstage).
//!
//! `idle -> armed -> acquiring -> idle`: `arm` names the next dataset (frames per trigger,
//! triggers, period, directory and file prefix, processing on or off) and may be repeated
//! until the first trigger; each `trigger` sends one trigger's frames; after the last
//! trigger's frames the I/O side closes the dataset's files and the service is idle again.
//! `disarm` drops an arm that has not started; `cancel` ends a dataset early (once its files
//! are closed); a failure puts the service in `error` with its reason until the next arm.
//! The I/O side (the manager's API and the daemons) calls these with what it is asked and
//! what it sees, and does what they answer.

use std::path::PathBuf;

use rdaq_proto::names;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use thiserror::Error;

/// The most frames one trigger may ask for, and the most triggers one arm may ask for:
/// bounds where the request is read (a JUNGFRAU at 2 kHz for most of a week).
pub const MAX_FRAMES_PER_TRIGGER: u64 = 1 << 30;
pub const MAX_TRIGGERS: u64 = 1 << 20;
/// The longest frame period an arm may ask for, in seconds.
pub const MAX_PERIOD_S: f64 = 3600.0;
/// The dataset path of the frames in every master file rdaq writes.
pub const FRAMES_DATASET: &str = "/entry/data/data";

/// What an arm asks for (`POST /arm`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ArmRequest {
    /// Frames each trigger sends (1 to 2^30).
    #[schema(minimum = 1, maximum = 1073741824)]
    pub frames_per_trigger: u64,
    /// Triggers of the dataset (up to 2^20); 0: as many as are sent, until `disarm` (as a
    /// Bluesky run does: one dataset from stage to unstage).
    #[serde(default = "one")]
    #[schema(minimum = 0, maximum = 1048576, default = 1)]
    pub triggers: u64,
    /// Frame period in seconds; 0: as fast as the detector goes. The files' `frame_time`.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 3600, default = 0)]
    pub period_s: f64,
    /// Each frame's exposure in seconds (the files' `count_time`), at most the period; 0:
    /// not known.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 3600, default = 0)]
    pub count_time_s: f64,
    /// The dataset's directory, relative to the service's data root.
    #[serde(default)]
    pub directory: String,
    /// The files' name prefix: `<prefix>_master.h5`, `<prefix>_data_000001.h5`, ...
    pub prefix: String,
    /// Online processing on (the configuration's) or off (raw frames written).
    #[serde(default = "yes")]
    #[schema(default = true)]
    pub process: bool,
    /// The sample's name, for the files (`/entry/sample/name`; empty: none).
    #[serde(default)]
    pub sample_name: String,
    /// The photon energy (keV), the detector's distance (m) and where the beam meets it
    /// (pixels, fast x and slow y), for the files; not given: the configuration's.
    #[serde(default)]
    #[schema(minimum = 0.1, maximum = 200)]
    pub photon_energy_kev: Option<f64>,
    #[serde(default)]
    #[schema(exclusive_minimum = 0, maximum = 100)]
    pub detector_distance_m: Option<f64>,
    #[serde(default)]
    pub beam_center_x: Option<f64>,
    #[serde(default)]
    pub beam_center_y: Option<f64>,
    /// How the detector's frames are triggered, for the files: internal, external (each
    /// trigger signal starts a trigger's frames: a `POST /trigger` per signal, or the
    /// detector's own input) or gate (the signal's length is each frame's exposure, so
    /// `count_time_s` stays 0); not given: the configuration's (`detector.trigger_mode`).
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "external")]
    pub trigger_mode: Option<String>,
    /// A JUNGFRAU pedestal run instead of data (one trigger, the beam off): its raw dark
    /// frames (with a detector the service drives, a third each in dynamic, forced G1 and
    /// forced G2 gain) are recorded into `<prefix>_calibration.h5` beside the dataset's raw
    /// files, and the service's processing takes that calibration from then on.
    #[serde(default)]
    #[schema(default = false)]
    pub pedestal: bool,
}

impl ArmRequest {
    /// The configuration sections that carry this dataset's metadata to its acquisition
    /// (empty where the arm gives none).
    pub fn metadata_sections(&self) -> toml::Table {
        let mut detector = toml::Table::new();
        let given = [("photon_energy_kev", self.photon_energy_kev), ("distance_m", self.detector_distance_m), ("beam_center_x", self.beam_center_x), ("beam_center_y", self.beam_center_y)];
        for (key, v) in given {
            if let Some(v) = v {
                detector.insert(key.into(), v.into());
            }
        }
        if let Some(mode) = &self.trigger_mode {
            detector.insert("trigger_mode".into(), mode.clone().into());
        }
        let mut t = toml::Table::new();
        if !detector.is_empty() {
            t.insert("detector".into(), detector.into());
        }
        if !self.sample_name.is_empty() {
            t.insert("sample".into(), toml::Table::from_iter([("name".to_string(), toml::Value::from(self.sample_name.clone()))]).into());
        }
        t
    }

    /// Checks the metadata fields (each error names its field).
    fn check_metadata(&self) -> Result<(), ServiceError> {
        use rdaq_proto::metadata;
        let named = |r: Result<(), metadata::Refused>| r.map_err(|(name, why)| field(name, why));
        named(metadata::sample_name("sample_name", &self.sample_name))?;
        named(self.photon_energy_kev.map_or(Ok(()), |e| metadata::photon_energy("photon_energy_kev", e)))?;
        named(self.detector_distance_m.map_or(Ok(()), |m| metadata::distance("detector_distance_m", m)))?;
        named(self.beam_center_x.map_or(Ok(()), |x| metadata::beam_center("beam_center_x", x)))?;
        named(self.beam_center_y.map_or(Ok(()), |y| metadata::beam_center("beam_center_y", y)))?;
        if let Some(mode) = &self.trigger_mode {
            named(metadata::trigger_mode("trigger_mode", mode))?;
            named(metadata::gate_exposure("count_time_s", mode, self.count_time_s))?;
        }
        Ok(())
    }
}

fn one() -> u64 {
    1
}

fn yes() -> bool {
    true
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Idle,
    Armed,
    Acquiring,
    Error,
}

/// One dataset: what was armed, where it goes, and how far it came.
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct Dataset {
    /// Counts the service's datasets from 1.
    pub number: u64,
    pub request: ArmRequest,
    /// The master file's absolute path.
    #[schema(value_type = String)]
    pub master: PathBuf,
    /// The frames' dataset in the master file.
    pub dataset: &'static str,
    /// Triggers whose frames were sent.
    pub triggers_done: u64,
    /// Frames written so far (never decreases).
    pub frames_written: u64,
    /// Ended early (cancelled, disarmed after a trigger, or failed).
    pub cancelled: bool,
    /// Once it ended: frames it asked for that are not in its files at all (they never
    /// arrived, or not in time); the summary says which and why. Not known (null) for a
    /// cancelled dataset of a receiver on its own: what its detector sent after the cancel
    /// was not waited for.
    pub frames_lost: Option<u64>,
    /// The acquisition's report once the dataset ended (the one `rdaq manage` writes).
    #[schema(value_type = Option<Object>)]
    pub summary: Option<serde_json::Value>,
    /// Once it ended, what a clean end hides: frames lost (none: nothing to say).
    pub warning: Option<String>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ServiceError {
    /// Not possible in the state the service is in (HTTP 409).
    #[error("{0}")]
    State(String),
    /// A field of the request out of range (HTTP 400); names the field.
    #[error("{field}: {why}")]
    Field { field: &'static str, why: String },
}

fn field(field: &'static str, why: impl Into<String>) -> ServiceError {
    ServiceError::Field { field, why: why.into() }
}

/// What the I/O side does after a trigger: send `frames` frames from `first_frame` on, into
/// dataset `number`'s files.
#[derive(Clone, Debug, PartialEq)]
pub struct Send {
    pub number: u64,
    pub first_frame: u64,
    pub frames: u64,
    pub period_s: f64,
}

#[derive(Debug)]
pub struct Service {
    root: PathBuf,
    state: State,
    error: Option<String>,
    current: Option<Dataset>,
    /// The I/O side is closing the dataset's files before its last trigger: cancelled
    /// (true), or an open-ended dataset disarmed (false).
    closing: Option<bool>,
    /// The last dataset that ended, for `/acquisition` after it.
    last: Option<Dataset>,
    datasets: u64,
}

impl Service {
    /// A service writing under `root` (absolute: every path it gives out is).
    pub fn new(root: PathBuf) -> Service {
        Service { root, state: State::Idle, error: None, current: None, closing: None, last: None, datasets: 0 }
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// Why the service is in `error`.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// The dataset armed or acquiring, else the last one that ended.
    pub fn dataset(&self) -> Option<&Dataset> {
        self.current.as_ref().or(self.last.as_ref())
    }

    /// Whether the dataset's files are being closed before its last trigger.
    pub fn is_closing(&self) -> bool {
        self.closing.is_some()
    }

    /// Whether they are being closed because the dataset was cancelled.
    pub fn is_cancelling(&self) -> bool {
        self.closing == Some(true)
    }

    /// Whether an arm would be taken in this state (what `arm` checks first: the I/O side
    /// asks before it touches anything).
    pub fn can_arm(&self) -> Result<(), ServiceError> {
        if self.closing.is_some() {
            return Err(ServiceError::State("closing: the dataset's files are being closed".into()));
        }
        match self.state {
            State::Acquiring => Err(ServiceError::State("acquiring: cancel it, or wait until it ends, before arming".into())),
            State::Armed if self.current.as_ref().is_some_and(|d| d.triggers_done > 0) => {
                Err(ServiceError::State("armed and triggered: the dataset is under way (disarm or cancel it first)".into()))
            }
            _ => Ok(()),
        }
    }

    /// Arms the next dataset (again, until its first trigger); refused while acquiring.
    pub fn arm(&mut self, req: ArmRequest) -> Result<&Dataset, ServiceError> {
        self.can_arm()?;
        let master = self.master(&req)?;
        let number = match self.state {
            State::Armed => self.datasets,
            _ => self.datasets + 1,
        };
        self.datasets = number;
        self.state = State::Armed;
        self.error = None;
        Ok(self.current.insert(Dataset { number, request: req, master, dataset: FRAMES_DATASET, triggers_done: 0, frames_written: 0, cancelled: false, frames_lost: None, summary: None, warning: None }))
    }

    /// The master file an arm request names, once its fields are in range (what `arm`
    /// checks first: the I/O side may look at the file before arming).
    pub fn master(&self, r: &ArmRequest) -> Result<PathBuf, ServiceError> {
        if r.frames_per_trigger == 0 || r.frames_per_trigger > MAX_FRAMES_PER_TRIGGER {
            return Err(field("frames_per_trigger", format!("{}; from 1 to {MAX_FRAMES_PER_TRIGGER}", r.frames_per_trigger)));
        }
        if r.pedestal && r.triggers != 1 {
            return Err(field("triggers", format!("{} for a pedestal dataset, which takes one trigger", r.triggers)));
        }
        if r.triggers > MAX_TRIGGERS {
            return Err(field("triggers", format!("{}; up to {MAX_TRIGGERS} (0: until disarm)", r.triggers)));
        }
        if !(r.period_s.is_finite() && (0.0..=MAX_PERIOD_S).contains(&r.period_s)) {
            return Err(field("period_s", format!("{}; from 0 (as fast as possible) to {MAX_PERIOD_S} s", r.period_s)));
        }
        r.check_metadata()?;
        rdaq_proto::times::check(r.count_time_s, r.period_s).map_err(|(name, why)| field(if name == "frame_time_s" { "period_s" } else { "count_time_s" }, why))?;
        if r.prefix.len() > 200 || !names::is_plain_file_name(&r.prefix) {
            return Err(field("prefix", format!("{:?} is not a plain file name", r.prefix)));
        }
        if !names::is_relative_dir(&r.directory) {
            return Err(field("directory", format!("{:?} is not a directory under the data root (relative, without ..)", r.directory)));
        }
        Ok(self.root.join(&r.directory).join(format!("{}_master.h5", r.prefix)))
    }

    /// Starts the next trigger of the armed dataset; refused unless armed.
    pub fn trigger(&mut self) -> Result<Send, ServiceError> {
        let (State::Armed, Some(d), None) = (self.state, self.current.as_mut(), self.closing) else {
            return Err(ServiceError::State(self.why_no_trigger()));
        };
        let r = &d.request;
        let send = Send { number: d.number, first_frame: d.triggers_done * r.frames_per_trigger, frames: r.frames_per_trigger, period_s: r.period_s };
        self.state = State::Acquiring;
        Ok(send)
    }

    /// Frames written so far in the dataset acquiring (a count that only grows).
    pub fn written(&mut self, frames: u64) {
        if let Some(d) = self.current.as_mut() {
            d.frames_written = d.frames_written.max(frames);
        }
    }

    /// The frames of the trigger under way were all sent and written. Returns whether that
    /// was the last trigger (or a cancel came meanwhile): the I/O side then closes the
    /// dataset's files and calls [`Service::closed`]; otherwise the service is armed for the
    /// next trigger.
    pub fn trigger_done(&mut self) -> bool {
        let Some(d) = self.current.as_mut().filter(|_| self.state == State::Acquiring) else { return false };
        d.triggers_done += 1;
        let more = d.request.triggers == 0 || d.triggers_done < d.request.triggers;
        if more && self.closing.is_none() {
            self.state = State::Armed;
            return false;
        }
        true
    }

    /// The I/O side closed the dataset's files: it ends with `summary` and the frames it
    /// lost (none when no files were open), and the service is idle.
    pub fn closed(&mut self, summary: serde_json::Value, frames_lost: Option<u64>) {
        self.ended_with(summary, frames_lost);
        let cancelled = self.closing.unwrap_or(false);
        self.end(cancelled);
    }

    /// What the I/O side could close of a dataset that is failing (call [`Service::fail`]
    /// next): its summary and the frames it lost.
    pub fn ended_with(&mut self, summary: serde_json::Value, frames_lost: Option<u64>) {
        if let Some(d) = self.current.as_mut() {
            d.summary = Some(summary);
            d.frames_lost = frames_lost;
            d.warning = frames_lost.filter(|&n| n > 0).map(|n| format!("{n} frames lost: not in the files (the summary says which and why)"));
        }
    }

    /// Drops an arm before its first trigger; refused while acquiring (cancel instead).
    /// After a trigger it ends the dataset (see [`Service::cancel`]): cancelled, unless the
    /// dataset was open-ended (`triggers` 0), which ends so.
    pub fn disarm(&mut self) -> Result<bool, ServiceError> {
        if self.closing.is_some() {
            // the files are being closed already: asked once
            return Ok(false);
        }
        match (self.state, &self.current) {
            (State::Acquiring, _) => Err(ServiceError::State("acquiring: cancel it instead".into())),
            (State::Armed, Some(d)) if d.triggers_done > 0 && d.request.triggers == 0 => Ok(self.close(false)),
            (State::Armed, Some(d)) if d.triggers_done > 0 => self.cancel(),
            _ => {
                self.current = None;
                self.state = if self.state == State::Error { State::Error } else { State::Idle };
                Ok(false)
            }
        }
    }

    /// Asks the I/O side to close the files (once); returns whether this asked it. The
    /// dataset is `acquiring` until they are closed (`idle` means its master is complete),
    /// also when it is closed between triggers.
    fn close(&mut self, cancelled: bool) -> bool {
        let first = self.closing.is_none();
        self.closing.get_or_insert(cancelled);
        self.state = State::Acquiring;
        first
    }

    /// Ends the dataset under way early: it keeps what was written. Returns whether the I/O
    /// side must close the dataset's files (a trigger was started), then call
    /// [`Service::closed`]; an arm not yet triggered ends at once. A second cancel while
    /// the files close asks nothing more.
    pub fn cancel(&mut self) -> Result<bool, ServiceError> {
        let Some(d) = &self.current else {
            return Err(ServiceError::State(format!("{}: nothing to cancel", self.state_name())));
        };
        if self.state == State::Armed && d.triggers_done == 0 {
            self.end(true);
            return Ok(false);
        }
        Ok(self.close(true))
    }

    /// A failure the I/O side saw (after closing what it could): the dataset ends, and the
    /// service says why until the next arm.
    pub fn fail(&mut self, reason: String) {
        if self.current.is_some() {
            self.end(true);
        }
        self.state = State::Error;
        self.error = Some(reason);
    }

    fn end(&mut self, cancelled: bool) {
        if let Some(mut d) = self.current.take() {
            d.cancelled = cancelled;
            self.last = Some(d);
        }
        self.closing = None;
        self.state = State::Idle;
    }

    /// Why a trigger is refused now, and what would let one through.
    fn why_no_trigger(&self) -> String {
        match (&self.current, self.closing) {
            (Some(_), Some(true)) => "cancelling: the dataset's files are being closed; arm the next one".into(),
            (Some(_), Some(false)) => "closing: the dataset's files are being closed; arm the next one".into(),
            (Some(d), None) if self.state == State::Acquiring => {
                format!("acquiring: trigger {} of dataset {} is under way; the next is taken once its frames are written (state armed)", d.triggers_done + 1, d.number)
            }
            _ => format!("{}: arm first", self.state_name()),
        }
    }

    fn state_name(&self) -> &'static str {
        match self.state {
            State::Idle => "idle",
            State::Armed => "armed",
            State::Acquiring => "acquiring",
            State::Error => "error",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn arm(frames: u64, triggers: u64) -> ArmRequest {
        ArmRequest { frames_per_trigger: frames, triggers, period_s: 0.01, count_time_s: 0.0, directory: "run1".into(), prefix: "sample".into(), process: true, sample_name: String::new(), photon_energy_kev: None, detector_distance_m: None, beam_center_x: None, beam_center_y: None, trigger_mode: None, pedestal: false }
    }

    #[test]
    fn datasets_go_idle_armed_acquiring_idle_many_times() {
        let mut s = Service::new("/data".into());
        for n in 1..=3 {
            let d = s.arm(arm(5, 2)).unwrap();
            assert_eq!((d.number, d.master.as_path(), d.dataset), (n, Path::new("/data/run1/sample_master.h5"), FRAMES_DATASET));
            assert_eq!(s.trigger().unwrap(), Send { number: n, first_frame: 0, frames: 5, period_s: 0.01 });
            assert_eq!(s.state(), State::Acquiring);
            s.written(3);
            s.written(2);
            assert_eq!(s.dataset().unwrap().frames_written, 3, "the count never goes back");
            assert!(!s.trigger_done());
            assert_eq!(s.state(), State::Armed, "one trigger left");
            assert_eq!(s.trigger().unwrap().first_frame, 5);
            s.written(10);
            assert!(s.trigger_done(), "the last trigger: close the files");
            assert_eq!(s.state(), State::Acquiring, "acquiring until the files are closed");
            s.closed(serde_json::json!({ "frames_complete": 10 }), Some(0));
            assert_eq!(s.state(), State::Idle);
            let d = s.dataset().unwrap();
            assert_eq!((d.number, d.triggers_done, d.frames_written, d.cancelled), (n, 2, 10, false));
            assert_eq!(d.summary.as_ref().unwrap()["frames_complete"], 10);
            assert_eq!(d.frames_lost, Some(0));
        }
    }

    #[test]
    fn what_a_state_does_not_allow_is_refused_and_changes_nothing() {
        let mut s = Service::new("/data".into());
        assert!(matches!(s.trigger(), Err(ServiceError::State(m)) if m.contains("arm first")), "trigger before arm");
        assert!(s.cancel().is_err());
        s.arm(arm(5, 1)).unwrap();
        let again = s.arm(ArmRequest { prefix: "other".into(), ..arm(7, 1) }).unwrap();
        assert_eq!((again.number, again.request.frames_per_trigger), (1, 7), "re-arming replaces the arm");
        s.trigger().unwrap();
        assert!(matches!(s.arm(arm(5, 1)), Err(ServiceError::State(_))), "a second arm while acquiring");
        assert!(s.disarm().is_err(), "disarm while acquiring");
        assert!(s.trigger().is_err(), "trigger while acquiring");
        assert_eq!(s.state(), State::Acquiring);
        assert_eq!(s.cancel(), Ok(true), "close the files");
        assert_eq!(s.cancel(), Ok(false), "already closing");
        assert!(s.arm(arm(5, 1)).is_err(), "arm while the files close");
        assert!(s.trigger_done(), "a cancelled trigger closes");
        s.closed(serde_json::Value::Null, None);
        assert_eq!((s.state(), s.dataset().unwrap().cancelled), (State::Idle, true));
        s.arm(arm(5, 1)).unwrap();
        assert_eq!(s.disarm(), Ok(false));
        assert_eq!((s.state(), s.dataset().unwrap().number), (State::Idle, 1), "a dropped arm leaves the last dataset as it was");
        s.arm(arm(5, 1)).unwrap();
        assert_eq!(s.cancel(), Ok(false), "an arm not triggered ends at once");
        assert_eq!(s.state(), State::Idle);
    }

    #[test]
    fn an_open_ended_dataset_takes_triggers_until_disarmed() {
        let mut s = Service::new("/data".into());
        s.arm(arm(4, 0)).unwrap();
        for k in 0..5 {
            assert_eq!(s.trigger().unwrap().first_frame, 4 * k);
            assert!(!s.trigger_done(), "never the last");
        }
        assert_eq!(s.disarm(), Ok(true), "close the files");
        assert_eq!(s.disarm(), Ok(false), "asked once");
        s.closed(serde_json::Value::Null, None);
        let d = s.dataset().unwrap();
        assert_eq!((s.state(), d.triggers_done, d.cancelled), (State::Idle, 5, false), "a normal end");
    }

    #[test]
    fn disarming_between_triggers_closes_the_dataset() {
        let mut s = Service::new("/data".into());
        s.arm(arm(5, 3)).unwrap();
        s.trigger().unwrap();
        assert!(!s.trigger_done());
        assert_eq!(s.disarm(), Ok(true), "files are open: close them");
        assert!(s.trigger().is_err(), "no trigger while the files close");
        s.closed(serde_json::Value::Null, None);
        let d = s.dataset().unwrap();
        assert_eq!((s.state(), d.triggers_done, d.cancelled), (State::Idle, 1, true));
    }

    #[test]
    fn a_failure_is_an_error_state_until_the_next_arm() {
        let mut s = Service::new("/data".into());
        s.arm(arm(5, 1)).unwrap();
        s.trigger().unwrap();
        s.fail("receiver dr0: disk full".into());
        assert_eq!((s.state(), s.error()), (State::Error, Some("receiver dr0: disk full")));
        assert!(s.dataset().unwrap().cancelled);
        assert!(s.trigger().is_err());
        s.arm(arm(5, 1)).unwrap();
        assert_eq!((s.state(), s.error()), (State::Armed, None));
    }

    #[test]
    fn arm_fields_are_bounded_and_paths_stay_under_the_root() {
        let mut s = Service::new("/data".into());
        let bad = |s: &mut Service, r: ArmRequest| match s.arm(r) {
            Err(ServiceError::Field { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(bad(&mut s, arm(0, 1)), "frames_per_trigger");
        assert_eq!(bad(&mut s, arm(MAX_FRAMES_PER_TRIGGER + 1, 1)), "frames_per_trigger");
        assert_eq!(bad(&mut s, arm(1, MAX_TRIGGERS + 1)), "triggers");
        assert_eq!(bad(&mut s, arm(1, u64::MAX)), "triggers");
        for p in [f64::NAN, -1.0, f64::INFINITY, 1e9] {
            assert_eq!(bad(&mut s, ArmRequest { period_s: p, ..arm(1, 1) }), "period_s", "{p}");
            assert_eq!(bad(&mut s, ArmRequest { count_time_s: p, ..arm(1, 1) }), "count_time_s", "{p}");
        }
        assert_eq!(bad(&mut s, ArmRequest { count_time_s: 0.02, ..arm(1, 1) }), "count_time_s", "longer than the period");
        assert_eq!(bad(&mut s, ArmRequest { photon_energy_kev: Some(0.0), ..arm(1, 1) }), "photon_energy_kev");
        assert_eq!(bad(&mut s, ArmRequest { detector_distance_m: Some(-0.1), ..arm(1, 1) }), "detector_distance_m");
        assert_eq!(bad(&mut s, ArmRequest { beam_center_y: Some(f64::NAN), ..arm(1, 1) }), "beam_center_y");
        assert_eq!(bad(&mut s, ArmRequest { sample_name: "a\tb".into(), ..arm(1, 1) }), "sample_name");
        assert_eq!(bad(&mut s, ArmRequest { trigger_mode: Some("edge".into()), ..arm(1, 1) }), "trigger_mode");
        assert_eq!(bad(&mut s, ArmRequest { pedestal: true, ..arm(30, 2) }), "triggers", "a pedestal is one trigger");
        let gate = |count_time_s| ArmRequest { trigger_mode: Some("gate".into()), count_time_s, ..arm(1, 1) };
        assert_eq!(bad(&mut s, gate(0.005)), "count_time_s", "a gate sets the exposure");
        for d in ["../elsewhere", "/etc", "a/../../b", "run\n1"] {
            assert_eq!(bad(&mut s, ArmRequest { directory: d.into(), ..arm(1, 1) }), "directory", "{d}");
        }
        for p in ["", "a/b", "..", ".hidden", "x\ny"] {
            assert_eq!(bad(&mut s, ArmRequest { prefix: p.into(), ..arm(1, 1) }), "prefix", "{p:?}");
        }
        assert_eq!(s.state(), State::Idle, "refused arms changed nothing");
        let d = s.arm(ArmRequest { directory: "".into(), ..arm(1, 1) }).unwrap();
        assert_eq!(d.master, Path::new("/data/sample_master.h5"), "no directory: the root");
        let sections = s.arm(gate(0.0)).unwrap().request.metadata_sections();
        assert_eq!(sections["detector"]["trigger_mode"].as_str(), Some("gate"), "the mode goes to the configuration");
        assert!(arm(1, 1).metadata_sections().is_empty(), "no mode given: the configuration's");
    }

    #[test]
    fn an_arm_request_names_its_fields_and_refuses_others() {
        let r: ArmRequest = serde_json::from_str(r#"{"frames_per_trigger": 10, "prefix": "s"}"#).unwrap();
        assert_eq!((r.triggers, r.period_s, r.directory.as_str(), r.process), (1, 0.0, "", true));
        let e = serde_json::from_str::<ArmRequest>(r#"{"frames_per_trigger": 10, "prefix": "s", "colour": 1}"#).unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
        assert!(serde_json::from_str::<ArmRequest>(r#"{"frames_per_trigger": -3, "prefix": "s"}"#).is_err(), "negative frames");
    }

    #[test]
    fn a_dataset_that_lost_frames_says_so_beside_its_clean_end() {
        let mut s = Service::new("/data".into());
        s.arm(arm(5, 1)).unwrap();
        s.trigger().unwrap();
        assert!(s.trigger_done());
        s.closed(serde_json::Value::Null, Some(3));
        let d = s.dataset().unwrap();
        assert_eq!((s.state(), d.warning.as_deref()), (State::Idle, Some("3 frames lost: not in the files (the summary says which and why)")));
        s.arm(arm(5, 1)).unwrap();
        s.trigger().unwrap();
        assert!(s.trigger_done());
        s.closed(serde_json::Value::Null, Some(0));
        assert_eq!(s.dataset().unwrap().warning, None);
    }
}
