//! `rdaq write`: the file writer on the other end of a stream. It consumes one Stream V2
//! series (rdaq's, or another source's with JUNGFRAU-sized images) and writes the NXmx master
//! and data files from it, putting each image's bslz4 chunk into its data file as it came
//! (no decompression, no re-compression). A receiver host streams; this runs on another.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use indicatif::ProgressBar;
use rdaq_sink::{NxmxMeta, NxmxWriter};
use rdaq_stream::{decode, Buffer, Consumer, Image, Message, SocketKind};

use crate::outputs;

pub struct WriteOptions {
    /// The publisher's endpoint, e.g. `tcp://receiver-host:31001`.
    pub from: String,
    pub socket: SocketKind,
    pub dir: PathBuf,
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
    /// Images the series' numbering skipped (dropped upstream, or taken by another consumer).
    pub images_missing: u64,
    pub images_before_start: u64,
    pub messages_undecodable: u64,
    pub bytes: u64,
    /// First to last image.
    pub data_window_s: f64,
    pub ended: bool,
    pub write_error: Option<String>,
}

impl WriteReport {
    /// Whether the series arrived whole and was saved.
    pub fn complete(&self) -> bool {
        self.ended && self.images_missing == 0 && self.images_before_start == 0 && self.messages_undecodable == 0 && self.write_error.is_none()
    }

    pub fn print(&self) {
        println!("---- rdaq write ----");
        let rate = if self.data_window_s > 0.0 { self.images_written as f64 / self.data_window_s } else { 0.0 };
        let mb = if self.data_window_s > 0.0 { self.bytes as f64 / 1e6 / self.data_window_s } else { 0.0 };
        println!("images      : {} written ({:.1} MB compressed, {rate:.1} images/s, {mb:.1} MB/s over the data window)", self.images_written, self.bytes as f64 / 1e6);
        println!("missing     : {} images skipped in the series' numbering, {} before start, {} undecodable messages", self.images_missing, self.images_before_start, self.messages_undecodable);
        println!("end         : {}", if self.ended { "received" } else { "not received (timeout or interrupted)" });
        match &self.master {
            Some(m) => println!("output      : {}", m.display()),
            None => println!("output      : none (no series started)"),
        }
        if let Some(e) = &self.write_error {
            println!("write error : {e}");
        }
    }
}

/// The series being written.
struct Series {
    writer: NxmxWriter,
    spots: bool,
    next_id: u64,
    first: Option<Instant>,
    last: Option<Instant>,
}

/// Consumes one series from `o.from` and writes it; stops at `end`, when `stop` is set, or
/// after `o.idle_timeout` without a message.
pub fn write(o: &WriteOptions, stop: &AtomicBool, bar: &ProgressBar) -> anyhow::Result<WriteReport> {
    std::fs::create_dir_all(&o.dir).with_context(|| format!("cannot create {}", o.dir.display()))?;
    let mut consumer = Consumer::connect(&o.from, o.socket, 1000)?;
    let (mut buf, mut report, mut series) = (Buffer::new(), WriteReport::default(), None::<Series>);
    let mut heard = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if !consumer.recv(&mut buf, Duration::from_millis(200))? {
            if o.idle_timeout.is_some_and(|t| heard.elapsed() > t) {
                break;
            }
            continue;
        }
        heard = Instant::now();
        match decode(&buf) {
            Ok(Message::Start(meta)) if series.is_none() => series = Some(open(o, *meta, bar)?),
            Ok(Message::Start(_)) => bail!("{}: a second series started before the first ended; rdaq write writes one series", o.from),
            Ok(Message::Image(img)) => match series.as_mut() {
                Some(s) => {
                    put(s, img, &mut report)?;
                    bar.inc(1);
                }
                None => report.images_before_start += 1,
            },
            Ok(Message::End) => {
                report.ended = true;
                break;
            }
            Err(e) => {
                if report.messages_undecodable == 0 {
                    eprintln!("rdaq write: a message from {} is not Stream V2: {e}", o.from);
                }
                report.messages_undecodable += 1;
            }
        }
    }
    bar.finish();
    if let Some(s) = series {
        close(s, &mut report)?;
    }
    Ok(report)
}

/// Creates the files of the series the `start` message describes.
fn open(o: &WriteOptions, mut meta: NxmxMeta, bar: &ProgressBar) -> anyhow::Result<Series> {
    if let Some(n) = o.images_per_file {
        meta.images_per_file = n;
    }
    let name = o.name.clone().unwrap_or_else(|| "series".to_string());
    let master = o.dir.join(format!("{name}_master.h5"));
    outputs::refuse_existing(outputs::series_files(&master).iter().map(PathBuf::as_path), o.overwrite)?;
    if let Some(n) = meta.number_of_images {
        bar.set_length(n);
    }
    let writer = NxmxWriter::create(&master, &meta, o.overwrite)?;
    outputs::warn_without_reserve(&writer, &master);
    Ok(Series { spots: meta.max_spots > 0, writer, next_id: 0, first: None, last: None })
}

/// Writes one image's chunk as it came, with its spot list.
fn put(s: &mut Series, img: Image, report: &mut WriteReport) -> anyhow::Result<()> {
    let want = s.writer.meta().pixel.bytes();
    if img.elem != want {
        bail!("image {}: {}-byte pixels, the series' start said {want}", img.image_id, img.elem);
    }
    report.images_missing += img.image_id.saturating_sub(s.next_id);
    s.next_id = s.next_id.max(img.image_id + 1);
    let now = Instant::now();
    s.first.get_or_insert(now);
    s.last = Some(now);
    if report.write_error.is_some() {
        return Ok(());
    }
    let r = s.writer.write_chunk(img.frame_number, &img.chunk, &img.missing).and_then(|()| match (s.spots, &img.spots) {
        (true, Some((spots, hit))) => s.writer.write_spots(spots, spots.len(), *hit),
        (true, None) => s.writer.write_spots(&[], 0, false),
        (false, _) => Ok(()),
    });
    match r {
        Ok(()) => report.bytes += img.chunk.len() as u64,
        Err(e) => {
            eprintln!("rdaq write: {e}: writing stops; images still arriving are counted but not saved");
            report.write_error = Some(e.to_string());
        }
    }
    Ok(())
}

fn close(s: Series, report: &mut WriteReport) -> anyhow::Result<()> {
    report.data_window_s = match (s.first, s.last) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => 0.0,
    };
    let closed = s.writer.finish()?;
    if let Some(why) = closed.unreadable {
        report.write_error.get_or_insert(why);
    }
    report.images_written = closed.frames;
    report.master = Some(closed.path);
    Ok(())
}
