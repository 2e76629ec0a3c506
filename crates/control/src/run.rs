//! `rdaq run --serve` and `rdaq receive --dashboard`: an acquisition of this process on the
//! web dashboard, beside a small API:
//! `GET /status` (the dashboard's snapshot), `GET /events`, and `POST /stop`, which ends
//! the run early as Ctrl-C does (the detector stops; the receiver finishes what it has).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use axum::extract::{ConnectInfo, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use rdaq_emulator::Control;
use rdaq_proto::events::{Event, EventPage};
use rdaq_run::board::{Board, Glance};

use crate::auth::Access;
use crate::dashboard::{self, ReceiverView, Snapshot, View};
use crate::http::{lock, Since};

/// What the dashboard of a run shows, and what stops it.
pub struct RunView {
    title: String,
    frames: Option<u64>,
    board: Arc<Board>,
    control: Arc<Control>,
    access: Arc<Access>,
    result: Mutex<Option<serde_json::Value>>,
}

impl RunView {
    /// The run's end: its summary on the page, the state "finished".
    pub fn finish(&self, result: serde_json::Value) {
        *lock(&self.result) = Some(result);
        self.board.set_state("finished");
    }

    fn stop(&self, by: SocketAddr) -> bool {
        let first = !self.control.stop.swap(true, Ordering::Relaxed);
        if first {
            tracing::warn!(%by, "stop requested through the API: the detector stops, the receiver finishes what it has");
            self.board.push_event(Event::StopRequested { by: by.to_string() });
        }
        first
    }
}

impl View for RunView {
    fn snapshot(&self) -> Snapshot {
        let b = &self.board;
        let state = b.state();
        let counters = b.receiver().map(|c| c.to_json());
        let mut s = Snapshot {
            title: self.title.clone(),
            uptime_s: b.uptime_s(),
            frames_expected: self.frames,
            receivers: vec![ReceiverView { name: "receiver".into(), alive: true, counters }],
            stop: (state == "acquiring" && !self.control.stop.load(Ordering::Relaxed)).then(|| "/stop".into()),
            token_required: self.access.has_token(),
            api_refused: self.access.refused(),
            result: lock(&self.result).clone(),
            state,
            ..Snapshot::default()
        };
        dashboard::from_board(b, &mut s);
        s
    }

    fn events(&self, since: u64) -> EventPage {
        self.board.events_since(since, 10_000)
    }

    fn glance(&self) -> Option<Arc<Glance>> {
        self.board.glance()
    }
}

/// Serves the dashboard of the run on `board` (stopped through `control`) at `addr` while
/// it runs; returns the view, to be told when the run has finished.
pub fn serve(addr: SocketAddr, access: Access, title: String, frames: Option<u64>, board: Arc<Board>, control: Arc<Control>) -> anyhow::Result<Arc<RunView>> {
    let access = Arc::new(access);
    let view = Arc::new(RunView { title, frames, board, control, access: access.clone(), result: Mutex::new(None) });
    let api = Router::new()
        .route("/status", get(|State(v): State<Arc<RunView>>| async move { Json(v.snapshot()) }))
        .route("/events", get(|State(v): State<Arc<RunView>>, Query(q): Query<Since>| async move { Json(v.board.events_since(q.since, q.limit.min(100_000))) }))
        .route("/stop", post(stop))
        .with_state(view.clone());
    let app = api.merge(dashboard::routes(view.clone()));
    crate::http::serve_in_background(addr, app, "run", access)?;
    Ok(view)
}

async fn stop(State(v): State<Arc<RunView>>, ConnectInfo(peer): ConnectInfo<SocketAddr>, _: crate::answer::NoParameters) -> Result<Json<serde_json::Value>, crate::http::ApiError> {
    if v.board.state() != "acquiring" {
        return Err(crate::http::conflict("the run is not acquiring"));
    }
    let first = v.stop(peer);
    Ok(Json(serde_json::json!({ "state": "stopping", "first_request": first })))
}
