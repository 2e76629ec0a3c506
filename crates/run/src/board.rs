//! What an acquisition shows while it runs, for the web dashboard (`rdaq_control::dashboard`):
//! the receiver's counters (sampled a few times a second), the processing graph's stages and
//! counts, the latency histograms, the events worth an operator's eye, and a glance at the
//! latest image with its spots. Filled by the consumer or the graph and by a sampler; read by
//! the dashboard. Nothing here is on the per-packet path; per frame it costs a few relaxed
//! atomic adds and one uncontended lock (the latency histogram).

use crate::budget::ThreadBudget;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdaq_detector::Geometry;
use rdaq_process::pipeline::StageStats;
use rdaq_proto::events::{Event, EventLog};
use rdaq_proto::events::ranges;
use rdaq_receiver::{Counters, FrameReady, FrameStatus};

use crate::latency::Latency;

/// How often a new glance is taken: often enough to look live, rarely enough that copying a
/// whole frame costs nothing measurable.
pub const GLANCE_EVERY: Duration = Duration::from_millis(500);

/// Events kept for the dashboard; older ones are counted as dropped.
const EVENTS_KEPT: usize = 4096;

/// The latest image shown: values per pixel (NaN: no value), row-major, and its spots.
#[derive(Clone, Debug)]
pub struct Glance {
    pub frame: u64,
    pub width: usize,
    pub height: usize,
    pub values: Vec<f32>,
    /// Spot centres (x fast, y slow) in pixels.
    pub spots: Vec<(f32, f32)>,
    /// What the values are: "keV", "raw ADC".
    pub unit: &'static str,
}

impl Glance {
    /// A glance at an assembled raw frame: the ADC value of each pixel (gain bits cleared),
    /// gaps without a value.
    pub fn raw(g: &Geometry, frame: u64, words: &[u16]) -> Glance {
        let values = words.iter().zip(g.gap_mask()).map(|(&w, m)| if m & rdaq_detector::geometry::MASK_GAP != 0 { f32::NAN } else { (w & 0x3fff) as f32 }).collect();
        Glance { frame, width: g.width(), height: g.height(), values, spots: Vec::new(), unit: "raw ADC" }
    }
}

/// The processing graph's running counts (the summary's processing report at the end).
#[derive(Debug, Default)]
pub struct ProcessCounts {
    pub dark_frames: AtomicU64,
    pub signal_frames: AtomicU64,
    pub hits: AtomicU64,
    pub vetoed: AtomicU64,
    pub spots_found: AtomicU64,
    pub pedestal_updates: AtomicU64,
    pub dark_incomplete: AtomicU64,
    /// GPU errors (the GPU backend then processes on the CPU).
    pub device_errors: AtomicU64,
}

impl ProcessCounts {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// One acquisition's live view.
#[derive(Debug)]
pub struct Board {
    start: Instant,
    /// Per-frame latency, step by step (the summary's at the end).
    pub latency: Mutex<Latency>,
    pub process: ProcessCounts,
    /// Whether the processing graph runs (its counts mean something).
    processing: std::sync::atomic::AtomicBool,
    stages: Mutex<Vec<Arc<StageStats>>>,
    receiver: Mutex<Option<Counters>>,
    events: Mutex<EventLog>,
    glance: Mutex<Option<Arc<Glance>>>,
    next_glance_ns: AtomicU64,
    state: Mutex<String>,
    /// Frames the consumer finished (dark, vetoed, written or not saved), and those of them
    /// that reached the writer: live counts for a controller waiting on a trigger.
    frames_done: AtomicU64,
    frames_to_writer: AtomicU64,
    /// Times the consumer's source (processing graph or raw chain) waited for a free frame
    /// buffer: back-pressure from its workers and the writer.
    buffer_waits: AtomicU64,
    /// How the acquisition shares the cores.
    threads: Mutex<Option<ThreadBudget>>,
    /// Whether the consumer takes frames (its buffers made, its threads started) or has
    /// ended: a detector started before that fills the receiver's ring meanwhile.
    consuming: (Mutex<Option<Instant>>, Condvar),
}

impl Default for Board {
    fn default() -> Self {
        Board {
            start: Instant::now(),
            latency: Mutex::default(),
            process: ProcessCounts::default(),
            processing: Default::default(),
            stages: Mutex::default(),
            receiver: Mutex::default(),
            events: Mutex::new(EventLog::new(EVENTS_KEPT)),
            glance: Mutex::default(),
            next_glance_ns: AtomicU64::new(0),
            state: Mutex::new("starting".into()),
            frames_done: AtomicU64::new(0),
            frames_to_writer: AtomicU64::new(0),
            buffer_waits: AtomicU64::new(0),
            threads: Mutex::default(),
            consuming: Default::default(),
        }
    }
}

/// A panicked holder leaves counts still worth showing: a poisoned lock is taken as it is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Board {
    /// Seconds since the board was made (the dashboard's time axis).
    pub fn uptime_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    pub fn set_state(&self, s: &str) {
        *lock(&self.state) = s.to_string();
    }

    pub fn state(&self) -> String {
        lock(&self.state).clone()
    }

    /// The processing graph's stages, once it runs.
    pub fn set_stages(&self, stages: Vec<Arc<StageStats>>) {
        self.processing.store(true, Ordering::Relaxed);
        *lock(&self.stages) = stages;
    }

    pub fn stages(&self) -> Vec<Arc<StageStats>> {
        lock(&self.stages).clone()
    }

    pub fn processing(&self) -> bool {
        self.processing.load(Ordering::Relaxed)
    }

    /// The receiver's counters as last sampled.
    pub fn sample(&self, c: Counters) {
        *lock(&self.receiver) = Some(c);
    }

    pub fn receiver(&self) -> Option<Counters> {
        *lock(&self.receiver)
    }

    pub fn push_event(&self, e: Event) {
        lock(&self.events).push(e);
    }

    /// Events numbered `since` on (at most `limit`), as the event log pages them.
    pub fn events_since(&self, since: u64, limit: usize) -> rdaq_proto::events::EventPage {
        lock(&self.events).since(since, limit)
    }

    /// Whether a new glance is due; true for one caller per [`GLANCE_EVERY`].
    pub fn glance_due(&self) -> bool {
        self.due(0)
    }

    /// Whether a glance at a frame that is not a hit is due: only when no hit has been
    /// shown for three periods (operators want to see spots; a run without hits still
    /// shows its frames).
    pub fn glance_due_without_hit(&self) -> bool {
        self.due(2 * GLANCE_EVERY.as_nanos() as u64)
    }

    /// Takes the next glance if `late` nanoseconds past its time.
    fn due(&self, late: u64) -> bool {
        let now = self.start.elapsed().as_nanos() as u64;
        let next = self.next_glance_ns.load(Ordering::Relaxed);
        now >= next + late && self.next_glance_ns.compare_exchange(next, now + GLANCE_EVERY.as_nanos() as u64, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    pub fn show(&self, g: Glance) {
        *lock(&self.glance) = Some(Arc::new(g));
    }

    pub fn glance(&self) -> Option<Arc<Glance>> {
        lock(&self.glance).clone()
    }

    /// Records one frame's latency steps.
    pub fn record(&self, t: &crate::latency::FrameTimes, written: Option<Instant>) {
        lock(&self.latency).record(t, written);
        self.frames_done.fetch_add(1, Ordering::Relaxed);
        if written.is_some() {
            self.frames_to_writer.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Frames the consumer finished so far, and those that reached the writer (the final
    /// written count, after write errors, is the summary's).
    pub fn frames_done(&self) -> (u64, u64) {
        (self.frames_done.load(Ordering::Relaxed), self.frames_to_writer.load(Ordering::Relaxed))
    }

    pub fn waited_for_buffer(&self) {
        self.buffer_waits.fetch_add(1, Ordering::Relaxed);
    }

    pub fn buffer_waits(&self) -> u64 {
        self.buffer_waits.load(Ordering::Relaxed)
    }

    /// The consumer takes frames from now on, or has ended (it will take none).
    pub fn set_consuming(&self) {
        lock(&self.consuming.0).get_or_insert_with(Instant::now);
        self.consuming.1.notify_all();
    }

    /// Waits until the consumer takes frames or has ended ([`Board::set_consuming`]).
    pub fn wait_consuming(&self) {
        let mut up = lock(&self.consuming.0);
        while up.is_none() {
            up = self.consuming.1.wait(up).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// When the consumer began to take frames (after making its buffers and threads).
    pub fn consuming_since(&self) -> Option<Instant> {
        *lock(&self.consuming.0)
    }

    pub fn set_threads(&self, t: ThreadBudget) {
        *lock(&self.threads) = Some(t);
    }

    /// How the acquisition shares the cores, once it has started.
    pub fn threads(&self) -> Option<ThreadBudget> {
        lock(&self.threads).clone()
    }

    pub fn latency(&self) -> Latency {
        lock(&self.latency).clone()
    }
}

/// The event of a frame `receiver` finished with cells missing (kept or discarded).
pub fn incomplete_event(receiver: &str, f: &FrameReady) -> Event {
    Event::FrameIncomplete {
        receiver: receiver.to_string(),
        frame: f.frame(),
        received: f.received_cells(),
        total: f.total_cells(),
        missing: ranges(f.missing()),
        kept: f.status() == FrameStatus::Incomplete,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_glance_per_period_and_raw_glances_mark_gaps() {
        let b = Board::default();
        assert!(b.glance_due());
        assert!(!b.glance_due(), "the second caller in the same period gets none");
        assert!(!b.glance_due_without_hit());
        let g = Geometry::new(2, 2, 2, 4).unwrap();
        let words = vec![0xc005u16; g.height() * g.width()];
        let gl = Glance::raw(&g, 7, &words);
        let gaps = g.gap_mask().iter().filter(|&&m| m != 0).count();
        assert_eq!(gl.values.iter().filter(|v| v.is_nan()).count(), gaps);
        assert!(gl.values.iter().filter(|v| !v.is_nan()).all(|&v| v == 5.0), "gain bits cleared");
        b.show(gl);
        assert_eq!(b.glance().unwrap().frame, 7);
    }
}
