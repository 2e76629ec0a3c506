//! The event channel: what modules and receivers report asynchronously, and a bounded log
//! that keeps the newest events, numbers them, and counts what it had to drop.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A module sent its last datagram of a frame (carrying `imm`).
    EndOfFrame { module: u16, frame: u64, imm: u32 },
    /// A module finished its transfer.
    EndOfTransfer { module: u16, frames: u64, datagrams: u64 },
    /// A module could not send as fast as asked (frames started late).
    SourceOverflow { module: u16, late_frames: u64 },
    /// A receiver completed a frame.
    FrameComplete { receiver: String, frame: u64, imm: Option<u32> },
    /// A receiver finished a frame with cells missing: `missing` lists half-open cell
    /// ranges of the frame's packet grid; `kept` says whether it was handed on (policy keep).
    FrameIncomplete { receiver: String, frame: u64, received: u32, total: u32, missing: Vec<(u32, u32)>, kept: bool },
    /// A receiver's loss window declared sequence numbers `start..end` (wrapping) of a
    /// module's data channel missing; retransmission may still recover them.
    PacketLoss { receiver: String, module: u16, start: u32, end: u32 },
    /// The manager changed the data transfer processes from `from_frame` on.
    Replanned { from_frame: u64, receivers: Vec<String>, reason: String },
    Error { source: String, message: String },
    /// An operator asked for the acquisition to stop (through the control API, from `by`).
    StopRequested { by: String },
}

/// Half-open ranges of consecutive cells.
pub fn ranges(cells: &[u32]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &c in cells {
        match out.last_mut() {
            Some((_, end)) if *end == c => *end = c + 1,
            _ => out.push((c, c + 1)),
        }
    }
    out
}

/// Keeps the newest `capacity` events; event `i` is the `i`-th ever pushed.
#[derive(Debug)]
pub struct EventLog {
    capacity: usize,
    first: u64,
    events: VecDeque<Event>,
    /// Events pushed out by newer ones before anyone could read them.
    pub dropped: u64,
}

/// A page of events.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventPage {
    /// Number of the first event in `events`.
    pub first: u64,
    /// Number to ask for next.
    pub next: u64,
    /// Events dropped from the log so far.
    pub dropped: u64,
    pub events: Vec<Event>,
}

impl EventLog {
    pub fn new(capacity: usize) -> Self {
        EventLog { capacity: capacity.max(1), first: 0, events: VecDeque::new(), dropped: 0 }
    }

    pub fn push(&mut self, e: Event) {
        if self.events.len() == self.capacity {
            self.events.pop_front();
            self.first += 1;
            self.dropped += 1;
        }
        self.events.push_back(e);
    }

    /// The number the next event will get.
    pub fn next(&self) -> u64 {
        self.first + self.events.len() as u64
    }

    /// Events numbered `since` and after (from the oldest kept one if `since` was dropped),
    /// at most `limit`.
    pub fn since(&self, since: u64, limit: usize) -> EventPage {
        let start = since.max(self.first);
        let skip = (start - self.first) as usize;
        let events: Vec<Event> = self.events.iter().skip(skip).take(limit).cloned().collect();
        EventPage { first: start, next: start + events.len() as u64, dropped: self.dropped, events }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_numbered_and_counted() {
        let mut log = EventLog::new(3);
        for f in 0..5 {
            log.push(Event::EndOfFrame { module: 0, frame: f, imm: f as u32 });
        }
        assert_eq!(log.dropped, 2);
        let p = log.since(0, 10);
        assert_eq!((p.first, p.next, p.events.len()), (2, 5, 3));
        let p = log.since(4, 10);
        assert_eq!(p.events, vec![Event::EndOfFrame { module: 0, frame: 4, imm: 4 }]);
        assert_eq!(log.since(5, 10).events.len(), 0);
        assert_eq!(ranges(&[1, 2, 3, 7, 9, 10]), vec![(1, 4), (7, 8), (9, 11)]);
        let j = serde_json::to_string(&p.events[0]).unwrap();
        assert!(j.starts_with(r#"{"type":"end_of_frame""#), "{j}");
    }
}
