//! What an emulator run reports: the manifest of what each module sent, the sending
//! counters, and the retransmission counts.

use std::time::Duration;

use rdaq_net::send::SendStats;

use crate::faults::FaultStats;

/// One line of the manifest: what a module sent for a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManifestEntry {
    pub frame: u64,
    pub module: u16,
    /// xxh3-64 of the raw module frame (little-endian 16-bit words).
    pub xxh3: u64,
}

/// The manifest as CSV: frame, module, xxh3 of the raw module frame (hex).
pub fn manifest_csv(m: &[ManifestEntry]) -> String {
    let mut s = String::from("frame,module,xxh3\n");
    for e in m {
        s.push_str(&format!("{},{},{:016x}\n", e.frame, e.module, e.xxh3));
    }
    s
}

#[derive(Debug, Default)]
pub struct EmulatorReport {
    pub manifest: Vec<ManifestEntry>,
    pub sent: SendStats,
    pub gso: bool,
    pub elapsed: Duration,
    /// Frames that started later than their scheduled time by more than one frame period.
    pub late_frames: u64,
    /// Frames a module started only after waiting for a slower module (the common trigger).
    pub held_back: u64,
    /// Sends refused (nothing listened at the destination port) while frames were being sent;
    /// `sent.refused` also counts the tail probes and answers after the last frame, which a
    /// receiver that has all its frames and closed its ports refuses harmlessly.
    pub refused_in_frames: u64,
    /// RoCEv2 frames the interface's queue refused (`ENOBUFS`): lost like frames on a wire,
    /// and sent again by the RC go-back.
    pub roce_refused: u64,
    pub retransmit: RetransmitStats,
    pub faults: FaultStats,
}

/// What the controllers did for retransmission.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, derive_more::AddAssign)]
pub struct RetransmitStats {
    /// Requests received, and the malformed ones or ones for another module among them.
    pub nacks: u64,
    pub bad_nacks: u64,
    /// Datagrams asked for, and sent again.
    pub requested: u64,
    pub resent: u64,
    /// Datagrams asked for that were no longer (or never) in the history.
    pub history_misses: u64,
    /// Last datagrams sent again after the end so that receivers can see a lost tail.
    pub probes: u64,
}
