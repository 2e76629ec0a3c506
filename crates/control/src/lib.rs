//! The control plane's I/O, beside the sans-I/O [`rdaq_manager`] (as quinn beside
//! quinn-proto): the daemons' HTTP/JSON control APIs and the system manager's runtime that
//! drives them.
//!
//! - [`receiver`]: the data receiver daemon (`rdaq receive --serve`): buffers defined by
//!   the manager, acquisitions to NXmx files, events, counters, `/metrics`.
//! - [`detector`]: the detector daemon (`rdaq emulate --serve`): emulated modules that take
//!   their DTPs from the manager.
//! - [`manager`]: the system manager's runtime over both (`rdaq manage`), beside its
//!   sans-I/O core [`rdaq_manager`]: telegrams, buffers, DTPs, start, heartbeats,
//!   re-planning, the report.
//! - [`service`]: the acquisition service over either (`--data-root DIR --serve ADDR`):
//!   datasets armed, triggered and followed by a control system; its state machine, sans
//!   I/O, is [`rdaq_manager::service`].
//! - [`dashboard`]: the live web page every server above serves, and `rdaq run --serve`'s
//!   ([`run`]).
//! - [`http`]: serving the APIs (routes every daemon has, until Ctrl-C).
//! - [`answer`]: the answers they give (errors, event pages).
//! - [`metrics`]: `/metrics` through `prometheus-client`.
//! - [`auth`]: the bearer token mutating calls (and optionally reads) need.
//! - [`site`]: what keeps other sites' pages away (Host, Origin, content type).

pub mod answer;
pub mod auth;
pub mod dashboard;
pub mod detector;
pub mod http;
pub mod manager;
pub mod metrics;
pub mod openapi;
pub mod receiver;
pub mod run;
pub mod service;
pub mod site;
