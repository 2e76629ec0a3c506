//! A series on the Stream V2 publisher: `start` when it opens, one `image` per frame
//! written (the chunk the file got, compressed once for both), `end` when it finishes,
//! also after an error.

use std::time::Instant;

use rdaq_process::spots::Spot;
use rdaq_sink::NxmxMeta;
use rdaq_stream::{Encoder, ImageInfo, Publisher, StreamConfig, StreamStats};

pub struct Stream {
    enc: Encoder,
    publisher: Publisher,
    images: u64,
    t0: Instant,
    endpoint: String,
    /// The first failure of the socket; nothing is sent after it.
    pub error: Option<String>,
}

/// What the stream did, for the summary.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StreamReport {
    pub endpoint: String,
    pub images_sent: u64,
    pub images_dropped: u64,
    pub waits: u64,
    pub bytes_sent: u64,
    pub start_sent: bool,
    pub end_sent: bool,
    pub error: Option<String>,
}

impl Stream {
    /// Binds the publisher and sends `start` (waiting a little for a consumer).
    pub fn open(cfg: &StreamConfig, meta: &NxmxMeta, series_id: u64) -> anyhow::Result<Stream> {
        let mut publisher = Publisher::bind(cfg)?;
        let mut enc = Encoder::new(meta, series_id);
        publisher.stats.start_sent = publisher.control(enc.start())?;
        let endpoint = publisher.endpoint();
        Ok(Stream { enc, publisher, images: 0, t0: Instant::now(), endpoint, error: None })
    }

    /// Publishes the next image of the series.
    pub fn image(&mut self, frame_number: u64, chunk: &[u8], missing: &[(usize, usize)], spots: Option<(&[Spot], bool)>) {
        if self.error.is_some() {
            return;
        }
        let now = self.t0.elapsed().as_nanos() as u64;
        let info = ImageInfo { image_id: self.images, frame_number, missing, spots, time_ns: (now, now) };
        self.images += 1;
        if let Err(e) = self.publisher.image(self.enc.image(&info, chunk)) {
            eprintln!("rdaq: {e}: the stream stops, the files go on");
            self.error = Some(e.to_string());
        }
    }

    /// Sends `end` and reports.
    pub fn finish(mut self) -> StreamReport {
        let StreamStats { images_sent, images_dropped, .. } = self.publisher.stats;
        let end = self.enc.end(images_sent, images_dropped).to_vec();
        self.publisher.stats.end_sent = self.error.is_none() && self.publisher.control(&end).unwrap_or(false);
        let s = &self.publisher.stats;
        StreamReport {
            endpoint: self.endpoint.clone(),
            images_sent: s.images_sent,
            images_dropped: s.images_dropped,
            waits: s.waits,
            bytes_sent: s.bytes_sent,
            start_sent: s.start_sent,
            end_sent: s.end_sent,
            error: self.error.take(),
        }
    }
}

impl StreamReport {
    /// The summary's line.
    pub fn line(&self) -> String {
        let mut l = format!(
            "{}: {} images sent ({:.1} MB), {} dropped (no consumer, or its queue full), {} waits for a consumer; start {}, end {}",
            self.endpoint,
            self.images_sent,
            self.bytes_sent as f64 / 1e6,
            self.images_dropped,
            self.waits,
            if self.start_sent { "sent" } else { "not sent (no consumer)" },
            if self.end_sent { "sent" } else { "not sent (no consumer)" }
        );
        if let Some(e) = &self.error {
            l.push_str(&format!("; stopped: {e}"));
        }
        l
    }
}
