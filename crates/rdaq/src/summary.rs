//! The end-of-acquisition summary: printed for people, written as JSON for tools and tests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use rdaq_emulator::EmulatorReport;
use rdaq_receiver::Counters;
use serde::Serialize;

use crate::consume::ConsumeStats;

#[derive(Debug, Serialize)]
pub struct Summary {
    pub frames_expected: Option<u64>,
    pub frames_complete: u64,
    pub frames_incomplete: u64,
    pub frames_discarded: u64,
    pub frames_written: u64,
    pub datagrams_sent: Option<u64>,
    pub sends_refused: Option<u64>,
    pub datagrams_received: u64,
    pub datagrams_placed: u64,
    pub landed_in_place: u64,
    pub datagrams_dropped: u64,
    pub dropped_by_reason: Vec<(String, u64)>,
    pub kernel_drops: u64,
    pub cells_missing: u64,
    /// Sequence numbers the loss windows declared missing.
    pub seq_missing: u64,
    pub nacks_sent: u64,
    pub datagrams_retransmitted_placed: u64,
    /// Retransmissions no longer needed when they came.
    pub datagrams_redundant: u64,
    pub frames_recovered: u64,
    pub frames_given_up: u64,
    /// Missing ranges not asked for (queue full, rate limit, send failed), and loss reports
    /// not delivered.
    pub nack_ranges_dropped: u64,
    pub loss_reports_dropped: u64,
    /// Requests the modules refused as malformed or for another module.
    pub bad_nacks: Option<u64>,
    /// Datagrams the modules sent again, and requests their history could not answer.
    pub datagrams_resent: Option<u64>,
    pub history_misses: Option<u64>,
    /// Faults the emulator injected: dropped, reordered, duplicated, corrupted, delayed.
    pub faults_injected: Option<[u64; 5]>,
    pub bytes_placed: u64,
    pub gb_per_s: f64,
    pub elapsed_s: f64,
    pub receiver_cpu_s: f64,
    pub compression_ratio: Option<f64>,
    pub output: Option<PathBuf>,
    pub manifest: Option<PathBuf>,
    /// The calibration at the end of the run (with the tracked pedestal).
    pub calibration: Option<PathBuf>,
    pub processing: Option<crate::online::ProcessReport>,
}

impl Summary {
    pub fn new(
        expected: u64,
        emu: &EmulatorReport,
        c: &Counters,
        consumed: &ConsumeStats,
        elapsed: Duration,
        output: Option<&Path>,
        manifest: Option<&Path>,
    ) -> Summary {
        let mut s = Summary::for_receiver(Some(expected), c, consumed, elapsed, output);
        s.datagrams_sent = Some(emu.sent.datagrams);
        s.sends_refused = Some(emu.sent.refused);
        s.datagrams_resent = Some(emu.retransmit.resent);
        s.history_misses = Some(emu.retransmit.history_misses);
        s.bad_nacks = Some(emu.retransmit.bad_nacks);
        let f = &emu.faults;
        s.faults_injected = Some([f.dropped, f.reordered, f.duplicated, f.corrupted, f.delayed]).filter(|v| v.iter().any(|&x| x > 0));
        // the data rate over the sending time, which is what the detector produced
        let secs = emu.elapsed.as_secs_f64().max(1e-9);
        s.gb_per_s = c.bytes_placed as f64 / 1e9 / secs;
        s.manifest = manifest.map(Path::to_owned);
        s
    }

    pub fn for_receiver(expected: Option<u64>, c: &Counters, consumed: &ConsumeStats, elapsed: Duration, output: Option<&Path>) -> Summary {
        let active = match (consumed.first, consumed.last) {
            (Some(a), Some(b)) if b > a => (b - a).as_secs_f64(),
            _ => elapsed.as_secs_f64(),
        };
        Summary {
            frames_expected: expected,
            frames_complete: c.frames_complete,
            frames_incomplete: c.frames_incomplete,
            frames_discarded: c.frames_discarded,
            frames_written: consumed.written,
            datagrams_sent: None,
            sends_refused: None,
            datagrams_received: c.datagrams,
            datagrams_placed: c.placed,
            landed_in_place: c.landed_in_place,
            datagrams_dropped: c.dropped_total(),
            dropped_by_reason: c.drops_by_reason().into_iter().map(|(n, v)| (n.to_string(), v)).collect(),
            kernel_drops: c.kernel_drops,
            cells_missing: c.cells_missing,
            seq_missing: c.seq_missing,
            nacks_sent: c.nacks_sent,
            datagrams_retransmitted_placed: c.placed_retransmitted,
            datagrams_redundant: c.redundant,
            frames_recovered: c.frames_recovered,
            frames_given_up: c.frames_given_up,
            nack_ranges_dropped: c.nack_ranges_dropped,
            loss_reports_dropped: c.loss_reports_dropped,
            bad_nacks: None,
            datagrams_resent: None,
            history_misses: None,
            faults_injected: None,
            bytes_placed: c.bytes_placed,
            gb_per_s: c.bytes_placed as f64 / 1e9 / active.max(1e-9),
            elapsed_s: elapsed.as_secs_f64(),
            receiver_cpu_s: c.cpu_time.as_secs_f64(),
            compression_ratio: (consumed.bytes_out > 0).then(|| consumed.bytes_in as f64 / consumed.bytes_out as f64),
            output: output.map(Path::to_owned),
            manifest: None,
            calibration: None,
            processing: None,
        }
    }

    /// True when any frame did not arrive complete.
    pub fn lost(&self) -> bool {
        let short = self.frames_expected.is_some_and(|e| self.frames_complete < e);
        short || self.frames_incomplete > 0 || self.frames_discarded > 0 || self.kernel_drops > 0
    }

    pub fn print(&self) {
        let sent = match (self.datagrams_sent, self.datagrams_resent) {
            (Some(s), Some(r)) if r > 0 => format!("sent {s} ({r} of them again: requested, or tail probes), "),
            (Some(s), _) => format!("sent {s}, "),
            _ => String::new(),
        };
        println!("---- rdaq summary ----");
        match self.frames_expected {
            Some(e) => println!("frames      : {} complete of {e} expected, {} incomplete (kept), {} discarded, {} written",
                self.frames_complete, self.frames_incomplete, self.frames_discarded, self.frames_written),
            None => println!("frames      : {} complete, {} incomplete (kept), {} discarded, {} written",
                self.frames_complete, self.frames_incomplete, self.frames_discarded, self.frames_written),
        }
        println!("datagrams   : {sent}received {}, placed {} ({} landed in place), dropped {}",
            self.datagrams_received, self.datagrams_placed, self.landed_in_place, self.datagrams_dropped);
        let reasons: Vec<String> = self.dropped_by_reason.iter().map(|(n, v)| format!("{n}={v}")).collect();
        println!("dropped     : {} (kernel socket drops {}, missing cells {}, refused sends {})",
            if reasons.is_empty() { "none".into() } else { reasons.join(" ") }, self.kernel_drops, self.cells_missing,
            self.sends_refused.unwrap_or(0));
        if let Some([d, r, u, c, l]) = self.faults_injected {
            println!("injected    : dropped {d}, reordered {r}, duplicated {u}, corrupted {c}, delayed {l}");
        }
        if self.seq_missing > 0 || self.nacks_sent > 0 || self.datagrams_retransmitted_placed > 0 {
            let resent = self.datagrams_resent.map_or(String::new(), |r| format!(", resent {r}"));
            let misses = self.history_misses.map_or(String::new(), |m| format!(", not in history {m}"));
            println!("recovery    : seq missing {}, requests {}{resent}{misses}, placed {} (redundant {}), frames recovered {}, given up {}",
                self.seq_missing, self.nacks_sent, self.datagrams_retransmitted_placed, self.datagrams_redundant,
                self.frames_recovered, self.frames_given_up);
        }
        let unasked = self.nack_ranges_dropped + self.loss_reports_dropped + self.bad_nacks.unwrap_or(0);
        if unasked > 0 {
            println!("not asked   : {} missing ranges not requested, {} loss reports dropped, {} requests refused by the modules",
                self.nack_ranges_dropped, self.loss_reports_dropped, self.bad_nacks.unwrap_or(0));
        }
        println!("throughput  : {:.3} GB placed, {:.3} GB/s, receiver CPU {:.2} s", self.bytes_placed as f64 / 1e9, self.gb_per_s, self.receiver_cpu_s);
        println!("elapsed     : {:.2} s", self.elapsed_s);
        if let Some(p) = &self.processing {
            println!("processing  : {} dark frames ({} incomplete, not tracked), {} pedestal updates; {} signal frames, {} hits, {} vetoed ({:.1}%), {} spots; {} frames written",
                p.dark_frames, p.dark_incomplete, p.pedestal_updates, p.signal_frames, p.hits, p.vetoed, 100.0 * p.vetoed_fraction, p.spots_found, p.frames_written);
            println!("  stage       workers  frames   ms/frame  busy s  waits  dropped  discarded  ring max");
            for s in &p.stages {
                println!("  {:<10} {:>7} {:>7} {:>10.3} {:>7.2} {:>6} {:>8} {:>10} {:>9}",
                    s.name, s.workers, s.frames, s.ms_per_frame, s.busy_s, s.blocked, s.dropped, s.discarded, s.high_water);
            }
            if p.pool_waits > 0 {
                println!("  the receiver side waited {} times for a free frame buffer (back-pressure)", p.pool_waits);
            }
        }
        if let Some(r) = self.compression_ratio {
            println!("compression : ratio {r:.2} (bitshuffle chunks of the written pixels)");
        }
        if let Some(o) = &self.output {
            println!("output      : {}", o.display());
        }
        if let Some(m) = &self.manifest {
            println!("manifest    : {}", m.display());
        }
        if let Some(c) = &self.calibration {
            println!("calibration : {} (with the tracked pedestal)", c.display());
        }
        println!("loss        : {}", if self.lost() { "YES" } else { "none" });
    }

    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(self)?).with_context(|| format!("cannot write {}", path.display()))
    }
}
