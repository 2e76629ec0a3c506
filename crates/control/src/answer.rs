//! The answers every control API gives: one-line JSON errors with their status, pages of
//! an event log, and the lock that serves shared state even after a panic. A leaf of the
//! crate: the token check, the dashboard and the servers all answer with it.

use std::sync::{Mutex, MutexGuard};

use axum::http::StatusCode;
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

