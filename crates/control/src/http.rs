//! What the control APIs share: HTTP/JSON on axum, the routes every daemon has, serving
//! until Ctrl-C, and the Prometheus text format.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::routing::get;
use axum::{Json, Router};
use rdaq_proto::events::EventPage;

use crate::auth::Access;
pub use crate::answer::{bad, conflict, events_page, internal, lock, ApiError, Since};

/// A daemon's state, shared by the handlers of its API.
pub type Shared<D> = Arc<Mutex<D>>;

/// What every daemon serves besides its own routes: its event log.
pub trait Daemon: Send + 'static {
    /// The page of its events that `q` asks for.
    fn event_page(&self, q: &Since) -> EventPage;
}

/// The router of daemon `d`: its own `routes`, `/events`, and the state they share.
pub fn daemon_router<D: Daemon>(d: Shared<D>, routes: Router<Shared<D>>) -> Router {
    routes.route("/events", get(events::<D>)).with_state(d)
}

async fn events<D: Daemon>(State(s): State<Shared<D>>, Query(q): Query<Since>) -> Json<EventPage> {
    Json(lock(&s).event_page(&q))
}

/// Until SIGINT (Ctrl-C) or SIGTERM (`systemctl stop`, `kill`): both end a daemon the same way.
async fn interrupted() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Serves `app` on `addr` until SIGINT or SIGTERM, behind `access`.
pub fn serve(addr: SocketAddr, app: axum::Router, what: &str, access: Arc<Access>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let listener = listen(addr, what, &access).await?;
        axum::serve(listener, guarded(app, access).into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(async {
                interrupted().await;
                crate::dashboard::close_feeds();
            })
            .await?;
        Ok(())
    })
}

/// Serves `app` behind `access` on `addr` from a thread of its own, while the caller runs
/// the acquisition; returns the address it listens on.
pub fn serve_in_background(addr: SocketAddr, app: axum::Router, what: &str, access: Arc<Access>) -> anyhow::Result<SocketAddr> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let listener = rt.block_on(listen(addr, what, &access))?;
    let bound = listener.local_addr()?;
    let app = guarded(app, access).into_make_service_with_connect_info::<SocketAddr>();
    std::thread::Builder::new().name(format!("rdaq-{what}-api")).spawn(move || {
        let _ = rt.block_on(async move { axum::serve(listener, app).await });
    })?;
    Ok(bound)
}

/// `app` with every call checked by `access` first, and every error answered as JSON.
pub fn guarded(app: axum::Router, access: Arc<Access>) -> axum::Router {
    app.layer(axum::middleware::map_response(crate::answer::json_errors)).layer(axum::middleware::from_fn_with_state(access, crate::auth::guard))
}

/// Binds `addr`, saying where and how the API listens, and warning when anyone on the
/// network may control it.
pub async fn listen(addr: SocketAddr, what: &str, access: &Access) -> anyhow::Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let token = if access.has_token() { "token required for changes" } else { "no token: open to every client that can reach it" };
    tracing::info!(daemon = what, "control API on http://{} ({token})", listener.local_addr()?);
    if !addr.ip().is_loopback() && !access.has_token() {
        tracing::warn!(daemon = what, "listening on {} without a token: anyone on the network can reconfigure or stop this daemon (--token-file or {})", addr.ip(), crate::auth::TOKEN_ENV);
    }
    Ok(listener)
}

/// `--serve`'s value: `ADDRESS:PORT`, or a port alone for localhost.
pub fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse().map_err(|_| format!("{s:?} is not ADDRESS:PORT or a port"))
}

