//! `rdaq manage`: the system manager's acquisition, over the daemons' control APIs, in the
//! RASHPA initialization order: telegrams (components), buffers on each receiver (buffers,
//! RAS), DTPs to the detector (RAS map, DTP), start. While it runs, the manager checks every
//! receiver's heartbeat; when one stops answering, it re-plans the remaining frames over the
//! receivers left (where the plan allows it without touching their buffers). At the end it
//! gathers the events and writes a report in which a frame counts as received only if every
//! receiver it was sent to is alive and reported it complete.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdaq_manager::{tally, Epoch, Heartbeats, Plan, Reported, Topology};
use rdaq_proto::events::{Event, EventPage};
use rdaq_proto::telegram::{BufferMap, BufferRequest, DetectorTelegram, ModuleDtp, ReceiverTelegram};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::detector::{self, DetectorState, DetectorStatus, DtpUpload};
use crate::receiver::{self as daemon, StartAnswer, StopAnswer};

#[derive(clap::Args)]
pub struct ManageArgs {
    /// Topology file (TOML): detector (with its control address), receivers, transfer mode.
    #[arg(long)]
    topology: PathBuf,
    #[arg(long, default_value_t = 100)]
    frames: u64,
    /// Frames per second (0: as fast as possible).
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Directory for the report, the events and the manifest (on the manager's host).
    #[arg(long, default_value = "out")]
    out: PathBuf,
    /// Heartbeat period.
    #[arg(long, default_value_t = 200)]
    heartbeat_ms: u64,
    /// Heartbeats a receiver may miss before it counts as dead.
    #[arg(long, default_value_t = 3)]
    misses: u32,
    /// Give up waiting for the detector after this long.
    #[arg(long, default_value_t = 600.0)]
    timeout_s: f64,
    #[arg(long)]
    tolerate_loss: bool,
    /// Replace the report, events and manifest in --out, and the receivers' files of the same
    /// names (default: refuse, naming the file, before anything starts).
    #[arg(long)]
    overwrite: bool,
    /// Serve the manager's API here (/status, /events, /report): events as they are gathered,
    /// the report at the end; keeps serving after the run until Ctrl-C.
    #[arg(long, value_parser = crate::http::listen_addr)]
    serve: Option<SocketAddr>,
    /// The token the manager sends to the daemons, and that its own API needs for reads
    /// when `--protect-reads` is given.
    #[command(flatten)]
    access: crate::auth::AccessArgs,
}

mod board;
mod processing;

use board::{Board, SharedBoard};
use crate::http::lock;

/// A blocking JSON client of the control APIs.
struct Api {
    agent: ureq::Agent,
    /// `Authorization` header value for the daemons.
    bearer: Option<String>,
}

impl Api {
    fn new(timeout: Duration, token: Option<&crate::auth::Token>) -> Api {
        Api { agent: ureq::AgentBuilder::new().timeout_connect(Duration::from_millis(1000)).timeout(timeout).build(), bearer: token.map(|t| t.bearer()) }
    }

    fn request(&self, method: &str, url: &str) -> ureq::Request {
        let r = self.agent.request(method, url);
        match &self.bearer {
            Some(b) => r.set("Authorization", b),
            None => r,
        }
    }

    fn answer<T: DeserializeOwned>(url: &str, r: Result<ureq::Response, ureq::Error>) -> anyhow::Result<T> {
        match r {
            Ok(resp) => resp.into_json::<T>().with_context(|| format!("{url}: unexpected answer")),
            Err(ureq::Error::Status(code, resp)) => {
                let msg = resp.into_json::<serde_json::Value>().ok().and_then(|v| v["error"].as_str().map(String::from)).unwrap_or_default();
                bail!("{url}: {code} {msg}")
            }
            Err(e) => bail!("{url}: {e}"),
        }
    }

    fn get<T: DeserializeOwned>(&self, host: SocketAddr, path: &str) -> anyhow::Result<T> {
        let url = format!("http://{host}{path}");
        Self::answer(&url, self.request("GET", &url).call())
    }

    fn text(&self, host: SocketAddr, path: &str) -> anyhow::Result<String> {
        let url = format!("http://{host}{path}");
        let r = self.request("GET", &url).call().map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
        r.into_string().with_context(|| format!("{url}: unreadable answer"))
    }

    fn send<T: DeserializeOwned>(&self, method: &str, host: SocketAddr, path: &str, body: &impl Serialize) -> anyhow::Result<T> {
        let url = format!("http://{host}{path}");
        Self::answer(&url, self.request(method, &url).send_json(serde_json::to_value(body)?))
    }
}

#[derive(Serialize, Default)]
struct ReceiverReport {
    alive: bool,
    frames_complete: u64,
    frames_incomplete: u64,
    frames_discarded: u64,
    output: Option<PathBuf>,
    /// Frames it refused whole because its ring was full (its consumer was behind).
    frames_refused: u64,
    /// Frames it received after writing failed, and why writing failed.
    frames_not_saved: u64,
    write_error: Option<String>,
    counters: serde_json::Value,
    events_dropped: u64,
    /// Its processing report (none: it wrote raw frames).
    processing: Option<serde_json::Value>,
}

#[derive(Serialize)]
struct Report {
    topology: PathBuf,
    mode: String,
    frames_expected: u64,
    /// The frames asked for, when an operator stopped the run before the detector sent them
    /// all (`frames_expected` is then what it started).
    stopped_early_of: Option<u64>,
    frames_complete: u64,
    /// Frames sent to a receiver that died, or never reported by a receiver they were sent to.
    frames_lost: Vec<u64>,
    /// Frames some receiver finished incomplete (missing data marked or discarded).
    frames_incomplete: Vec<u64>,
    epochs: Vec<Epoch>,
    receivers: BTreeMap<String, ReceiverReport>,
    /// One master over every receiver's data files, in frame order (none: see
    /// `master_note`).
    master: Option<PathBuf>,
    master_note: Option<String>,
    /// The receivers' processing counts summed (none: raw frames).
    processing: Option<serde_json::Value>,
    detector: serde_json::Value,
    modules: Vec<serde_json::Value>,
    elapsed_s: f64,
}

/// Events of one component, gathered as they come: `next` is the number to ask for next
/// (an acquisition's own start on a daemon that ran others).
struct Feed {
    host: SocketAddr,
    next: u64,
    dropped: u64,
    events: Vec<Event>,
}

impl Feed {
    fn new(host: SocketAddr, next: u64) -> Feed {
        Feed { host, next, dropped: 0, events: Vec::new() }
    }

    /// Fetches what is new; copies it to the manager's log.
    fn pull(&mut self, api: &Api, log: &SharedBoard) -> anyhow::Result<()> {
        loop {
            let page: EventPage = api.get(self.host, &format!("/events?since={}&limit=10000", self.next))?;
            self.dropped = self.dropped.max(page.dropped);
            if page.first > self.next {
                // the component's log dropped events before we read them: say so in ours
                let lost = page.first - self.next;
                let e = Event::Error { source: self.host.to_string(), message: format!("{lost} events dropped before they were read") };
                lock(log).events.push(e);
            }
            if page.events.is_empty() {
                return Ok(());
            }
            self.next = page.next;
            let mut b = lock(log);
            for e in &page.events {
                b.events.push(e.clone());
            }
            drop(b);
            self.events.extend(page.events);
        }
    }
}

/// Where each receiver's ring stands at frame `until` under `dtps` (over all modules).
fn ring_positions(dtps: &[ModuleDtp], until: u64) -> HashMap<String, u64> {
    let mut pos = HashMap::new();
    for d in dtps {
        for (name, k) in d.ring_next(until) {
            let e = pos.entry(name.to_string()).or_insert(0);
            *e = (*e).max(k);
        }
    }
    pos
}

/// The manager's acquisition: configure, start, watch, gather, report. Exit 1 when data was
/// lost (unless `--tolerate-loss`).
pub fn manage(a: ManageArgs) -> anyhow::Result<ExitCode> {
    let s = Session::open(&a)?;
    s.check_telegrams()?;
    let mut c = s.configure()?;
    let mut feeds = s.start_receivers(&c)?;
    let start = Instant::now();
    let run = detector::StartRequest { frames: a.frames, rate_hz: a.rate, first_frame: 0 };
    let _: serde_json::Value = s.api.send("POST", s.det_ctl, "/start", &run).context("starting the detector")?;
    // the detector's event log starts anew with each run
    let mut det_feed = Feed::new(s.det_ctl, 0);
    let mut w = Watch { live: c.requests.iter().map(|(r, _)| *r).collect(), dead: BTreeSet::new() };
    s.watch(&mut c, &mut w, &mut feeds, &mut det_feed, start)?;
    let elapsed = start.elapsed();
    let det_stop: serde_json::Value = s.api.send("POST", s.det_ctl, "/stop", &serde_json::json!({})).context("stopping the detector")?;
    let frames = frames_expected(&a, &s, &det_stop);
    let manifest = s.api.text(s.det_ctl, "/manifest").context("detector manifest")?;
    rdaq_run::outputs::write_file(&a.out.join("manifest.csv"), manifest.as_bytes(), a.overwrite)?;
    det_feed.pull(&s.api, &s.shared)?;
    let g = s.gather(&c, &mut w, &mut feeds, &det_feed.events)?;
    let (frames_complete, frames_lost) = tally(frames, &c.epochs, &w.dead, &g.reported);
    let joined = join_outputs(&a, &g.receivers);
    let report = Report {
        topology: a.topology.clone(),
        mode: format!("{:?}", s.t.transfer.mode),
        frames_expected: frames,
        stopped_early_of: (frames < a.frames).then_some(a.frames),
        frames_complete,
        frames_lost,
        frames_incomplete: g.reported.incomplete.into_iter().collect(),
        epochs: c.epochs,
        processing: processing::totals(g.receivers.values().filter_map(|r| r.processing.as_ref())),
        master: joined.as_ref().ok().cloned(),
        master_note: joined.err(),
        receivers: g.receivers,
        detector: det_stop,
        modules: module_ends(&det_feed.events),
        elapsed_s: elapsed.as_secs_f64(),
    };
    let loss = report.frames_complete < frames || report.receivers.values().any(|r| r.write_error.is_some());
    s.publish(&report, loss)?;
    print_report(&report, &a.out);
    if a.serve.is_some() {
        tracing::info!("done; the API keeps serving the report until Ctrl-C");
        let (tx, rx) = std::sync::mpsc::channel();
        ctrlc::set_handler(move || {
            let _ = tx.send(());
        })?;
        let _ = rx.recv();
    }
    if loss && !a.tolerate_loss {
        tracing::warn!("data was lost (use --tolerate-loss to exit 0 anyway)");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// One acquisition of the manager: its options, the topology, the control clients and what
/// its API shows.
struct Session<'a> {
    a: &'a ManageArgs,
    t: Topology,
    plan: Plan,
    det_ctl: SocketAddr,
    api: Api,
    /// Short timeouts: a receiver that does not answer in a heartbeat misses it.
    heartbeat: Api,
    shared: SharedBoard,
    /// The configuration sections of every receiver's acquisition (none: raw frames).
    sections: Option<toml::Table>,
}

/// What the manager configured: the plan's buffer requests, the receivers' answers, and the
/// epochs of DTPs (one more for each re-plan).
struct Configured {
    requests: Vec<(usize, BufferRequest)>,
    maps: Vec<BufferMap>,
    epochs: Vec<Epoch>,
}

/// The receivers still answering, and the names of those that stopped.
struct Watch {
    live: Vec<usize>,
    dead: BTreeSet<String>,
}

/// What the receivers said at the end.
struct Gathered {
    receivers: BTreeMap<String, ReceiverReport>,
    reported: Reported,
}

impl<'a> Session<'a> {
    /// Reads and checks the topology and the options, refuses existing output files, and
    /// starts the manager's API if asked.
    fn open(a: &'a ManageArgs) -> anyhow::Result<Session<'a>> {
        let text = std::fs::read_to_string(&a.topology).with_context(|| format!("cannot read {}", a.topology.display()))?;
        let t = Topology::from_toml(&text).with_context(|| format!("invalid topology {}", a.topology.display()))?;
        let plan = Plan::new(&t).with_context(|| format!("invalid topology {}", a.topology.display()))?;
        let det_ctl = t.detector.control.context("detector.control: the detector's control address is needed")?;
        let sections = processing::sections(&t).with_context(|| format!("invalid topology {}", a.topology.display()))?;
        if !(a.rate >= 0.0 && a.rate.is_finite()) {
            bail!("--rate must be 0 (as fast as possible) or positive");
        }
        std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;
        let files = ["report.json", "events.jsonl", "manifest.csv", JOINED].map(|f| a.out.join(f));
        rdaq_run::outputs::refuse_existing(files.iter().map(PathBuf::as_path), a.overwrite)?;
        let shared: SharedBoard = std::sync::Arc::new(std::sync::Mutex::new(Board::new(format!("manager {}", a.topology.display()), a.frames)));
        let access = a.access.access()?;
        let token = access.token().cloned();
        if let Some(addr) = a.serve {
            board::serve(addr, shared.clone(), std::sync::Arc::new(access))?;
        }
        let api = Api::new(Duration::from_secs(60), token.as_ref());
        let heartbeat = Api::new(Duration::from_millis(a.heartbeat_ms.max(100)), token.as_ref());
        Ok(Session { a, t, plan, det_ctl, api, heartbeat, shared, sections })
    }

    /// Components: the detector and every receiver of the plan are the ones the topology
    /// names.
    fn check_telegrams(&self) -> anyhow::Result<()> {
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
    fn configure(&self) -> anyhow::Result<Configured> {
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
    fn show_plan(&self, epochs: &[Epoch]) {
        lock(&self.shared).set_plan(&format!("{:?}", self.t.transfer.mode), self.t.detector.modules, self.det_ctl, epochs);
    }

    /// Starts every receiver of the plan (each writes its part of the image); if one fails,
    /// those started go back to waiting (nothing was sent yet).
    fn start_receivers(&self, c: &Configured) -> anyhow::Result<HashMap<usize, Feed>> {
        let t = &self.t;
        let full = t.geometry();
        let mut feeds: HashMap<usize, Feed> = HashMap::new();
        let (streams, previews) = (t.streams(), t.previews());
        for (rp, (r, _)) in self.plan.receivers.iter().zip(&c.requests) {
            let spec = &t.receivers[*r];
            let g = rp.geometry(full);
            let output = Some(format!("{}_master.h5", spec.name));
            let body = daemon::StartRequest { output, directory: None, module_cols: g.module_cols, gap_x: g.gap_x, gap_y: g.gap_y, overwrite: self.a.overwrite, stream: Some(streams[*r].clone()), preview: Some(previews[*r].clone()), config: self.sections.clone() };
            let v: StartAnswer = match self.api.send("POST", spec.control, "/start", &body) {
                Ok(v) => v,
                Err(e) => {
                    for started in feeds.keys() {
                        let _ = self.api.send::<serde_json::Value>("POST", t.receivers[*started].control, "/stop", &serde_json::json!({}));
                    }
                    return Err(e.context(format!("starting {}", spec.name)));
                }
            };
            if let Some(e) = &v.stream {
                tracing::info!(receiver = %spec.name, stream = %e, "streaming");
            }
            if let Some(e) = &v.preview {
                tracing::info!(receiver = %spec.name, preview = %e, "preview");
            }
            feeds.insert(*r, Feed::new(spec.control, v.events_from));
            lock(&self.shared).receivers.insert(spec.name.clone(), (true, None));
        }
        Ok(feeds)
    }

    /// Until the detector has sent everything (or the timeout): its progress, the receivers'
    /// heartbeats and events; re-plans when receivers stop answering.
    fn watch(&self, c: &mut Configured, w: &mut Watch, feeds: &mut HashMap<usize, Feed>, det_feed: &mut Feed, start: Instant) -> anyhow::Result<()> {
        let mut beats = Heartbeats::new(self.a.misses);
        let deadline = start + Duration::from_secs_f64(self.a.timeout_s);
        loop {
            std::thread::sleep(Duration::from_millis(self.a.heartbeat_ms));
            let st: DetectorStatus = self.api.get(self.det_ctl, "/status").context("detector status")?;
            let stop = {
                let mut b = lock(&self.shared);
                b.status = serde_json::json!({ "state": "running", "detector": st, "dead": w.dead });
                b.stop_requested
            };
            if stop || st.state != DetectorState::Running || Instant::now() > deadline {
                return Ok(());
            }
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
                Err(why) => tracing::error!("{why}"),
            }
        }
    }

    /// One heartbeat round: the receivers that just reached `--misses` missed heartbeats.
    fn heartbeats(&self, live: &[usize], beats: &mut Heartbeats, feeds: &mut HashMap<usize, Feed>) -> Vec<usize> {
        let mut lost_now = Vec::new();
        for &r in live {
            let spec = &self.t.receivers[r];
            let answer = self.heartbeat.get::<serde_json::Value>(spec.control, "/status");
            let counters = answer.as_ref().ok().map(|v| v["counters"].clone()).filter(|c| !c.is_null());
            let processing = answer.as_ref().ok().and_then(|v| serde_json::from_value(v["processing"].clone()).ok());
            let mut b = lock(&self.shared);
            b.receivers.insert(spec.name.clone(), (answer.is_ok(), counters));
            if let Some(p) = processing {
                b.processing.insert(spec.name.clone(), p);
            }
            drop(b);
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

    /// Stops every receiver still alive and gathers its answer and events; writes the
    /// events of all components to `events.jsonl`.
    fn gather(&self, c: &Configured, w: &mut Watch, feeds: &mut HashMap<usize, Feed>, det_events: &[Event]) -> anyhow::Result<Gathered> {
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
        rdaq_run::outputs::write_file(&self.a.out.join("events.jsonl"), events_out.as_bytes(), self.a.overwrite)?;
        Ok(g)
    }

    /// Writes the report and shows it on the manager's API.
    fn publish(&self, report: &Report, lost: bool) -> anyhow::Result<()> {
        rdaq_run::outputs::write_file(&self.a.out.join("report.json"), serde_json::to_string_pretty(report)?.as_bytes(), self.a.overwrite)?;
        let mut b = lock(&self.shared);
        b.report = Some(serde_json::to_value(report)?);
        b.lost = Some(lost);
        b.status = serde_json::json!({ "state": "done", "frames_complete": report.frames_complete, "frames_lost": report.frames_lost.len() });
        Ok(())
    }
}

impl Gathered {
    /// Notes a receiver's frame event.
    fn note(&mut self, e: Event) {
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
    fn from_stop(v: StopAnswer) -> ReceiverReport {
        ReceiverReport {
            alive: true,
            frames_complete: v.frames_complete,
            frames_incomplete: v.frames_incomplete,
            frames_discarded: v.frames_discarded,
            output: v.output,
            frames_refused: v.frames_refused,
            frames_not_saved: v.frames_not_saved,
            write_error: v.write_error,
            counters: v.counters,
            events_dropped: 0,
            processing: v.processing,
        }
    }
}

/// The name of the master over every receiver's files, in `--out`.
const JOINED: &str = "acquisition_master.h5";

/// Writes one master over the receivers' series in `--out`, when their files are visible
/// from here and hold whole frames (temporal receivers); otherwise says why not.
fn join_outputs(a: &ManageArgs, receivers: &BTreeMap<String, ReceiverReport>) -> Result<PathBuf, String> {
    let masters: Vec<PathBuf> = receivers.values().filter_map(|r| r.output.clone()).collect();
    let out = a.out.join(JOINED);
    match rdaq_sink::join::join(&out, &masters, a.overwrite) {
        Ok(j) => {
            tracing::info!(master = %out.display(), frames = j.frames, data_files = j.data_files, "joined the receivers' files");
            Ok(out)
        }
        Err(e) => {
            tracing::info!("no joined master: {e}");
            Err(e.to_string())
        }
    }
}

/// The frames the run should have delivered: all asked for, or after an operator's stop
/// those the detector started (a frame some modules had not sent yet is reported
/// incomplete or lost, not left out).
fn frames_expected(a: &ManageArgs, s: &Session, det_stop: &serde_json::Value) -> u64 {
    if !lock(&s.shared).stop_requested {
        return a.frames;
    }
    let module_frames = det_stop["module_frames"].as_u64().unwrap_or(a.frames * s.t.detector.modules as u64);
    module_frames.div_ceil(s.t.detector.modules.max(1) as u64).min(a.frames)
}

/// What each module said it sent, from its end-of-transfer event.
fn module_ends(det_events: &[Event]) -> Vec<serde_json::Value> {
    det_events
        .iter()
        .filter_map(|e| match e {
            Event::EndOfTransfer { module, frames, datagrams } => Some(serde_json::json!({ "module": module, "frames": frames, "datagrams": datagrams })),
            _ => None,
        })
        .collect()
}

fn print_report(report: &Report, out: &std::path::Path) {
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
        if let Some(e) = &r.write_error {
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
    println!("report     : {}", out.join("report.json").display());
}

/// Re-plans the frames still to come over the receivers left, if the transfer mode allows it
/// with the buffers they already have. Returns the new epoch, or why there is none.
fn replan(api: &Api, det_ctl: SocketAddr, t: &Topology, c: &Configured, live: &[usize], dead: &BTreeSet<String>, frontier: u64) -> Result<Epoch, String> {
    let reason = format!("{} stopped answering", dead.iter().cloned().collect::<Vec<_>>().join(", "));
    let mut t2 = t.clone();
    t2.transfer.receivers = Some(live.iter().map(|&r| t.receivers[r].name.clone()).collect());
    let plan2 = match Plan::new(&t2) {
        Ok(p) if !live.is_empty() => p,
        Ok(_) => return Err("no receiver left; the rest of the run is lost".into()),
        Err(e) => return Err(format!("cannot re-plan over the receivers left ({e}); their frames are lost")),
    };
    // only plans that keep every remaining receiver's buffers as they are
    let mut maps2 = Vec::new();
    for (rp, (_, req2)) in plan2.receivers.iter().zip(plan2.buffer_requests(&t2)) {
        match c.requests.iter().position(|(r, req)| *r == rp.receiver && *req == req2) {
            Some(i) => maps2.push(c.maps[i].clone()),
            None => return Err(format!("re-planning would change {}'s buffers during the run; not re-planned", t.receivers[rp.receiver].name)),
        }
    }
    let receivers = t2.transfer.receivers.clone().unwrap_or_default();
    let mut from = frontier + 2;
    for _ in 0..10 {
        let positions = ring_positions(&c.epochs.last().expect("initial epoch").dtps, from);
        let dtps = plan2.module_dtps_from(&t2, &maps2, from, |name| positions.get(name).copied().unwrap_or(0)).map_err(|e| format!("cannot re-plan: {e}"))?;
        match api.send::<serde_json::Value>("PUT", det_ctl, "/dtp", &DtpUpload { from_frame: Some(from), dtps: dtps.clone() }) {
            Ok(_) => return Ok(Epoch { from_frame: from, receivers, reason, dtps }),
            Err(e) => {
                tracing::warn!(from_frame = from, "re-plan refused ({e:#}), trying later");
                from += 5;
            }
        }
    }
    Err("the detector refused every re-plan; the dead receivers' frames are lost".into())
}
