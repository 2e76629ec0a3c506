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
    #[arg(long, value_parser = rdaq_run::config::seconds_arg, default_value_t = 600.0)]
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
    /// Run as the acquisition service instead of one acquisition: configured once, then
    /// datasets armed and triggered through the API of --serve (POST /arm, /trigger,
    /// /cancel; GET /acquisition, /openapi.json), their files under this directory (the
    /// receivers' --out-dir, on one host). Each dataset says its frames, rate and files.
    #[arg(long, requires = "serve", value_name = "DIR", conflicts_with_all = ["frames", "rate", "out", "overwrite", "tolerate_loss"])]
    data_root: Option<PathBuf>,
    /// The token the manager sends to the daemons, and that its own API needs for reads
    /// when `--protect-reads` is given.
    #[command(flatten)]
    access: crate::auth::AccessArgs,
}

mod board;
mod datasets;
mod processing;
mod service;

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
    frames_written: u64,
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
/// lost (unless `--tolerate-loss`); with `--data-root`, the acquisition service instead.
pub fn manage(a: ManageArgs) -> anyhow::Result<ExitCode> {
    if a.data_root.is_some() {
        return service::serve(&a);
    }
    let s = Session::open(&a)?;
    s.check_telegrams()?;
    // Ctrl-C or SIGTERM ends the acquisition as `POST /stop` does (the detector stopped,
    // the receivers' files closed, the report written); after it, the API's serving
    let (interrupted, interrupts) = std::sync::mpsc::channel();
    let board = s.shared.clone();
    ctrlc::set_handler(move || {
        lock(&board).stop_requested = true;
        let _ = interrupted.send(());
    })?;
    let names = Names { prefix: None, directory: None, overwrite: a.overwrite, sections: s.sections.clone() };
    let mut run = s.begin(&names)?;
    s.send(&mut run, 0, a.frames, a.rate)?;
    let files = Files { report: a.out.join("report.json"), events: a.out.join("events.jsonl"), manifest: a.out.join("manifest.csv"), master: a.out.join(JOINED), overwrite: a.overwrite };
    let report = s.end(run, &files, a.frames)?;
    let loss = report.lost();
    s.publish(&report, loss, &files)?;
    print_report(&report, &files.report);
    if a.serve.is_some() {
        tracing::info!("done; the API keeps serving the report until Ctrl-C");
        let _ = interrupts.recv();
    }
    if loss && !a.tolerate_loss {
        tracing::warn!("data was lost (use --tolerate-loss to exit 0 anyway)");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// How one acquisition's receivers name their files: `<name>_master.h5`, or
/// `<prefix>_<name>_master.h5` in `directory` (under each daemon's output directory).
struct Names {
    prefix: Option<String>,
    directory: Option<String>,
    overwrite: bool,
    /// The configuration sections of every receiver's acquisition (none: raw frames).
    sections: Option<toml::Table>,
}

/// Where the manager writes what an acquisition came to.
struct Files {
    report: PathBuf,
    events: PathBuf,
    manifest: PathBuf,
    /// One master over every receiver's files.
    master: PathBuf,
    overwrite: bool,
}

/// One acquisition under way: the configuration, the receivers' event feeds and liveness,
/// and what the detector's runs (one per trigger) said.
struct Running {
    c: Configured,
    feeds: HashMap<usize, Feed>,
    w: Watch,
    det_events: Vec<Event>,
    det_stops: Vec<serde_json::Value>,
    manifest: String,
    /// Frames the detector's runs were to deliver.
    frames: u64,
    /// The detector's runs' time, each from its start until it had sent everything.
    elapsed: Duration,
}

/// How often the manager asks the detector whether its run ended.
const DETECTOR_POLL: Duration = Duration::from_millis(20);

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
    fn connect(a: &'a ManageArgs, access: &crate::auth::Access, frames: u64) -> anyhow::Result<Session<'a>> {
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
    fn begin(&self, names: &Names) -> anyhow::Result<Running> {
        let c = self.configure()?;
        let feeds = self.start_receivers(&c, names)?;
        let w = Watch { live: c.requests.iter().map(|(r, _)| *r).collect(), dead: BTreeSet::new() };
        Ok(Running { c, feeds, w, det_events: Vec::new(), det_stops: Vec::new(), manifest: String::new(), frames: 0, elapsed: Duration::ZERO })
    }

    /// One run of the detector: frames `first..first + frames` at `rate`, watched until
    /// sent (or stopped); its manifest and events join the acquisition's.
    fn send(&self, r: &mut Running, first: u64, frames: u64, rate: f64) -> anyhow::Result<()> {
        let run = detector::StartRequest { frames, rate_hz: rate, first_frame: first };
        let _: serde_json::Value = self.api.send("POST", self.det_ctl, "/start", &run).context("starting the detector")?;
        // the detector's event log starts anew with each run
        let mut det_feed = Feed::new(self.det_ctl, 0);
        let start = Instant::now();
        let watched = self.watch(&mut r.c, &mut r.w, &mut r.feeds, &mut det_feed, start);
        r.elapsed += start.elapsed();
        let det_stop: serde_json::Value = self.api.send("POST", self.det_ctl, "/stop", &serde_json::json!({})).context("stopping the detector")?;
        watched?;
        r.frames += self.frames_sent(frames, &det_stop);
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
    fn end(&self, mut r: Running, files: &Files, asked: u64) -> anyhow::Result<Report> {
        rdaq_run::outputs::write_file(&files.manifest, r.manifest.as_bytes(), files.overwrite)?;
        let (g, events) = self.gather(&r.c, &mut r.w, &mut r.feeds, &r.det_events)?;
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
    fn start_receivers(&self, c: &Configured, names: &Names) -> anyhow::Result<HashMap<usize, Feed>> {
        let t = &self.t;
        let full = t.geometry();
        let mut feeds: HashMap<usize, Feed> = HashMap::new();
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
            lock(&self.shared).receivers.insert(spec.name.clone(), (true, None));
        }
        Ok(feeds)
    }

    /// Until the detector has sent everything (or the timeout): its progress, the receivers'
    /// heartbeats and events; re-plans when receivers stop answering.
    fn watch(&self, c: &mut Configured, w: &mut Watch, feeds: &mut HashMap<usize, Feed>, det_feed: &mut Feed, start: Instant) -> anyhow::Result<()> {
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
    fn note_status(&self, name: &str, answer: Option<&serde_json::Value>) {
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
    fn heartbeats(&self, live: &[usize], beats: &mut Heartbeats, feeds: &mut HashMap<usize, Feed>) -> Vec<usize> {
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
    /// the events of all components, as JSON lines.
    fn gather(&self, c: &Configured, w: &mut Watch, feeds: &mut HashMap<usize, Feed>, det_events: &[Event]) -> anyhow::Result<(Gathered, String)> {
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
        Ok((g, events_out))
    }

    /// Writes the report and shows it on the manager's API.
    fn publish(&self, report: &Report, lost: bool, files: &Files) -> anyhow::Result<()> {
        rdaq_run::outputs::write_file(&files.report, serde_json::to_string_pretty(report)?.as_bytes(), files.overwrite)?;
        let mut b = lock(&self.shared);
        b.report = Some(serde_json::to_value(report)?);
        b.lost = Some(lost);
        b.status = serde_json::json!({ "state": "done", "frames_complete": report.frames_complete, "frames_lost": report.frames_lost.len() });
        Ok(())
    }
}

impl Report {
    /// Whether data was lost: frames not complete, or a receiver's writing failed.
    fn lost(&self) -> bool {
        self.frames_complete < self.frames_expected || self.receivers.values().any(|r| r.write_error.is_some())
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
            frames_written: v.frames_written,
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

/// Writes `out`, one master over the receivers' series, when their files are visible from
/// here and hold whole frames (temporal receivers); otherwise says why not.
fn join_outputs(out: &std::path::Path, receivers: &BTreeMap<String, ReceiverReport>, overwrite: bool) -> Result<PathBuf, String> {
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

impl Session<'_> {
    /// The frames a run of `frames` should have delivered: all, or after an operator's stop
    /// those the detector started (a frame some modules had not sent yet is reported
    /// incomplete or lost, not left out).
    fn frames_sent(&self, frames: u64, det_stop: &serde_json::Value) -> u64 {
        if !lock(&self.shared).stop_requested {
            return frames;
        }
        let module_frames = det_stop["module_frames"].as_u64().unwrap_or(frames * self.t.detector.modules as u64);
        module_frames.div_ceil(self.t.detector.modules.max(1) as u64).min(frames)
    }
}

/// The detector's answers to its runs' stops: one run's as it is, several summed (the
/// elapsed time too).
fn sum_stops(mut stops: Vec<serde_json::Value>) -> serde_json::Value {
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
fn module_ends(det_events: &[Event]) -> Vec<serde_json::Value> {
    det_events
        .iter()
        .filter_map(|e| match e {
            Event::EndOfTransfer { module, frames, datagrams } => Some(serde_json::json!({ "module": module, "frames": frames, "datagrams": datagrams })),
            _ => None,
        })
        .collect()
}

fn print_report(report: &Report, report_file: &std::path::Path) {
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
    println!("report     : {}", report_file.display());
}

/// Why there is no new plan: no receiver is left (the acquisition cannot go on), or the
/// receivers left cannot take the frames of those gone (theirs are lost; the run goes on).
enum Replan {
    NoneLeft(String),
    Refused(String),
}

/// Re-plans the frames still to come over the receivers left, if the transfer mode allows it
/// with the buffers they already have. Returns the new epoch, or why there is none.
fn replan(api: &Api, det_ctl: SocketAddr, t: &Topology, c: &Configured, live: &[usize], dead: &BTreeSet<String>, frontier: u64) -> Result<Epoch, Replan> {
    let reason = format!("{} stopped answering", dead.iter().cloned().collect::<Vec<_>>().join(", "));
    if live.is_empty() {
        return Err(Replan::NoneLeft(reason));
    }
    let mut t2 = t.clone();
    t2.transfer.receivers = Some(live.iter().map(|&r| t.receivers[r].name.clone()).collect());
    let plan2 = Plan::new(&t2).map_err(|e| Replan::Refused(format!("cannot re-plan over the receivers left ({e}); their frames are lost")))?;
    // only plans that keep every remaining receiver's buffers as they are
    let mut maps2 = Vec::new();
    for (rp, (_, req2)) in plan2.receivers.iter().zip(plan2.buffer_requests(&t2)) {
        match c.requests.iter().position(|(r, req)| *r == rp.receiver && *req == req2) {
            Some(i) => maps2.push(c.maps[i].clone()),
            None => return Err(Replan::Refused(format!("re-planning would change {}'s buffers during the run; not re-planned", t.receivers[rp.receiver].name))),
        }
    }
    let receivers = t2.transfer.receivers.clone().unwrap_or_default();
    let mut from = frontier + 2;
    for _ in 0..10 {
        let positions = ring_positions(&c.epochs.last().expect("initial epoch").dtps, from);
        let dtps = plan2.module_dtps_from(&t2, &maps2, from, |name| positions.get(name).copied().unwrap_or(0)).map_err(|e| Replan::Refused(format!("cannot re-plan: {e}")))?;
        match api.send::<serde_json::Value>("PUT", det_ctl, "/dtp", &DtpUpload { from_frame: Some(from), dtps: dtps.clone() }) {
            Ok(_) => return Ok(Epoch { from_frame: from, receivers, reason, dtps }),
            Err(e) => {
                tracing::warn!(from_frame = from, "re-plan refused ({e:#}), trying later");
                from += 5;
            }
        }
    }
    Err(Replan::Refused("the detector refused every re-plan; the dead receivers' frames are lost".into()))
}
