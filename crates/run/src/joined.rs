//! The series `rdaq write` merges from several sources (the receivers of one acquisition),
//! published again as one Stream V2 series: one `start`, the images in frame order with
//! their `image_id` counted from 0 again, and one `end`, as if one receiver had taken the
//! series. The chunks and spot lists go on as they came; each image's times are its
//! source's (its receiver's series began within the acquisition's start).

use rdaq_sink::NxmxMeta;
use rdaq_stream::{Encoder, Image, ImageInfo, Publisher, StreamConfig, StreamError, StreamStats};

pub struct Joined {
    publisher: Publisher,
    encoder: Option<Encoder>,
    next_id: u64,
}

impl Joined {
    /// Binds the joined stream's endpoint; fails naming it.
    pub fn bind(cfg: &StreamConfig) -> Result<Joined, StreamError> {
        Ok(Joined { publisher: Publisher::bind(cfg)?, encoder: None, next_id: 0 })
    }

    /// The endpoint bound (a `tcp://*:0` one says its port here).
    pub fn endpoint(&self) -> String {
        self.publisher.endpoint()
    }

    /// Sends the series' `start`: the first source's metadata, with the images of every
    /// source (`number_of_images`, when each said it; otherwise none).
    pub fn start(&mut self, meta: &NxmxMeta) -> Result<(), StreamError> {
        let encoder = self.encoder.insert(Encoder::new(meta, 1));
        self.publisher.stats.start_sent = self.publisher.control(encoder.start())?;
        Ok(())
    }

    /// Whether the series' `start` went out (or was tried).
    pub fn started(&self) -> bool {
        self.encoder.is_some()
    }

    /// Sends one merged image as the next of the series (an image before `start` is not
    /// sent, and not counted).
    pub fn image(&mut self, img: &Image) -> Result<(), StreamError> {
        let Some(encoder) = self.encoder.as_mut() else { return Ok(()) };
        let spots = img.spots.as_ref().map(|(s, hit)| (s.as_slice(), *hit));
        let info = ImageInfo { image_id: self.next_id, frame_number: img.frame_number, missing: &img.missing, spots, time_ns: img.time_ns };
        self.next_id += 1;
        self.publisher.image(encoder.image(&info, &img.chunk))
    }

    /// Sends the `end` (once a `start` went out), with the images the sources' numbering
    /// skipped (`missing`), and says what the stream did.
    pub fn end(mut self, missing: u64) -> Result<StreamStats, StreamError> {
        if let Some(encoder) = self.encoder.as_mut() {
            let (sent, dropped) = (self.publisher.stats.images_sent, self.publisher.stats.images_dropped);
            self.publisher.stats.end_sent = self.publisher.control(encoder.end(sent, dropped, Some(missing)))?;
        }
        Ok(self.publisher.stats)
    }
}
