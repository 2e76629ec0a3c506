//! The data receiver daemon. Buffers are defined by the system manager (`PUT /buffers`);
//! an unchanged request keeps the buffers, keys and ports it had (reconfiguring is
//! idempotent). `POST /start` writes the frames to an NXmx file, `POST /stop` finishes the
//! frames in progress and closes it; the receiver stays up for the next acquisition.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use axum::extract::State;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use indicatif::ProgressBar;
use rdaq_detector::{Description, Geometry, MODULE_BYTES};
use rdaq_proto::events::{Event, EventLog, EventPage};
use rdaq_proto::telegram::{BufferMap, BufferRequest, ReceiverTelegram, TELEGRAM_VERSION};
use rdaq_receiver::{Counters, FrameStatus, IncompletePolicy, Receiver, ReceiverConfig, ReceiverError};
use rdaq_sink::NxmxWriter;
use serde::{Deserialize, Serialize};

use crate::dashboard::{self, ReceiverView, Snapshot, View};
use crate::http::{bad, conflict, daemon_router, events_page, internal, lock, ApiError, Daemon, Since};
use crate::openapi::{self, Described, Method};
use rdaq_run::acquisition::{self, Chain};
use rdaq_run::remote;
use rdaq_run::config::Config;
use rdaq_run::consume::ConsumeStats;
use rdaq_run::board::{incomplete_event, Board};
use rdaq_run::stream::{Stream, StreamReport};

#[derive(Clone, Debug)]
pub struct Options {
    pub name: String,
    pub data: IpAddr,
    pub memory_bytes: u64,
    pub out_dir: PathBuf,
    pub policy: IncompletePolicy,
    pub frame_timeout: Duration,
    pub recv_buffer: usize,
    pub engine: rdaq_receiver::EngineKind,
    /// The Stream V2 publisher each acquisition binds (none: no stream).
    pub stream: Option<rdaq_stream::StreamConfig>,
    /// The configuration every acquisition starts from (the daemon's `--config` and
    /// options); a start request's `config` sections go over it.
    pub config: Config,
}

type Outcome = anyhow::Result<acquisition::Outcome>;

struct Acquisition {
    stop: Arc<AtomicBool>,
    consumer: JoinHandle<Outcome>,
    /// The stream's counts while it runs.
    stream: Option<Arc<rdaq_run::stream::Live>>,
}

struct Active {
    request: BufferRequest,
    rx: Arc<Receiver>,
    acq: Option<Acquisition>,
    /// A start is making its files and stream (outside the lock).
    starting: bool,
}

struct ReceiverDaemon {
    opts: Options,
    active: Option<Active>,
    events: Arc<Mutex<EventLog>>,
    /// The current or last acquisition as it goes: latency, a glance at the latest frame.
    board: Arc<Board>,
    /// What the last acquisition came to (the answer to its stop), for the dashboard.
    last: Option<serde_json::Value>,
    access: Arc<crate::auth::Access>,
    /// When the daemon started (the dashboard's time axis, across acquisitions).
    started: std::time::Instant,
}

type Shared = crate::http::Shared<ReceiverDaemon>;

impl Daemon for ReceiverDaemon {
    fn event_page(&self, q: &Since) -> EventPage {
        events_page(&self.events, q)
    }
}

/// Serves the daemon's API on `addr` behind `access` until SIGINT or SIGTERM; an acquisition
/// still running then is stopped as `POST /stop` stops it (its files closed and readable).
pub fn serve(addr: std::net::SocketAddr, opts: Options, access: Arc<crate::auth::Access>) -> anyhow::Result<()> {
    let (app, shared) = router(opts, access.clone());
    crate::http::serve(addr, app, "receive", access)?;
    let acquiring = lock(&shared).active.as_ref().filter(|a| a.acq.is_some()).map(|a| a.rx.clone());
    if let Some(rx) = acquiring {
        tracing::warn!("stopping the acquisition under way: the daemon was told to end");
        // a detector still sending would keep the consumer busy: nothing more is received
        rx.stop_now();
        stop_active(&shared).map_err(|e| anyhow::anyhow!("stopping the acquisition: {}", e.1))?;
    }
    Ok(())
}

/// The daemon's API and its state; `access` is the one [`crate::http::serve`] guards it
/// with (its refusals are counted in `/metrics`).
fn router(opts: Options, access: Arc<crate::auth::Access>) -> (Router, Shared) {
    let d = ReceiverDaemon { opts, active: None, events: Arc::new(Mutex::new(EventLog::new(1 << 16))), board: Arc::default(), last: None, access, started: std::time::Instant::now() };
    let shared: Shared = Arc::new(Mutex::new(d));
    let routes = Router::new()
        .route("/telegram", get(telegram))
        .route("/buffers", put(buffers))
        .route("/start", post(start))
        .route("/stop", post(stop))
        .route("/status", get(status))
        .route("/metrics", get(metrics));
    let app = daemon_router(shared.clone(), routes).merge(dashboard::routes(Arc::new(DaemonView(shared.clone()))));
    let described: Vec<Described> = DESCRIBED.into_iter().chain(dashboard::DESCRIBED).collect();
    let doc = openapi::document("rdaq receiver daemon", "A data receiver: its buffers defined by the manager, one acquisition at a time into its output directory. Calls that change something need the token when one is set (Authorization: Bearer). Bodies are JSON objects, described in docs/control.md, not here.", &described);
    (openapi::serve_document(app, doc), shared)
}

/// The daemon's routes as its OpenAPI document describes them.
const DESCRIBED: [Described; 7] = [
    Described { path: "/telegram", method: Method::Get, summary: "What the receiver offers: its ports, address and memory (the manager plans with it)", answers: "application/json" },
    Described { path: "/buffers", method: Method::Put, summary: "Defines the receiver's buffers from the manager's buffer request; answers their buffer map", answers: "application/json" },
    Described { path: "/start", method: Method::Post, summary: "Starts an acquisition into a file of the output directory", answers: "application/json" },
    Described { path: "/stop", method: Method::Post, summary: "Stops the acquisition under way; answers its summary", answers: "application/json" },
    Described { path: "/status", method: Method::Get, summary: "The acquisition under way or the last one, its counters and how the cores are shared", answers: "application/json" },
    Described { path: "/metrics", method: Method::Get, summary: "The receiver's counters, OpenMetrics text", answers: "application/openmetrics-text" },
    openapi::EVENTS,
];

/// The receiver daemon on its dashboard.
struct DaemonView(Shared);

impl View for DaemonView {
    fn snapshot(&self) -> Snapshot {
        let d = lock(&self.0);
        let (state, counters) = match &d.active {
            None => ("idle", None),
            Some(a) => (if a.acq.is_some() { "acquiring" } else if a.starting { "starting" } else { "configured" }, Some(a.rx.counters().to_json())),
        };
        let mut s = Snapshot {
            title: format!("receiver {}", d.opts.name),
            state: state.into(),
            uptime_s: d.started.elapsed().as_secs_f64(),
            receivers: vec![ReceiverView { name: d.opts.name.clone(), alive: true, counters }],
            stop: (state == "acquiring").then(|| "/stop".into()),
            start: (state == "configured").then(|| "/start".into()),
            token_required: d.access.has_token(),
            api_refused: d.access.refused(),
            result: if state == "acquiring" { None } else { d.last.clone() },
            ..Snapshot::default()
        };
        dashboard::from_board(&d.board, &mut s);
        s
    }

    fn events(&self, since: u64) -> EventPage {
        lock(&lock(&self.0).events).since(since, 10_000)
    }

    fn glance(&self) -> Option<Arc<rdaq_run::board::Glance>> {
        lock(&self.0).board.glance()
    }
}

async fn telegram(State(s): State<Shared>) -> Json<ReceiverTelegram> {
    let d = lock(&s);
    Json(ReceiverTelegram {
        version: TELEGRAM_VERSION,
        name: d.opts.name.clone(),
        data: d.opts.data,
        memory_bytes: d.opts.memory_bytes,
        engines: vec!["recvmmsg".into()],
        max_payload_bytes: rdaq_proto::MAX_PAYLOAD as u32,
    })
}

fn check_request(opts: &Options, r: &BufferRequest) -> Result<(), ApiError> {
    if r.version != TELEGRAM_VERSION {
        return Err(bad(format!("version: telegram version {} is not {TELEGRAM_VERSION}", r.version)));
    }
    if r.modules.is_empty() || r.modules.len() > 64 {
        return Err(bad("modules: 1 to 64 modules"));
    }
    if r.native.is_none() && r.module_bytes != MODULE_BYTES as u64 {
        return Err(bad(format!("module_bytes: rdaq datagrams carry JUNGFRAU modules of {MODULE_BYTES} bytes")));
    }
    if r.native.is_some() && (r.roce.is_some() || r.checksum) {
        return Err(bad("native: a detector's own packets are neither RoCEv2 WRITEs nor rdaq datagrams with checksums"));
    }
    if r.slots < 2 {
        return Err(bad("slots: at least 2"));
    }
    let need = r.slots.saturating_mul(r.modules.len() as u64 * r.module_bytes);
    if need > opts.memory_bytes {
        return Err(bad(format!("slots: {} slots need {need} bytes, this receiver has {}", r.slots, opts.memory_bytes)));
    }
    Ok(())
}

async fn buffers(State(s): State<Shared>, Json(req): Json<BufferRequest>) -> Result<Json<BufferMap>, ApiError> {
    let (old, old_rcfg, rcfg) = {
        let mut d = lock(&s);
        check_request(&d.opts, &req)?;
        match &d.active {
            Some(a) if a.acq.is_some() || a.starting => return Err(conflict("an acquisition is running: stop it first")),
            Some(a) if a.request == req => return Ok(Json(a.rx.buffer_map().clone())),
            _ => {}
        }
        // a request refused here leaves the buffers in place as they were
        let rcfg = receiver_config(&d.opts, &req)?;
        rcfg.validate().map_err(|e| bad(format!("{e}")))?;
        let old_rcfg = d.active.as_ref().and_then(|a| receiver_config(&d.opts, &a.request).ok());
        (d.active.take(), old_rcfg, rcfg)
    };
    let (started, old) = tokio::task::spawn_blocking(move || replace(old, old_rcfg, rcfg)).await.map_err(internal)?;
    let mut d = lock(&s);
    match (started, old) {
        (Ok(rx), _) => {
            let map = rx.buffer_map().clone();
            d.active = Some(Active { request: req, rx: Arc::new(rx), acq: None, starting: false });
            Ok(Json(map))
        }
        (Err(e), Old::Kept(a)) => {
            d.active = Some(a);
            Err(bad(format!("{e}")))
        }
        (Err(e), Old::Rebound(a)) => {
            d.active = Some(a);
            Err(bad(format!("{e}; the previous buffers had to go for their ports and were set up again, with new keys (and new ports where the kernel picks them): upload the DTPs again")))
        }
        (Err(e), Old::None) => Err(bad(format!("{e}"))),
    }
}

/// Starts the receiver `rcfg` in place of `old`, which keeps running unless it must go: the
/// new one is tried beside it first, then, when it may need the old one's ports, without it.
/// On failure the old buffers are handed back, set up again from `old_rcfg` if they had to
/// go (new keys; the same ports unless the kernel picked them).
fn replace(old: Option<Active>, old_rcfg: Option<ReceiverConfig>, rcfg: ReceiverConfig) -> (Result<Receiver, ReceiverError>, Old) {
    match (Receiver::start(rcfg.clone()), old) {
        (Ok(rx), _) => (Ok(rx), Old::None),
        (Err(e), None) => (Err(e), Old::None),
        (Err(e), Some(old)) if !shares_ports(old.rx.buffer_map(), &rcfg) => (Err(e), Old::Kept(old)),
        (Err(_), Some(old)) => {
            let request = old.request.clone();
            drop(old);
            match Receiver::start(rcfg) {
                Ok(rx) => (Ok(rx), Old::None),
                Err(e) => {
                    let again = old_rcfg.and_then(|c| Receiver::start(c).ok());
                    (Err(e), again.map_or(Old::None, |rx| Old::Rebound(Active { request, rx: Arc::new(rx), acq: None, starting: false })))
                }
            }
        }
    }
}

/// What became of the buffers in place when a buffer request failed.
enum Old {
    /// None were in place, or they went and could not be bound again.
    None,
    /// Untouched: the same keys and ports.
    Kept(Active),
    /// Set up again after they had to go: new keys (and ports, where the kernel picks them).
    Rebound(Active),
}

/// Whether the receiver `new` may need a port the buffers `old` hold: one of the ports from
/// its first data port on (a few per module, generously), or RoCEv2's one port.
fn shares_ports(old: &BufferMap, new: &ReceiverConfig) -> bool {
    let wanted = new.data_port..new.data_port.saturating_add(8u16.saturating_mul(new.modules));
    !old.roce.is_empty() || (new.data_port != 0 && old.data_ports.iter().any(|p| wanted.contains(p)))
}

/// The receiver that takes what request `r` asks for: rdaq datagrams or RoCEv2 WRITEs into
/// the buffers it defines, or a detector's native packets (the source of
/// [`rdaq_run::remote`], as `rdaq receive` takes them), with this daemon's settings.
fn receiver_config(opts: &Options, r: &BufferRequest) -> Result<ReceiverConfig, ApiError> {
    let base = match &r.native {
        None => ReceiverConfig::for_request(r),
        Some(_) => {
            let geometry = Geometry::new(r.modules.len() as u16, 1, 0, 0).expect("one column fits any count");
            let cfg = acquisition_config(opts, None, geometry, false).map_err(|e| bad(format!("{e:#}")))?;
            let rcfg = remote::setup(&source_of(r)?, &cfg).map_err(|e| bad(format!("{e:#}")))?.rcfg;
            if rcfg.module_bytes != r.module_bytes {
                return Err(bad(format!("module_bytes: the detector's packets make module frames of {} bytes, not {}", rcfg.module_bytes, r.module_bytes)));
            }
            ReceiverConfig { data_port: r.data_port, slots: r.slots as usize, frames: None, ..rcfg }
        }
    };
    Ok(ReceiverConfig { bind: opts.data, recv_buffer: opts.recv_buffer, engine: opts.engine, frame_timeout: opts.frame_timeout, policy: opts.policy, ..base })
}

/// What the modules of request `r` send, as the source of an acquisition.
fn source_of(r: &BufferRequest) -> Result<remote::Source, ApiError> {
    let s = remote::Source { module_ids: r.modules.clone(), naming: remote::Naming::Fields("native"), ..remote::Source::new("rdaq") };
    Ok(match (&r.native, r.roce) {
        (Some(n), _) => {
            let d = Description::named_or_text(&n.detector).map_err(|e| bad(format!("native.detector: {e}")))?;
            remote::Source {
                format: "sls".into(),
                detector: Some(d),
                interfaces: n.interfaces,
                read_rows: n.read_rows,
                bit_depth: n.bit_depth,
                link: n.link.clone(),
                gap_pixels: n.gap_pixels,
                grid_cols: Some(n.module_cols),
                ..s
            }
        }
        (None, Some(roce)) => remote::Source { format: "roce".into(), roce_mtu: roce.mtu, first_frame: roce.first_frame, ..s },
        (None, None) => s,
    })
}

/// The configuration of an acquisition of the modules held here (the image `geometry`):
/// the start request's configuration `sections` over the daemon's (over the defaults of
/// a detector outside this process, [`Config::remote`]), its ring the daemon's memory.
/// With `streaming`, the images go on a Stream V2 stream too.
fn acquisition_config(opts: &Options, sections: Option<toml::Table>, geometry: Geometry, streaming: bool) -> anyhow::Result<Config> {
    let mut cfg = match sections {
        Some(t) => Config::with_sections(opts.config.clone(), t)?,
        None => opts.config.clone(),
    };
    (cfg.detector.modules, cfg.detector.module_cols, cfg.detector.gap_x, cfg.detector.gap_y) = (geometry.modules, geometry.module_cols, geometry.gap_x, geometry.gap_y);
    cfg.receiver.ring_mib = (opts.memory_bytes >> 20).max(1) as usize;
    // the stream is the daemon's (or the start request's); the preview is the
    // configuration's unless the start request names one
    cfg.stream.endpoint = if streaming { cfg.stream.endpoint } else { "none".into() };
    if !cfg.jungfrau() || cfg.detector.bit_depth.is_some() || cfg.detector.link.is_some() {
        anyhow::bail!("detector.name, bit_depth and link: a daemon's detector is the one its buffer request names (native.detector)");
    }
    cfg.check()?;
    Ok(cfg)
}

/// `POST /start`: an acquisition into this file, with the geometry of the modules held here.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// Output file name in the daemon's output directory (none: frames are counted only).
    #[serde(default)]
    pub output: Option<String>,
    /// The output's directory under the daemon's output directory (relative, without `..`;
    /// made if missing, never through a symbolic link); default: the output directory.
    #[serde(default)]
    pub directory: Option<String>,
    /// Geometry of the modules this receiver holds, for assembly.
    #[serde(default = "rdaq_detector::geometry::default_module_cols")]
    pub module_cols: u16,
    #[serde(default = "rdaq_detector::geometry::default_gap_x")]
    pub gap_x: usize,
    #[serde(default = "rdaq_detector::geometry::default_gap_y")]
    pub gap_y: usize,
    /// Replace an existing output file (default: refuse to start).
    #[serde(default)]
    pub overwrite: bool,
    /// The Stream V2 endpoint of this acquisition ("none": off; default: the daemon's
    /// `--stream`).
    #[serde(default)]
    pub stream: Option<String>,
    /// `stream` is a default (the manager's, for a topology that names none): when another
    /// process on this host holds its port, the acquisition streams on a free port of the
    /// same address instead, and the answer names it.
    #[serde(default)]
    pub stream_may_move: bool,
    /// The live preview endpoint of this acquisition (`rdaq preview --from`; "none": off;
    /// default: the daemon's `--preview`, itself off by default).
    #[serde(default)]
    pub preview: Option<String>,
    /// Sections of the run configuration (rdaq.example.toml: `process`, `detector`'s photon
    /// energy, seed and chopper, `output.images_per_file`, `goniometer`) for this
    /// acquisition, over the defaults of a detector outside this process; with a
    /// `process.calibration`, the frames are processed.
    #[serde(default)]
    pub config: Option<toml::Table>,
    /// Each frame's exposure and period in seconds, for the files and the stream (0:
    /// unknown).
    #[serde(default)]
    pub count_time_s: f64,
    #[serde(default)]
    pub frame_time_s: f64,
    /// The whole detector's module grid, when the modules held here are some of its modules
    /// (a spatial plan), stacked in one column: the files and the stream then say where
    /// they go, so that `rdaq write` joins the receivers' parts into whole images.
    #[serde(default)]
    pub detector: Option<DetectorGrid>,
}

/// A detector's module grid: its modules, and how many per row.
#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DetectorGrid {
    pub modules: u16,
    pub module_cols: u16,
}


/// The answer to `POST /start`: the file being written, and the number of the acquisition's
/// first event (its events are those from there on).
#[derive(Serialize, Deserialize)]
pub struct StartAnswer {
    pub state: String,
    pub output: Option<PathBuf>,
    pub events_from: u64,
    /// The Stream V2 endpoint the frames are published on (none: no stream).
    #[serde(default)]
    pub stream: Option<String>,
    /// The preview endpoint (none: no preview).
    #[serde(default)]
    pub preview: Option<String>,
}

/// `POST /start`, in three steps so that nothing slow runs under the daemon's lock (a
/// `/status` must answer while files are created): the request is checked and the
/// acquisition marked as starting, the chain, the files and the stream are made outside the
/// lock, and the acquisition is launched under it.
async fn start(State(s): State<Shared>, Json(req): Json<StartRequest>) -> Result<Json<StartAnswer>, ApiError> {
    let plan = prepare(&mut lock(&s), &req)?;
    let opened = tokio::task::spawn_blocking(move || open_outputs(plan)).await.map_err(internal);
    let mut d = lock(&s);
    let (plan, outputs) = match opened {
        Ok((plan, Ok(outputs))) => (plan, outputs),
        Ok((plan, Err(e))) => {
            finish_starting(&mut d, &plan.rx);
            return Err(e);
        }
        Err(e) => {
            d.active.iter_mut().for_each(|a| a.starting = false);
            return Err(e);
        }
    };
    finish_starting(&mut d, &plan.rx);
    launch(&mut d, plan, outputs)
}

/// What a start request asks for, checked under the lock.
struct Plan {
    rx: Arc<Receiver>,
    name: String,
    events: Arc<Mutex<EventLog>>,
    out_dir: PathBuf,
    /// The output's directory under `out_dir`, made outside the lock.
    subdir: Option<PathBuf>,
    path: Option<PathBuf>,
    overwrite: bool,
    source: remote::Source,
    cfg: Config,
    stream_cfg: Option<rdaq_stream::StreamConfig>,
    preview: Option<(rdaq_stream::StreamConfig, Duration)>,
    /// The frames' count time and frame time (0: unknown).
    times: (f64, f64),
}

/// What the acquisition writes to, made outside the lock.
struct Outputs {
    chain: Chain,
    writer: Option<NxmxWriter>,
    stream: Option<Stream>,
}

/// Checks start request `req` against the buffers held, and marks the acquisition as
/// starting (a second start, a new buffer request or a stop waits for it).
fn prepare(d: &mut ReceiverDaemon, req: &StartRequest) -> Result<Plan, ApiError> {
    let (name, out_dir, events, daemon_stream, opts) = (d.opts.name.clone(), d.opts.out_dir.clone(), d.events.clone(), d.opts.stream.clone(), d.opts.clone());
    let Some(active) = d.active.as_mut() else {
        return Err(conflict("no buffers: PUT /buffers first"));
    };
    if active.acq.is_some() || active.starting {
        return Err(conflict("an acquisition is already running"));
    }
    let modules = active.request.modules.len() as u16;
    rdaq_proto::times::check(req.count_time_s, req.frame_time_s).map_err(|(field, why)| bad(format!("{field}: {why}")))?;
    if let Some((field, gap)) = [("gap_x", req.gap_x), ("gap_y", req.gap_y)].into_iter().find(|&(_, g)| g > rdaq_run::config::MAX_GAP) {
        return Err(bad(format!("{field}: {gap} gap pixels; at most {} (a module's width)", rdaq_run::config::MAX_GAP)));
    }
    let geometry = Geometry::new(modules, req.module_cols, req.gap_x, req.gap_y)
        .ok_or_else(|| bad(format!("module_cols: {} does not divide the {modules} modules held here into rows", req.module_cols)))?;
    let whole = req.detector.map(|d| detector_of(d, &active.request.modules, geometry)).transpose()?;
    let subdir = match &req.directory {
        Some(_) if req.output.is_none() => return Err(bad("directory: only with an output")),
        Some(d) => Some(rdaq_run::outputs::subdirectory("directory", d).map_err(|e| bad(format!("{e:#}")))?),
        None => None,
    };
    let path = match &req.output {
        Some(f) if !rdaq_proto::names::is_plain_file_name(f) => return Err(bad(format!("output: {f:?} is not a plain file name"))),
        Some(f) => Some(out_dir.join(subdir.as_deref().unwrap_or(Path::new(""))).join(f)),
        None => None,
    };
    let series = path.as_deref().map(rdaq_run::outputs::series_files);
    if let Some(p) = series.iter().flatten().find(|p| rdaq_sink::claim::taken(p) && !req.overwrite) {
        return Err(conflict(format!("output: {} exists: the receiver does not overwrite data (start with \"overwrite\": true to replace it)", p.display())));
    }
    let mut stream_cfg = match &req.stream {
        Some(e) => stream_at(daemon_stream, e).map_err(|e| bad(format!("stream: {e:#}")))?,
        None => daemon_stream,
    };
    if let Some(c) = stream_cfg.as_mut().filter(|_| req.stream_may_move) {
        if let Some(free) = rdaq_run::config::free_port_if_taken(&c.endpoint) {
            tracing::warn!(stream = %c.endpoint, "the default stream port is taken (another acquisition on this host?): streaming on a free port, named in the start's answer");
            c.endpoint = free;
        }
    }
    let source = remote::Source { whole, ..source_of(&active.request)? };
    let mut cfg = acquisition_config(&opts, req.config.clone(), geometry, stream_cfg.is_some()).map_err(|e| bad(format!("config: {e:#}")))?;
    if let Some(p) = &req.preview {
        cfg.stream.preview = p.clone();
    }
    let preview = cfg.stream.preview_config().map_err(|e| bad(format!("preview: {e:#}")))?;
    active.starting = true;
    Ok(Plan { rx: active.rx.clone(), name, events, out_dir, subdir, path, overwrite: req.overwrite, source, cfg, stream_cfg, preview, times: (req.count_time_s, req.frame_time_s) })
}

/// The whole detector of grid `d` that the modules `ids` held here (in the image
/// `geometry`) are part of; they must be one column of it.
fn detector_of(d: DetectorGrid, ids: &[u16], geometry: Geometry) -> Result<Geometry, ApiError> {
    let whole = Geometry::new(d.modules, d.module_cols, geometry.gap_x, geometry.gap_y)
        .ok_or_else(|| bad(format!("detector.module_cols: {} does not divide the detector's {} modules into rows", d.module_cols, d.modules)))?;
    let part = rdaq_sink::DetectorPart { module_ids: ids.to_vec(), detector: whole };
    if !part.valid() {
        return Err(bad(format!("detector.modules: the modules held here ({ids:?}) are not distinct modules of a {}-module detector", d.modules)));
    }
    if geometry.module_cols != 1 {
        return Err(bad("module_cols: the modules of a part of a detector are stacked in one column (module_cols 1)"));
    }
    Ok(whole)
}

/// Builds the chain and creates the files and the stream of `plan` (slow: not under the lock).
fn open_outputs(plan: Plan) -> (Plan, Result<Outputs, ApiError>) {
    let opened = (|| {
        let remote::Setup { chain, mut meta, notes, .. } = remote::setup(&plan.source, &plan.cfg).map_err(|e| bad(format!("config: {e:#}")))?;
        (meta.count_time_s, meta.frame_time_s) = plan.times;
        for n in notes {
            tracing::info!(receiver = %plan.name, "{n}");
        }
        // the stream's ports before the directory and the file: a refused start makes neither
        let preview = plan.preview.as_ref().map(|(c, every)| (c, *every));
        let stream = Stream::open(plan.stream_cfg.as_ref(), preview, &meta, events_series(&plan.events)).map_err(|e| conflict(format!("stream: {e:#}")))?;
        if let Some(d) = &plan.subdir {
            rdaq_run::outputs::make_subdirectory("directory", &plan.out_dir, d).map_err(|e| bad(format!("{e:#}")))?;
        }
        let writer = match &plan.path {
            Some(p) => Some(NxmxWriter::create(p, &meta, plan.overwrite).map_err(|e| match e {
                rdaq_sink::SinkError::Claim(c) => conflict(format!("output: {c}")),
                e => bad(format!("output: {e}")),
            })?),
            None => None,
        };
        Ok(Outputs { chain, writer, stream })
    })();
    (plan, opened)
}

/// Clears the starting mark of the buffers `rx` (still the ones held: a buffer request
/// waits for a start).
fn finish_starting(d: &mut ReceiverDaemon, rx: &Arc<Receiver>) {
    if let Some(a) = d.active.as_mut().filter(|a| Arc::ptr_eq(&a.rx, rx)) {
        a.starting = false;
    }
}

/// Starts the acquisition `plan` into `outputs`: the consumer thread, under the lock.
fn launch(d: &mut ReceiverDaemon, plan: Plan, outputs: Outputs) -> Result<Json<StartAnswer>, ApiError> {
    let Some(active) = d.active.as_mut().filter(|a| Arc::ptr_eq(&a.rx, &plan.rx)) else {
        return Err(conflict("the buffers changed while the acquisition started"));
    };
    let Plan { name, events, path, .. } = plan;
    let Outputs { chain, writer, stream } = outputs;
    let (endpoint, preview_endpoint) = stream.as_ref().map(Stream::endpoints).unwrap_or_default();
    let live = stream.as_ref().map(Stream::live);
    // a new acquisition: frame numbers may start again; whatever was in progress is finished
    // and goes nowhere (no consumer yet), so drain it
    active.rx.reset();
    while let Ok(f) = active.rx.frames().try_recv() {
        active.rx.release(f).expect("a frame of this receiver");
    }
    let events_from = lock(&events).next();
    let stop = Arc::new(AtomicBool::new(false));
    let (rx, flag) = (active.rx.clone(), stop.clone());
    let loss_rx = active.rx.clone();
    let (events_w, name_w) = (events.clone(), name.clone());
    let board = Arc::new(Board::default());
    let chain = Chain { board: board.clone(), name: name.clone(), consumer_delay: Duration::ZERO, ..chain };
    let consumer = std::thread::Builder::new()
        .name("rdaq-consume".into())
        .spawn(move || -> Outcome {
            let on_frame = |f: &rdaq_receiver::FrameReady| {
                let e = match f.status() {
                    FrameStatus::Complete => Event::FrameComplete { receiver: name.clone(), frame: f.frame(), imm: f.imm() },
                    _ => incomplete_event(&name, f),
                };
                let mut log = lock(&events);
                log.push(e);
                for l in loss_rx.losses().try_iter() {
                    log.push(Event::PacketLoss { receiver: name.clone(), module: l.module, start: l.start, end: l.end });
                }
            };
            let outcome = acquisition::consume(&rx, chain, acquisition::Sinks { writer, stream }, &ProgressBar::hidden(), Some(&flag), on_frame)?;
            for e in [&outcome.consumed.write_error, &outcome.consumed.stage_failure].into_iter().flatten() {
                lock(&events_w).push(Event::Error { source: name_w.clone(), message: e.clone() });
            }
            Ok(outcome)
        })
        .map_err(internal)?;
    active.acq = Some(Acquisition { stop, consumer, stream: live });
    d.board = board;
    tracing::info!(receiver = %d.opts.name, output = ?path, events_from, "acquisition started");
    Ok(Json(StartAnswer { state: "acquiring".into(), output: path, events_from, stream: endpoint, preview: preview_endpoint }))
}

/// The daemon's stream settings (`--stream-policy`, ...) at `endpoint`, which a start
/// request names; "none": no stream.
fn stream_at(daemon: Option<rdaq_stream::StreamConfig>, endpoint: &str) -> anyhow::Result<Option<rdaq_stream::StreamConfig>> {
    let Some(asked) = (rdaq_run::config::Stream { endpoint: endpoint.into(), ..Default::default() }).config()? else {
        return Ok(None);
    };
    Ok(Some(rdaq_stream::StreamConfig { endpoint: asked.endpoint.clone(), ..daemon.unwrap_or(asked) }))
}

/// The receiver daemon's answer to `POST /stop`: what the acquisition came to. The manager
/// reads it with the same type.
#[derive(Serialize, Deserialize)]
pub struct StopAnswer {
    pub frames_complete: u64,
    pub frames_incomplete: u64,
    pub frames_discarded: u64,
    /// Frames refused whole because the ring was full (the consumer was behind).
    pub frames_refused: u64,
    pub frames_written: u64,
    /// Frames received after writing failed, and why it failed.
    pub frames_not_saved: u64,
    pub write_error: Option<String>,
    /// Why processing stopped (a worker of the graph panicked: a bug), if it did.
    #[serde(default)]
    pub stage_failure: Option<String>,
    pub output: Option<PathBuf>,
    pub counters: serde_json::Value,
    /// What the Stream V2 publisher did (none: no stream).
    #[serde(default)]
    pub stream: Option<StreamReport>,
    /// The processing graph's report (none: raw frames): dark and signal frames, hits,
    /// vetoed, spots, its stages.
    #[serde(default)]
    pub processing: Option<serde_json::Value>,
}

async fn stop(State(s): State<Shared>, _: crate::answer::NoParameters) -> Result<Json<StopAnswer>, ApiError> {
    tokio::task::spawn_blocking(move || stop_active(&s)).await.map_err(internal)?.map(Json)
}

/// Stops the acquisition under way: frames in progress are finished (under the policy),
/// the consumer ends, the files are closed; what it came to (blocks until then).
fn stop_active(s: &Shared) -> Result<StopAnswer, ApiError> {
    let (rx, acq) = {
        let mut d = lock(s);
        let Some(active) = d.active.as_mut() else {
            return Err(conflict("no acquisition to stop"));
        };
        let Some(acq) = active.acq.take() else {
            return Err(conflict("no acquisition to stop"));
        };
        (active.rx.clone(), acq)
    };
    // frames in progress are finished (under the policy) and queued before the flag
    let counters = rx.flush().unwrap_or_else(|| rx.counters());
    acq.stop.store(true, Ordering::Relaxed);
    let outcome = acq.consumer.join().map_err(|_| anyhow::anyhow!("consumer panicked")).map_err(internal)?.map_err(internal)?;
    let (stats, output, stream, processed) = (outcome.consumed, outcome.h5, outcome.stream, outcome.processed);
    let lost = log_summary(&lock(s).opts.name, &stats, &counters, output.as_deref());
    let answer = StopAnswer {
        frames_complete: stats.complete,
        frames_incomplete: stats.incomplete,
        frames_discarded: stats.discarded,
        frames_refused: counters.frames_refused,
        frames_written: stats.written,
        frames_not_saved: stats.not_saved,
        write_error: stats.write_error,
        stage_failure: stats.stage_failure,
        output,
        counters: counters.to_json(),
        stream,
        processing: processed.map(|p| serde_json::to_value(p).expect("a report serializes")),
    };
    lock(s).last = Some(serde_json::json!({ "lost": lost, "summary": &answer }));
    Ok(answer)
}

/// The acquisition's one summary line in the log (a warning when anything was lost or not
/// saved); returns whether anything was.
fn log_summary(name: &str, stats: &ConsumeStats, c: &Counters, output: Option<&std::path::Path>) -> bool {
    let output = output.map(|p| p.display().to_string()).unwrap_or_else(|| "none".into());
    let lost = stats.incomplete + stats.discarded + c.frames_refused + stats.not_saved > 0 || stats.write_error.is_some() || stats.stage_failure.is_some();
    macro_rules! summary {
        ($level:ident) => {
            tracing::$level!(
                receiver = name,
                frames_complete = stats.complete,
                frames_incomplete = stats.incomplete,
                frames_discarded = stats.discarded,
                frames_refused = c.frames_refused,
                frames_written = stats.written,
                frames_not_saved = stats.not_saved,
                datagrams_dropped = c.dropped_total(),
                write_error = stats.write_error.as_deref().unwrap_or("none"),
                stage_failure = stats.stage_failure.as_deref().unwrap_or("none"),
                output = %output,
                "acquisition finished"
            )
        };
    }
    if lost {
        summary!(warn);
    } else {
        summary!(info);
    }
    lost
}

async fn status(State(s): State<Shared>) -> Json<serde_json::Value> {
    let d = lock(&s);
    let (state, request, counters) = match &d.active {
        None => ("idle", None, None),
        Some(a) => (if a.acq.is_some() { "acquiring" } else if a.starting { "starting" } else { "configured" }, Some(&a.request), Some(a.rx.counters().to_json())),
    };
    let dropped_events = lock(&d.events).dropped;
    let stream = stream_live(&d);
    let processing = dashboard::process_view(&d.board);
    let (frames_done, frames_to_writer) = d.board.frames_done();
    Json(serde_json::json!({ "name": d.opts.name, "state": state, "request": request, "counters": counters, "events_dropped": dropped_events, "stream": stream, "processing": processing, "frames_done": frames_done, "frames_to_writer": frames_to_writer, "threads": d.board.threads(), "api_refused": d.access.refused() }))
}

/// The running acquisition's stream counts.
#[derive(Default, Serialize)]
struct StreamCounts {
    images_sent: u64,
    images_dropped: u64,
    waits: u64,
    /// Consumers that took images.
    consumers: u64,
    images_encoded: u64,
}

fn stream_live(d: &ReceiverDaemon) -> Option<StreamCounts> {
    let live = d.active.as_ref()?.acq.as_ref()?.stream.as_ref()?;
    let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    Some(StreamCounts {
        images_sent: get(&live.images_sent),
        images_dropped: get(&live.images_dropped),
        waits: get(&live.waits),
        consumers: get(&live.consumers),
        images_encoded: get(&live.images_encoded),
    })
}

/// A series number for the stream: the acquisition's first event number (unique per daemon).
fn events_series(events: &Arc<Mutex<EventLog>>) -> u64 {
    lock(events).next()
}

async fn metrics(State(s): State<Shared>) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    let d = lock(&s);
    let c = d.active.as_ref().map(|a| a.rx.counters()).unwrap_or_default();
    let mut m = crate::metrics::Scrape::new("receiver", &d.opts.name);
    m.receiver(&c, &d.board);
    m.counter("events_dropped", "Events pushed out of the event log unread", lock(&d.events).dropped);
    m.counter("api_refused", "Control calls refused for a missing or wrong token", d.access.refused());
    let st = stream_live(&d).unwrap_or_default();
    m.counter("stream_images_sent", "Images published on the Stream V2 stream (this acquisition)", st.images_sent);
    m.counter("stream_images_dropped", "Images the stream dropped: no consumer, or its queue full (this acquisition)", st.images_dropped);
    m.counter("stream_waits", "Images that waited for a stream consumer (block policy; this acquisition)", st.waits);
    m.counter("stream_consumers", "Stream consumers connected while images went out (this acquisition)", st.consumers);
    m.counter("stream_images_encoded", "Images encoded for the stream or the preview: those someone would take (this acquisition)", st.images_encoded);
    m.answer()
}
