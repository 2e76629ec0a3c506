//! The web dashboard: one page, served from the binary on the same HTTP server as the
//! control API, that shows an acquisition live. The page (and the vendored plotting library,
//! uPlot) is compiled in; the data comes as server-sent events from `/dashboard/live`, one
//! update every [`PERIOD`] with the whole [`Snapshot`] and the events since the last one.
//! Rates (frames/s, GB/s, busy fractions, hit rate) are differences of the snapshot's
//! counters, computed by the page. `/dashboard/preview.png` renders the latest glance
//! ([`rdaq_run::board::Glance`]) with its spots.
//!
//! The page and its scripts carry no data and are open to everyone; the live feed and the
//! preview are reads (open unless `--protect-reads`); the stop button sends the token the
//! operator typed, like any other client.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use rdaq_proto::events::{Event, EventPage};
use rdaq_run::board::{Board, Glance, ProcessCounts};
use rdaq_run::latency::StepLatency;
use serde::Serialize;

use crate::openapi::{Described, Method};

/// How often the live feed sends an update.
pub const PERIOD: Duration = Duration::from_millis(500);

/// Events sent per update at most (the rest follow in the next ones).
const EVENTS_PER_UPDATE: usize = 500;

/// Set when the server shuts down: live feeds end, so that open pages do not hold the
/// graceful shutdown (it waits for every connection).
static CLOSING: AtomicBool = AtomicBool::new(false);

/// Ends every live feed of this process (at its next update).
pub fn close_feeds() {
    CLOSING.store(true, Ordering::Relaxed);
}

pub use crate::auth::ASSETS;

/// Everything the page shows, at one moment.
#[derive(Serialize, Default, Debug)]
pub struct Snapshot {
    /// What serves the page: "rdaq run", "receiver r0", "manager".
    pub title: String,
    /// "starting", "configured", "acquiring", "finished", ...
    pub state: String,
    /// Seconds since the server started (the time axis of rates and plots).
    pub uptime_s: f64,
    pub frames_expected: Option<u64>,
    pub receivers: Vec<ReceiverView>,
    pub stages: Vec<StageView>,
    pub latency: Vec<StepLatency>,
    pub process: Option<ProcessView>,
    /// How the acquisition shares the host's cores among its threads.
    pub threads: Option<rdaq_run::budget::ThreadBudget>,
    pub preview: Option<PreviewView>,
    /// The plan: transfer mode, receivers and the DTP epochs (the manager's page).
    pub topology: Option<serde_json::Value>,
    /// The call that stops the acquisition, while one can be stopped here.
    pub stop: Option<String>,
    /// The call that starts an acquisition (`{"output": FILE}`), while one can be started
    /// here (a receiver daemon with buffers and no acquisition).
    pub start: Option<String>,
    /// Whether changes (stop) need the token.
    pub token_required: bool,
    /// Control calls refused for a missing or wrong token.
    pub api_refused: u64,
    /// The acquisition's result, once it is finished.
    pub result: Option<serde_json::Value>,
}

/// One receiver: whether it answers, and its counters (as in `/status`).
#[derive(Serialize, Debug)]
pub struct ReceiverView {
    pub name: String,
    pub alive: bool,
    pub counters: Option<serde_json::Value>,
}

/// One stage of the processing graph (counters since it started).
#[derive(Serialize, Debug)]
pub struct StageView {
    pub name: String,
    pub workers: usize,
    pub frames: u64,
    pub busy_s: f64,
    /// Frames in its input rings, the one in work included.
    pub queued: u64,
    /// Room of its input rings (all workers; one shared ring or one each).
    pub capacity: usize,
    pub blocked: u64,
    pub dropped: u64,
    pub discarded: u64,
}

/// The processing graph's counts.
#[derive(Serialize, serde::Deserialize, Default, Debug, Clone, utoipa::ToSchema)]
pub struct ProcessView {
    pub dark_frames: u64,
    pub signal_frames: u64,
    pub hits: u64,
    pub vetoed: u64,
    pub spots_found: u64,
    pub pedestal_updates: u64,
    /// GPU errors (the GPU backend then processes on the CPU).
    #[serde(default)]
    pub device_errors: u64,
}

/// The latest glance, as `/dashboard/preview.png` shows it.
#[derive(Serialize, Debug)]
pub struct PreviewView {
    pub frame: u64,
    pub width: usize,
    pub height: usize,
    pub spots: usize,
    pub unit: &'static str,
}

/// What a server shows on its dashboard.
pub trait View: Send + Sync + 'static {
    fn snapshot(&self) -> Snapshot;
    /// Its events numbered `since` on.
    fn events(&self, since: u64) -> EventPage;
    /// The latest image with its spots.
    fn glance(&self) -> Option<Arc<Glance>>;
}

/// Fills what `board` knows: the stages, the latency, the processing counts, the preview.
pub fn from_board(b: &Board, s: &mut Snapshot) {
    s.stages = b.stages().iter().map(|st| stage_view(st)).collect();
    s.latency = b.latency().report();
    s.process = process_view(b);
    s.threads = b.threads();
    s.preview = b.glance().map(|g| PreviewView { frame: g.frame, width: g.width, height: g.height, spots: g.spots.len(), unit: g.unit });
}

/// The processing counts of the board's acquisition; `None` when it is raw.
pub fn process_view(b: &Board) -> Option<ProcessView> {
    let (p, get) = (&b.process, ProcessCounts::get);
    b.processing().then(|| ProcessView {
        dark_frames: get(&p.dark_frames),
        signal_frames: get(&p.signal_frames),
        hits: get(&p.hits),
        vetoed: get(&p.vetoed),
        spots_found: get(&p.spots_found),
        pedestal_updates: get(&p.pedestal_updates),
        device_errors: get(&p.device_errors),
    })
}

impl ProcessView {
    /// The sum of the counts of several acquisitions (a manager's receivers).
    pub fn sum<'a>(views: impl Iterator<Item = &'a ProcessView>) -> Option<ProcessView> {
        views.fold(None, |acc, v| {
            let mut t = acc.unwrap_or_default();
            t.dark_frames += v.dark_frames;
            t.signal_frames += v.signal_frames;
            t.hits += v.hits;
            t.vetoed += v.vetoed;
            t.spots_found += v.spots_found;
            t.pedestal_updates += v.pedestal_updates;
            t.device_errors += v.device_errors;
            Some(t)
        })
    }
}

fn stage_view(st: &rdaq_process::pipeline::StageStats) -> StageView {
    use std::sync::atomic::Ordering::Relaxed;
    let frames = st.processed.load(Relaxed);
    let sent: u64 = st.rings.iter().map(|r| r.sent.load(Relaxed)).sum();
    StageView {
        name: st.name.clone(),
        workers: st.workers,
        frames,
        busy_s: st.busy_ns.load(Relaxed) as f64 / 1e9,
        queued: sent.saturating_sub(frames),
        capacity: st.capacity * st.rings.len(),
        blocked: st.blocked(),
        dropped: st.dropped(),
        discarded: st.discarded.load(Relaxed),
    }
}

/// The dashboard's routes as an OpenAPI document describes them.
pub const DESCRIBED: [Described; 5] = [
    Described { path: "/", method: Method::Get, summary: "The dashboard's page", answers: "text/html" },
    Described { path: "/dashboard/assets/{file}", method: Method::Get, summary: "The dashboard's script and style files", answers: "text/plain" },
    Described { path: "/dashboard/live", method: Method::Get, summary: "The dashboard's live feed: a snapshot per event (server-sent events)", answers: "text/event-stream" },
    Described { path: "/dashboard/snapshot", method: Method::Get, summary: "What the dashboard shows (receivers, plan, result)", answers: "application/json" },
    Described { path: "/dashboard/preview.png", method: Method::Get, summary: "The latest frame, as an image", answers: "image/png" },
];

/// The dashboard's routes over `view`: the page at `/`, its files, the live feed and the
/// preview image. Merge them into the server's router.
pub fn routes(view: Arc<dyn View>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/dashboard/assets/{file}", get(asset))
        .route("/dashboard/live", get(live))
        .route("/dashboard/snapshot", get(snapshot))
        .route("/dashboard/preview.png", get(preview))
        .with_state(view)
}

const INDEX: &str = include_str!("../assets/dashboard/index.html");

/// The page's files, compiled in: name, content type, bytes.
const FILES: [(&str, &str, &[u8]); 4] = [
    ("app.js", "text/javascript; charset=utf-8", include_bytes!("../assets/dashboard/app.js")),
    ("app.css", "text/css; charset=utf-8", include_bytes!("../assets/dashboard/app.css")),
    ("uPlot.iife.min.js", "text/javascript; charset=utf-8", include_bytes!("../assets/dashboard/vendor/uPlot.iife.min.js")),
    ("uPlot.min.css", "text/css; charset=utf-8", include_bytes!("../assets/dashboard/vendor/uPlot.min.css")),
];

async fn page() -> axum::response::Html<&'static str> {
    axum::response::Html(INDEX)
}

async fn asset(axum::extract::Path(file): axum::extract::Path<String>) -> Response {
    match FILES.iter().find(|(name, ..)| *name == file) {
        Some((_, kind, bytes)) => ([(header::CONTENT_TYPE, *kind), (header::CACHE_CONTROL, "max-age=3600")], *bytes).into_response(),
        None => crate::answer::ApiError(StatusCode::NOT_FOUND, format!("no dashboard file {file:?}")).into_response(),
    }
}

async fn snapshot(State(v): State<Arc<dyn View>>) -> axum::Json<Snapshot> {
    axum::Json(v.snapshot())
}

/// Events an operator watches: not every frame completed.
fn notable(e: &Event) -> bool {
    !matches!(e, Event::FrameComplete { .. } | Event::EndOfFrame { .. })
}

/// One update of the live feed: the snapshot and the notable events from `since` on.
fn update(v: &dyn View, since: u64) -> (String, u64) {
    let page = v.events(since);
    let events: Vec<&Event> = page.events.iter().filter(|e| notable(e)).take(EVENTS_PER_UPDATE).collect();
    // events past the cap come in the next update
    let next = if events.len() == EVENTS_PER_UPDATE { page.first + position_after_cap(&page) } else { page.next };
    let data = serde_json::json!({ "snapshot": v.snapshot(), "events": events, "events_dropped": page.dropped });
    (data.to_string(), next)
}

/// The event number just after the last of the capped events of `page`.
fn position_after_cap(page: &EventPage) -> u64 {
    let mut kept = 0;
    for (i, e) in page.events.iter().enumerate() {
        kept += notable(e) as usize;
        if kept == EVENTS_PER_UPDATE {
            return i as u64 + 1;
        }
    }
    page.events.len() as u64
}

async fn live(State(v): State<Arc<dyn View>>) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let feed = futures_util::stream::unfold((v, 0u64, true), |(v, since, first)| async move {
        if !first {
            tokio::time::sleep(PERIOD).await;
        }
        if CLOSING.load(Ordering::Relaxed) {
            return None;
        }
        let (data, next) = update(v.as_ref(), since);
        Some((Ok(SseEvent::default().event("update").data(data)), (v, next, false)))
    });
    Sse::new(feed).keep_alive(KeepAlive::default())
}

async fn preview(State(v): State<Arc<dyn View>>) -> Response {
    let Some(g) = v.glance() else {
        return crate::answer::ApiError(StatusCode::NOT_FOUND, "no frame yet".into()).into_response();
    };
    let png = tokio::task::spawn_blocking(move || render(&g)).await;
    match png {
        Ok(Ok(png)) => ([(header::CONTENT_TYPE, "image/png"), (header::CACHE_CONTROL, "no-store")], png).into_response(),
        Ok(Err(e)) => crate::answer::internal(e).into_response(),
        Err(e) => crate::answer::internal(e).into_response(),
    }
}

/// The glance as the preview renders it: color map, spots circled, scale bar.
fn render(g: &Glance) -> Result<Vec<u8>, String> {
    let shown = rdaq_preview::Shown { width: g.width, height: g.height, values: &g.values, spots: &g.spots, pixel_size_m: rdaq_detector::jungfrau::PIXEL_SIZE_M };
    let mut png = Vec::new();
    rdaq_preview::write_png(&rdaq_preview::render(&shown), &mut png).map_err(|e| format!("preview: {e}"))?;
    Ok(png)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_updates_resume_after_the_last_event_sent() {
        let mut events = Vec::new();
        for f in 0..(EVENTS_PER_UPDATE as u64 + 10) {
            events.push(Event::FrameComplete { receiver: "r".into(), frame: f, imm: None });
            events.push(Event::Error { source: "t".into(), message: format!("{f}") });
        }
        let page = EventPage { first: 100, next: 100 + events.len() as u64, dropped: 0, events };
        // the 500th notable event is the 1000th event: the next update starts after it
        assert_eq!(position_after_cap(&page), 2 * EVENTS_PER_UPDATE as u64);
    }
}
