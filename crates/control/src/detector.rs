//! The detector daemon: emulated modules that take their data transfer processes from the
//! system manager (`PUT /dtp`, also while running: a live re-plan from a given frame) and
//! send on `POST /start`: JUNGFRAU modules sending rdaq datagrams, or a described detector
//! (EIGER) sending its own packets with a counting pattern
//! ([`rdaq_emulator::described`]), each module's ports to the ports its route names.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use rdaq_detector::{Description, SynthConfig, MODULE_BYTES};
use rdaq_emulator::described::{self, DescribedDetector};
use rdaq_emulator::{Control, EmulatorConfig, EmulatorError, EmulatorReport};
use rdaq_proto::events::EventPage;
use rdaq_proto::telegram::{DetectorTelegram, ModuleDtp, NativeRequest, TELEGRAM_VERSION};
use serde::{Deserialize, Serialize};

use crate::http::{bad, conflict, daemon_router, events_page, internal, lock, ApiError, Daemon, Since};
use crate::openapi::{self, Described, Method};

#[derive(Clone, Debug)]
pub struct Options {
    pub name: String,
    pub modules: u16,
    pub seed: u64,
    /// A described detector's own packets instead of JUNGFRAU's rdaq datagrams.
    pub native: Option<Native>,
}

/// A described detector the daemon emulates, and how a receiver's buffer request names it.
#[derive(Clone, Debug)]
pub struct Native {
    pub detector: DescribedDetector,
    pub request: NativeRequest,
}

impl Native {
    /// `modules` modules of the description named in `request` (a detector placed by
    /// header), at its bit depth and link.
    pub fn new(request: NativeRequest, modules: u16) -> anyhow::Result<Native> {
        let d = Description::named_or_text(&request.detector)?;
        let wire = d.wire(request.bit_depth, request.link.as_deref()).map_err(|e| anyhow::anyhow!("--{} {}: {}", e.field.replace('_', "-"), e.value, e.why))?;
        let detector = DescribedDetector::new(&d, &wire, modules, request.module_cols).map_err(|e| anyhow::anyhow!("--detector {}: {e}", d.name))?;
        Ok(Native { detector, request: NativeRequest { bit_depth: Some(wire.bits), link: Some(wire.link), ..request } })
    }
}

struct DetectorDaemon {
    opts: Options,
    max_rate_hz: f64,
    dtps: Option<Vec<ModuleDtp>>,
    control: Arc<Control>,
    run: Option<JoinHandle<Result<EmulatorReport, EmulatorError>>>,
    report: Option<EmulatorReport>,
    access: Arc<crate::auth::Access>,
}

type Shared = crate::http::Shared<DetectorDaemon>;

impl Daemon for DetectorDaemon {
    fn event_page(&self, q: &Since) -> EventPage {
        events_page(&self.control.events, q)
    }
}

/// Frames per second one module's synthesis reaches on this machine (measured once).
fn measure_rate(seed: u64) -> f64 {
    1.0 / rdaq_emulator::config::frame_make_time(&SynthConfig { seed, ..Default::default() }).as_secs_f64()
}

/// The daemon's API; `access` is the one [`crate::http::serve`] guards it with (its
/// refusals are counted in `/status`).
pub fn router(opts: Options, access: Arc<crate::auth::Access>) -> Router {
    let max_rate_hz = measure_rate(opts.seed);
    let d = DetectorDaemon { opts, max_rate_hz, dtps: None, control: Arc::new(Control::default()), run: None, report: None, access };
    let routes = Router::new()
        .route("/telegram", get(telegram))
        .route("/dtp", put(dtp))
        .route("/start", post(start))
        .route("/stop", post(stop))
        .route("/status", get(status))
        .route("/manifest", get(manifest));
    let doc = openapi::document("rdaq detector daemon", "Emulated detector modules: the manager uploads what each module sends where (DTPs), then starts and stops them. Calls that change something need the token when one is set (Authorization: Bearer). Bodies are JSON objects, described in docs/control.md, not here.", &DESCRIBED);
    openapi::serve_document(daemon_router(Arc::new(std::sync::Mutex::new(d)), routes), doc)
}

/// The daemon's routes as its OpenAPI document describes them.
const DESCRIBED: [Described; 7] = [
    Described { path: "/telegram", method: Method::Get, summary: "What the modules offer: their count, sizes and links (the manager plans with it)", answers: "application/json" },
    Described { path: "/dtp", method: Method::Put, summary: "What each module sends where (the manager's data transfer processes)", answers: "application/json" },
    Described { path: "/start", method: Method::Post, summary: "Starts sending frames (count, rate, faults)", answers: "application/json" },
    Described { path: "/stop", method: Method::Post, summary: "Stops sending; answers what was sent", answers: "application/json" },
    Described { path: "/status", method: Method::Get, summary: "Whether the modules send, and what they sent", answers: "application/json" },
    Described { path: "/manifest", method: Method::Get, summary: "The frames sent, one CSV line each", answers: "text/csv" },
    openapi::EVENTS,
];

async fn telegram(State(s): State<Shared>) -> Json<DetectorTelegram> {
    let d = lock(&s);
    let (module_bytes, links, payload) = match &d.opts.native {
        Some(n) => (n.detector.module_bytes(), n.detector.ports() as u16, n.detector.payload() as u32),
        None => (MODULE_BYTES as u64, 1, rdaq_proto::MAX_PAYLOAD as u32),
    };
    Json(DetectorTelegram {
        version: TELEGRAM_VERSION,
        name: d.opts.name.clone(),
        modules: d.opts.modules,
        module_bytes,
        links_per_module: links,
        max_payload_bytes: payload,
        max_rate_hz: d.max_rate_hz,
        native: d.opts.native.as_ref().map(|n| n.request.clone()),
    })
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DtpUpload {
    /// While running: the first frame the new DTPs apply to.
    #[serde(default)]
    pub from_frame: Option<u64>,
    pub dtps: Vec<ModuleDtp>,
}

fn running(d: &DetectorDaemon) -> bool {
    d.run.as_ref().is_some_and(|h| !h.is_finished())
}

async fn dtp(State(s): State<Shared>, Json(up): Json<DtpUpload>) -> Result<Json<serde_json::Value>, ApiError> {
    let mut d = lock(&s);
    if up.dtps.len() != d.opts.modules as usize {
        return Err(bad(format!("dtps: {} DTPs for {} modules", up.dtps.len(), d.opts.modules)));
    }
    match &d.opts.native {
        Some(n) => check_native_routes(n, &up)?,
        // what the modules could not run is refused here, not in their threads
        None => rdaq_emulator::check_dtps(d.opts.modules, MODULE_BYTES as u64, &up.dtps).map_err(|e| bad(format!("dtps: {e}")))?,
    }
    if running(&d) {
        let Some(from) = up.from_frame else {
            return Err(conflict("running: a live update needs from_frame"));
        };
        return match d.control.update(from, up.dtps.clone()) {
            Ok(()) => Ok(Json(serde_json::json!({ "applied_from": from }))),
            Err(EmulatorError::UpdateTooLate { frontier, .. }) => Err(ApiError(
                StatusCode::CONFLICT,
                format!("from_frame {from} has started already; the first free frame is {frontier}"),
            )),
            Err(e) => Err(bad(format!("dtps: {e}"))),
        };
    }
    if up.from_frame.is_some() {
        return Err(conflict("not running: a live update (from_frame) has nothing to update"));
    }
    d.dtps = Some(up.dtps);
    Ok(Json(serde_json::json!({ "applied_from": 0 })))
}

/// A described detector's modules each send to one receiver's ports, one per port of the
/// module, for the whole run.
fn check_native_routes(n: &Native, up: &DtpUpload) -> Result<(), ApiError> {
    if up.from_frame.is_some() {
        return Err(conflict("from_frame: a detector's own packets go to the ports it was configured with; it takes no re-plan while running"));
    }
    let ports = n.detector.ports();
    for dtp in &up.dtps {
        match &dtp.routes[..] {
            [r] if r.ports.len() == ports => {}
            _ => return Err(bad(format!("dtps: module {} of {} needs one route with {ports} ports", dtp.module, n.detector.name()))),
        }
    }
    Ok(())
}

/// Where each module's ports send, module after module (`described::send`'s order).
fn native_destinations(dtps: &[ModuleDtp]) -> Vec<SocketAddr> {
    dtps.iter().flat_map(|d| d.routes[0].ports.iter().map(|&p| SocketAddr::new(d.routes[0].data.ip(), p))).collect()
}

/// `POST /start`: send frames `first_frame..first_frame + frames` at `rate_hz`.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    pub frames: u64,
    /// Frames per second; 0 as fast as possible.
    #[serde(default)]
    pub rate_hz: f64,
    #[serde(default)]
    pub first_frame: u64,
}

async fn start(State(s): State<Shared>, Json(req): Json<StartRequest>) -> Result<Json<serde_json::Value>, ApiError> {
    let mut d = lock(&s);
    if running(&d) {
        return Err(conflict("already running"));
    }
    let Some(dtps) = d.dtps.clone() else {
        return Err(conflict("no DTPs: PUT /dtp first"));
    };
    let cfg = EmulatorConfig {
        modules: d.opts.modules,
        frames: req.frames,
        first_frame: req.first_frame,
        rate_hz: (req.rate_hz != 0.0).then_some(req.rate_hz),
        synth: SynthConfig { seed: d.opts.seed, ..Default::default() },
        ..EmulatorConfig::default()
    };
    rdaq_emulator::config::check_rate(cfg.rate_hz).map_err(|e| bad(format!("rate_hz: {e}")))?;
    cfg.last_frame().map_err(|e| bad(format!("first_frame: {e}")))?;
    let control = Arc::new(Control::default());
    d.control = control.clone();
    d.report = None;
    let native = d.opts.native.clone();
    let handle = std::thread::Builder::new()
        .name("rdaq-emulate".into())
        .spawn(move || match native {
            None => rdaq_emulator::run(&cfg, &dtps, control),
            Some(n) => send_native(&n.detector, &cfg, &native_destinations(&dtps), &control),
        })
        .map_err(internal)?;
    d.run = Some(handle);
    Ok(Json(serde_json::json!({ "state": "running" })))
}

/// A described detector's frames from `cfg.first_frame` on, numbered as the manager counts
/// them (a detector with reset frames starts with one, an even number), reported as the
/// rdaq modules' run is.
fn send_native(det: &DescribedDetector, cfg: &EmulatorConfig, dests: &[SocketAddr], control: &Control) -> Result<EmulatorReport, EmulatorError> {
    let first = cfg.first_frame.saturating_add((det.sends_reset_frames() && cfg.first_frame % 2 == 1) as u64);
    let r = described::send(det, dests, first, cfg.frames, cfg.rate_hz, true, control).map_err(|source| EmulatorError::Send { module: 0, source })?;
    Ok(r.into())
}

#[derive(Serialize)]
pub struct StopAnswer {
    pub module_frames: u64,
    pub datagrams: u64,
    pub bytes: u64,
    pub late_frames: u64,
    pub refused: u64,
    /// RoCEv2 frames the interface's queue refused (sent again by go-back).
    pub roce_refused: u64,
    /// Retransmission: requests received (and refused as malformed or for another module),
    /// datagrams sent again, datagrams asked for that the history no longer held.
    pub nacks: u64,
    pub bad_nacks: u64,
    pub resent: u64,
    pub history_misses: u64,
    pub elapsed_s: f64,
}

async fn stop(State(s): State<Shared>, _: crate::answer::NoParameters) -> Result<Json<StopAnswer>, ApiError> {
    let handle = {
        let mut d = lock(&s);
        d.control.stop.store(true, Ordering::Relaxed);
        d.run.take()
    };
    let Some(handle) = handle else {
        return Err(conflict("not running"));
    };
    let r = tokio::task::spawn_blocking(move || handle.join()).await.map_err(internal)?.map_err(|_| internal("emulator panicked"))?;
    let r = r.map_err(internal)?;
    let answer = StopAnswer {
        module_frames: r.manifest.len() as u64,
        datagrams: r.sent.datagrams,
        bytes: r.sent.bytes,
        late_frames: r.late_frames,
        refused: r.sent.refused,
        roce_refused: r.roce_refused,
        nacks: r.retransmit.nacks,
        bad_nacks: r.retransmit.bad_nacks,
        resent: r.retransmit.resent,
        history_misses: r.retransmit.history_misses,
        elapsed_s: r.elapsed.as_secs_f64(),
    };
    lock(&s).report = Some(r);
    Ok(Json(answer))
}

/// Where the detector daemon is: idle, sending, done sending, or stopped (its report kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DetectorState {
    Idle,
    Running,
    Done,
    Stopped,
}

/// `GET /status` of the detector daemon.
#[derive(Debug, Serialize, Deserialize)]
pub struct DetectorStatus {
    pub name: String,
    pub state: DetectorState,
    /// Module frames fully sent.
    pub module_frames: u64,
    /// The first frame no module has started yet (a re-plan applies from a later one).
    pub frontier: u64,
    /// Whether DTPs were uploaded.
    pub dtps: bool,
    /// Control calls refused for a missing or wrong token.
    #[serde(default)]
    pub api_refused: u64,
}

async fn status(State(s): State<Shared>) -> Json<DetectorStatus> {
    let d = lock(&s);
    let state = match &d.run {
        Some(h) if !h.is_finished() => DetectorState::Running,
        Some(_) => DetectorState::Done,
        None if d.report.is_some() => DetectorState::Stopped,
        None => DetectorState::Idle,
    };
    Json(DetectorStatus {
        name: d.opts.name.clone(),
        state,
        module_frames: d.control.module_frames.load(Ordering::Relaxed),
        frontier: d.control.frontier(),
        dtps: d.dtps.is_some(),
        api_refused: d.access.refused(),
    })
}

async fn manifest(State(s): State<Shared>) -> Result<String, ApiError> {
    let d = lock(&s);
    let Some(r) = &d.report else {
        return Err(conflict("no finished run: POST /stop first"));
    };
    Ok(rdaq_emulator::manifest_csv(&r.manifest))
}
