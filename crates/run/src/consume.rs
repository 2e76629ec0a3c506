//! The consumer side of a receiver for raw frames: takes finished frames, assembles and
//! compresses them, writes them to the NXmx file and the stream, gives the slots back, and
//! counts what it saw. The work runs on the pipeline graph of `rdaq_process::pipeline`:
//!
//! ```text
//! receiver ring -> source (this thread: counts, pairs reset frames) -> assemble (n workers:
//!   assembly, compression; slot given back) -> write (1: source order restored, pedestal
//!   run, glance, stream, file)
//! ```
//!
//! so a raw run's assembly and compression use as many cores as it is given, and the
//! writer, not one consumer thread, sets its pace. Frames move as pooled `Box<Job>` buffers
//! (allocated once, reused); each byte of a frame is copied once: into the image, or, when
//! only the chunk is wanted, into a staging block of the compressor that stays in the cache.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver as ChanRx, RecvTimeoutError, Sender};

use indicatif::ProgressBar;
use rdaq_detector::Geometry;
use rdaq_process::bitshuffle::{Codec, Compressor};
use rdaq_process::pedestal_run::PedestalRun;
use rdaq_process::pipeline::{Emit, Failure, Pipeline, Policy, Port, WhenFull, WorkerFn};
use rdaq_process::spots::Spot;
use rdaq_receiver::{FrameReady, FrameStatus, Receiver};
use rdaq_sink::{NxmxWriter, SharedChunk};

use crate::assemble::{Assembler, Decoder};
use crate::board::{Board, Glance};
use crate::counts::{CountFinder, Finding};
use crate::graph::deliver::Processed;
use crate::latency::{FrameTimes, Latency};
use crate::pairs::{Outcome, Pairs};
use crate::reorder::Reorder;
use crate::stream::{ChunkDemand, Stream};

#[derive(Clone, Debug, Default)]
pub struct ConsumeStats {
    pub written: u64,
    pub complete: u64,
    pub incomplete: u64,
    pub discarded: u64,
    /// Frames received after writing failed, so not saved.
    pub not_saved: u64,
    /// The first write failure (the file, the frame and the operating system's reason).
    pub write_error: Option<String>,
    /// Why processing stopped: the worker of the graph that panicked, and what it said.
    pub stage_failure: Option<String>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// The writer's chunks written out by its I/O threads, and its waits for them.
    pub chunks_handed_on: u64,
    pub io_waits: u64,
    pub first: Option<Instant>,
    pub last: Option<Instant>,
    /// What the consumer did with the frames, for the summary.
    pub what: String,
    /// Per-frame latency, step by step.
    pub latency: Latency,
    /// Reset frames subtracted from their data frames (not written).
    pub reset_frames: u64,
    /// Data frames whose reset frame did not come (lost, discarded, refused, or finished
    /// after a newer reset frame): not written.
    pub without_reset: u64,
    /// Reset frames whose data frame did not come: given back unused.
    pub unused_resets: u64,
    /// Times the raw consumer's source waited for a free frame buffer (back-pressure from
    /// the assemble workers and the writer).
    pub pool_waits: u64,
    /// A counting detector's spot finding and veto, when on.
    pub processed: Option<crate::graph::ProcessReport>,
}

impl ConsumeStats {
    /// Counts a finished frame as it arrives; false for a discarded one (it has no data to
    /// write or process).
    pub fn arrived(&mut self, f: &FrameReady) -> bool {
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
        match f.status() {
            FrameStatus::Discarded => self.discarded += 1,
            FrameStatus::Complete => self.complete += 1,
            FrameStatus::Incomplete => self.incomplete += 1,
        }
        f.status() != FrameStatus::Discarded
    }

    /// Counts a frame not saved because a worker of the graph panicked (`failure` is set),
    /// saying so once.
    pub fn not_saved_after(&mut self, failure: &Failure) {
        if self.stage_failure.is_none() {
            let why = failure.first().unwrap_or_default();
            eprintln!("rdaq: {why}: processing stops; frames still arriving are counted as not saved");
            self.stage_failure = Some(why);
        }
        self.not_saved += 1;
    }

    /// After the graph ended: the frames handed on that never left it (held by the worker
    /// that panicked, or waiting behind its frame to be put in order), counted as not saved.
    pub fn lost_in_graph(&mut self, failure: &Failure, frames: u64) {
        if let Some(why) = failure.first() {
            self.stage_failure.get_or_insert(why);
            self.not_saved += frames;
        }
    }

    /// Records a failed write: writing stops, the frame is counted as not saved.
    pub fn write_failed(&mut self, e: impl std::fmt::Display) {
        if self.write_error.is_none() {
            eprintln!("rdaq: {e}: writing stops; frames still arriving are counted as not saved");
            self.write_error = Some(e.to_string());
        }
        self.not_saved += 1;
    }
}

/// Runs of pixels (first, count) of the assembled JUNGFRAU image that the frame's missing
/// cells cover.
pub fn missing_ranges(rx: &Receiver, geometry: &Geometry, f: &FrameReady) -> Vec<(usize, usize)> {
    Assembler::new(*geometry, None).missing(rx, f)
}

/// Pairs of a data frame and its reset frame that may wait for their other frame at once
/// (at most a quarter of the ring: waiting frames hold their slots).
const PAIRS_WAITING: usize = 8;

/// How long the consumer waits for a frame before looking at its stop flag.
const POLL: Duration = Duration::from_millis(50);

/// What a stage expects of the frames it is given: taken from the receiver it reads.
pub(crate) const OWN_FRAME: &str = "a handed frame of this receiver";

/// The next finished frame; `None` once the receiver has finished, or once `until` is set
/// and no frame is waiting.
pub fn next_frame(rx: &Receiver, until: Option<&AtomicBool>) -> Option<FrameReady> {
    loop {
        match rx.frames().recv_timeout(POLL) {
            Ok(f) => return Some(f),
            Err(RecvTimeoutError::Timeout) if until.is_some_and(|u| u.load(Ordering::Relaxed)) => return None,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// A free buffer of `pool`; when none is free, counts the wait on `board` (for `/metrics`),
/// calls `waited` (to count it for the summary) and waits for one. `None` once `failure`
/// says a worker panicked: the buffers it and the stages after it held may never come back.
pub(crate) fn from_pool<T>(pool: &ChanRx<T>, board: Option<&Board>, failure: &Failure, waited: impl FnOnce()) -> Option<T> {
    if failure.is_set() {
        return None;
    }
    if let Ok(t) = pool.try_recv() {
        return Some(t);
    }
    if let Some(b) = board {
        b.waited_for_buffer();
    }
    waited();
    loop {
        match pool.recv_timeout(POLL) {
            Ok(t) => return Some(t),
            Err(_) if failure.is_set() => return None,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => unreachable!("the pool outlives the graph"),
        }
    }
}

/// Where the raw chain's source hands frames on: the pool of buffers, the assemble
/// workers' port, and whether one of the graph's workers panicked.
struct Handing<'p> {
    pool: &'p ChanRx<Box<Job>>,
    to: &'p Port<Box<Job>>,
    failure: &'p Failure,
}

/// The workers that assemble and compress raw frames side by side, and the frames queued
/// per worker in their shared ring (`process.workers`, `process.ring_frames`).
#[derive(Clone, Copy, Debug)]
pub struct Workers {
    pub count: usize,
    pub ring_frames: usize,
}

/// Where the consumer puts frames: the assembled image (the detector's `geometry`) goes
/// to the NXmx files and the stream, compressed once for both.
pub struct Sinks<'a> {
    pub geometry: Geometry,
    pub writer: Option<&'a mut NxmxWriter>,
    pub stream: Option<&'a mut Stream>,
    /// When the frames were sent, where the detector runs in this process.
    pub sent: Option<&'a rdaq_emulator::clock::SendClock>,
    /// Where latency and a glance at the latest frame are shown while the acquisition goes
    /// on (the dashboard, a daemon's `/metrics`), with the stages' counters; events are
    /// `on_frame`'s to report.
    pub board: Option<&'a Board>,
    /// How a described detector's module frames become module images (`None`: JUNGFRAU's
    /// 16-bit module frames, put in place as they are).
    pub decoder: Option<Decoder>,
    /// A JUNGFRAU pedestal run that takes every complete frame's image.
    pub pedestal_run: Option<&'a mut PedestalRun>,
    /// The assemble workers.
    pub workers: Workers,
    /// A chunk made once that the workers hand on instead of assembling and compressing
    /// (the serial-ceiling benchmark, `rdaq bench pipeline --raw --ceiling`); `None` for an
    /// acquisition.
    pub canned: Option<&'a SharedChunk>,
    /// A counting detector's spot finding and veto ([`crate::counts`]).
    pub finding: Option<Arc<Finding>>,
    /// Where every written frame goes, with its counts and spots, before its buffer returns
    /// to the pool (with spot finding only: a program in this process reading the frames).
    pub deliver: Option<Sender<Processed>>,
}

/// A counting detector's written frame handed to a program ([`crate::graph::deliver`]): its
/// pooled buffer, back to the pool when dropped.
pub struct Delivered {
    job: Option<Box<Job>>,
    pool: Sender<Box<Job>>,
    pixel_bytes: usize,
    bytes: usize,
}

impl Delivered {
    fn job(&self) -> &Job {
        self.job.as_ref().expect("held until dropped")
    }

    pub fn frame(&self) -> u64 {
        self.job().frame
    }

    /// The assembled image's counts, little-endian.
    pub fn bytes(&self) -> &[u8] {
        &rdaq_process::bytes_of(&self.job().image[..])[..self.bytes]
    }

    pub fn pixel_bytes(&self) -> usize {
        self.pixel_bytes
    }

    pub fn spots(&self) -> (&[Spot], bool) {
        (&self.job().spots, self.job().hit)
    }
}

impl Drop for Delivered {
    fn drop(&mut self) {
        if let Some(job) = self.job.take() {
            // the consumer may have ended: then the buffer just goes
            let _ = self.pool.send(job);
        }
    }
}

/// One frame on its way from the source to the write stage (pooled: allocated once,
/// reused; its image and chunk grow to their size the first time).
struct Job {
    /// The frame's place in the source's order (the write stage keeps it).
    seq: u64,
    frame: u64,
    complete: bool,
    data: Option<FrameReady>,
    reset: Option<FrameReady>,
    bytes_in: u64,
    missing: Vec<(usize, usize)>,
    /// The assembled image, in 16-bit words (other pixel sizes in their bytes).
    image: Vec<u16>,
    /// `image` holds this frame's image (for the file, the stream, the pedestal run or a
    /// glance).
    assembled: bool,
    /// A glance at this frame is due on the board.
    glance: bool,
    /// Written out by an I/O thread after the write stage hands it on ([`SharedChunk`]).
    chunk: SharedChunk,
    /// `chunk` holds this frame's compressed image.
    chunked: bool,
    times: Option<FrameTimes>,
    /// With spot finding: the frame's spots, whether it is a hit, and whether the veto
    /// keeps it out of the file and the stream.
    spots: Vec<Spot>,
    hit: bool,
    vetoed: bool,
}

/// An assemble worker's own state, kept from frame to frame.
struct Worker {
    asm: Assembler,
    comp: Compressor,
    /// One compression block of a JUNGFRAU image made straight from the slot.
    staging: Vec<u16>,
    finder: Option<CountFinder>,
}

/// What the source, the workers and the write stage share.
struct Consumer<'a> {
    rx: &'a Receiver,
    geometry: Geometry,
    decoder: Option<Decoder>,
    board: Option<&'a Board>,
    sent: Option<&'a rdaq_emulator::clock::SendClock>,
    codec: Codec,
    has_pedestal_run: bool,
    /// Whether the workers compress (set by the write stage as it publishes).
    demand: ChunkDemand,
    stats: Mutex<ConsumeStats>,
    pool: Sender<Box<Job>>,
    canned: Option<&'a SharedChunk>,
    finding: Option<Arc<Finding>>,
    /// Frames compressed (with spot finding: the report's count).
    compressed: AtomicU64,
    /// Frames that left the write stage's reorder (written, vetoed or not saved): the rest
    /// of those handed on were lost in the graph when a worker panicked.
    delivered: AtomicU64,
    deliver: Option<Sender<Processed>>,
}

/// Consumes frames until the receiver finishes, or until `until` is set and no frame is
/// waiting: assembles each frame's modules into the detector image (gaps marked),
/// compresses it once, publishes the chunk on the stream and writes it, in the source's
/// order. Without a writer, a stream and a pedestal run, frames are only counted.
/// `on_frame` sees every frame first.
pub fn consume(rx: &Receiver, mut sinks: Sinks, bar: &ProgressBar, until: Option<&AtomicBool>, mut on_frame: impl FnMut(&FrameReady)) -> anyhow::Result<ConsumeStats> {
    let assemble = sinks.writer.is_some() || sinks.stream.is_some() || sinks.pedestal_run.is_some();
    let Workers { count, ring_frames } = sinks.workers;
    let by = format!("{count} worker{}", if count == 1 { "" } else { "s" });
    let what = match (sinks.writer.is_some(), sinks.stream.is_some()) {
        (true, _) => format!("assembling ({by}) and writing frames"),
        (false, true) => format!("assembling ({by}) and streaming frames"),
        (false, false) if assemble => format!("assembling ({by}) frames for the pedestal run"),
        (false, false) => "counting frames".to_string(),
    };
    anyhow::ensure!(count > 0 && ring_frames > 0, "the consumer needs workers and rings");
    let demand = ChunkDemand::new(sinks.writer.is_some(), sinks.stream.as_deref_mut());
    let (pool, pool_rx) = job_pool(if assemble { (count + 2) * ring_frames + 4 } else { 0 });
    let c = Consumer {
        rx,
        geometry: sinks.geometry,
        decoder: sinks.decoder.take(),
        board: sinks.board,
        sent: sinks.sent,
        codec: sinks.writer.as_ref().map_or(Codec::Lz4, |w| w.meta().codec),
        has_pedestal_run: sinks.pedestal_run.is_some(),
        demand,
        stats: Mutex::new(ConsumeStats { what, ..Default::default() }),
        pool,
        canned: sinks.canned,
        finding: sinks.finding.take(),
        compressed: AtomicU64::new(0),
        delivered: AtomicU64::new(0),
        deliver: sinks.deliver.take(),
    };
    if !assemble {
        if let Some(b) = c.board {
            b.set_consuming();
        }
        c.count(bar, until, &mut on_frame)?;
        return Ok(c.stats.into_inner().expect("not poisoned"));
    }
    let fed = std::thread::scope(|s| {
        let mut p: Pipeline<Box<Job>> = Pipeline::default();
        let mut sinks = Some(sinks);
        let write = p.stage("write", 1, ring_frames, |_| c.write_worker(sinks.take().expect("one write worker")));
        let assemble = p.shared_stage("assemble", count, count * ring_frames, |_| c.assemble_worker());
        p.connect(assemble, write, Policy::RoundRobin, WhenFull::Block);
        let to_assemble = p.source(assemble, Policy::LeastLoaded, WhenFull::Block);
        let failure = p.failure();
        let running = p.spawn(s);
        if let Some(b) = c.board {
            b.set_stages(running.stats.clone());
            b.set_consuming();
        }
        let fed = c.feed(&pool_rx, to_assemble, &failure, bar, until, &mut on_frame);
        running.join();
        fed.map(|handed_on| (handed_on, failure))
    });
    let (handed_on, failure) = fed?;
    let mut stats = c.stats.into_inner().expect("not poisoned");
    stats.lost_in_graph(&failure, handed_on - c.delivered.load(Ordering::Relaxed));
    if let (Some(f), Some(b)) = (&c.finding, c.board) {
        stats.processed = Some(crate::counts::report(f, b, stats.written, c.compressed.load(Ordering::Relaxed), stats.pool_waits));
    }
    Ok(stats)
}

/// `n` pooled frame buffers, empty until first used.
fn job_pool(n: usize) -> (Sender<Box<Job>>, ChanRx<Box<Job>>) {
    let (tx, rx) = bounded::<Box<Job>>(n.max(1));
    for _ in 0..n {
        let job = Job {
            seq: 0,
            frame: 0,
            complete: false,
            data: None,
            reset: None,
            bytes_in: 0,
            missing: Vec::new(),
            image: Vec::new(),
            assembled: false,
            glance: false,
            chunk: SharedChunk::default(),
            chunked: false,
            times: None,
            spots: Vec::new(),
            hit: false,
            vetoed: false,
        };
        tx.send(Box::new(job)).expect("pool has room");
    }
    (tx, rx)
}

impl<'a> Consumer<'a> {
    /// Without sinks: counts each frame and gives its slots back.
    fn count(&self, bar: &ProgressBar, until: Option<&AtomicBool>, on_frame: &mut dyn FnMut(&FrameReady)) -> anyhow::Result<()> {
        while let Some(f) = next_frame(self.rx, until) {
            on_frame(&f);
            bar.inc(1);
            self.stats.lock().expect("not poisoned").arrived(&f);
            self.record(&FrameTimes::of(&f, self.sent), None);
            self.rx.release(f)?;
        }
        Ok(())
    }

    /// The source: counts every frame, pairs a descrambled detector's data frames with
    /// their reset frames, and hands the frames with data on to the assemble workers,
    /// numbered in order; returns how many it handed on. Gives back the slots of frames
    /// without data, and after a worker panicked, of every frame (counted as not saved).
    fn feed(&self, pool: &ChanRx<Box<Job>>, to: Port<Box<Job>>, failure: &Failure, bar: &ProgressBar, until: Option<&AtomicBool>, on_frame: &mut dyn FnMut(&FrameReady)) -> anyhow::Result<u64> {
        let to = Handing { pool, to: &to, failure };
        let needs_reset = self.decoder.as_ref().is_some_and(Decoder::needs_reset);
        // a descrambled detector's frames waiting for their partners (their slots held), and
        // what an offered frame settled
        let mut pairs = Pairs::new(PAIRS_WAITING.min(self.rx.buffer_map().buffers.len() / 4));
        let mut settled = Vec::with_capacity(4);
        let mut seq = 0u64;
        while let Some(f) = next_frame(self.rx, until) {
            on_frame(&f);
            bar.inc(1);
            if !self.stats.lock().expect("not poisoned").arrived(&f) {
                if needs_reset {
                    pairs.gone(f.frame(), |o| settled.push(o));
                }
                self.record(&FrameTimes::of(&f, self.sent), None);
                self.rx.release(f)?;
            } else if needs_reset {
                pairs.offer(f, |o| settled.push(o));
            } else {
                self.hand_on(&to, &mut seq, f, None)?;
            }
            self.settle(&to, &mut seq, &mut settled)?;
        }
        pairs.finish(|o| settled.push(o));
        self.settle(&to, &mut seq, &mut settled)?;
        Ok(seq)
    }

    /// Hands on the pairs of data and reset frames settled, and gives back every other
    /// frame settled (counting the data frames without their reset frame).
    fn settle(&self, to: &Handing, seq: &mut u64, settled: &mut Vec<Outcome<FrameReady>>) -> anyhow::Result<()> {
        for o in settled.drain(..) {
            match o {
                Outcome::Pair { data, reset } => {
                    self.stats.lock().expect("not poisoned").reset_frames += 1;
                    self.hand_on(to, seq, data, Some(reset))?;
                }
                Outcome::WithoutReset(d) => {
                    self.stats.lock().expect("not poisoned").without_reset += 1;
                    self.record(&FrameTimes::of(&d, self.sent), None);
                    self.rx.release(d)?;
                }
                Outcome::UnusedReset(r) => {
                    self.stats.lock().expect("not poisoned").unused_resets += 1;
                    self.rx.release(r)?;
                }
            }
        }
        Ok(())
    }

    /// Frame `f` (with its reset frame, when the detector sends them) into a pooled buffer,
    /// to the assemble workers; after a worker panicked, its slots given back instead.
    fn hand_on(&self, to: &Handing, seq: &mut u64, f: FrameReady, reset: Option<FrameReady>) -> anyhow::Result<()> {
        // the stats' lock is not held while waiting: the write stage takes it to free a buffer
        let Some(mut job) = from_pool(to.pool, self.board, to.failure, || self.stats.lock().expect("not poisoned").pool_waits += 1) else {
            self.stats.lock().expect("not poisoned").not_saved_after(to.failure);
            self.record(&FrameTimes::of(&f, self.sent), None);
            self.rx.release(f)?;
            if let Some(r) = reset {
                self.rx.release(r)?;
            }
            return Ok(());
        };
        (job.seq, job.frame, job.complete) = (*seq, f.frame(), f.status() == FrameStatus::Complete);
        job.times = Some(FrameTimes::of(&f, self.sent));
        (job.data, job.reset) = (Some(f), reset);
        *seq += 1;
        to.to.send(job);
        Ok(())
    }

    /// An assemble worker: each frame's missing pixels, its image (when the pedestal run, a
    /// glance or a described detector's chunk needs it) and the image's chunk (when the file
    /// or a stream reader takes it; a JUNGFRAU's made straight from the slot when nothing
    /// else needs the image); gives the slots back.
    fn assemble_worker(&'a self) -> WorkerFn<'a, Box<Job>> {
        let asm = Assembler::new(self.geometry, self.decoder.clone());
        let comp = Compressor::new(asm.pixel_bytes(), 0, self.codec);
        let finder = self.finding.clone().map(CountFinder::new);
        let mut w = Worker { asm, comp, staging: Vec::new(), finder };
        Box::new(move |mut job: Box<Job>, e: &Emit<Box<Job>>| {
            self.assemble_one(&mut w, &mut job);
            e.send(0, job);
        })
    }

    fn assemble_one(&self, w: &mut Worker, job: &mut Job) {
        #[cfg(test)]
        crate::fault::bug_at(job.frame);
        let (f, reset) = (job.data.take().expect("handed on with its slot"), job.reset.take());
        job.missing.clear();
        job.missing.extend(w.asm.missing(self.rx, &f));
        if let Some(r) = &reset {
            job.missing.extend(w.asm.missing(self.rx, r));
        }
        let raw = self.rx.data(&f).expect(OWN_FRAME);
        job.bytes_in = raw.len() as u64;
        job.chunked = self.demand.wanted();
        (job.hit, job.vetoed) = (false, false);
        job.spots.clear();
        match self.canned {
            // the serial-ceiling benchmark: the chunk made once, handed on by reference (the
            // write stage takes it), no assembly
            Some(_) => (job.assembled, job.glance) = (false, false),
            None => {
                let reset_raw = reset.as_ref().map(|r| self.rx.data(r).expect(OWN_FRAME));
                self.image_and_chunk(w, job, raw, reset_raw);
            }
        }
        if let Some(t) = job.times.as_mut() {
            t.processed = Some(Instant::now());
        }
        self.rx.release(f).expect(OWN_FRAME);
        if let Some(r) = reset {
            self.rx.release(r).expect(OWN_FRAME);
        }
    }

    /// The frame's image where something needs it (with spot finding, always), its spots
    /// and the veto's word, and its chunk where it is wanted and not vetoed.
    fn image_and_chunk(&self, w: &mut Worker, job: &mut Job, raw: &[u8], reset_raw: Option<&[u8]>) {
        job.glance = self.board.is_some_and(|b| b.glance_due());
        job.assembled = job.glance || self.has_pedestal_run || w.finder.is_some() || (job.chunked && !w.asm.raw_words());
        if job.assembled {
            let image = w.asm.assemble(raw, reset_raw, &mut job.image);
            if let Some(f) = w.finder.as_mut() {
                let (width, height) = (self.geometry.width(), self.geometry.height());
                let judged = f.judge(image, width, height, &mut job.spots, self.board);
                (job.hit, job.vetoed) = (judged.hit, judged.vetoed);
                job.chunked &= !job.vetoed;
                if let (Some(b), true) = (self.board, job.glance) {
                    b.show(f.glance(job.frame, width, height, &job.spots));
                }
            }
            if job.chunked {
                w.comp.compress(image, &mut job.chunk.make_mut());
                self.compressed.fetch_add(1, Ordering::Relaxed);
            }
        } else if job.chunked {
            // only the chunk is wanted: made from the slot, without the image in memory
            w.asm.compress_words(raw, &mut w.comp, &mut w.staging, &mut job.chunk.make_mut());
        }
    }

    /// The write stage: puts the frames back into the source's order, then gives each to
    /// the pedestal run and the board, publishes its chunk and writes it.
    fn write_worker(&'a self, sinks: Sinks<'a>) -> WorkerFn<'a, Box<Job>> {
        let Sinks { mut writer, mut stream, mut pedestal_run, .. } = sinks;
        let mut order = Reorder::new();
        Box::new(move |job: Box<Job>, _: &Emit<Box<Job>>| {
            order.push(job.seq, job, |job| {
                self.delivered.fetch_add(1, Ordering::Relaxed);
                self.take_image(&job, pedestal_run.as_deref_mut());
                if job.vetoed {
                    // counted by the finder; neither written nor streamed
                    self.record(job.times.as_ref().expect("set by the source"), None);
                    let _ = self.pool.send(job);
                    return;
                }
                let chunk = self.canned.unwrap_or(&job.chunk);
                let spots = self.finding.is_some().then_some((&job.spots[..], job.hit));
                if let Some(s) = stream.as_deref_mut() {
                    self.demand.publish(s, job.chunked, job.frame, &chunk.read(), &job.missing, spots);
                }
                let mut st = self.stats.lock().expect("not poisoned");
                if let Some(w) = writer.as_deref_mut() {
                    write_one(w, &mut st, job.frame, chunk, &job.missing, job.bytes_in, spots);
                }
                drop(st);
                self.record(job.times.as_ref().expect("set by the source"), Some(Instant::now()));
                self.hand_back(job);
            });
        })
    }

    /// A written frame's buffer: to the program that reads the frames (a counting
    /// detector's, assembled), else back to the pool.
    fn hand_back(&self, job: Box<Job>) {
        let (Some(to), Some(f)) = (&self.deliver, &self.finding) else {
            let _ = self.pool.send(job);
            return;
        };
        let pixel_bytes = f.pixel_bytes();
        let bytes = self.geometry.width() * self.geometry.height() * pixel_bytes;
        let d = Delivered { job: Some(job), pool: self.pool.clone(), pixel_bytes, bytes };
        // a holder that went away takes no more frames: they go back to the pool
        if let Err(e) = to.send(Processed::counted(d)) {
            drop(e.into_inner());
        }
    }

    /// The assembled image of a frame for the pedestal run and, when a glance is due, the
    /// board.
    fn take_image(&self, job: &Job, pedestal_run: Option<&mut PedestalRun>) {
        let words = (job.assembled && self.decoder.is_none()).then_some(&job.image[..]);
        if let (Some(run), Some(words)) = (pedestal_run, words) {
            // missing pixels read as the error word: only whole frames are dark frames
            if job.complete {
                run.push(words);
            } else {
                run.leave_out();
            }
        }
        if let (Some(b), Some(words)) = (self.board.filter(|_| job.glance), words) {
            b.show(Glance::raw(&self.geometry, job.frame, words));
        }
    }

    fn record(&self, t: &FrameTimes, written: Option<Instant>) {
        self.stats.lock().expect("not poisoned").latency.record(t, written);
        if let Some(b) = self.board {
            b.record(t, written);
        }
    }
}

/// Writes one frame's chunk and counts it; after a write error, frames are counted as not
/// saved.
fn write_one(w: &mut NxmxWriter, s: &mut ConsumeStats, frame: u64, chunk: &SharedChunk, missing: &[(usize, usize)], bytes_in: u64, spots: Option<(&[Spot], bool)>) {
    if s.write_error.is_some() {
        s.not_saved += 1;
        return;
    }
    let before = w.bytes_written;
    let written = w.write_shared(frame, chunk, missing).and_then(|()| spots.map_or(Ok(()), |(sp, hit)| w.write_spots(sp, sp.len(), hit)));
    match written {
        Ok(()) => {
            s.bytes_in += bytes_in;
            s.bytes_out += w.bytes_written - before;
            (s.chunks_handed_on, s.io_waits) = (w.chunks_handed_on, w.io_waits);
            s.written += 1;
        }
        Err(e) => s.write_failed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdaq_detector::jungfrau::MODULE_BYTES;

    #[test]
    fn an_assemble_worker_that_panics_ends_the_chain_and_every_frame_not_written_is_counted() {
        let dir = std::env::temp_dir().join(format!("rdaq-consume-panic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let mut cfg = crate::config::Config::default();
        (cfg.detector.modules, cfg.process.mode) = (1, "none".into());
        let g = cfg.geometry().expect("one module");
        let (meta, setup) = crate::plan::plan(&cfg, g, None).expect("a plan");
        assert!(setup.is_none(), "raw frames");
        let mut writer = NxmxWriter::create(&dir.join("raw_master.h5"), &meta, true).expect("a file");
        let (rx, mut placer) = Receiver::in_memory(1, MODULE_BYTES as u64, 6).expect("an in-memory receiver");
        // the fourth of forty frames makes its worker panic; the pool has buffers for twelve
        let first = crate::fault::PANIC_FRAME - 3;
        let stats = std::thread::scope(|s| {
            s.spawn(move || {
                for f in first..first + 40 {
                    let free = placer.free().next();
                    let slot = free.unwrap_or_else(|| placer.wait_released().expect("the chain gives slots back"));
                    placer.hand(slot, f);
                }
            });
            let workers = Workers { count: 2, ring_frames: 2 };
            let sinks = Sinks { geometry: g, writer: Some(&mut writer), stream: None, sent: None, board: None, decoder: None, pedestal_run: None, workers, canned: None, finding: None, deliver: None };
            consume(&rx, sinks, &ProgressBar::hidden(), None, |_| {}).expect("the chain ends")
        });
        let closed = writer.finish().expect("the files close");
        std::fs::remove_dir_all(&dir).ok();
        let why = stats.stage_failure.expect("the panic is reported");
        assert!(why.contains("of the assemble stage panicked") && why.contains("a bug met frame 7777777"), "{why}");
        assert_eq!((stats.written, closed.frames), (3, 3), "the frames before it, in order");
        assert_eq!(stats.not_saved, 37, "the frame and every frame after it counted");
    }
}
