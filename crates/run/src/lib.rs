//! rdaq acquisitions as a library, below the command line: what `rdaq run`, `rdaq receive`
//! and the receiver daemon do with the frames a receiver hands on.
//!
//! - [`acquisition`]: the chain every entry point's frames take after the receiver
//!   (processing graph or raw consumer, then the sinks), and what came of it.
//! - [`assemble`]: a frame's slot as the detector image (JUNGFRAU's, or a described
//!   detector's decoded modules).
//! - [`budget`]: how an acquisition shares the host's cores among its threads.
//! - [`board`]: what an acquisition shows while it runs (the web dashboard's source).
//! - [`config`]: the TOML configuration of a run, checked before anything starts.
//! - [`plan`]: what the files say of an acquisition and its processing graph's settings;
//!   [`calibration`]: the calibration the processing starts with.
//! - [`consume`]: the plain consumer: frames to the NXmx file, slots back, counts;
//!   [`counts`]: spot finding and the veto on a counting detector's frames there.
//! - [`graph`]: the online processing graph (pedestal, conversion, spots and veto,
//!   compression, writing) over the receiver's ring.
//! - [`run`]: a single-receiver run with the emulated detector; [`topology`]: a run of a
//!   whole plan (several receivers) in one process.
//! - [`remote`]: the source of an acquisition of a detector outside this process: its
//!   packets, the receiver that takes them, the image and chain of its frames;
//!   [`receive`]: that acquisition from start to summary (`rdaq receive`, Python);
//!   [`embedded`]: either acquisition in a thread of a program (Python, librdaq), its
//!   processed frames handed out.
//! - [`drive`]: a PSI detector driven by its receiver, through PSI's Python client.
//! - [`pedestal`]: a pedestal run recorded into a calibration file.
//! - [`pairs`]: a descrambled detector's data frames paired with their reset frames.
//! - [`outputs`]: the output files and the rule that protects them (no silent overwrite).
//! - [`summary`]: the end-of-acquisition summary and the exit status it implies.
//! - [`stream`]: a run's series on the Stream V2 publisher; [`write`]: the file writer on
//!   the other end of a stream (`rdaq write`).
//!
//! ```no_run
//! use std::sync::Arc;
//! let cfg = rdaq_run::config::Config::default();
//! cfg.check()?;
//! let summary = rdaq_run::emulated::run(&cfg, Arc::default(), Arc::default(), &rdaq_run::progress_bar(None, "run"))?;
//! summary.print();
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod acquisition;
pub mod assemble;
pub mod board;
pub mod drive;
pub mod budget;
pub mod calibration;
pub mod config;
pub mod consume;
pub mod counts;
pub mod embedded;
pub mod emulated;
#[cfg(test)]
mod fault;
pub mod graph;
pub mod joined;
pub mod latency;
pub mod outputs;
pub mod pairs;
pub mod parts;
pub mod pedestal;
pub mod receive;
pub mod receiver_report;
pub mod plan;
mod reorder;
pub mod remote;
pub mod stream;
pub mod summary;
pub mod topology;
pub mod write;

use indicatif::{ProgressBar, ProgressStyle};

/// A bar when the frame count is known, a counter otherwise (drawn only on a terminal).
pub fn progress_bar(len: Option<u64>, what: &str) -> ProgressBar {
    let (bar, template) = match len {
        Some(n) => (ProgressBar::new(n), "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} frames ({per_sec})"),
        None => (ProgressBar::new_spinner(), "{prefix} [{elapsed_precise}] {spinner} {pos} frames ({per_sec})"),
    };
    bar.set_style(ProgressStyle::with_template(template).expect("valid template"));
    bar.set_prefix(what.to_string());
    bar
}
