//! The manager's decisions while an acquisition runs and after it, sans I/O: which
//! receivers count as dead from their heartbeats, and which frames count as received. The
//! control plane (`rdaq-control`) asks the daemons and feeds the answers in.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use rdaq_proto::telegram::ModuleDtp;
use serde::Serialize;

/// Missed heartbeats in a row, per receiver.
#[derive(Debug)]
pub struct Heartbeats {
    allowed: u32,
    missed: BTreeMap<usize, u32>,
}

impl Heartbeats {
    /// A receiver that misses `allowed` heartbeats in a row counts as dead.
    pub fn new(allowed: u32) -> Heartbeats {
        Heartbeats { allowed: allowed.max(1), missed: BTreeMap::new() }
    }

    /// Notes whether receiver `r` answered this heartbeat; true when this miss makes it dead
    /// (exactly once: on the `allowed`-th miss in a row).
    pub fn answer(&mut self, r: usize, answered: bool) -> bool {
        let n = self.missed.entry(r).or_insert(0);
        if answered {
            *n = 0;
            return false;
        }
        *n += 1;
        *n == self.allowed
    }
}

/// A span of frames routed by one set of DTPs: from the start, or from a re-plan.
#[derive(Clone, Debug, Serialize)]
pub struct Epoch {
    pub from_frame: u64,
    pub receivers: Vec<String>,
    pub reason: String,
    #[serde(skip)]
    pub dtps: Vec<ModuleDtp>,
}

/// What the receivers reported of an acquisition.
#[derive(Debug, Default)]
pub struct Reported {
    /// (receiver, frame) pairs reported complete.
    pub complete: HashSet<(String, u64)>,
    /// Frames some receiver finished incomplete.
    pub incomplete: BTreeSet<u64>,
}

/// Frames received, and frames lost, of `0..frames`. A frame is received when every
/// receiver its epoch sent it to is alive and reported it complete; it is lost when one of
/// them died, or when none reported it at all (a frame finished incomplete is counted as
/// incomplete, not lost).
pub fn tally(frames: u64, epochs: &[Epoch], dead: &BTreeSet<String>, r: &Reported) -> (u64, Vec<u64>) {
    let mut lost = Vec::new();
    let mut complete = 0;
    for f in 0..frames {
        let epoch = epochs.iter().rev().find(|e| e.from_frame <= f).expect("epoch 0 covers frame 0");
        let mut to: BTreeSet<&str> = BTreeSet::new();
        for d in &epoch.dtps {
            d.destinations(f, |i, _| {
                to.insert(d.routes[i].receiver.as_str());
            });
        }
        if to.iter().all(|name| !dead.contains(*name) && r.complete.contains(&(name.to_string(), f))) {
            complete += 1;
        } else if !r.incomplete.contains(&f) || to.iter().any(|n| dead.contains(*n)) {
            lost.push(f);
        }
    }
    (complete, lost)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Plan, Topology};
    use rdaq_proto::telegram::{BufferMap, LocalBufferInfo, TELEGRAM_VERSION};

    #[test]
    fn a_receiver_is_dead_at_its_nth_miss_in_a_row_once() {
        let mut h = Heartbeats::new(3);
        assert!(!h.answer(0, false) && !h.answer(0, false));
        assert!(!h.answer(0, true), "an answer resets the count");
        assert!(!h.answer(0, false) && !h.answer(0, false));
        assert!(h.answer(0, false), "the third miss in a row");
        assert!(!h.answer(0, false), "reported once");
        assert!(!h.answer(1, false), "per receiver");
    }

    /// Two receivers in temporal mode (even frames to dr0, odd to dr1), with their DTPs.
    fn temporal_epoch() -> Epoch {
        let text = "[detector]\nmodules = 1\n[transfer]\nmode = \"temporal\"\n\
            [[receivers]]\nname = \"dr0\"\ncontrol = \"10.0.0.1:7000\"\ndata = \"10.0.0.1\"\ndata_port = 50000\nmemory_mib = 64\n\
            [[receivers]]\nname = \"dr1\"\ncontrol = \"10.0.0.2:7000\"\ndata = \"10.0.0.2\"\ndata_port = 50000\nmemory_mib = 64\n";
        let t = Topology::from_toml(text).unwrap();
        let plan = Plan::new(&t).unwrap();
        let maps: Vec<BufferMap> = plan
            .buffer_requests(&t)
            .iter()
            .map(|(_, req)| BufferMap {
                version: TELEGRAM_VERSION,
                modules: req.modules.len() as u16,
                module_bytes: req.module_bytes,
                payload_bytes: req.payload_bytes,
                data_ports: (0..req.modules.len() as u16).map(|m| 50000 + m).collect(),
                buffers: (0..req.slots as u32).map(|i| LocalBufferInfo { id: i, key: 1, size: req.module_bytes * req.modules.len() as u64, va: 0 }).collect(),
                checksum: false,
                roce: Vec::new(),
            })
            .collect();
        let dtps = plan.module_dtps(&t, &maps).unwrap();
        Epoch { from_frame: 0, receivers: vec!["dr0".into(), "dr1".into()], reason: "initial plan".into(), dtps }
    }

    #[test]
    fn frames_count_as_received_only_from_live_receivers_that_reported_them() {
        let e = [temporal_epoch()];
        let mut r = Reported::default();
        for f in 0..4 {
            r.complete.insert((if f % 2 == 0 { "dr0" } else { "dr1" }.to_string(), f));
        }
        r.incomplete.insert(5);
        let none = BTreeSet::new();
        // frame 4 was never reported (lost); frame 5 was finished incomplete (not lost)
        assert_eq!(tally(6, &e, &none, &r), (4, vec![4]));
        // dr1 died: its frames are lost whatever it reported
        let dead: BTreeSet<String> = ["dr1".to_string()].into();
        assert_eq!(tally(6, &e, &dead, &r), (2, vec![1, 3, 4, 5]));
    }
}
