//! What the manager's API and dashboard show: its state, the receivers as their heartbeats
//! found them, the plan and its epochs, the events gathered, and the report at the end;
//! and the operator's request to stop.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{ConnectInfo, Query, State};
use axum::routing::{get, post};
use axum::Json;
use rdaq_manager::Epoch;
use rdaq_proto::events::{Event, EventLog, EventPage};

use crate::auth::Access;
use crate::dashboard::{self, ProcessView, ReceiverView, Snapshot, View};
use crate::http::lock;
use crate::openapi::{Described, Method};

/// Events the manager keeps for `/events`: of one acquisition (all of a long one's are in its
/// events.jsonl), and of the service, which runs for weeks: there the log is a window on the
/// latest datasets (each dataset's events are in its own events.jsonl), so that memory stays
/// flat however many datasets it takes. Older events are counted as dropped.
pub const EVENTS_KEPT_RUN: usize = 1 << 20;
pub const EVENTS_KEPT_SERVICE: usize = 4096;

/// What the manager's API shows.
pub struct Board {
    pub title: String,
    pub frames: u64,
    pub status: serde_json::Value,
    pub events: EventLog,
    /// Each receiver's last heartbeat: whether it answered, and its counters then.
    pub receivers: BTreeMap<String, (bool, Option<serde_json::Value>)>,
    /// Each receiver's counters when the acquisition service's dataset started (they run on
    /// from dataset to dataset: a dataset's own are counted from these).
    pub counters_base: BTreeMap<String, serde_json::Value>,
    /// Each processing receiver's counts at its last heartbeat.
    pub processing: BTreeMap<String, ProcessView>,
    /// Frames each receiver's acquisition had taken to its writer at its last heartbeat.
    pub to_writer: BTreeMap<String, u64>,
    pub topology: Option<serde_json::Value>,
    pub report: Option<serde_json::Value>,
    /// Whether the finished acquisition lost data (what the exit status says).
    pub lost: Option<bool>,
    /// An operator asked to stop (`POST /stop`).
    pub stop_requested: bool,
    start: Instant,
}

impl Board {
    pub fn new(title: String, frames: u64, events_kept: usize) -> Board {
        Board {
            title,
            frames,
            status: serde_json::json!({ "state": "configuring" }),
            events: EventLog::new(events_kept),
            receivers: BTreeMap::new(),
            counters_base: BTreeMap::new(),
            processing: BTreeMap::new(),
            to_writer: BTreeMap::new(),
            topology: None,
            report: None,
            lost: None,
            stop_requested: false,
            start: Instant::now(),
        }
    }

    /// The plan as the dashboard shows it: the mode, the detector and each epoch's receivers.
    pub fn set_plan(&mut self, mode: &str, modules: u16, detector: SocketAddr, epochs: &[Epoch]) {
        let epochs: Vec<_> = epochs.iter().map(|e| serde_json::json!({ "from_frame": e.from_frame, "receivers": e.receivers, "reason": e.reason, "dtps": e.dtps.len() })).collect();
        self.topology = Some(serde_json::json!({ "mode": mode, "modules": modules, "detector": detector.to_string(), "epochs": epochs }));
    }
}

pub type SharedBoard = Arc<Mutex<Board>>;

/// The manager on its dashboard.
struct ManagerView {
    board: SharedBoard,
    access: Arc<Access>,
}

impl View for ManagerView {
    fn snapshot(&self) -> Snapshot {
        let b = lock(&self.board);
        let state = b.status["state"].as_str().unwrap_or("unknown").to_string();
        let receivers = b.receivers.iter().map(|(name, (alive, counters))| ReceiverView { name: name.clone(), alive: *alive, counters: counters.clone() }).collect();
        Snapshot {
            title: b.title.clone(),
            uptime_s: b.start.elapsed().as_secs_f64(),
            frames_expected: Some(b.frames),
            receivers,
            process: ProcessView::sum(b.processing.values()),
            topology: b.topology.clone(),
            stop: (state == "running" && !b.stop_requested).then(|| "/stop".into()),
            token_required: self.access.has_token(),
            api_refused: self.access.refused(),
            result: b.report.as_ref().map(|r| serde_json::json!({ "lost": b.lost, "summary": r })),
            state,
            ..Snapshot::default()
        }
    }

    fn events(&self, since: u64) -> EventPage {
        lock(&self.board).events.since(since, 10_000)
    }

    fn glance(&self) -> Option<Arc<rdaq_run::board::Glance>> {
        None
    }
}

/// Starts the manager's API and dashboard in a background thread.
pub fn serve(addr: SocketAddr, b: SharedBoard, access: Arc<Access>) -> anyhow::Result<()> {
    let doc = crate::openapi::document("rdaq system manager", "One acquisition over the receiver and detector daemons of a topology: its state, plan, events and report. Stop needs the token when one is set (Authorization: Bearer).", &described());
    crate::http::serve_in_background(addr, crate::openapi::serve_document(router(b, access.clone()), doc), "manage", access)?;
    Ok(())
}

/// The manager's API and dashboard as an OpenAPI document describes them.
pub fn described() -> Vec<Described> {
    let api = [
        Described { path: "/status", method: Method::Get, summary: "The manager's state, plan and receivers", answers: "application/json" },
        crate::openapi::EVENTS,
        Described { path: "/report", method: Method::Get, summary: "The last acquisition's report (409 while one runs)", answers: "application/json" },
        Described { path: "/stop", method: Method::Post, summary: "Stops the acquisition under way early", answers: "application/json" },
    ];
    api.into_iter().chain(dashboard::DESCRIBED).collect()
}

/// The manager's API and dashboard.
pub fn router(b: SharedBoard, access: Arc<Access>) -> axum::Router {
    let api = axum::Router::new()
        .route("/status", get(|State(b): State<SharedBoard>| async move { Json(lock(&b).status.clone()) }))
        .route("/events", get(|State(b): State<SharedBoard>, Query(q): Query<crate::http::Since>| async move { Json(lock(&b).events.since(q.since, q.limit.min(100_000))) }))
        .route(
            "/report",
            get(|State(b): State<SharedBoard>| async move {
                match lock(&b).report.clone() {
                    Some(r) => Ok(Json(r)),
                    None => Err(crate::http::conflict("the acquisition is still running")),
                }
            }),
        )
        .route("/stop", post(stop))
        .with_state(b.clone());
    api.merge(dashboard::routes(Arc::new(ManagerView { board: b, access })))
}

async fn stop(State(b): State<SharedBoard>, ConnectInfo(peer): ConnectInfo<SocketAddr>, _: crate::answer::NoParameters) -> Result<Json<serde_json::Value>, crate::http::ApiError> {
    let mut b = lock(&b);
    if b.status["state"] != "running" {
        return Err(crate::http::conflict("the acquisition is not running"));
    }
    if !b.stop_requested {
        b.stop_requested = true;
        tracing::warn!(%peer, "stop requested through the API: the detector stops, the receivers finish what they have");
        b.events.push(Event::StopRequested { by: peer.to_string() });
    }
    Ok(Json(serde_json::json!({ "state": "stopping" })))
}
