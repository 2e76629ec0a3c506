//! The end-of-acquisition summary: printed for people, written as JSON for tools and tests,
//! and the exit status (docs/exit-codes in the README): 0 when every frame expected arrived
//! complete and was saved, 1 when data was lost, incomplete or not saved, 2 for errors.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use rdaq_emulator::EmulatorReport;
use rdaq_receiver::ledger::describe_runs;
use rdaq_receiver::{Counters, FrameSet, Outcome};
use serde::Serialize;

use crate::consume::ConsumeStats;

/// A line of the printed summary, into its text.
macro_rules! say {
    ($o:expr, $($t:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($o, $($t)*);
    }};
}

/// Writes `text` to stdout. A closed stdout (`rdaq run | head -3`, `| true`) is not an error
/// of the acquisition: what is printed here is also in the summary JSON and the files, which
/// are written whatever happens to the terminal, so a closed pipe only ends the printing, as
/// it would end a Unix tool's output.
pub fn print_out(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => eprintln!("rdaq: cannot print the summary on stdout: {e}"),
    }
}

/// Runs of frame numbers listed at most, in the summary and its JSON.
const RUNS_SHOWN: usize = 20;

#[derive(Debug, Serialize)]
pub struct Summary {
    pub frames_expected: Option<u64>,
    /// The frames asked for, when the run was stopped before the detector sent them all
    /// (Ctrl-C, or a stop through the API): `frames_expected` is then what it sent.
    pub stopped_early_of: Option<u64>,
    pub frames_complete: u64,
    pub frames_incomplete: u64,
    pub frames_discarded: u64,
    /// Frames refused whole because the ring was full (the consumer was behind).
    pub frames_refused: u64,
    pub frames_refused_runs: Vec<(u64, u64)>,
    /// Frames of which nothing arrived; `frames_never_seen_runs` lists the ones whose numbers
    /// are known (the rest lie before the first or after the last frame seen).
    pub frames_never_seen: u64,
    pub frames_never_seen_runs: Vec<(u64, u64)>,
    /// Frames that came (finished or refused) beyond those expected: more frame numbers than
    /// the count, or numbers outside the expected ones (modules whose numbers disagree).
    pub frames_beyond_expected: u64,
    pub frames_written: u64,
    /// Frames received but not saved because writing had failed.
    pub frames_not_saved: u64,
    /// A descrambled detector's reset frames, subtracted from their data frames (not written).
    pub reset_frames: u64,
    /// Its data frames whose reset frame did not come: not written.
    pub data_without_reset: u64,
    /// Its reset frames whose data frame did not come: not used.
    pub unused_reset_frames: u64,
    /// Why writing stopped (the file and the operating system's reason).
    pub write_error: Option<String>,
    /// Why processing stopped: the worker of the graph that panicked (a bug), and what it
    /// said; the frames from then on are counted as not saved.
    #[serde(default)]
    pub stage_failure: Option<String>,
    pub datagrams_sent: Option<u64>,
    /// Sends of frames refused by the receiver's host (nothing listened at the port).
    pub sends_refused: Option<u64>,
    /// The receive engine that ran.
    pub engine: Option<String>,
    /// The host's transport settings as found at start (warnings name known-bad ones).
    pub tuning: Vec<Tuning>,
    /// Per-frame latency, step by step (the steps frames went through).
    pub latency: Vec<crate::latency::StepLatency>,
    pub datagrams_received: u64,
    pub datagrams_placed: u64,
    pub landed_in_place: u64,
    /// Placed datagrams copied once by placement, and those of them that were first moved
    /// out of a wrongly predicted cell (a second copy).
    pub copied: u64,
    pub evacuated: u64,
    pub datagrams_dropped: u64,
    pub dropped_by_reason: Vec<(String, u64)>,
    /// Valid packets of the detector that the receiver's settings have no place for (packet
    /// numbers past a frame or outside the rows read): the frames are not what it sent.
    pub packets_misfit: u64,
    pub kernel_drops: u64,
    /// The transport sends again whatever is dropped below placement (RoCEv2's RC go-back),
    /// so kernel drops are loss only where frames show it.
    pub kernel_drops_recovered: bool,
    pub cells_missing: u64,
    /// Sequence numbers the loss windows declared missing.
    pub seq_missing: u64,
    pub nacks_sent: u64,
    /// RoCEv2 ACKs sent, and ACKs or NAKs the receiver's interface refused (lost).
    pub acks_sent: u64,
    pub replies_refused: u64,
    /// RoCEv2 frames the sender's interface refused (lost; sent again by go-back).
    pub roce_sends_refused: Option<u64>,
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
    /// Frames the emulated modules started late, and frames a module waited for a slower one.
    pub late_frames: Option<u64>,
    pub held_back: Option<u64>,
    /// Faults the emulator injected: dropped, reordered, duplicated, corrupted, delayed.
    pub faults_injected: Option<[u64; 5]>,
    pub bytes_placed: u64,
    /// Placed bytes over the data window (first to last frame handed on).
    pub gb_per_s: f64,
    pub data_window_s: f64,
    /// Start to end of the command, waits included.
    pub elapsed_s: f64,
    /// Frames per second the consumer (writing, processing) took over the data window, and
    /// what it was.
    pub consumer_frames_per_s: f64,
    pub consumer: String,
    /// Times the raw consumer waited for a free frame buffer (the processing graph's are
    /// `processing.pool_waits`).
    pub consumer_waits: u64,
    pub receiver_cpu_s: f64,
    pub compression_ratio: Option<f64>,
    /// Data-file chunks the writer's I/O threads wrote out, and the times the writer waited
    /// for a place among them ([`rdaq_sink::deferred`]).
    pub chunks_handed_on: u64,
    pub io_waits: u64,
    pub output: Option<PathBuf>,
    pub manifest: Option<PathBuf>,
    /// The calibration at the end of the run (with the tracked pedestal).
    pub calibration: Option<PathBuf>,
    pub processing: Option<crate::graph::ProcessReport>,
    /// How the acquisition shared the cores among its threads.
    pub threads: Option<crate::budget::ThreadBudget>,
    /// What the Stream V2 publisher did.
    pub stream: Option<crate::stream::StreamReport>,
    /// What points to a wrong setting (interfaces, read rows, a silent port).
    pub hints: Vec<String>,
}

/// Frames expected of an acquisition: an exact range of numbers (the emulator's), or only a
/// count (a detector whose numbering starts anywhere).
#[derive(Clone, Debug)]
pub enum Expected {
    Range { first: u64, count: u64 },
    /// These frame numbers (a receiver of a temporal plan gets every n-th frame).
    Frames(FrameSet),
    Count(u64),
    Unknown,
}

/// One transport setting as the receiver found it at start.
#[derive(Clone, Debug, Serialize)]
pub struct Tuning {
    pub setting: String,
    pub value: String,
    pub warning: Option<String>,
}

impl Summary {
    /// Takes the receiver's engine and transport findings.
    pub fn with_receiver(mut self, rx: &rdaq_receiver::Receiver) -> Summary {
        self.engine = Some(rx.engine().to_string());
        self.kernel_drops_recovered = rx.recovers_drops_below();
        self.tuning = rx.tuning().iter().map(|f| Tuning { setting: f.setting.clone(), value: f.value.clone(), warning: f.warning.clone() }).collect();
        self
    }

    /// The summary of `rdaq run`: the emulator's report beside the receiver's.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        frames: u64,
        emu: &EmulatorReport,
        c: &Counters,
        outcome: &Outcome,
        consumed: &ConsumeStats,
        elapsed: Duration,
        output: Option<&Path>,
        manifest: Option<&Path>,
    ) -> Summary {
        let mut s = Summary::for_receiver(Expected::Range { first: 0, count: frames }, c, outcome, consumed, elapsed, output);
        s.datagrams_sent = Some(emu.sent.datagrams);
        s.sends_refused = Some(emu.refused_in_frames);
        s.roce_sends_refused = Some(emu.roce_refused);
        s.datagrams_resent = Some(emu.retransmit.resent);
        s.history_misses = Some(emu.retransmit.history_misses);
        s.bad_nacks = Some(emu.retransmit.bad_nacks);
        s.late_frames = Some(emu.late_frames);
        s.held_back = Some(emu.held_back);
        let f = &emu.faults;
        s.faults_injected = Some([f.dropped, f.reordered, f.duplicated, f.corrupted, f.delayed]).filter(|v| v.iter().any(|&x| x > 0));
        s.manifest = manifest.map(Path::to_owned);
        s
    }

    pub fn for_receiver(expected: Expected, c: &Counters, outcome: &Outcome, consumed: &ConsumeStats, elapsed: Duration, output: Option<&Path>) -> Summary {
        let window = match (consumed.first, consumed.last) {
            (Some(a), Some(b)) if b > a => (b - a).as_secs_f64(),
            _ => 0.0,
        };
        let (never, never_runs) = never_seen(&expected, outcome);
        let seen = consumed.complete + consumed.incomplete + consumed.discarded;
        Summary {
            frames_expected: match &expected {
                Expected::Range { count, .. } | Expected::Count(count) => Some(*count),
                Expected::Frames(set) => Some(set.len()),
                Expected::Unknown => None,
            },
            stopped_early_of: None,
            frames_complete: c.frames_complete,
            frames_incomplete: c.frames_incomplete,
            frames_discarded: c.frames_discarded,
            frames_refused: c.frames_refused,
            frames_refused_runs: outcome.ledger.refused.runs().iter().take(RUNS_SHOWN).copied().collect(),
            frames_never_seen: never,
            frames_never_seen_runs: never_runs,
            frames_beyond_expected: beyond_expected(&expected, outcome),
            frames_written: consumed.written,
            frames_not_saved: consumed.not_saved,
            reset_frames: consumed.reset_frames,
            data_without_reset: consumed.without_reset,
            unused_reset_frames: consumed.unused_resets,
            write_error: consumed.write_error.clone(),
            stage_failure: consumed.stage_failure.clone(),
            datagrams_sent: None,
            sends_refused: None,
            engine: None,
            tuning: Vec::new(),
            latency: consumed.latency.report(),
            datagrams_received: c.datagrams,
            datagrams_placed: c.placed,
            landed_in_place: c.landed_in_place,
            copied: c.copied,
            evacuated: c.evacuated,
            datagrams_dropped: c.dropped_total(),
            dropped_by_reason: c.drops_by_reason().into_iter().map(|(n, v)| (n.to_string(), v)).collect(),
            packets_misfit: c.dropped(rdaq_receiver::DropReason::UnexpectedPacket),
            kernel_drops: c.kernel_drops,
            kernel_drops_recovered: false,
            cells_missing: c.cells_missing,
            seq_missing: c.seq_missing,
            nacks_sent: c.nacks_sent,
            acks_sent: c.acks_sent,
            replies_refused: c.replies_refused,
            roce_sends_refused: None,
            datagrams_retransmitted_placed: c.placed_retransmitted,
            datagrams_redundant: c.redundant,
            frames_recovered: c.frames_recovered,
            frames_given_up: c.frames_given_up,
            nack_ranges_dropped: c.nack_ranges_dropped,
            loss_reports_dropped: c.loss_reports_dropped,
            bad_nacks: None,
            datagrams_resent: None,
            history_misses: None,
            late_frames: None,
            held_back: None,
            faults_injected: None,
            bytes_placed: c.bytes_placed,
            gb_per_s: if window > 0.0 { c.bytes_placed as f64 / 1e9 / window } else { 0.0 },
            data_window_s: window,
            elapsed_s: elapsed.as_secs_f64(),
            consumer_frames_per_s: if window > 0.0 { seen as f64 / window } else { 0.0 },
            consumer: consumed.what.clone(),
            consumer_waits: consumed.pool_waits,
            receiver_cpu_s: c.cpu_time.as_secs_f64(),
            compression_ratio: (consumed.bytes_out > 0).then(|| consumed.bytes_in as f64 / consumed.bytes_out as f64),
            chunks_handed_on: consumed.chunks_handed_on,
            io_waits: consumed.io_waits,
            output: output.map(Path::to_owned),
            manifest: None,
            calibration: None,
            processing: None,
            threads: None,
            stream: None,
            hints: outcome.hints.clone(),
        }
    }

    /// Frames that are not in the files at all: never seen, refused, discarded incomplete,
    /// or, of a known count, never come.
    pub fn frames_lost(&self) -> u64 {
        let gone = self.frames_never_seen + self.frames_refused + self.frames_discarded;
        let short = self.frames_expected.map_or(0, |e| e.saturating_sub(self.frames_complete + self.frames_incomplete + gone));
        gone + short
    }

    /// True when any frame expected did not arrive complete or was not saved, or the frames
    /// are not what the detector sent (its packets did not fit the settings).
    pub fn lost(&self) -> bool {
        let short = self.frames_expected.is_some_and(|e| self.frames_complete < e);
        short
            || self.frames_incomplete > 0
            || self.frames_discarded > 0
            || self.frames_refused > 0
            || self.frames_never_seen > 0
            || self.frames_beyond_expected > 0
            || self.packets_misfit > 0
            || (self.kernel_drops > 0 && !self.kernel_drops_recovered)
            || self.frames_not_saved > 0
            || self.data_without_reset > 0
            || self.write_error.is_some()
            || self.stage_failure.is_some()
            || self.frames_complete + self.frames_incomplete + self.frames_discarded == 0
    }

    /// The exit status: 0 nothing lost, 1 data lost (unless `tolerate`).
    pub fn exit_code(&self, command: &str, tolerate: bool) -> ExitCode {
        if !self.lost() {
            return ExitCode::SUCCESS;
        }
        if tolerate {
            eprintln!("rdaq {command}: data was lost; exit 0 as --tolerate-loss asks");
            return ExitCode::SUCCESS;
        }
        eprintln!("rdaq {command}: data was lost (exit 1; --tolerate-loss exits 0 anyway)");
        ExitCode::from(1)
    }

    /// Prints the summary on stdout (a closed stdout ends nothing: [`print_out`]).
    pub fn print(&self) {
        let mut text = String::new();
        self.write_to(&mut text);
        print_out(&text);
    }

    /// The summary as [`Summary::print`] prints it.
    pub fn write_to(&self, o: &mut String) {
        say!(o, "---- rdaq summary ----");
        self.print_frames(o);
        self.print_datagrams(o);
        self.print_recovery(o);
        self.print_rates(o);
        self.print_processing(o);
        self.print_outputs(o);
        self.print_latency(o);
        for h in &self.hints {
            say!(o, "hint        : {h}");
        }
        say!(o, "loss        : {}", if self.lost() { "YES" } else { "none" });
    }

    fn print_latency(&self, o: &mut String) {
        for (i, l) in self.latency.iter().enumerate() {
            let label = if i == 0 { "latency" } else { "" };
            say!(o, "{label:<11} : {:<22} p50 {:>9.3} ms  p99 {:>9.3} ms  max {:>9.3} ms  ({} frames)", l.step, l.p50_us as f64 / 1e3, l.p99_us as f64 / 1e3, l.max_us as f64 / 1e3, l.frames);
        }
    }

    fn print_frames(&self, o: &mut String) {
        let beyond = if self.frames_beyond_expected > 0 { format!("; {} more came than expected (see hint)", self.frames_beyond_expected) } else { String::new() };
        let arrived = format!(
            "{} complete, {} incomplete (kept), {} discarded, {} refused (ring full), {} never arrived{beyond}",
            self.frames_complete, self.frames_incomplete, self.frames_discarded, self.frames_refused, self.frames_never_seen
        );
        if let (Some(asked), Some(sent)) = (self.stopped_early_of, self.frames_expected) {
            say!(o, "stopped     : early, after {sent} of the {asked} frames asked for");
        }
        match self.frames_expected {
            Some(e) => say!(o, "frames      : {e} expected: {arrived}"),
            None => say!(o, "frames      : {arrived}"),
        }
        if self.frames_never_seen > 0 {
            let known: u64 = self.frames_never_seen_runs.iter().map(|(a, b)| b - a).sum();
            let unknown = self.frames_never_seen - known;
            let mut parts = Vec::new();
            if !self.frames_never_seen_runs.is_empty() {
                parts.push(format!("frames {}", describe_runs(&self.frames_never_seen_runs, RUNS_SHOWN)));
            }
            if unknown > 0 {
                parts.push(format!("{unknown} whose numbers are unknown (before the first or after the last frame seen)"));
            }
            say!(o, "never seen  : {}", parts.join("; "));
        }
        if self.frames_refused > 0 {
            say!(o, "refused     : frames {} (the ring was full: the consumer was behind; each refused whole)", describe_runs(&self.frames_refused_runs, RUNS_SHOWN));
        }
        let not_saved = if self.frames_not_saved > 0 { format!(", {} received but not saved", self.frames_not_saved) } else { String::new() };
        let which = match &self.processing {
            Some(p) if p.veto => " (the signal frames that were hits: see processing)",
            Some(_) => " (every signal frame: the veto is off)",
            None => "",
        };
        say!(o, "saved       : {} frames written{which}{not_saved}", self.frames_written);
        if self.reset_frames + self.data_without_reset + self.unused_reset_frames > 0 {
            say!(o, 
                "reset frames: {} subtracted from their data frames (not written); {} data frames without their reset frame (not written); {} reset frames without their data frame (not used)",
                self.reset_frames, self.data_without_reset, self.unused_reset_frames
            );
        }
    }

    fn print_datagrams(&self, o: &mut String) {
        if let Some(e) = &self.engine {
            say!(o, "engine      : {e}");
        }
        let sent = match (self.datagrams_sent, self.datagrams_resent) {
            (Some(s), Some(r)) if r > 0 => format!("sent {s} ({r} of them again: requested, or tail probes), "),
            (Some(s), _) => format!("sent {s}, "),
            _ => String::new(),
        };
        say!(o, "datagrams   : {sent}received {}, placed {} ({} landed in place, {} copied), rejected {}",
            self.datagrams_received, self.datagrams_placed, self.landed_in_place, self.copied, self.datagrams_dropped);
        if self.evacuated > 0 {
            say!(o, "moved       : {} payloads landed in a wrongly predicted cell and were moved out first (two copies)", self.evacuated);
        }
        if self.datagrams_dropped > 0 {
            let reasons: Vec<String> = self.dropped_by_reason.iter().map(|(n, v)| format!("{n}={v}")).collect();
            say!(o, "rejected    : {}", reasons.join(" "));
        }
        if self.packets_misfit > 0 {
            say!(o, "misfit      : {} of the detector's packets had no place in the frames as set up: the frames are not what it sent (see hint)", self.packets_misfit);
        }
        if self.cells_missing > 0 || self.kernel_drops > 0 || self.sends_refused.unwrap_or(0) > 0 {
            let recovered = if self.kernel_drops_recovered { ", sent again by the RoCEv2 sender" } else { "" };
            say!(o, "missing     : {} datagram cells missing in {} incomplete or discarded frames; {} datagrams dropped by the kernel (socket buffer full{recovered}); {} sends refused (nothing listened at the receiver's port)",
                self.cells_missing, self.frames_incomplete + self.frames_discarded, self.kernel_drops, self.sends_refused.unwrap_or(0));
        }
        if let Some([d, r, u, c, l]) = self.faults_injected {
            say!(o, "injected    : dropped {d}, reordered {r}, duplicated {u}, corrupted {c}, delayed {l}");
        }
    }

    fn print_recovery(&self, o: &mut String) {
        if self.seq_missing > 0 || self.nacks_sent > 0 || self.datagrams_retransmitted_placed > 0 {
            let resent = self.datagrams_resent.map_or(String::new(), |r| format!(", resent {r}"));
            let misses = self.history_misses.map_or(String::new(), |m| format!(", not in the sender's history {m}"));
            say!(o, "recovery    : seq missing {}, requests {}{resent}{misses}, placed {} (redundant {}), frames recovered {}, given up {}",
                self.seq_missing, self.nacks_sent, self.datagrams_retransmitted_placed, self.datagrams_redundant,
                self.frames_recovered, self.frames_given_up);
        }
        if self.acks_sent > 0 {
            say!(o, "rc          : {} ACKs sent, {} ACKs or NAKs refused by the receiver's interface, {} WRITE packets refused by the sender's interface (all recovered by timeout and go-back)",
                self.acks_sent, self.replies_refused, self.roce_sends_refused.map_or("?".to_string(), |n| n.to_string()));
        }
        // gaps that were not asked for only matter when something stayed missing; the
        // counts are in the JSON either way
        let unasked = self.nack_ranges_dropped + self.loss_reports_dropped + self.bad_nacks.unwrap_or(0);
        if unasked > 0 && self.lost() {
            say!(o, "not asked   : {} missing ranges were not asked for again (request queue full, rate limit, or nobody to ask), {} loss reports dropped, {} requests refused by the modules",
                self.nack_ranges_dropped, self.loss_reports_dropped, self.bad_nacks.unwrap_or(0));
        }
        if let (Some(late), Some(held)) = (self.late_frames, self.held_back) {
            if late > 0 {
                say!(o, "detector    : {late} module frames started more than a frame period late; {held} times a module waited for a slower one (common trigger)");
            }
        }
    }

    fn print_rates(&self, o: &mut String) {
        say!(o, "throughput  : {:.3} GB placed; {:.3} GB/s over the {:.2} s data window (first to last frame); receiver CPU {:.2} s",
            self.bytes_placed as f64 / 1e9, self.gb_per_s, self.data_window_s, self.receiver_cpu_s);
        say!(o, "elapsed     : {:.2} s (start to end, waits included)", self.elapsed_s);
        if self.frames_refused > 0 {
            let sent = self.frames_complete + self.frames_incomplete + self.frames_discarded + self.frames_refused;
            let arriving = if self.data_window_s > 0.0 { sent as f64 / self.data_window_s } else { 0.0 };
            say!(o, "limit       : the consumer ({}) was the limit: it took {:.0} frames/s while frames arrived at {:.0} frames/s",
                self.consumer, self.consumer_frames_per_s, arriving);
        }
        if self.consumer_waits > 0 {
            say!(o, "consumer    : waited {} times for a free frame buffer (back-pressure from its workers and the writer)", self.consumer_waits);
        }
        if let Some(t) = &self.threads {
            let over = if t.oversubscribed { format!("; {} busy threads on {} cores: they took turns", t.threads, t.cores) } else { String::new() };
            say!(o, "threads     : {}{over}", t.describe());
        }
    }

    fn print_processing(&self, o: &mut String) {
        let Some(p) = &self.processing else { return };
        if p.veto && p.signal_frames > 0 && p.hits == 0 {
            say!(o, "warning     : every signal frame was vetoed (none had {} spots): nothing of them was written; lower process.min_spots, or set process.veto = false to write every frame", p.min_spots);
        }
        say!(o, "processing  : {} dark frames ({} incomplete, not tracked), {} pedestal updates; {} signal frames, {} hits, {} vetoed ({:.1}%), {} spots; {} compressed, {} frames written",
            p.dark_frames, p.dark_incomplete, p.pedestal_updates, p.signal_frames, p.hits, p.vetoed, 100.0 * p.vetoed_fraction, p.spots_found, p.frames_compressed, p.frames_written);
        say!(o, "  stage          workers  frames   ms/frame  busy s  waits  dropped  discarded  ring max");
        for s in &p.stages {
            say!(o, "  {:<13} {:>7} {:>7} {:>10.3} {:>7.2} {:>6} {:>8} {:>10} {:>9}",
                s.name, s.workers, s.frames, s.ms_per_frame, s.busy_s, s.blocked, s.dropped, s.discarded, s.high_water);
        }
        if !p.steps.is_empty() {
            let steps: Vec<String> = p.steps.iter().map(|s| format!("{} {:.3}", s.name, s.ms_per_frame)).collect();
            say!(o, "  per signal frame (ms, process workers): {}; frames held back for order: at most {}", steps.join(", "), p.reorder_high_water);
        }
        if p.pool_waits > 0 {
            say!(o, "  the receiver side waited {} times for a free frame buffer (back-pressure)", p.pool_waits);
        }
        if let Some(g) = &p.gpu {
            say!(o, "  gpu: {}, {} lanes, ring {}registered; {} images copied back, {} frames with too many strong pixels for the device's list, {} waits for a free lane",
                g.device, g.lanes, if g.ring_registered { "" } else { "not " }, g.images_copied_back, g.strong_overflow, g.lane_waits);
            if g.frames_shared_with_cpu > 0 {
                say!(o, "  gpu: {} frames processed on the CPU while every lane was busy (process.gpu_cpu_workers)", g.frames_shared_with_cpu);
            }
            if g.device_errors > 0 {
                say!(o, "  gpu errors: {} (first: {}); {} frames processed on the CPU after it", g.device_errors, g.first_error.as_deref().unwrap_or("?"), g.frames_on_cpu);
            }
        }
    }

    fn print_outputs(&self, o: &mut String) {
        if let Some(r) = self.compression_ratio {
            say!(o, "compression : ratio {r:.2} (bitshuffle chunks of the written pixels)");
        }
        match &self.output {
            Some(path) => {
                say!(o, "output      : {}", path.display());
                say!(o, "  {} chunks written out by the writer's {} I/O threads; {} waits for them", self.chunks_handed_on, rdaq_sink::deferred::IO_THREADS, self.io_waits);
            }
            None if self.frames_written == 0 => say!(o, "output      : none (no frame was written, so no data file was kept)"),
            None => {}
        }
        if let Some(e) = &self.write_error {
            say!(o, "write error : {e}");
        }
        if let Some(e) = &self.stage_failure {
            say!(o, "stage failed: {e}");
        }
        if let Some(m) = &self.manifest {
            say!(o, "manifest    : {}", m.display());
        }
        if let Some(c) = &self.calibration {
            say!(o, "calibration : {} (with the tracked pedestal)", c.display());
        }
        if let Some(s) = &self.stream {
            say!(o, "stream      : {}", s.line());
        }
    }

    /// Writes the summary to the new file `path` (or replacing one, with `overwrite`).
    pub fn write_json(&self, path: &Path, overwrite: bool) -> anyhow::Result<()> {
        crate::outputs::write_file(path, serde_json::to_string_pretty(self)?.as_bytes(), overwrite)
    }
}

/// Frames expected of which nothing arrived: how many, and the runs whose numbers are known.
/// With only a count expected, the gaps between the first and the last frame seen have
/// known numbers, and the rest of the shortfall does not.
fn never_seen(expected: &Expected, outcome: &Outcome) -> (u64, Vec<(u64, u64)>) {
    let l = &outcome.ledger;
    let runs = match (expected, l.span()) {
        (Expected::Range { first, count }, _) => l.never_seen(*first, first + count),
        (Expected::Frames(set), _) => set.runs().iter().flat_map(|&(a, b)| l.never_seen(a, b)).collect(),
        (_, Some((lo, hi))) => l.never_seen(lo, hi + 1),
        (_, None) => Vec::new(),
    };
    let known: u64 = runs.iter().map(|(a, b)| b - a).sum();
    let (total, runs) = match expected {
        // gaps between the numbers seen are frames of the acquisition only while they fit in
        // what is missing of the count (else the numbering jumped: modules that disagree)
        Expected::Count(count) => {
            let short = count.saturating_sub(l.finished.len() + l.refused.len());
            (short, if known <= short { runs } else { Vec::new() })
        }
        Expected::Range { .. } | Expected::Frames(_) | Expected::Unknown => (known, runs),
    };
    (total, runs.into_iter().take(RUNS_SHOWN).collect())
}

/// Frames that finished or were refused beyond those expected: past the count, or outside
/// the expected numbers.
fn beyond_expected(expected: &Expected, outcome: &Outcome) -> u64 {
    let l = &outcome.ledger;
    let came = || l.finished.runs().iter().chain(l.refused.runs());
    let outside = |want: &[(u64, u64)]| -> u64 {
        let inside = |&(a, b): &(u64, u64)| want.iter().map(|&(c, d)| b.min(d).saturating_sub(a.max(c))).sum::<u64>();
        came().map(|r| (r.1 - r.0) - inside(r)).sum()
    };
    match expected {
        Expected::Count(count) => (l.finished.len() + l.refused.len()).saturating_sub(*count),
        Expected::Range { first, count } => outside(&[(*first, first + count)]),
        Expected::Frames(set) => outside(set.runs()),
        Expected::Unknown => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdaq_receiver::Ledger;

    fn ledger(finished: &[u64], refused: &[u64]) -> Outcome {
        let mut l = Ledger::default();
        for &f in finished {
            l.finished.insert(f);
        }
        for &f in refused {
            l.refused.insert(f);
        }
        Outcome { ledger: l, hints: Vec::new() }
    }

    #[test]
    fn frames_never_seen_are_counted_with_their_numbers() {
        let o = ledger(&(0..50).collect::<Vec<_>>(), &[]);
        assert_eq!(never_seen(&Expected::Range { first: 0, count: 100 }, &o), (50, vec![(50, 100)]));
        // a count only: the 50 missing after frame 49 have no known numbers
        assert_eq!(never_seen(&Expected::Count(100), &o), (50, vec![]));
        let o = ledger(&[14, 15, 18], &[16]);
        assert_eq!(never_seen(&Expected::Count(5), &o), (1, vec![(17, 18)]));
        assert_eq!(never_seen(&Expected::Count(8), &o), (4, vec![(17, 18)]));
        assert_eq!(never_seen(&Expected::Count(3), &ledger(&[], &[])), (3, vec![]));
    }

    #[test]
    fn frames_of_disagreeing_modules_add_up() {
        // two modules 100 frames apart, 3 frames each: 6 frame numbers for 3 expected
        let o = ledger(&[14, 15, 16, 114, 115, 116], &[]);
        assert_eq!(never_seen(&Expected::Count(3), &o), (0, vec![]), "the jump is not 97 frames lost");
        assert_eq!(beyond_expected(&Expected::Count(3), &o), 3);
        assert_eq!(beyond_expected(&Expected::Range { first: 14, count: 3 }, &o), 3);
        assert_eq!(beyond_expected(&Expected::Range { first: 0, count: 200 }, &o), 0);
        let c = Counters { frames_incomplete: 6, ..Default::default() };
        let s = Summary::for_receiver(Expected::Count(3), &c, &o, &ConsumeStats::default(), Duration::ZERO, None);
        assert_eq!(s.frames_incomplete + s.frames_never_seen - s.frames_beyond_expected, 3);
        assert!(s.lost());
    }

    #[test]
    fn packets_that_did_not_fit_the_settings_are_loss() {
        let mut c = Counters { frames_complete: 3, ..Default::default() };
        let o = ledger(&[0, 1, 2], &[]);
        assert!(!Summary::for_receiver(Expected::Count(3), &c, &o, &ConsumeStats { written: 3, ..Default::default() }, Duration::ZERO, None).lost());
        c.drop(rdaq_receiver::DropReason::UnexpectedPacket);
        let s = Summary::for_receiver(Expected::Count(3), &c, &o, &ConsumeStats { written: 3, ..Default::default() }, Duration::ZERO, None);
        assert!(s.lost() && s.packets_misfit == 1);
    }

    #[test]
    fn every_frame_expected_is_in_exactly_one_count() {
        let c = Counters { frames_complete: 40, frames_incomplete: 5, frames_discarded: 2, frames_refused: 3, ..Default::default() };
        let finished: Vec<u64> = (0..47).collect();
        let o = ledger(&finished, &[60, 61, 62]);
        let s = Summary::for_receiver(Expected::Range { first: 0, count: 100 }, &c, &o, &ConsumeStats::default(), Duration::ZERO, None);
        assert_eq!(s.frames_complete + s.frames_incomplete + s.frames_discarded + s.frames_refused + s.frames_never_seen, 100);
        assert_eq!(s.frames_never_seen_runs, vec![(47, 60), (63, 100)]);
        assert!(s.lost());
    }

    #[test]
    fn a_run_that_received_nothing_lost_everything() {
        let s = Summary::for_receiver(Expected::Unknown, &Counters::default(), &Outcome::default(), &ConsumeStats::default(), Duration::ZERO, None);
        assert!(s.lost(), "nothing arrived: exit 1, not 0");
    }
}
