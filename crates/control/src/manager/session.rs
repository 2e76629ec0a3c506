//! One acquisition of the system manager, step by step in the RASHPA initialization order:
//! the telegrams checked, the buffers defined on each receiver, the DTPs uploaded to the
//! detector, the receivers started, the detector run and watched (heartbeats, re-plans),
//! the events gathered and the report written.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdaq_manager::{tally, Epoch, Heartbeats, Plan, Reported, Topology};
use rdaq_proto::events::Event;
use rdaq_proto::telegram::{BufferMap, BufferRequest, DetectorTelegram, ReceiverTelegram};

use super::board::{self, Board, SharedBoard};
use super::processing;
use super::client::{Api, Feed};
use super::replan::{replan, Replan};
use super::report::{join_outputs, module_ends, sum_stops, Gathered, ReceiverReport, Report, JOINED};
use super::ManageArgs;
use crate::detector::{self, DetectorState, DetectorStatus, DtpUpload};
use crate::http::lock;
use crate::receiver::{self as daemon, StartAnswer, StopAnswer};

/// How one acquisition's receivers name their files (`<name>_master.h5`, or
/// `<prefix>_<name>_master.h5` in `directory`, under each daemon's output directory) and
/// what the files say of the frames.
pub(crate) struct Names {
    pub(crate) prefix: Option<String>,
    pub(crate) directory: Option<String>,
    pub(crate) overwrite: bool,
    /// The configuration sections of every receiver's acquisition (none: raw frames).
    pub(crate) sections: Option<toml::Table>,
    /// The frames' count time and frame time in seconds, for the files (0: unknown).
    pub(crate) times: (f64, f64),
}

/// Where the manager writes what an acquisition came to.
pub(crate) struct Files {
    pub(crate) report: PathBuf,
    pub(crate) events: PathBuf,
    pub(crate) manifest: PathBuf,
    /// One master over every receiver's files.
    pub(crate) master: PathBuf,
    pub(crate) overwrite: bool,
}

/// One acquisition under way: the configuration, the receivers' event feeds and liveness,
/// and what the detector's runs (one per trigger) said.
pub(crate) struct Running {
    pub(crate) c: Configured,
    pub(crate) feeds: HashMap<usize, Feed>,
    /// Each receiver's master, where it said it writes it (an absolute path).
    pub(crate) outputs: HashMap<usize, PathBuf>,
    pub(crate) w: Watch,
    pub(crate) det_events: Vec<Event>,
    pub(crate) det_stops: Vec<serde_json::Value>,
    pub(crate) manifest: String,
    /// Frames the detector's runs were to deliver.
    pub(crate) frames: u64,
    /// The detector's runs' time, each from its start until it had sent everything.
    pub(crate) elapsed: Duration,
}

/// How often the manager asks the detector whether its run ended.
pub(crate) const DETECTOR_POLL: Duration = Duration::from_millis(20);

/// One acquisition of the manager: its options, the topology, the control clients and what
/// its API shows.
pub(crate) struct Session<'a> {
    pub(crate) a: &'a ManageArgs,
    pub(crate) t: Topology,
    pub(crate) plan: Plan,
    pub(crate) det_ctl: SocketAddr,
    pub(crate) api: Api,
    /// Short timeouts: a receiver that does not answer in a heartbeat misses it.
    pub(crate) heartbeat: Api,
    pub(crate) shared: SharedBoard,
    /// The configuration sections of every receiver's acquisition (none: raw frames).
    pub(crate) sections: Option<toml::Table>,
}

/// What the manager configured: the plan's buffer requests, the receivers' answers, and the
/// epochs of DTPs (one more for each re-plan).
pub(crate) struct Configured {
    pub(crate) requests: Vec<(usize, BufferRequest)>,
    pub(crate) maps: Vec<BufferMap>,
    pub(crate) epochs: Vec<Epoch>,
}

/// The receivers still answering, and the names of those that stopped.
pub(crate) struct Watch {
    pub(crate) live: Vec<usize>,
    pub(crate) dead: BTreeSet<String>,
}

impl<'a> Session<'a> {
    /// Reads and checks the topology and the options, refuses existing output files, and
    /// starts the manager's API if asked.
    pub(crate) fn open(a: &'a ManageArgs) -> anyhow::Result<Session<'a>> {
        if !(a.rate >= 0.0 && a.rate.is_finite()) {
            bail!("--rate must be 0 (as fast as possible) or positive");
        }
        let access = a.access.access()?;
        let s = Session::connect(a, &access, a.frames)?;
        std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;
        let files = ["report.json", "events.jsonl", "manifest.csv", JOINED].map(|f| a.out.join(f));
        rdaq_run::outputs::refuse_existing(files.iter().map(PathBuf::as_path), a.overwrite)?;
        if let Some(addr) = a.serve {
            board::serve(addr, s.shared.clone(), std::sync::Arc::new(access))?;
        }
        Ok(s)
    }

    /// Reads and checks the topology; the control clients, with the token of `access`.
    pub(crate) fn connect(a: &'a ManageArgs, access: &crate::auth::Access, frames: u64) -> anyhow::Result<Session<'a>> {
        let text = std::fs::read_to_string(&a.topology).with_context(|| format!("cannot read {}", a.topology.display()))?;
        let t = Topology::from_toml(&text).with_context(|| format!("invalid topology {}", a.topology.display()))?;
        let plan = Plan::new(&t).with_context(|| format!("invalid topology {}", a.topology.display()))?;
        let det_ctl = t.detector.control.context("detector.control: the detector's control address is needed")?;
        let sections = processing::sections(&t).with_context(|| format!("invalid topology {}", a.topology.display()))?;
        let kept = if a.data_root.is_some() { board::EVENTS_KEPT_SERVICE } else { board::EVENTS_KEPT_RUN };
        let shared: SharedBoard = std::sync::Arc::new(std::sync::Mutex::new(Board::new(format!("manager {}", a.topology.display()), frames, kept)));
        let token = access.token().cloned();
        let api = Api::new(Duration::from_secs(60), token.as_ref());
        let heartbeat = Api::new(Duration::from_millis(a.heartbeat_ms.max(100)), token.as_ref());
        Ok(Session { a, t, plan, det_ctl, api, heartbeat, shared, sections })
    }

    /// Configures the system and starts every receiver of the plan, naming their files
    /// after `names`.
    pub(crate) fn begin(&self, names: &Names) -> anyhow::Result<Running> {
        let c = self.configure()?;
        let (feeds, outputs) = self.start_receivers(&c, names)?;
        let w = Watch { live: c.requests.iter().map(|(r, _)| *r).collect(), dead: BTreeSet::new() };
        Ok(Running { c, feeds, outputs, w, det_events: Vec::new(), det_stops: Vec::new(), manifest: String::new(), frames: 0, elapsed: Duration::ZERO })
    }

    /// One run of the detector: frames `first..first + frames` at `rate`, watched until
    /// sent (or stopped); its manifest and events join the acquisition's.
    pub(crate) fn send(&self, r: &mut Running, first: u64, frames: u64, rate: f64) -> anyhow::Result<()> {
        let run = detector::StartRequest { frames, rate_hz: rate, first_frame: first };
        let _: serde_json::Value = self.api.send("POST", self.det_ctl, "/start", &run).context("starting the detector")?;
        // the detector's event log starts anew with each run
        let mut det_feed = Feed::new(self.det_ctl, 0);
        let start = Instant::now();
        let watched = self.watch(&mut r.c, &mut r.w, &mut r.feeds, &mut det_feed, start);
        r.elapsed += start.elapsed();
        let det_stop: serde_json::Value = self.api.send("POST", self.det_ctl, "/stop", &serde_json::json!({})).context("stopping the detector")?;
        // a failed run was to deliver every frame asked for: those missing are lost
        r.frames += if watched.is_ok() { self.frames_sent(frames, &det_stop) } else { frames };
        let recorded = self.record_run(r, det_feed, det_stop);
        watched.and(recorded)
    }

    /// Keeps what the detector said of a run: its manifest rows, events and stop answer.
    fn record_run(&self, r: &mut Running, mut det_feed: Feed, det_stop: serde_json::Value) -> anyhow::Result<()> {
        let manifest = self.api.text(self.det_ctl, "/manifest").context("detector manifest")?;
        // one header over every run's rows
        let rows = if r.manifest.is_empty() { manifest.as_str() } else { manifest.split_once('\n').map_or("", |(_, rows)| rows) };
        r.manifest.push_str(rows);
        det_feed.pull(&self.api, &self.shared)?;
        r.det_events.append(&mut det_feed.events);
        r.det_stops.push(det_stop);
        Ok(())
    }

    /// Stops the receivers and gathers what the acquisition came to into its files and a
    /// report; `asked` is the frames asked for.
    pub(crate) fn end(&self, mut r: Running, files: &Files, asked: u64) -> anyhow::Result<Report> {
        rdaq_run::outputs::write_file(&files.manifest, r.manifest.as_bytes(), files.overwrite)?;
        let (g, events) = self.gather(&r.c, &mut r.w, &mut r.feeds, &r.outputs, &r.det_events)?;
        rdaq_run::outputs::write_file(&files.events, events.as_bytes(), files.overwrite)?;
        let (frames_complete, frames_lost) = tally(r.frames, &r.c.epochs, &r.w.dead, &g.reported);
        let joined = join_outputs(&files.master, &g.receivers, files.overwrite);
        Ok(Report {
            topology: self.a.topology.clone(),
            mode: format!("{:?}", self.t.transfer.mode),
            frames_expected: r.frames,
            stopped_early_of: (r.frames < asked).then_some(asked),
            frames_complete,
            frames_lost,
            frames_incomplete: g.reported.incomplete.into_iter().collect(),
            epochs: r.c.epochs,
            processing: processing::totals(g.receivers.values().filter_map(|r| r.processing.as_ref())),
            master: joined.as_ref().ok().cloned(),
            master_note: joined.err(),
            receivers: g.receivers,
            detector: sum_stops(r.det_stops),
            modules: module_ends(&r.det_events),
            elapsed_s: r.elapsed.as_secs_f64(),
        })
    }

    /// Components: the detector and every receiver of the plan are the ones the topology
    /// names.
    pub(crate) fn check_telegrams(&self) -> anyhow::Result<()> {
        let t = &self.t;
        let det: DetectorTelegram = self.api.get(self.det_ctl, "/telegram").context("detector")?;
        if det.modules != t.detector.modules {
            bail!("detector.modules: the topology says {}, the detector at {} has {}", t.detector.modules, self.det_ctl, det.modules);
        }
        self.plan.sends.agrees(det.native.as_ref(), det.module_bytes).map_err(|e| anyhow::anyhow!("detector.name: {e} (at {})", self.det_ctl))?;
        for &r in &t.participants() {
            let spec = &t.receivers[r];
            let tel: ReceiverTelegram = self.api.get(spec.control, "/telegram").with_context(|| format!("receiver {}", spec.name))?;
            if tel.name != spec.name {
                bail!("receivers.{}.control: {} answers as {:?}", spec.name, spec.control, tel.name);
            }
            if tel.data != spec.data {
                bail!("receivers.{}.data: the topology says {}, the receiver listens on {}", spec.name, spec.data, tel.data);
            }
        }
        Ok(())
    }

    /// Buffers on every receiver, the address space, then the DTPs to the detector.
    pub(crate) fn configure(&self) -> anyhow::Result<Configured> {
        let (t, plan) = (&self.t, &self.plan);
        let requests = plan.buffer_requests(t);
        let mut maps: Vec<BufferMap> = Vec::new();
        for (r, req) in &requests {
            let spec = &t.receivers[*r];
            maps.push(self.api.send("PUT", spec.control, "/buffers", req).with_context(|| format!("defining buffers on {}", spec.name))?);
        }
        let ras = rdaq_manager::AddressSpace::new(plan);
        let dtps = plan.module_dtps(t, &maps)?;
        let _: serde_json::Value = self.api.send("PUT", self.det_ctl, "/dtp", &DtpUpload { from_frame: None, dtps: dtps.clone() }).context("uploading DTPs")?;
        let receivers = plan.receivers.iter().map(|rp| t.receivers[rp.receiver].name.clone()).collect();
        tracing::info!(modules = t.detector.modules, receivers = plan.receivers.len(), mode = ?t.transfer.mode, address_space_mib = ras.len() >> 20, "planned");
        let epochs = vec![Epoch { from_frame: 0, receivers, reason: "initial plan".into(), dtps }];
        self.show_plan(&epochs);
        Ok(Configured { requests, maps, epochs })
    }

    /// The plan on the dashboard.
    pub(crate) fn show_plan(&self, epochs: &[Epoch]) {
        lock(&self.shared).set_plan(&format!("{:?}", self.t.transfer.mode), self.t.detector.modules, self.det_ctl, epochs);
    }

    /// Starts every receiver of the plan (each writes its part of the image); if one fails,
    /// those started go back to waiting (nothing was sent yet). Returns their event feeds
    /// and the masters they write.
    pub(crate) fn start_receivers(&self, c: &Configured, names: &Names) -> anyhow::Result<(HashMap<usize, Feed>, HashMap<usize, PathBuf>)> {
        let t = &self.t;
        let full = t.geometry();
        let mut feeds: HashMap<usize, Feed> = HashMap::new();
        let mut outputs = HashMap::new();
        let (streams, previews) = (t.streams(), t.previews());
        for (rp, (r, _)) in self.plan.receivers.iter().zip(&c.requests) {
            let spec = &t.receivers[*r];
            let g = rp.geometry(full);
            let output = Some(match &names.prefix {
                Some(p) => format!("{p}_{}_master.h5", spec.name),
                None => format!("{}_master.h5", spec.name),
            });
            let body = daemon::StartRequest {
                output,
                directory: names.directory.clone(),
                module_cols: g.module_cols,
                gap_x: g.gap_x,
                gap_y: g.gap_y,
                overwrite: names.overwrite,
                stream: Some(streams[*r].clone()),
                stream_may_move: spec.stream.is_none(),
                preview: Some(previews[*r].clone()),
                config: names.sections.clone(),
                count_time_s: names.times.0,
                frame_time_s: names.times.1,
                // a receiver of some of the modules says where they go (for a joiner)
                detector: (rp.modules.len() != full.modules as usize).then_some(daemon::DetectorGrid { modules: full.modules, module_cols: full.module_cols }),
            };
            let v: StartAnswer = match self.api.send("POST", spec.control, "/start", &body) {
                Ok(v) => v,
                Err(e) => {
                    for started in feeds.keys() {
                        let _ = self.api.send::<serde_json::Value>("POST", t.receivers[*started].control, "/stop", &serde_json::json!({}));
                    }
                    return Err(e.context(format!("starting {}", spec.name)));
                }
            };
            match &v.stream {
                Some(e) if spec.stream.is_none() && *e != streams[*r] => tracing::warn!(receiver = %spec.name, stream = %e, default = %streams[*r], "streaming on a free port: the default one was taken (another acquisition on that host?)"),
                Some(e) => tracing::info!(receiver = %spec.name, stream = %e, "streaming"),
                None => {}
            }
            if let Some(e) = &v.preview {
                tracing::info!(receiver = %spec.name, preview = %e, "preview");
            }
            feeds.insert(*r, Feed::new(spec.control, v.events_from));
            if let Some(o) = v.output.filter(|o| o.is_absolute()) {
                outputs.insert(*r, o);
            }
            lock(&self.shared).receivers.insert(spec.name.clone(), (true, None));
        }
        Ok((feeds, outputs))
    }

    /// Until the detector has sent everything (or the timeout): its progress, the receivers'
    /// heartbeats and events; re-plans when receivers stop answering.
    pub(crate) fn watch(&self, c: &mut Configured, w: &mut Watch, feeds: &mut HashMap<usize, Feed>, det_feed: &mut Feed, start: Instant) -> anyhow::Result<()> {
        let mut beats = Heartbeats::new(self.a.misses);
        let deadline = start + Duration::from_secs_f64(self.a.timeout_s);
        let period = Duration::from_millis(self.a.heartbeat_ms);
        let mut next_beat = start + period;
        loop {
            // the detector more often than the heartbeats: a short run ends when it does
            std::thread::sleep(DETECTOR_POLL.min(period));
            let st: DetectorStatus = self.api.get(self.det_ctl, "/status").context("detector status")?;
            let stop = {
                let mut b = lock(&self.shared);
                b.status = serde_json::json!({ "state": "running", "detector": st, "dead": w.dead });
                b.stop_requested
            };
            if stop || st.state != DetectorState::Running || Instant::now() > deadline {
                return Ok(());
            }
            if Instant::now() < next_beat {
                continue;
            }
            next_beat += period;
            det_feed.pull(&self.api, &self.shared)?;
            let lost_now = self.heartbeats(&w.live, &mut beats, feeds);
            if lost_now.is_empty() {
                continue;
            }
            w.live.retain(|r| !lost_now.contains(r));
            for &r in &lost_now {
                w.dead.insert(self.t.receivers[r].name.clone());
            }
            match replan(&self.api, self.det_ctl, &self.t, c, &w.live, &w.dead, st.frontier) {
                Ok(e) => {
                    tracing::warn!(from_frame = e.from_frame, receivers = ?e.receivers, "re-planned");
                    lock(&self.shared).events.push(Event::Replanned { from_frame: e.from_frame, receivers: e.receivers.clone(), reason: e.reason.clone() });
                    c.epochs.push(e);
                    self.show_plan(&c.epochs);
                }
                Err(Replan::Refused(why)) => tracing::error!("{why}"),
                Err(Replan::NoneLeft(why)) => bail!("{why}: no receiver is left, the acquisition cannot go on"),
            }
        }
    }

    /// What receiver `name` answered to `/status` (none: it did not), on the board.
    pub(crate) fn note_status(&self, name: &str, answer: Option<&serde_json::Value>) {
        let counters = answer.map(|v| v["counters"].clone()).filter(|c| !c.is_null());
        let processing = answer.and_then(|v| serde_json::from_value(v["processing"].clone()).ok());
        let to_writer = answer.and_then(|v| v["frames_to_writer"].as_u64());
        let mut b = lock(&self.shared);
        b.receivers.insert(name.to_string(), (answer.is_some(), counters));
        if let Some(n) = to_writer {
            b.to_writer.insert(name.to_string(), n);
        }
        if let Some(p) = processing {
            b.processing.insert(name.to_string(), p);
        }
    }

    /// One heartbeat round: the receivers that just reached `--misses` missed heartbeats.
    pub(crate) fn heartbeats(&self, live: &[usize], beats: &mut Heartbeats, feeds: &mut HashMap<usize, Feed>) -> Vec<usize> {
        let mut lost_now = Vec::new();
        for &r in live {
            let spec = &self.t.receivers[r];
            let answer = self.heartbeat.get::<serde_json::Value>(spec.control, "/status");
            self.note_status(&spec.name, answer.as_ref().ok());
            if answer.is_ok() {
                if let Some(f) = feeds.get_mut(&r) {
                    // a failed pull is a missed heartbeat next time round, not an error
                    let _ = f.pull(&self.heartbeat, &self.shared);
                }
            }
            if beats.answer(r, answer.is_ok()) {
                let why = answer.err().map_or(String::new(), |e| format!("{e:#}"));
                tracing::error!(receiver = %spec.name, "stopped answering ({why})");
                lost_now.push(r);
            }
        }
        lost_now
    }

    /// Stops every receiver still alive and gathers its answer and events; returns them with
    /// the events of all components, as JSON lines. A dead receiver's files are recovered
    /// where they can be read from here (`outputs`), so that the master holds its frames.
    pub(crate) fn gather(&self, c: &Configured, w: &mut Watch, feeds: &mut HashMap<usize, Feed>, outputs: &HashMap<usize, PathBuf>, det_events: &[Event]) -> anyhow::Result<(Gathered, String)> {
        let mut g = Gathered { receivers: BTreeMap::new(), reported: Reported::default() };
        let mut events_out = String::new();
        for (r, _) in &c.requests {
            let spec = &self.t.receivers[*r];
            let mut rep = ReceiverReport::default();
            if w.live.contains(r) {
                match self.api.send::<StopAnswer>("POST", spec.control, "/stop", &serde_json::json!({})) {
                    Ok(v) => {
                        rep = ReceiverReport::from_stop(v);
                        if let Some(p) = rep.processing.as_ref().and_then(|p| serde_json::from_value(p.clone()).ok()) {
                            lock(&self.shared).processing.insert(spec.name.clone(), p);
                        }
                    }
                    Err(e) => {
                        tracing::error!(receiver = %spec.name, "failed at the end: {e:#}");
                        w.dead.insert(spec.name.clone());
                    }
                }
            }
            // only this host's receivers: a writer elsewhere that still runs would not be seen
            if !rep.alive && spec.control.ip().is_loopback() {
                rep.recover(&spec.name, outputs.get(r));
            }
            if rep.alive {
                let feed = feeds.get_mut(r).expect("a feed per started receiver");
                feed.pull(&self.api, &self.shared)?;
                rep.events_dropped = feed.dropped;
                for e in std::mem::take(&mut feed.events) {
                    events_out.push_str(&serde_json::to_string(&e)?);
                    events_out.push('\n');
                    g.note(e);
                }
            }
            g.receivers.insert(spec.name.clone(), rep);
        }
        for e in det_events {
            events_out.push_str(&serde_json::to_string(e)?);
            events_out.push('\n');
        }
        Ok((g, events_out))
    }

    /// Writes the report and shows it on the manager's API.
    pub(crate) fn publish(&self, report: &Report, lost: bool, files: &Files) -> anyhow::Result<()> {
        rdaq_run::outputs::write_file(&files.report, serde_json::to_string_pretty(report)?.as_bytes(), files.overwrite)?;
        let mut b = lock(&self.shared);
        b.report = Some(serde_json::to_value(report)?);
        b.lost = Some(lost);
        b.status = serde_json::json!({ "state": "done", "frames_complete": report.frames_complete, "frames_lost": report.frames_lost.len() });
        Ok(())
    }
}

impl Session<'_> {
    /// The frames a run of `frames` should have delivered: all, or after an operator's stop
    /// those the detector started (a frame some modules had not sent yet is reported
    /// incomplete or lost, not left out).
    pub(crate) fn frames_sent(&self, frames: u64, det_stop: &serde_json::Value) -> u64 {
        if !lock(&self.shared).stop_requested {
            return frames;
        }
        let module_frames = det_stop["module_frames"].as_u64().unwrap_or(frames * self.t.detector.modules as u64);
        module_frames.div_ceil(self.t.detector.modules.max(1) as u64).min(frames)
    }
}
