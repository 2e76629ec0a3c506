//! The answers every control API gives: one-line JSON errors with their status, pages of
//! an event log, and the lock that serves shared state even after a panic. A leaf of the
//! crate: the token check, the dashboard and the servers all answer with it.

use std::sync::{Mutex, MutexGuard};

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rdaq_proto::events::{EventLog, EventPage};
use serde::Deserialize;

/// An error answer: status and a one-line message, as `{"error": "..."}`.
pub struct ApiError(pub StatusCode, pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

/// Middleware: an error answer that is not JSON (axum's own, for a body it could not take
/// (400, 413, 415, 422), an unknown path (404) or method (405)) becomes `{"error": "..."}`
/// with the same status and headers, as every other error.
pub async fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    let json = resp.headers().get(header::CONTENT_TYPE).is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
    if json || !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    // axum's rejections are one line; more is not a message
    let text = axum::body::to_bytes(body, 16 * 1024).await.map(|b| String::from_utf8_lossy(&b).trim().to_string()).unwrap_or_default();
    let msg = if text.is_empty() { status.canonical_reason().unwrap_or("error").to_ascii_lowercase() } else { text };
    let mut answer = ApiError(status, msg).into_response();
    for (k, v) in parts.headers.iter().filter(|(k, _)| *k != header::CONTENT_TYPE && *k != header::CONTENT_LENGTH) {
        answer.headers_mut().insert(k, v.clone());
    }
    answer
}

/// The most bytes a call that takes no parameters reads of its body.
const NO_PARAMETERS_MAX: usize = 4096;

/// The body of a call that takes no parameters (`POST /stop`, `/disarm`, ...): nothing, or
/// the JSON object `{}`. Malformed JSON, a field or another value is refused (400), a body
/// over 4 KiB too (413), as a body that does not parse is everywhere else.
pub struct NoParameters;

impl<S: Send + Sync> axum::extract::FromRequest<S> for NoParameters {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, _: &S) -> Result<Self, ApiError> {
        let too_large = |_| ApiError(StatusCode::PAYLOAD_TOO_LARGE, format!("body: more than {NO_PARAMETERS_MAX} bytes for a call that takes no parameters"));
        let bytes = axum::body::to_bytes(req.into_body(), NO_PARAMETERS_MAX).await.map_err(too_large)?;
        if !bytes.iter().all(u8::is_ascii_whitespace) {
            let refuse = |why: String| bad(format!("body: this call takes no parameters, only {{}} or nothing ({why})"));
            match serde_json::from_slice::<serde_json::Value>(&bytes).map_err(|e| refuse(e.to_string()))? {
                serde_json::Value::Object(fields) if fields.is_empty() => {}
                serde_json::Value::Object(fields) => return Err(refuse(format!("unknown field {:?}", fields.keys().next().expect("not empty")))),
                _ => return Err(refuse("not an object".into())),
            }
        }
        Ok(NoParameters)
    }
}

pub fn bad(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into())
}

pub fn conflict(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::CONFLICT, msg.into())
}

pub fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}"))
}

#[derive(Deserialize)]
pub struct Since {
    #[serde(default)]
    pub since: u64,
    #[serde(default = "page")]
    pub limit: usize,
}

fn page() -> usize {
    10_000
}

/// Locks shared state; a panicked holder leaves counters and logs that are still worth
/// serving, so a poisoned lock is taken as it is.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn events_page(log: &Mutex<EventLog>, q: &Since) -> EventPage {
    lock(log).since(q.since, q.limit.min(100_000))
}

