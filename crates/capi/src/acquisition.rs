//! The acquisitions a C program runs (`rdaq_acquisition_*`): the one acquisition of
//! `rdaq run` or `rdaq receive` ([`rdaq_run::embedded`]), by handle, with the processed
//! frames the caller holds, by id. As with receivers, a wrong or stale number is found here
//! and refused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;
use rdaq_run::config::Config;
use rdaq_run::embedded::{self, Embedded};
use rdaq_run::graph::deliver::{Pixels, Processed};
use rdaq_run::remote::{Naming, Source};
use rdaq_run::summary::Summary;

use crate::error::{Failure, RdaqStatus};
use crate::registry::lock;
use crate::RdaqImage;

/// One running (or finished) acquisition and the frames the caller holds.
pub struct Run {
    frames: crossbeam_channel::Receiver<Processed>,
    control: Arc<rdaq_emulator::Control>,
    /// The acquisition's thread, until it is joined.
    thread: Mutex<Option<JoinHandle<anyhow::Result<Summary>>>>,
    /// What it came to, once joined: its summary (JSON) or why it failed.
    outcome: OnceLock<Result<String, String>>,
    held: Mutex<HashMap<u64, Processed>>,
    next_id: AtomicU64,
    pub ports: Vec<u16>,
    width: u32,
    height: u32,
}

static RUNS: Mutex<Option<HashMap<u64, Arc<Run>>>> = Mutex::new(None);
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

fn config_error(e: anyhow::Error) -> Failure {
    Failure::new(RdaqStatus::Config, format!("{e:#}"))
}

/// Starts the acquisition `config` (TOML sections of rdaq.example.toml) describes, of
/// `source` (TOML fields of what a detector outside sends; none: the emulated detector);
/// returns its handle.
pub fn open(config: &str, source: Option<&str>) -> Result<u64, Failure> {
    let base = if source.is_some() { Config::remote() } else { Config::default() };
    let cfg = Config::parse_over(base, config, "config").map_err(config_error)?;
    cfg.check().map_err(config_error)?;
    let source = source
        .map(|s| toml::from_str::<Source>(s).map_err(|e| Failure::new(RdaqStatus::Config, format!("source: {}", e.to_string().trim().replace('\n', " ")))))
        .transpose()?
        .map(|s| Source { naming: Naming::Fields("source"), ..s });
    let Embedded { frames, run, control, geometry, ports } = embedded::start(cfg, source).map_err(|e| Failure::new(RdaqStatus::Start, format!("{e:#}")))?;
    let run = Run {
        frames,
        control,
        thread: Mutex::new(Some(run)),
        outcome: OnceLock::new(),
        held: Mutex::default(),
        next_id: AtomicU64::new(1),
        ports,
        width: geometry.width() as u32,
        height: geometry.height() as u32,
    };
    let h = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
    lock(&RUNS).get_or_insert_with(HashMap::new).insert(h, Arc::new(run));
    Ok(h)
}

fn unknown(h: u64) -> Failure {
    Failure::new(RdaqStatus::BadHandle, format!("handle {h}: no such acquisition (never opened, or closed)"))
}

pub fn run(h: u64) -> Result<Arc<Run>, Failure> {
    lock(&RUNS).as_ref().and_then(|m| m.get(&h).cloned()).ok_or_else(|| unknown(h))
}

/// Forgets the acquisition: it is stopped, the frames held go back, the frames still coming
/// are let go, and its thread is waited for.
pub fn close(h: u64) -> Result<(), Failure> {
    let r = lock(&RUNS).as_mut().and_then(|m| m.remove(&h)).ok_or_else(|| unknown(h))?;
    r.control.stop.store(true, Ordering::Relaxed);
    lock(&r.held).clear();
    while r.frames.recv().is_ok() {}
    r.join();
    Ok(())
}

impl Run {
    /// The next processed frame within `timeout_ms` (negative: until the acquisition
    /// ends), now held by the caller; at the end, its thread is joined.
    pub fn next(&self, timeout_ms: i64) -> Result<RdaqImage, Failure> {
        let got = if timeout_ms < 0 {
            self.frames.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            self.frames.recv_deadline(Instant::now() + Duration::from_millis(timeout_ms as u64))
        };
        let p = match got {
            Ok(p) => p,
            Err(RecvTimeoutError::Timeout) => return Err(Failure::new(RdaqStatus::Timeout, format!("no frame within {timeout_ms} ms"))),
            Err(RecvTimeoutError::Disconnected) => {
                self.join();
                return match self.summary() {
                    Err(f) => Err(f),
                    Ok(_) => Err(Failure::new(RdaqStatus::Finished, "the acquisition has finished: no more frames")),
                };
            }
        };
        let (pixel, data, len) = match p.pixels() {
            Pixels::I16(v) => (0, v.as_ptr() as *const u8, std::mem::size_of_val(v)),
            Pixels::I32(v) => (1, v.as_ptr() as *const u8, std::mem::size_of_val(v)),
            Pixels::F32(v) => (2, v.as_ptr() as *const u8, std::mem::size_of_val(v)),
            // a counting detector's counts: 3, 4, 5 for 1, 2, 4 bytes
            Pixels::Counts { bytes, size } => (2 + size.trailing_zeros() as i32 + 1, bytes.as_ptr(), bytes.len()),
        };
        let (spots, hit) = p.spots();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let image = RdaqImage { id, number: p.frame(), pixel, data, len, width: self.width, height: self.height, hit: hit as i32, spots: spots.len() as u32 };
        // the buffer behind `data` stays where it is while `p` is held (it moves by box)
        lock(&self.held).insert(id, p);
        Ok(image)
    }

    /// Gives frame `id`'s buffer back to the processing graph.
    pub fn release(&self, id: u64) -> Result<(), Failure> {
        lock(&self.held).remove(&id).map(drop).ok_or_else(|| Failure::new(RdaqStatus::BadFrame, format!("frame id {id}: not held (never handed out, or released already)")))
    }

    pub fn stop(&self) {
        self.control.stop.store(true, Ordering::Relaxed);
    }

    /// Waits for the acquisition's thread (once) and keeps what it came to.
    fn join(&self) {
        if let Some(t) = lock(&self.thread).take() {
            let outcome = match t.join() {
                Ok(Ok(s)) => Ok(serde_json::to_string(&s).expect("a summary serializes")),
                Ok(Err(e)) => Err(format!("{e:#}")),
                Err(_) => Err("the acquisition's thread panicked".into()),
            };
            let _ = self.outcome.set(outcome);
        }
    }

    /// The summary (JSON, as `--summary-json` writes it) of an acquisition that ended.
    pub fn summary(&self) -> Result<String, Failure> {
        match self.outcome.get() {
            None => Err(Failure::new(RdaqStatus::Running, "the acquisition has not finished: read its frames until RDAQ_STATUS_FINISHED")),
            Some(Ok(s)) => Ok(s.clone()),
            Some(Err(e)) => Err(Failure::new(RdaqStatus::Failed, format!("the acquisition failed: {e}"))),
        }
    }
}
