//! `rdaq write`: the file writer on the other end of a stream. It consumes one Stream V2
//! series (rdaq's, or another source's with JUNGFRAU-sized images) and writes the NXmx master
//! and data files from it, putting each image's bslz4 chunk into its data file as it came
//! (no decompression, no re-compression). A receiver host streams; this runs on another.
//!
//! From several sources (the receivers of one acquisition, each streaming its own series of
//! whole frames), it writes one series: each source's images come in its frame order, and
//! the writer merges them, writing the lowest frame number once every source still running
//! has one waiting (or has ended). A source that falls more than [`MAX_WAITING`] images
//! behind the others no longer holds them back: what it sends later is written when it
//! comes, and counted as out of order.
//!
//! Receivers that each hold some of the modules (a spatial plan; their `start` says which)
//! send parts of every image: the parts of one frame are joined into the whole image
//! ([`crate::parts`]), and the modules of a part that did not come are marked missing.
//!
//! With a stream endpoint, the merged series is also published again as one Stream V2
//! series ([`crate::joined`]): one live stream of a multi-receiver acquisition; the files
//! are then optional.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use indicatif::ProgressBar;
use rdaq_sink::{DetectorPart, NxmxMeta, NxmxWriter};
use rdaq_stream::{decode, Buffer, Consumer, Image, Message, SocketKind, StreamConfig, StreamStats};

use crate::joined::Joined;
use crate::outputs;
use crate::parts::PartJoiner;

/// Images waiting for the other sources, at most, before the lowest is written anyway.
pub const MAX_WAITING: usize = 256;

pub struct WriteOptions {
    /// The publishers' endpoints, e.g. `tcp://receiver-host:31001` (one per receiver).
    pub from: Vec<String>,
    pub socket: SocketKind,
    /// Where the files go (none: no files, the joined stream only).
    pub dir: Option<PathBuf>,
    /// Publish the merged series again as one Stream V2 series here.
    pub stream: Option<StreamConfig>,
    /// Files are `<name>_master.h5`, `<name>_data_000001.h5`, ... (default name "series").
    pub name: Option<String>,
    /// Images per data file; default what the source says (rdaq's), else 1000.
    pub images_per_file: Option<usize>,
    pub overwrite: bool,
    /// Give up when no message came for this long (default: wait until `end` or Ctrl-C).
    pub idle_timeout: Option<Duration>,
}

/// What the writer did.
#[derive(Debug, Default, serde::Serialize)]
pub struct WriteReport {
    pub master: Option<PathBuf>,
    /// Images the files hold (set when they are closed).
    pub images_written: u64,
    /// Images the series' numbering skipped (dropped upstream, or taken by another consumer),
    /// summed over the sources.
    pub images_missing: u64,
    pub images_before_start: u64,
    /// Images written after one of a higher frame number (a source that fell behind).
    pub images_out_of_order: u64,
    /// Parts of images (receivers of some of the modules): images written with the parts of
    /// some sources absent (their modules marked missing: a frame that receiver vetoed or
    /// never took), and parts that came after their frame was written (not joined).
    pub images_with_parts_absent: u64,
    pub parts_late: u64,
    pub messages_undecodable: u64,
    pub bytes: u64,
    /// First to last image.
    pub data_window_s: f64,
    /// Every source's series ended.
    pub ended: bool,
    pub write_error: Option<String>,
    /// Each source's part.
    pub sources: Vec<SourceReport>,
    /// The joined stream: where it was published and what it sent.
    pub stream: Option<JoinedReport>,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct JoinedReport {
    pub endpoint: String,
    #[serde(flatten)]
    pub stats: StreamStats,
}

/// What one source sent.
#[derive(Debug, Default, serde::Serialize)]
pub struct SourceReport {
    pub endpoint: String,
    pub images: u64,
    /// The image numbers its series skipped, counted.
    pub images_missing: u64,
    pub ended: bool,
}

impl WriteReport {
    /// Whether the series arrived whole and was saved.
    pub fn complete(&self) -> bool {
        self.ended && self.images_missing == 0 && self.images_before_start == 0 && self.messages_undecodable == 0 && self.parts_late == 0 && self.write_error.is_none()
    }

    pub fn print(&self) {
        println!("---- rdaq write ----");
        let rate = if self.data_window_s > 0.0 { self.images_written as f64 / self.data_window_s } else { 0.0 };
        let mb = if self.data_window_s > 0.0 { self.bytes as f64 / 1e6 / self.data_window_s } else { 0.0 };
        println!("images      : {} written ({:.1} MB compressed, {rate:.1} images/s, {mb:.1} MB/s over the data window)", self.images_written, self.bytes as f64 / 1e6);
        println!("missing     : {} images skipped in the series' numbering, {} before start, {} undecodable messages", self.images_missing, self.images_before_start, self.messages_undecodable);
        if self.sources.len() > 1 {
            for s in &self.sources {
                println!("source      : {}: {} images, {} skipped, {}", s.endpoint, s.images, s.images_missing, if s.ended { "ended" } else { "no end" });
            }
            println!("order       : {} images written out of frame order", self.images_out_of_order);
        }
        if self.images_with_parts_absent > 0 || self.parts_late > 0 {
            println!("parts       : {} images with some sources' parts absent (marked missing), {} parts late (not joined)", self.images_with_parts_absent, self.parts_late);
        }
        println!("end         : {}", if self.ended { "received" } else { "not received (timeout or interrupted)" });
        match &self.master {
            Some(m) => println!("output      : {}", m.display()),
            None => println!("output      : no files"),
        }
        if let Some(j) = &self.stream {
            let s = &j.stats;
            println!("stream      : {}: {} images sent, {} dropped, {} waits; start {}, end {}", j.endpoint, s.images_sent, s.images_dropped, s.waits,
                if s.start_sent { "sent" } else { "not sent" }, if s.end_sent { "sent" } else { "not sent" });
        }
        if let Some(e) = &self.write_error {
            println!("write error : {e}");
        }
    }
}

/// The series being written (to files, or only to the joined stream).
struct Series {
    meta: NxmxMeta,
    writer: Option<NxmxWriter>,
    spots: bool,
    first: Option<Instant>,
    last: Option<Instant>,
    /// The highest frame number written so far.
    highest: Option<u64>,
    /// Joins the parts when the sources hold parts of the detector.
    joiner: Option<PartJoiner>,
}

/// One publisher and the images of its series waiting for the merge.
struct Source {
    consumer: Consumer,
    report: SourceReport,
    started: bool,
    /// The images its `start` said its series holds.
    announced: Option<u64>,
    /// The modules it holds, when its images are parts of the detector's.
    part: Option<DetectorPart>,
    next_id: u64,
    waiting: VecDeque<Image>,
}

/// Consumes one series from each of `o.from` and writes them as one; stops when every
/// source ended, when `stop` is set, or after `o.idle_timeout` without a message.
pub fn write(o: &WriteOptions, stop: &AtomicBool, bar: &ProgressBar) -> anyhow::Result<WriteReport> {
    if o.from.is_empty() {
        bail!("--from: at least one stream endpoint");
    }
    if o.dir.is_none() && o.stream.is_none() {
        bail!("nothing to write: give --out (files), --stream (one joined stream) or both");
    }
    if let Some(dir) = &o.dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut joined = o.stream.as_ref().map(Joined::bind).transpose()?;
    let mut sources = Vec::with_capacity(o.from.len());
    for e in &o.from {
        let consumer = Consumer::connect(e, o.socket, 1000)?;
        sources.push(Source { consumer, report: SourceReport { endpoint: e.clone(), ..Default::default() }, started: false, announced: None, part: None, next_id: 0, waiting: VecDeque::new() });
    }
    let mut report = consume(o, stop, bar, &mut sources, joined.as_mut())?;
    report.images_missing = sources.iter().map(|s| s.report.images_missing).sum();
    if let Some(j) = joined {
        let endpoint = j.endpoint();
        report.stream = Some(JoinedReport { endpoint, stats: j.end(report.images_missing)? });
    }
    report.sources = sources.into_iter().map(|s| s.report).collect();
    Ok(report)
}

/// Takes the sources' messages until every source ended, `stop` is set, or `o.idle_timeout`
/// passed without a message, merging their images into the series.
fn consume(o: &WriteOptions, stop: &AtomicBool, bar: &ProgressBar, sources: &mut [Source], mut joined: Option<&mut Joined>) -> anyhow::Result<WriteReport> {
    let (mut buf, mut report, mut series) = (Buffer::new(), WriteReport::default(), None::<Series>);
    let mut heard = Instant::now();
    while !stop.load(Ordering::Relaxed) && !sources.iter().all(|s| s.report.ended) {
        let mut any = false;
        for k in 0..sources.len() {
            let wait = Duration::from_millis(if any { 0 } else { 200 / sources.len() as u64 });
            if sources[k].report.ended || !sources[k].consumer.recv(&mut buf, wait)? {
                continue;
            }
            any = true;
            take(o, &mut sources[k], &buf, &mut series, &mut report, bar)?;
        }
        if let Some(s) = series.as_mut() {
            merge(s, sources, Merge::InOrder, &mut report, bar, joined.as_deref_mut())?;
        }
        if any {
            heard = Instant::now();
        } else if o.idle_timeout.is_some_and(|t| heard.elapsed() > t) {
            break;
        }
    }
    bar.finish();
    report.ended = sources.iter().all(|s| s.report.ended);
    if let Some(mut s) = series {
        // what still waits (interrupted, or a source that never ended) is written too
        merge(&mut s, sources, Merge::All, &mut report, bar, joined.as_deref_mut())?;
        // a series without images (every frame vetoed) still starts and ends
        if let Some(j) = joined.filter(|j| !j.started()) {
            j.start(&joined_meta(&s.meta, sources))?;
        }
        close(s, &mut report)?;
    }
    Ok(report)
}

/// Takes one message of source `src`: a start opens the series (or must match it), an
/// image waits for the merge, an end ends the source.
fn take(o: &WriteOptions, src: &mut Source, buf: &Buffer, series: &mut Option<Series>, report: &mut WriteReport, bar: &ProgressBar) -> anyhow::Result<()> {
    let from = &src.report.endpoint;
    match decode(buf) {
        Ok(Message::Start(_)) if src.started => bail!("{from}: a second series started before the first ended; rdaq write writes one series per source"),
        Ok(Message::Start(meta)) => {
            src.started = true;
            src.announced = meta.number_of_images;
            src.part = meta.part.clone();
            match series {
                None => *series = Some(open(o, *meta, bar)?),
                Some(s) => same_images(s, &meta).with_context(|| format!("{from}: its series cannot be written with the first source's"))?,
            }
        }
        Ok(Message::Image(_)) if !src.started => report.images_before_start += 1,
        Ok(Message::Image(img)) => {
            src.report.images_missing += img.image_id.saturating_sub(src.next_id);
            src.next_id = src.next_id.max(img.image_id + 1);
            src.report.images += 1;
            src.waiting.push_back(img);
        }
        Ok(Message::End) => src.report.ended = true,
        Err(e) => {
            if report.messages_undecodable == 0 {
                eprintln!("rdaq write: a message from {from} is not Stream V2: {e}");
            }
            report.messages_undecodable += 1;
        }
    }
    Ok(())
}

/// Fails unless a second source's series has the first one's images (size, pixels, spots),
/// or parts of the same detector when the first's are parts.
fn same_images(s: &Series, b: &NxmxMeta) -> anyhow::Result<()> {
    let a = &s.meta;
    match (&s.joiner, &b.part) {
        (Some(j), Some(p)) if j.detector() != p.detector => bail!("its images are parts of a {}-module detector, the first's of a {}-module one", p.detector.modules, j.detector().modules),
        (Some(_), None) => bail!("its images are whole images, the first source's parts of them (modules held by one receiver each)"),
        (None, Some(_)) => bail!("its images are parts of the detector (modules held by one receiver each), the first source's whole images"),
        _ => {}
    }
    let (ga, gb) = (&a.geometry, &b.part.as_ref().map_or(b.geometry, |p| p.detector));
    if (ga.height(), ga.width()) != (gb.height(), gb.width()) || a.pixel != b.pixel || a.max_spots != b.max_spots {
        bail!("its images are {}x{} {:?} with {} spots kept, the first's {}x{} {:?} with {}", gb.height(), gb.width(), b.pixel, b.max_spots, ga.height(), ga.width(), a.pixel, a.max_spots);
    }
    Ok(())
}

/// How much of what waits [`merge`] writes.
#[derive(Clone, Copy, PartialEq)]
enum Merge {
    /// The lowest frame, as long as every source still running has one waiting, or too
    /// many wait.
    InOrder,
    /// Everything, in frame order (the sources are done, or the writer stops).
    All,
}

/// Writes the waiting images in frame order, as `how` says. The joined stream starts with
/// the first.
fn merge(s: &mut Series, sources: &mut [Source], how: Merge, report: &mut WriteReport, bar: &ProgressBar, mut joined: Option<&mut Joined>) -> anyhow::Result<()> {
    loop {
        let held = how == Merge::InOrder && sources.iter().any(|x| !x.report.ended && x.waiting.is_empty());
        let waiting: usize = sources.iter().map(|x| x.waiting.len()).sum();
        if waiting == 0 || (held && waiting <= MAX_WAITING) {
            return Ok(());
        }
        if let Some(j) = joined.as_deref_mut().filter(|j| !j.started()) {
            j.start(&joined_meta(&s.meta, sources))?;
        }
        let k = (0..sources.len()).filter(|&k| !sources[k].waiting.is_empty()).min_by_key(|&k| sources[k].waiting[0].frame_number).expect("an image waits");
        let img = match s.joiner.is_some() {
            true => match join_parts(s, sources, sources[k].waiting[0].frame_number, report) {
                Some(img) => img,
                None => continue,
            },
            false => sources[k].waiting.pop_front().expect("an image waits"),
        };
        if s.highest.is_some_and(|h| img.frame_number < h) {
            report.images_out_of_order += 1;
        }
        s.highest = s.highest.max(Some(img.frame_number));
        if let Some(j) = joined.as_deref_mut() {
            j.image(&img)?;
        }
        put(s, img, report);
        bar.inc(1);
    }
}

/// The whole image of frame `frame` from the parts of it waiting first in line; `None`
/// when they came after the frame was written (counted late), or cannot be joined
/// (counted undecodable).
fn join_parts(s: &mut Series, sources: &mut [Source], frame: u64, report: &mut WriteReport) -> Option<Image> {
    let taken: Vec<(usize, Image)> =
        sources.iter_mut().enumerate().filter(|(_, x)| x.waiting.front().is_some_and(|i| i.frame_number == frame)).map(|(k, x)| (k, x.waiting.pop_front().expect("an image waits"))).collect();
    if s.highest.is_some_and(|h| frame <= h) {
        if report.parts_late == 0 {
            eprintln!("rdaq write: parts of frame {frame} came after it was written (a source fell behind): counted, not joined");
        }
        report.parts_late += taken.len() as u64;
        return None;
    }
    let parts: Vec<(&DetectorPart, Image)> = taken.into_iter().map(|(k, img)| (sources[k].part.as_ref().expect("a source of parts"), img)).collect();
    let brought: usize = parts.iter().map(|(p, _)| p.module_ids.len()).sum();
    let joiner = s.joiner.as_mut().expect("parts are joined");
    match joiner.join(&parts) {
        Ok(mut img) => {
            // as one receiver would: at most max_spots
            if let Some((spots, _)) = img.spots.as_mut() {
                spots.truncate(s.meta.max_spots);
            }
            report.images_with_parts_absent += u64::from(brought < joiner.detector().modules as usize);
            Some(img)
        }
        Err(e) => {
            if report.messages_undecodable == 0 {
                eprintln!("rdaq write: frame {frame}: a part cannot be joined: {e}");
            }
            report.messages_undecodable += 1;
            None
        }
    }
}

/// The joined series' metadata: the first source's, holding every source's images when each
/// said how many (sources of parts each a share of the images as large as their part of
/// the modules).
fn joined_meta(first: &NxmxMeta, sources: &[Source]) -> NxmxMeta {
    let modules = first.geometry.modules as u64;
    let shares: Option<u64> = sources.iter().map(|x| Some(x.announced? * x.part.as_ref().map_or(modules, |p| p.module_ids.len() as u64))).sum();
    let announced = shares.filter(|n| n % modules == 0).map(|n| n / modules);
    NxmxMeta { number_of_images: announced, ..first.clone() }
}

/// Creates the files of the series the `start` message describes (none without a
/// directory): of the whole detector when its images are parts of it.
fn open(o: &WriteOptions, meta: NxmxMeta, bar: &ProgressBar) -> anyhow::Result<Series> {
    let (mut meta, joiner) = match meta.part.clone() {
        Some(part) => {
            let joiner = PartJoiner::new(part.detector, meta.pixel);
            (whole_meta(meta, &part), Some(joiner))
        }
        None => (meta, None),
    };
    if let Some(n) = o.images_per_file {
        meta.images_per_file = n;
    }
    if let Some(n) = meta.number_of_images {
        bar.set_length(n);
    }
    let writer = match &o.dir {
        Some(dir) => {
            let name = o.name.clone().unwrap_or_else(|| "series".to_string());
            let master = dir.join(format!("{name}_master.h5"));
            outputs::refuse_existing(outputs::series_files(&master).iter().map(PathBuf::as_path), o.overwrite)?;
            let writer = NxmxWriter::create(&master, &meta, o.overwrite)?;
            outputs::warn_without_reserve(&writer, &master);
            Some(writer)
        }
        None => None,
    };
    Ok(Series { spots: meta.max_spots > 0, meta, writer, first: None, last: None, highest: None, joiner })
}

/// The series of the whole detector that a part's series belongs to: its images and
/// beam centre (the part's counts from its first module).
fn whole_meta(part_meta: NxmxMeta, part: &DetectorPart) -> NxmxMeta {
    let (r0, c0) = part.detector.origin(part.module_ids[0]);
    let [x, y] = part_meta.beam_center;
    NxmxMeta { geometry: part.detector, beam_center: [x + c0 as f64, y + r0 as f64], part: None, ..part_meta }
}

/// Writes one image's chunk as it came, with its spot list.
fn put(s: &mut Series, img: Image, report: &mut WriteReport) {
    let now = Instant::now();
    s.first.get_or_insert(now);
    s.last = Some(now);
    let Some(writer) = s.writer.as_mut().filter(|_| report.write_error.is_none()) else { return };
    let want = s.meta.pixel.bytes();
    if img.elem != want {
        report.write_error = Some(format!("image {} (frame {}): {}-byte pixels, the series' start said {want}", img.image_id, img.frame_number, img.elem));
        return;
    }
    let r = writer.write_chunk(img.frame_number, &img.chunk, &img.missing).and_then(|()| match (s.spots, &img.spots) {
        (true, Some((spots, hit))) => writer.write_spots(spots, spots.len(), *hit),
        (true, None) => writer.write_spots(&[], 0, false),
        (false, _) => Ok(()),
    });
    match r {
        Ok(()) => report.bytes += img.chunk.len() as u64,
        Err(e) => {
            eprintln!("rdaq write: {e}: writing stops; images still arriving are counted but not saved");
            report.write_error = Some(e.to_string());
        }
    }
}

fn close(s: Series, report: &mut WriteReport) -> anyhow::Result<()> {
    report.data_window_s = match (s.first, s.last) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => 0.0,
    };
    let Some(writer) = s.writer else { return Ok(()) };
    let closed = writer.finish()?;
    if let Some(why) = closed.unreadable {
        report.write_error.get_or_insert(why);
    }
    report.images_written = closed.frames;
    report.master = Some(closed.path);
    Ok(())
}
