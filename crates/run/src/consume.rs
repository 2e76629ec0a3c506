//! The consumer side of a receiver: takes finished frames, writes them to the NXmx file,
//! gives the slots back, and counts what it saw.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;

use indicatif::ProgressBar;
use rdaq_detector::Geometry;
use rdaq_receiver::{FrameReady, FrameStatus, Receiver};
use rdaq_process::bitshuffle::{Codec, Compressor};
use rdaq_process::pedestal_run::PedestalRun;
use rdaq_sink::NxmxWriter;

use crate::assemble::{Assembler, Decoder};
use crate::pairs::{Outcome, Pairs};
use crate::board::{Board, Glance};
use crate::latency::{FrameTimes, Latency};
use crate::stream::{Stream, Wanted};

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
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub first: Option<Instant>,
    pub last: Option<Instant>,
    /// What the consumer did with the frames, for the summary.
    pub what: &'static str,
    /// Per-frame latency, step by step.
    pub latency: Latency,
    /// Reset frames subtracted from their data frames (not written).
    pub reset_frames: u64,
    /// Data frames whose reset frame did not come (lost, discarded, refused, or finished
    /// after a newer reset frame): not written.
    pub without_reset: u64,
    /// Reset frames whose data frame did not come: given back unused.
    pub unused_resets: u64,
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
    Assembler::new(*geometry, None, false).missing(rx, f)
}

/// Pairs of a data frame and its reset frame that may wait for their other frame at once
/// (at most a quarter of the ring: waiting frames hold their slots).
const PAIRS_WAITING: usize = 8;

/// How long the consumer waits for a frame before looking at its stop flag.
const POLL: Duration = Duration::from_millis(50);

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

/// Where the consumer puts frames: the assembled image (the detector's `geometry`) goes
/// to the NXmx files and the stream, compressed once for both.
pub struct Sinks<'a> {
    pub geometry: Geometry,
    pub writer: Option<&'a mut NxmxWriter>,
    pub stream: Option<&'a mut Stream>,
    /// When the frames were sent, where the detector runs in this process.
    pub sent: Option<&'a rdaq_emulator::clock::SendClock>,
    /// Where latency and a glance at the latest frame are shown while the acquisition goes
    /// on (the dashboard, a daemon's `/metrics`); events are `on_frame`'s to report.
    pub board: Option<&'a Board>,
    /// How a described detector's module frames become module images (`None`: JUNGFRAU's
    /// 16-bit module frames, put in place as they are).
    pub decoder: Option<Decoder>,
    /// A JUNGFRAU pedestal run that takes every complete frame's image.
    pub pedestal_run: Option<&'a mut PedestalRun>,
}

/// Consumes frames until the receiver finishes, or until `until` is set and no frame is
/// waiting: assembles each frame's modules into the detector image (gaps marked),
/// compresses it once, publishes the chunk on the stream and writes it. Without a writer and
/// a stream, frames are only counted. `on_frame` sees every frame first.
pub fn consume(rx: &Receiver, mut sinks: Sinks, bar: &ProgressBar, until: Option<&AtomicBool>, mut on_frame: impl FnMut(&FrameReady)) -> anyhow::Result<ConsumeStats> {
    let assemble = sinks.writer.is_some() || sinks.stream.is_some() || sinks.pedestal_run.is_some();
    let what = match (sinks.writer.is_some(), sinks.stream.is_some()) {
        (true, _) => "assembling and writing frames",
        (false, true) => "assembling and streaming frames",
        (false, false) => "counting frames",
    };
    let mut s = ConsumeStats { what, ..Default::default() };
    let asm = Assembler::new(sinks.geometry, sinks.decoder.take(), assemble);
    let codec = sinks.writer.as_ref().map_or(Codec::Lz4, |w| w.meta().codec);
    let mut enc = Encode { comp: Compressor::new(asm.pixel_bytes(), 0, codec), asm, chunk: Vec::new() };
    // a descrambled detector's frames waiting for their partners (their slots held), and
    // what an offered frame settled
    let mut pairs = Pairs::new(PAIRS_WAITING.min(rx.buffer_map().buffers.len() / 4));
    let mut settled = Vec::with_capacity(4);
    while let Some(f) = next_frame(rx, until) {
        on_frame(&f);
        bar.inc(1);
        if !s.arrived(&f) || !assemble {
            if assemble && enc.asm.needs_reset() {
                pairs.gone(f.frame(), |o| settled.push(o));
            }
            record(&mut s, sinks.board, &FrameTimes::of(&f, sinks.sent), None);
            rx.release(f)?;
            settle(rx, &mut sinks, &mut enc, &mut s, &mut settled)?;
            continue;
        }
        if !enc.asm.needs_reset() {
            emit(rx, &mut sinks, &mut enc, &mut s, f, None)?;
            continue;
        }
        pairs.offer(f, |o| settled.push(o));
        settle(rx, &mut sinks, &mut enc, &mut s, &mut settled)?;
    }
    pairs.finish(|o| settled.push(o));
    settle(rx, &mut sinks, &mut enc, &mut s, &mut settled)?;
    Ok(s)
}

/// What turns a frame into the chunk the file and the stream take, kept from frame to frame.
struct Encode {
    asm: Assembler,
    comp: Compressor,
    chunk: Vec<u8>,
}

/// Writes the pairs of data and reset frames settled, and gives back every frame settled
/// (counting the data frames without their reset frame).
fn settle(rx: &Receiver, sinks: &mut Sinks, enc: &mut Encode, s: &mut ConsumeStats, settled: &mut Vec<Outcome<FrameReady>>) -> anyhow::Result<()> {
    for o in settled.drain(..) {
        match o {
            Outcome::Pair { data, reset } => {
                s.reset_frames += 1;
                emit(rx, sinks, enc, s, data, Some(reset))?;
            }
            Outcome::WithoutReset(d) => {
                s.without_reset += 1;
                record(s, sinks.board, &FrameTimes::of(&d, sinks.sent), None);
                rx.release(d)?;
            }
            Outcome::UnusedReset(r) => {
                s.unused_resets += 1;
                rx.release(r)?;
            }
        }
    }
    Ok(())
}

/// Assembles frame `f` (minus its reset frame, when given), compresses it once, publishes
/// and writes it, and gives back its slots. Each step is done for the sinks that take its
/// result: a frame nobody takes (no file, a stream nobody reads) is neither assembled nor
/// compressed.
fn emit(rx: &Receiver, sinks: &mut Sinks, enc: &mut Encode, s: &mut ConsumeStats, f: FrameReady, reset: Option<FrameReady>) -> anyhow::Result<()> {
    let mut times = FrameTimes::of(&f, sinks.sent);
    let wanted = sinks.stream.as_deref_mut().map(Stream::wants_image);
    let chunked = sinks.writer.is_some() || wanted.is_some_and(Wanted::any);
    let glance = sinks.board.filter(|b| b.glance_due());
    let raw = rx.data(&f)?;
    let mut missing = Vec::new();
    if chunked || glance.is_some() || sinks.pedestal_run.is_some() {
        missing = enc.asm.missing(rx, &f);
        if let Some(r) = &reset {
            missing.extend(enc.asm.missing(rx, r));
        }
        let reset_raw = reset.as_ref().map(|r| rx.data(r)).transpose()?;
        let image = enc.asm.assemble(raw, reset_raw);
        if chunked {
            enc.comp.compress(image, &mut enc.chunk);
        }
        take_image(sinks, &enc.asm, &f, glance);
    }
    times.processed = Some(Instant::now());
    if let (Some(st), Some(w)) = (sinks.stream.as_deref_mut(), wanted) {
        st.image(w, f.frame(), &enc.chunk, &missing, None);
    }
    if let Some(w) = sinks.writer.as_deref_mut() {
        write_one(w, s, f.frame(), &enc.chunk, &missing, raw.len() as u64);
    }
    record(s, sinks.board, &times, Some(Instant::now()));
    rx.release(f)?;
    if let Some(r) = reset {
        rx.release(r)?;
    }
    Ok(())
}

/// The assembled image of frame `f` for the pedestal run and, when a glance is due, the
/// board.
fn take_image(sinks: &mut Sinks, asm: &Assembler, f: &FrameReady, glance: Option<&Board>) {
    if let (Some(run), Some(words)) = (sinks.pedestal_run.as_deref_mut(), asm.words()) {
        // missing pixels read as the error word: only whole frames are dark frames
        if f.status() == FrameStatus::Complete {
            run.push(words);
        } else {
            run.leave_out();
        }
    }
    if let Some((b, words)) = glance.zip(asm.words()) {
        b.show(Glance::raw(&sinks.geometry, f.frame(), words));
    }
}

fn record(s: &mut ConsumeStats, board: Option<&Board>, t: &FrameTimes, written: Option<Instant>) {
    s.latency.record(t, written);
    if let Some(b) = board {
        b.record(t, written);
    }
}

/// Writes one frame's chunk and counts it; after a write error, frames are counted as not
/// saved.
fn write_one(w: &mut NxmxWriter, s: &mut ConsumeStats, frame: u64, chunk: &[u8], missing: &[(usize, usize)], bytes_in: u64) {
    if s.write_error.is_some() {
        s.not_saved += 1;
        return;
    }
    let before = w.bytes_written;
    match w.write_chunk(frame, chunk, missing) {
        Ok(()) => {
            s.bytes_in += bytes_in;
            s.bytes_out += w.bytes_written - before;
            s.written += 1;
        }
        Err(e) => s.write_failed(e),
    }
}
