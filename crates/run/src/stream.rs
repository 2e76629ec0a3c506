//! A series on the Stream V2 publisher: `start` when it opens, one `image` per frame written
//! (the chunk the file got, compressed once for both), `end` when it finishes, also after an
//! error. Beside it the live preview: a few times a second the series' `start` and the latest
//! image (with its spots) on a PUB socket, never waiting for anyone. An image that nobody
//! would take (no consumer connected under the drop policy, no preview viewer) is neither
//! encoded nor, where the stream is its only sink, compressed: it is counted as dropped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdaq_process::spots::Spot;
use rdaq_sink::NxmxMeta;
use rdaq_stream::{Encoder, ImageInfo, Publisher, StreamConfig, StreamStats};

pub struct Stream {
    enc: Encoder,
    main: Option<Publisher>,
    preview: Option<Preview>,
    images: u64,
    /// Images encoded (for the stream or the preview).
    encoded: u64,
    t0: Instant,
    /// The exposure of an image (0: unknown).
    count_ns: u64,
    live: Arc<Live>,
    /// The first failure of a socket; nothing is sent after it.
    pub error: Option<String>,
}

/// The stream's counts while it runs, for a daemon's `/status` and `/metrics`.
#[derive(Debug, Default)]
pub struct Live {
    pub images_sent: AtomicU64,
    pub images_dropped: AtomicU64,
    pub waits: AtomicU64,
    /// Consumers connected while images went out.
    pub consumers: AtomicU64,
    /// Images encoded: those that someone would take.
    pub images_encoded: AtomicU64,
}

/// Who the next image would reach ([`Stream::wants_image`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Wanted {
    main: bool,
    preview: bool,
}

impl Wanted {
    /// Anyone: the image's chunk is needed.
    pub fn any(self) -> bool {
        self.main || self.preview
    }
}

/// Whether workers that make chunks ahead of the stage that publishes them should make the
/// next ones: always with a file; otherwise while the stream's last image (at the start:
/// its first) would reach someone (a consumer, a preview viewer). Without a file, a stream
/// nobody reads then costs no compression; the first frames after a consumer connects reach
/// the stream without a chunk and count as dropped.
pub struct ChunkDemand {
    wanted: AtomicBool,
    has_file: bool,
}

impl ChunkDemand {
    /// The demand of a chain with a file (`has_file`) and `stream`.
    pub fn new(has_file: bool, stream: Option<&mut Stream>) -> ChunkDemand {
        let wanted = has_file || stream.is_some_and(|s| s.wants_image().any());
        ChunkDemand { wanted: AtomicBool::new(wanted), has_file }
    }

    /// Whether the next chunks are wanted (read by the workers).
    pub fn wanted(&self) -> bool {
        self.wanted.load(Ordering::Relaxed)
    }

    /// Publishes the next image on `stream` (its chunk made when `chunked`) to those it
    /// would reach, and sets the demand from who that is.
    pub fn publish(&self, stream: &mut Stream, chunked: bool, frame_number: u64, chunk: &[u8], missing: &[(usize, usize)], spots: Option<(&[Spot], bool)>) {
        let wanted = stream.wants_image();
        self.wanted.store(self.has_file || wanted.any(), Ordering::Relaxed);
        // a frame not compressed (nobody wanted it then) meets a consumer that just
        // connected: dropped
        let wanted = if chunked { wanted } else { Wanted::default() };
        stream.image(wanted, frame_number, chunk, missing, spots);
    }
}

/// The preview publisher and its clock.
struct Preview {
    publisher: Publisher,
    every: Duration,
    last: Option<Instant>,
    start: Vec<u8>,
}

/// What the stream did, for the summary.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct StreamReport {
    /// Where the stream went (none: only the preview).
    pub endpoint: Option<String>,
    #[serde(flatten)]
    pub stats: StreamStats,
    pub preview: Option<String>,
    pub preview_images: u64,
    /// Images encoded for the stream or the preview (an image nobody would take is not).
    #[serde(default)]
    pub images_encoded: u64,
    /// Several consumers shared the images of a PUSH stream: each has only part of them.
    #[serde(default)]
    pub split: bool,
    pub error: Option<String>,
}

impl Stream {
    /// Opens the stream and preview of a run's configuration `s`, moved off a default port
    /// another acquisition holds ([`crate::config::Stream::off_busy_defaults`]), saying so as
    /// `who` (the command).
    pub fn open_configured(s: &crate::config::Stream, meta: &NxmxMeta, who: &str) -> anyhow::Result<Option<Stream>> {
        let (s, moved) = s.off_busy_defaults();
        for m in moved {
            eprintln!("{who}: warning: {m}");
        }
        let preview = s.preview_config()?;
        Stream::open(s.config()?.as_ref(), preview.as_ref().map(|(c, every)| (c, *every)), meta, 1)
    }

    /// Binds the publishers that are configured and sends `start` (waiting a little for a
    /// consumer). `None` when neither is.
    pub fn open(main: Option<&StreamConfig>, preview: Option<(&StreamConfig, Duration)>, meta: &NxmxMeta, series_id: u64) -> anyhow::Result<Option<Stream>> {
        if main.is_none() && preview.is_none() {
            return Ok(None);
        }
        let mut enc = Encoder::new(meta, series_id);
        // the series' date is the encoder's: the images' times count from here
        let t0 = Instant::now();
        let start = enc.start().to_vec();
        let main = match main {
            Some(cfg) => {
                let mut p = Publisher::bind(cfg)?;
                warn_if_exposed(&p, "stream");
                p.stats.start_sent = p.control(&start)?;
                Some(p)
            }
            None => None,
        };
        let preview = match preview {
            Some((cfg, every)) => {
                let publisher = Publisher::bind(cfg)?;
                warn_if_exposed(&publisher, "preview");
                Some(Preview { publisher, every, last: None, start })
            }
            None => None,
        };
        let count_ns = (meta.count_time_s * 1e9) as u64;
        Ok(Some(Stream { enc, main, preview, images: 0, encoded: 0, t0, count_ns, live: Arc::default(), error: None }))
    }

    /// The counts as they go.
    pub fn live(&self) -> Arc<Live> {
        self.live.clone()
    }

    /// Who the next image would reach: the stream's consumers (or, under the block policy,
    /// the one it waits for), and, when one is due, the preview's viewers. Nobody: the
    /// caller need not make its chunk, and [`Stream::image`] only counts it.
    pub fn wants_image(&mut self) -> Wanted {
        if self.error.is_some() {
            return Wanted::default();
        }
        let main = self.main.as_mut().is_some_and(Publisher::wants_images);
        let preview = self.preview.as_mut().is_some_and(|pv| pv.due() && pv.publisher.wants_images());
        Wanted { main, preview }
    }

    /// The next image, which nobody would take: counted as dropped, not encoded.
    fn pass_image(&mut self) {
        self.images += 1;
        if let Some(p) = self.main.as_mut() {
            p.pass();
        }
        self.show_live();
    }

    /// Publishes the next image of the series to those [`Stream::wants_image`] said it
    /// would reach (`chunk` is not read when nobody).
    pub fn image(&mut self, wanted: Wanted, frame_number: u64, chunk: &[u8], missing: &[(usize, usize)], spots: Option<(&[Spot], bool)>) {
        if self.error.is_some() {
            return;
        }
        if !wanted.any() {
            return self.pass_image();
        }
        // rdaq has no exposure clock of the detector's: the exposure ended before the image
        // was handed on, and lasted the count time
        let stop = self.t0.elapsed().as_nanos() as u64;
        let info = ImageInfo { image_id: self.images, frame_number, missing, spots, time_ns: (stop.saturating_sub(self.count_ns), stop) };
        let Wanted { main, preview } = wanted;
        self.images += 1;
        self.encoded += 1;
        let msg = self.enc.image(&info, chunk);
        let mut r = Ok(());
        match self.main.as_mut() {
            Some(p) if main => r = p.image(msg),
            Some(p) => p.pass(),
            None => {}
        }
        if let Some(pv) = self.preview.as_mut().filter(|_| preview) {
            pv.last = Some(Instant::now());
            r = r.and_then(|()| pv.publisher.image(&pv.start)).and_then(|()| pv.publisher.image(msg));
        }
        self.show_live();
        if let Err(e) = r {
            eprintln!("rdaq: {e}: the stream stops, the files go on");
            self.error = Some(e.to_string());
        }
    }

    /// The counts for a daemon's `/status` and `/metrics`.
    fn show_live(&self) {
        self.live.images_encoded.store(self.encoded, Ordering::Relaxed);
        if let Some(p) = &self.main {
            self.live.images_sent.store(p.stats.images_sent, Ordering::Relaxed);
            self.live.images_dropped.store(p.stats.images_dropped, Ordering::Relaxed);
            self.live.waits.store(p.stats.waits, Ordering::Relaxed);
            self.live.consumers.store(p.stats.consumers, Ordering::Relaxed);
        }
    }

    /// The endpoints bound (the port the system picked where the configuration said 0):
    /// the stream's and the preview's.
    pub fn endpoints(&self) -> (Option<String>, Option<String>) {
        (self.main.as_ref().map(Publisher::endpoint), self.preview.as_ref().map(|p| p.publisher.endpoint()))
    }

    /// Sends `end` and reports.
    pub fn finish(mut self) -> StreamReport {
        let mut stats = StreamStats::default();
        if let Some(p) = self.main.as_mut() {
            let end = self.enc.end(p.stats.images_sent, p.stats.images_dropped, None).to_vec();
            p.stats.end_sent = self.error.is_none() && p.control(&end).unwrap_or(false);
            stats = p.stats.clone();
        }
        StreamReport {
            endpoint: self.main.as_ref().map(Publisher::endpoint),
            stats,
            preview: self.preview.as_ref().map(|p| p.publisher.endpoint()),
            // each preview sends the start and the image
            preview_images: self.preview.as_ref().map_or(0, |p| p.publisher.stats.images_sent / 2),
            images_encoded: self.encoded,
            split: self.main.as_ref().is_some_and(Publisher::split),
            error: self.error.take(),
        }
    }
}

impl Preview {
    /// Whether a preview image is due (the first, then one per `every`).
    fn due(&self) -> bool {
        self.last.is_none_or(|t| t.elapsed() >= self.every)
    }
}

/// Says at start that a publisher is open to other hosts: nothing authenticates its readers.
fn warn_if_exposed(p: &Publisher, what: &str) {
    if p.exposed() {
        eprintln!("rdaq: the {what} on {} is open to the network: any host that reaches this one can read its images (no authentication; see docs/operations.md#security-model)", p.endpoint());
    }
}

impl StreamReport {
    /// The summary's line.
    pub fn line(&self) -> String {
        let s = &self.stats;
        let mut l = match &self.endpoint {
            Some(e) => format!(
                "{e}: {} images sent ({:.1} MB), {} dropped (no consumer, or its queue full), {} waits for a consumer; start {}, end {}",
                s.images_sent,
                s.bytes_sent as f64 / 1e6,
                s.images_dropped,
                s.waits,
                if s.start_sent { "sent" } else { "not sent (no consumer)" },
                if s.end_sent { "sent" } else { "not sent (no consumer)" }
            ) + &consumers(s, self.split),
            None => "off".to_string(),
        };
        if let Some(p) = &self.preview {
            l.push_str(&format!("; preview on {p}: {} images", self.preview_images));
        }
        if let Some(e) = &self.error {
            l.push_str(&format!("; stopped: {e}"));
        }
        l
    }
}

/// The consumers that took images; on a PUSH stream with several at once, each has only
/// part of the series.
fn consumers(s: &StreamStats, split: bool) -> String {
    let mut l = format!("; {} consumer{} took images", s.consumers, if s.consumers == 1 { "" } else { "s" });
    if split {
        l.push_str(&format!(" ({} at once: the stream shared its images between them, each has only part of the series)", s.consumers_at_once));
    }
    l
}
