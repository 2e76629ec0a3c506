//! The acquisition service's HTTP API: the handlers read requests into the state machine
//! ([`rdaq_manager::service`]) and hand what it answers to the worker; `GET /acquisition`
//! shows where it stands. The OpenAPI document at `/openapi.json` is generated from the
//! handlers and their types (utoipa).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use axum::Json;
use rdaq_manager::service::{ArmRequest, Dataset, Send, ServiceError, State as Phase};
use serde::Serialize;
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{prepare_directory, Hub, Ready, SharedHub, Work, READY_WAIT};
use crate::dashboard::ProcessView;
use crate::http::{lock, ApiError};
use crate::openapi::{serve_document, with_bearer, with_described, Described};

/// The size of the images in a dataset's master (modules and gaps).
#[derive(Clone, Copy, Serialize, ToSchema)]
pub struct Image {
    pub height: usize,
    pub width: usize,
}

/// `GET /acquisition`: where the service is, and its dataset.
#[derive(Serialize, ToSchema)]
pub struct Acquisition {
    pub state: Phase,
    /// The directory every dataset's `directory` is relative to (absolute).
    #[schema(value_type = String)]
    pub data_root: PathBuf,
    pub image: Image,
    /// Why the service is in `error` (until the next arm).
    pub error: Option<String>,
    /// The dataset armed or under way, else the last one that ended.
    pub dataset: Option<Dataset>,
    pub live: Live,
    /// Calls of this API refused (bad requests, wrong state), each logged with its reason.
    pub requests_refused: u64,
}

/// What the receivers said at their last answer: the processing counts of the dataset
/// under way (or the last), and their own counters (a system's daemons: since their
/// buffers were defined; a receiver on its own: in the dataset).
#[derive(Default, Serialize, ToSchema)]
pub struct Live {
    pub processing: Option<ProcessView>,
    /// Datagrams the receivers dropped, for any reason.
    pub datagrams_dropped: u64,
    /// Frames they finished with data missing.
    pub frames_incomplete: u64,
    /// How the acquisition shares the host's cores (a receiver on its own; a system's
    /// receivers each say it in their own `/status`).
    #[schema(value_type = Option<Object>)]
    pub threads: Option<rdaq_run::budget::ThreadBudget>,
}

/// What `POST /trigger` started.
#[derive(Serialize, ToSchema)]
pub struct Triggered {
    pub state: Phase,
    /// The dataset's number.
    pub number: u64,
    /// The trigger's first frame (counted from 0 in the dataset) and its frames.
    pub first_frame: u64,
    pub frames: u64,
}

/// A refused or failed call: its one-line reason (it names the field of a bad request).
#[derive(Serialize, ToSchema)]
pub struct ErrorAnswer {
    pub error: String,
}

#[derive(OpenApi)]
#[openapi(
    info(title = "rdaq acquisition service", description = "Configured once, then datasets: arm, trigger, cancel, follow. Every call that changes something needs the token when one is set (Authorization: Bearer); with --protect-reads, reads too.")
)]
struct ApiDoc;

/// The service's routes, each with its part of the OpenAPI document.
fn api() -> OpenApiRouter<SharedHub> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(acquisition))
        .routes(routes!(arm))
        .routes(routes!(trigger))
        .routes(routes!(disarm))
        .routes(routes!(cancel))
}

/// The service's routes, and `/openapi.json`: the document they make with the routes
/// `extra` describes; every refusal counted and logged.
pub(super) fn router(hub: SharedHub, extra: &[Described]) -> axum::Router {
    let (router, doc) = api().with_state(hub.clone()).split_for_parts();
    let router = router.layer(axum::middleware::from_fn_with_state(hub, note_refusal));
    serve_document(router, with_bearer(with_described(doc, extra)))
}

/// Middleware: a refused call (4xx) is counted and logged with its one-line reason.
async fn note_refusal(State(hub): State<SharedHub>, req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let resp = next.run(req).await;
    if !resp.status().is_client_error() {
        return resp;
    }
    let n = hub.refused.fetch_add(1, Ordering::Relaxed) + 1;
    let (parts, body) = resp.into_parts();
    // the answers here are one-line JSON errors
    let bytes = axum::body::to_bytes(body, 16 * 1024).await.unwrap_or_default();
    let why = serde_json::from_slice::<serde_json::Value>(&bytes).ok().and_then(|v| v["error"].as_str().map(String::from)).unwrap_or_default();
    tracing::warn!(%method, path, status = parts.status.as_u16(), refused = n, "refused {method} {path}: {why}");
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

fn answer(e: ServiceError) -> ApiError {
    match e {
        ServiceError::State(m) => ApiError(StatusCode::CONFLICT, m),
        e @ ServiceError::Field { .. } => ApiError(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

impl Hub {
    /// The acquisition as it stands, its written count brought up to the receivers' last
    /// answers.
    fn acquisition(&self) -> Acquisition {
        let (live, to_writer) = self.backend.live();
        let mut s = lock(&self.service);
        if matches!(s.state(), Phase::Acquiring | Phase::Armed) {
            s.written(to_writer);
        }
        let requests_refused = self.refused.load(Ordering::Relaxed);
        Acquisition { state: s.state(), data_root: self.root.clone(), image: self.image, error: s.error().map(String::from), dataset: s.dataset().cloned(), live, requests_refused }
    }
}

/// The service's state and its dataset (the one under way, else the last that ended, with
/// its summary).
#[utoipa::path(get, path = "/acquisition", responses((status = 200, body = Acquisition)))]
async fn acquisition(State(hub): State<SharedHub>) -> Json<Acquisition> {
    Json(hub.acquisition())
}

/// Arms the next dataset (again, until its first trigger). Its directory is made under the
/// data root; files of the same name are refused.
#[utoipa::path(post, path = "/arm", request_body = ArmRequest, responses(
    (status = 200, body = Acquisition, description = "armed"),
    (status = 400, body = ErrorAnswer, description = "a field out of range, unknown, or a path outside the data root"),
    (status = 409, body = ErrorAnswer, description = "acquiring, or the dataset's files exist"),
))]
async fn arm(State(hub): State<SharedHub>, body: Bytes) -> Result<Json<Acquisition>, ApiError> {
    let req: ArmRequest = read_arm(&body)?;
    let master = {
        let s = lock(&hub.service);
        s.can_arm().and_then(|()| s.master(&req)).map_err(answer)?
    };
    if let Some((field, why)) = hub.backend.refuses(&req) {
        return Err(answer(ServiceError::Field { field, why }));
    }
    let dir = master.parent().expect("a master path has a directory").to_path_buf();
    let rel = Path::new(&req.directory).to_path_buf();
    let h = hub.clone();
    tokio::task::spawn_blocking(move || prepare_directory(&h.root, &rel, &h.backend.files(&dir, &req)).map(|()| req))
        .await
        .map_err(crate::http::internal)?
        .map_err(|e| e.answer())
        .and_then(|req| lock(&hub.service).arm(req).map(|_| ()).map_err(answer))?;
    Ok(Json(hub.acquisition()))
}

/// An arm request, or a 400 naming the field that is wrong.
fn read_arm(body: &[u8]) -> Result<ArmRequest, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        let inner = e.into_inner();
        crate::http::bad(if at == "." { inner.to_string() } else { format!("{at}: {inner}") })
    })
}

/// Starts the next trigger; answers once its frames may come (the receivers listen), and
/// goes on in the background (follow it with `GET /acquisition`).
#[utoipa::path(post, path = "/trigger", responses(
    (status = 202, body = Triggered, description = "the receivers listen: the trigger's frames are being taken"),
    (status = 409, body = ErrorAnswer, description = "not armed"),
    (status = 500, body = ErrorAnswer, description = "the trigger failed (the service is in error, saying why)"),
))]
async fn trigger(State(hub): State<SharedHub>, _: crate::answer::NoParameters) -> Result<(StatusCode, Json<Triggered>), ApiError> {
    let send: Send = lock(&hub.service).trigger().map_err(answer)?;
    let t = Triggered { state: Phase::Acquiring, number: send.number, first_frame: send.first_frame, frames: send.frames };
    let (tx, rx) = tokio::sync::oneshot::channel();
    hub.send(Work::Trigger(send, Ready(Some(tx))));
    match tokio::time::timeout(READY_WAIT, rx).await {
        Ok(Ok(Err(why))) => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("the trigger failed: {why}"))),
        Err(_) => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("the receivers did not start within {READY_WAIT:?}"))),
        // ready, or a step that needed no receiver (a cancel came first)
        Ok(_) => Ok((StatusCode::ACCEPTED, Json(t))),
    }
}

/// Drops an arm not yet triggered; between triggers, ends the dataset as a cancel does.
#[utoipa::path(post, path = "/disarm", responses(
    (status = 200, body = Acquisition),
    (status = 409, body = ErrorAnswer, description = "acquiring: cancel instead"),
))]
async fn disarm(State(hub): State<SharedHub>, _: crate::answer::NoParameters) -> Result<Json<Acquisition>, ApiError> {
    let close = lock(&hub.service).disarm().map_err(answer)?;
    if close {
        hub.send(Work::Close);
    }
    Ok(Json(hub.acquisition()))
}

/// Ends the dataset under way early: the detector stops, the receivers finish what they
/// have, the files are closed (the state goes idle then, the dataset marked cancelled).
#[utoipa::path(post, path = "/cancel", responses(
    (status = 200, body = Acquisition),
    (status = 409, body = ErrorAnswer, description = "nothing to cancel"),
))]
async fn cancel(State(hub): State<SharedHub>, _: crate::answer::NoParameters) -> Result<Json<Acquisition>, ApiError> {
    let mut s = lock(&hub.service);
    let acquiring = s.state() == Phase::Acquiring;
    let close = s.cancel().map_err(answer)?;
    drop(s);
    if close && acquiring {
        // the worker ends the trigger, then closes the files
        hub.backend.stop_trigger();
    } else if close {
        hub.send(Work::Close);
    }
    Ok(Json(hub.acquisition()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_arm_names_its_field() {
        let msg = |body: &str| read_arm(body.as_bytes()).map(|_| ()).expect_err("refused").1;
        assert!(msg(r#"{"frames_per_trigger": -3, "prefix": "s"}"#).starts_with("frames_per_trigger: "));
        assert!(msg(r#"{"frames_per_trigger": 3, "prefix": "s", "colour": 1}"#).contains("colour"));
        assert!(msg(r#"{"prefix": "s"}"#).contains("frames_per_trigger"));
        assert!(msg("not json").contains("expected"));
    }

    #[test]
    fn the_openapi_document_describes_every_route() {
        let (_, doc) = api().split_for_parts();
        let v = serde_json::to_value(with_bearer(doc)).unwrap();
        for p in ["/acquisition", "/arm", "/trigger", "/disarm", "/cancel"] {
            assert!(v["paths"][p].is_object(), "{p}");
        }
        assert_eq!(v["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
        assert!(v["paths"]["/arm"]["post"]["security"][0]["bearer"].is_array(), "a change needs the token");
        assert!(v["paths"]["/acquisition"]["get"]["security"].is_null(), "a read does not (without --protect-reads)");
        let arm = &v["components"]["schemas"]["ArmRequest"];
        assert_eq!(arm["properties"]["frames_per_trigger"]["minimum"], 1);
        assert!(arm["required"].as_array().unwrap().contains(&"prefix".into()));
    }
}
