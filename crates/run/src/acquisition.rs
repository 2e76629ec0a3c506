//! One acquisition's chain after the receiver, the same for every entry point (`rdaq run`,
//! `rdaq receive`, the receiver daemon, a plan run in one process): the frames go through
//! the processing graph ([`crate::graph`]) or, raw, through the consumer's assemble
//! workers ([`crate::consume`]), into the sinks (the NXmx series, the Stream V2 stream, the board
//! behind the dashboard and `/metrics`); at the end the stream is finished and the files
//! closed, and the [`Outcome`] says what came of it. A feature added here reaches every
//! entry point.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use indicatif::ProgressBar;
use rdaq_detector::Geometry;
use rdaq_emulator::Control;
use rdaq_process::pedestal_run::PedestalRun;
use rdaq_receiver::{FrameReady, FrameStatus, Receiver};
use rdaq_sink::NxmxWriter;

use crate::assemble::Decoder;
use crate::board::{incomplete_event, Board};
use crate::budget::ThreadBudget;
use crate::config::Config;
use crate::consume::{self, ConsumeStats, Workers};
use crate::graph::{self, ProcessReport};
use crate::outputs;
use crate::stream::{Stream, StreamReport};

/// What an acquisition does with its receiver's frames.
pub struct Chain {
    /// The image the frames make (the modules this receiver holds).
    pub geometry: Geometry,
    /// How a described detector's module frames become module images (`None`: JUNGFRAU's
    /// 16-bit module frames, put in place as they are).
    pub decoder: Option<Decoder>,
    /// The processing graph's settings; `None`: the frames go to the sinks raw.
    pub processing: Option<graph::Setup>,
    /// Where the acquisition shows itself while it runs (the dashboard, `/metrics`).
    pub board: Arc<Board>,
    /// The detector of this process, whose send times start each frame's latency.
    pub sent: Option<Arc<Control>>,
    /// The consumer waits this long per frame (testing: a consumer slower than the detector).
    pub consumer_delay: Duration,
    /// Who reports the frames that came incomplete or were discarded, on the board.
    pub name: String,
    /// A JUNGFRAU pedestal run that takes every complete raw frame (raw chains only).
    pub pedestal_run: Option<PedestalRun>,
    /// The workers that assemble and compress raw frames (raw chains only: the graph has
    /// its own in `processing`).
    pub workers: Workers,
    /// How the cores are shared among the acquisition's threads.
    pub threads: ThreadBudget,
    /// A counting detector's spot finding and veto in the raw chain's workers
    /// ([`crate::counts`]; raw chains only).
    pub finding: Option<Arc<crate::counts::Finding>>,
    /// Where a counting detector's written frames go with their spots (a program in this
    /// process reading them; raw chains with `finding` only).
    pub deliver: Option<crossbeam_channel::Sender<crate::graph::deliver::Processed>>,
}

impl Chain {
    /// The chain of the configuration `cfg` (its workers, thread budget and consumer delay)
    /// for `processing` (none: raw frames) over the image `geometry`, JUNGFRAU's module
    /// frames, on a board of its own, reported as `name`.
    pub fn new(cfg: &Config, geometry: Geometry, processing: Option<graph::Setup>, name: impl Into<String>) -> Chain {
        Chain {
            geometry,
            decoder: None,
            processing,
            board: Arc::default(),
            sent: None,
            consumer_delay: cfg.faults.consumer_delay(),
            name: name.into(),
            pedestal_run: None,
            workers: cfg.raw_workers(),
            threads: cfg.thread_budget(),
            finding: None,
            deliver: None,
        }
    }

    /// Hands every written frame to `tx` before its buffer is reused: the graph's
    /// processed frames, or a counting detector's counts with their spots. False (and
    /// nothing handed out) for a chain of raw frames.
    pub fn deliver_to(&mut self, tx: crossbeam_channel::Sender<crate::graph::deliver::Processed>) -> bool {
        match self.processing.as_mut() {
            Some(p) => p.deliver = Some(tx),
            None if self.finding.is_some() => self.deliver = Some(tx),
            None => return false,
        }
        true
    }
}

/// Where the frames go.
#[derive(Default)]
pub struct Sinks {
    pub writer: Option<NxmxWriter>,
    pub stream: Option<Stream>,
}

/// What came of an acquisition's frames.
pub struct Outcome {
    pub consumed: ConsumeStats,
    /// The processing graph's report, or a counting detector's spot finding's (`None` for
    /// raw frames).
    pub processed: Option<ProcessReport>,
    /// The master file, when it holds a frame.
    pub h5: Option<PathBuf>,
    pub stream: Option<StreamReport>,
    /// The pedestal run, with every complete frame taken.
    pub pedestal_run: Option<PedestalRun>,
    pub threads: ThreadBudget,
}

/// Takes the receiver's frames through the chain into the sinks until the receiver
/// finishes (or `until` is set and no frame is waiting); `on_frame` sees every frame first.
/// The stream is finished also when consuming failed; the files are closed when it did not.
pub fn consume(rx: &Receiver, chain: Chain, sinks: Sinks, bar: &ProgressBar, until: Option<&AtomicBool>, mut on_frame: impl FnMut(&FrameReady)) -> anyhow::Result<Outcome> {
    let Sinks { mut writer, mut stream } = sinks;
    let Chain { geometry, decoder, processing, board, sent, consumer_delay, name, mut pedestal_run, workers, threads, finding, deliver } = chain;
    if let Some(w) = threads.warning() {
        eprintln!("rdaq: warning: {w}");
    }
    board.set_threads(threads.clone());
    anyhow::ensure!(processing.is_none() || pedestal_run.is_none(), "a pedestal run takes raw frames, not processed ones");
    let consumed = match processing {
        Some(setup) => {
            let setup = graph::Setup { board: board.clone(), sent: sent.clone(), consumer_delay, ..setup };
            graph::run(rx, writer.as_mut(), stream.as_mut(), setup, bar, until, &mut on_frame).map(|(c, r)| (c, Some(r)))
        }
        None => {
            let sinks = consume::Sinks { geometry, writer: writer.as_mut(), stream: stream.as_mut(), sent: sent.as_deref().map(|c| &c.sent), board: Some(&board), decoder, pedestal_run: pedestal_run.as_mut(), workers, canned: None, finding, deliver };
            consume::consume(rx, sinks, bar, until, |f| {
                if f.status() != FrameStatus::Complete {
                    board.push_event(incomplete_event(&name, f));
                }
                on_frame(f);
                std::thread::sleep(consumer_delay);
            })
            .map(|mut c| {
                let found = c.processed.take();
                (c, found)
            })
        }
    };
    let streamed = stream.map(Stream::finish);
    let (mut consumed, processed) = consumed?;
    let h5 = match writer {
        Some(w) => outputs::close(w, &mut consumed)?,
        None => None,
    };
    Ok(Outcome { consumed, processed, h5, stream: streamed, pedestal_run, threads })
}
