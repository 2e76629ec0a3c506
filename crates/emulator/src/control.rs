//! The shared state of a running emulator: progress, the stop flag, DTP updates (which
//! frame each set applies from) and the event log.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rdaq_detector::MODULE_BYTES;
use rdaq_proto::events::{Event, EventLog};
use rdaq_proto::telegram::ModuleDtp;

use crate::config::{check_dtps, EmulatorError};

/// Events kept for readers of a running emulator.
const EVENT_LOG: usize = 1 << 16;

/// Shared state of a running emulator: progress, stop, DTP updates and events.
pub struct Control {
    /// Module frames fully sent.
    pub module_frames: AtomicU64,
    pub stop: AtomicBool,
    /// DTP sets with the frame they apply from, in increasing order of that frame.
    pub(crate) plans: RwLock<Vec<(u64, Arc<Vec<ModuleDtp>>)>>,
    /// One past the highest frame any module has started (taken under the plans' lock, so
    /// an update can never apply to a frame already on its way).
    frontier: AtomicU64,
    pub events: Mutex<EventLog>,
    /// When each recent frame started going out.
    pub sent: crate::clock::SendClock,
}

impl Default for Control {
    fn default() -> Self {
        Control {
            module_frames: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            plans: RwLock::new(Vec::new()),
            frontier: AtomicU64::new(0),
            events: Mutex::new(EventLog::new(EVENT_LOG)),
            sent: crate::clock::SendClock::default(),
        }
    }
}

impl Control {
    /// Makes `dtps` apply to frames `from_frame` and later (the frames before keep the DTPs
    /// they had). Fails if `from_frame` is not after the newest update's, or if a module has
    /// already started that frame ([`Control::frontier`] says the first frame still free).
    pub fn update(&self, from_frame: u64, dtps: Vec<ModuleDtp>) -> Result<(), EmulatorError> {
        let module_bytes = dtps.first().map_or(MODULE_BYTES as u64, |d| d.module_bytes);
        check_dtps(dtps.len() as u16, module_bytes, &dtps)?;
        let mut plans = self.plans.write().unwrap_or_else(|e| e.into_inner());
        if plans.last().is_some_and(|(f, _)| *f >= from_frame) {
            return Err(EmulatorError::UpdateOrder { from_frame });
        }
        let frontier = self.frontier.load(Ordering::Acquire);
        if from_frame < frontier {
            return Err(EmulatorError::UpdateTooLate { from_frame, frontier });
        }
        plans.push((from_frame, Arc::new(dtps)));
        Ok(())
    }

    /// The first frame no module has started yet.
    pub fn frontier(&self) -> u64 {
        self.frontier.load(Ordering::Acquire)
    }

    /// The DTPs for `frame`, marking it started.
    pub(crate) fn start_frame(&self, frame: u64) -> Option<Arc<Vec<ModuleDtp>>> {
        let plans = self.plans.read().unwrap_or_else(|e| e.into_inner());
        self.frontier.fetch_max(frame + 1, Ordering::AcqRel);
        plans.iter().rev().find(|(from, _)| *from <= frame).map(|(_, d)| d.clone())
    }

    pub(crate) fn event(&self, e: Event) {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).push(e);
    }

}
