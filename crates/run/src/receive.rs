//! An acquisition of a detector outside this process, from start to summary: the receiver
//! of its [`remote::Setup`], the NXmx series and the Stream V2 stream, the frames through
//! the chain ([`crate::acquisition`]) until the receiver stops (its frame count, a stop,
//! the deadline), and the summary. `rdaq receive` and Python's
//! `rdaq.Acquisition(source=...)` run it; they only turn their inputs into its source and
//! configuration.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::ProgressBar;
use rdaq_emulator::Control;
use rdaq_process::pedestal_run::PedestalRun;
use rdaq_receiver::{Counters, Receiver};
use rdaq_sink::{NxmxMeta, NxmxWriter};

use crate::acquisition::{self, Chain, Outcome, Sinks};
use crate::board::Board;
use crate::config::Config;
use crate::graph::ProcessReport;
use crate::remote::Setup;
use crate::receiver_report::check_guards;
use crate::stream::Stream;
use crate::summary::{Expected, Summary};
use crate::outputs;

/// How often the board takes the receiver's counters.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// A started acquisition: its receiver listens, its sinks are open.
pub struct Receiving {
    pub rx: Receiver,
    chain: Chain,
    sinks: Sinks,
    frames: Option<u64>,
}

/// Starts the receiver of `setup` and opens the sinks: the series at `out` (none: the
/// frames are counted only; an existing file is refused unless `output.overwrite`) and the
/// configuration's stream and preview. The receiver stops after the frames of its
/// configuration (the source's count), which the files and the stream announce.
pub fn start(setup: Setup, cfg: &Config, out: Option<&Path>) -> anyhow::Result<Receiving> {
    let Setup { rcfg, chain, meta, .. } = setup;
    let frames = rcfg.frames;
    let rx = Receiver::start(rcfg).context("starting the receiver")?;
    // the stream's ports before the files: a start that fails leaves no file behind
    let stream = Stream::open_configured(&cfg.stream, &meta, "rdaq")?;
    let writer = match out {
        Some(p) => Some(open_series(p, &meta, frames, cfg.output.overwrite)?),
        None => None,
    };
    Ok(Receiving { rx, chain, sinks: Sinks { writer, stream }, frames })
}

/// The series at `p`, after a look at the free space when the frame count is known.
fn open_series(p: &Path, meta: &NxmxMeta, frames: Option<u64>, overwrite: bool) -> anyhow::Result<NxmxWriter> {
    let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if let Some(n) = frames {
        let frame = meta.image_bytes() as u64;
        outputs::warn_if_short(dir, n * frame, &format!("{n} frames of {:.1} MB before compression", frame as f64 / 1e6));
    }
    let w = NxmxWriter::create(p, meta, overwrite)?;
    outputs::warn_without_reserve(&w, p);
    Ok(w)
}

/// What came of a finished acquisition.
pub struct Received {
    pub summary: Summary,
    /// The receiver's counters at the end.
    pub counters: Counters,
    /// The pedestal run the chain recorded, with every complete frame taken.
    pub pedestal_run: Option<PedestalRun>,
    /// What ended the acquisition.
    pub ended: Ended,
}

/// What ends an acquisition besides its frame count and a stop.
#[derive(Clone, Debug, Default)]
pub struct Ending {
    /// The limit in any case.
    pub deadline: Option<Instant>,
    /// The detector has finished once no datagram came for this long after the first: the
    /// frames not seen by then never arrived (a detector that sent fewer frames than asked
    /// is not waited for until the deadline).
    pub quiet: Option<Duration>,
    /// Set once the detector says it has sent everything (rdaq drives it): the receiver then
    /// ends once no datagram came for the duration (the datagrams in flight have landed).
    pub finished: Option<(Arc<AtomicBool>, Duration)>,
}

/// What ended the receiving, beside its own frame count, a stop or the deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The receiver itself (its frames, a stop, the deadline).
    Itself,
    /// No datagram came for `Ending::quiet`.
    Quiet,
    /// The detector said it had finished, and the datagrams in flight have landed.
    Finished,
}

impl Receiving {
    /// Where the acquisition shows itself while it runs.
    pub fn board(&self) -> Arc<Board> {
        self.chain.board.clone()
    }

    /// Takes the frames through the chain until the receiver stops by itself (its frame
    /// count), `stop` is set (Ctrl-C, the dashboard, Python), or as `ending` says; then the
    /// summary.
    pub fn run(self, bar: &ProgressBar, ending: Ending, stop: &Control) -> anyhow::Result<Received> {
        let Receiving { mut rx, chain, sinks, frames } = self;
        let board = chain.board.clone();
        let start = Instant::now();
        let (outcome, ended) = consume_until_stopped(&rx, chain, sinks, bar, ending, stop);
        let outcome = outcome?;
        bar.finish();
        let counters = rx.join()?;
        board.sample(counters);
        let expected = frames.map_or(Expected::Unknown, Expected::Count);
        let mut summary = Summary::for_receiver(expected, &counters, &rx.outcome(), &outcome.consumed, start.elapsed(), outcome.h5.as_deref()).with_receiver(&rx);
        summary.stream = outcome.stream;
        summary.threads = Some(outcome.threads);
        summary.processing = outcome.processed.map(|p| ProcessReport { calibration: None, ..p });
        check_guards(&rx)?;
        Ok(Received { summary, counters, pedestal_run: outcome.pedestal_run, ended })
    }
}

/// Takes the frames through the chain until the receiver stops by itself, `stop`, or as
/// `ending` says; the board follows the receiver's counters. Says what ended it.
fn consume_until_stopped(rx: &Receiver, chain: Chain, sinks: Sinks, bar: &ProgressBar, ending: Ending, stop: &Control) -> (anyhow::Result<Outcome>, Ended) {
    let board = chain.board.clone();
    board.set_state("acquiring");
    std::thread::scope(|s| {
        let consumer = s.spawn(|| acquisition::consume(rx, chain, sinks, bar, None, |_| {}));
        let mut sampled = Instant::now();
        let mut heard = (0u64, Instant::now());
        let mut ended = Ended::Itself;
        while !consumer.is_finished() {
            // the deadline is the limit in any case: no waiting for the ports to go quiet
            if ending.deadline.is_some_and(|d| Instant::now() >= d) {
                rx.stop_now();
            } else if stop.stop.load(Ordering::Relaxed) {
                rx.stop();
            }
            if sampled.elapsed() >= SAMPLE_EVERY {
                let c = rx.counters();
                board.sample(c);
                sampled = Instant::now();
                if ended == Ended::Itself {
                    ended = quiet_end(&mut heard, c.datagrams, &ending);
                    if ended != Ended::Itself {
                        rx.stop_now();
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        (consumer.join().expect("consumer thread panicked"), ended)
    })
}

/// Whether the ports' quiet ends the receiving: no datagram for `ending.quiet` once one came,
/// or, once the detector has finished, none for its grace (also when none came at all).
fn quiet_end(heard: &mut (u64, Instant), datagrams: u64, ending: &Ending) -> Ended {
    let finished = ending.finished.as_ref().filter(|(f, _)| f.load(Ordering::Acquire));
    if went_quiet(heard, datagrams, ending.quiet) {
        Ended::Quiet
    } else if finished.is_some_and(|(_, grace)| heard.1.elapsed() >= *grace) {
        Ended::Finished
    } else {
        Ended::Itself
    }
}

/// Whether no datagram came for `quiet` since the last change of the count (`heard`: the
/// count and when it last changed), once one came.
fn went_quiet(heard: &mut (u64, Instant), datagrams: u64, quiet: Option<Duration>) -> bool {
    if datagrams != heard.0 {
        *heard = (datagrams, Instant::now());
        return false;
    }
    datagrams > 0 && quiet.is_some_and(|q| heard.1.elapsed() >= q)
}
