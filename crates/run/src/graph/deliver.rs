//! Processed frames handed to a program in this process (the Python package): each written
//! frame's pooled buffer, with its photon counts (or a counting detector's counts, from the
//! raw chain's pool), goes out on a bounded channel instead of straight back to the pool, and
//! returns to the pool when the holder drops it. Nothing is
//! copied on the way: the holder reads the buffer the graph converted into. A holder that
//! keeps frames keeps the graph's buffers, so the graph waits (counted as `pool_waits`) and
//! the receiver's ring fills, as with any slow consumer.

use crossbeam_channel::Sender;
use rdaq_process::kev_to_photons;
use rdaq_process::spots::Spot;
use rdaq_sink::PixelType;

use super::{Counts, Work};

/// Frames waiting for the holder, at most.
pub const WAITING: usize = 8;

/// One processed, written frame.
pub struct Processed {
    held: Held,
}

/// Whose buffer a frame is.
enum Held {
    /// The processing graph's.
    Graph { work: Option<Box<Work>>, pixel: PixelType, pool: Sender<Box<Work>> },
    /// The raw chain's, a counting detector's frame with its spots.
    Counted(crate::consume::Delivered),
}

/// A frame's pixels as the files hold them: photon counts (int16 or int32, with the files'
/// saturation and no-data markers), keV, or a counting detector's counts (unsigned, of
/// `size` bytes each, little-endian, not necessarily aligned to their size).
pub enum Pixels<'a> {
    I16(&'a [i16]),
    I32(&'a [i32]),
    F32(&'a [f32]),
    Counts { bytes: &'a [u8], size: usize },
}

impl Processed {
    /// Converts `wk`'s image to the file's pixels (`pixel`, photons of `photon_kev`) and
    /// wraps it; dropping it gives the buffer back to `pool`.
    pub(super) fn new(mut wk: Box<Work>, pixel: PixelType, photon_kev: f32, pool: Sender<Box<Work>>) -> Processed {
        let n = wk.image.len();
        // allocated once per pooled buffer, the first time it is handed out; counts that
        // came from the device are the frame's already (plain: frames delivered are not
        // fetched bitshuffled)
        debug_assert_ne!(wk.counts, Counts::Shuffled, "a delivered frame's counts are plain");
        match pixel {
            _ if wk.counts == Counts::Plain => {}
            PixelType::Photons16 => {
                wk.counts16.resize(n, 0);
                kev_to_photons(&wk.image, photon_kev, &mut wk.counts16);
            }
            PixelType::Photons32 => {
                wk.counts32.resize(n, 0);
                kev_to_photons(&wk.image, photon_kev, &mut wk.counts32);
            }
            _ => {}
        }
        Processed { held: Held::Graph { work: Some(wk), pixel, pool } }
    }

    /// A counting detector's frame of the raw chain.
    pub(crate) fn counted(d: crate::consume::Delivered) -> Processed {
        Processed { held: Held::Counted(d) }
    }

    /// The frame number.
    pub fn frame(&self) -> u64 {
        match &self.held {
            Held::Graph { work, .. } => held(work).frame,
            Held::Counted(d) => d.frame(),
        }
    }

    /// The image's pixels, row-major, as the file holds them.
    pub fn pixels(&self) -> Pixels<'_> {
        match &self.held {
            Held::Graph { work, pixel, .. } => {
                let w = held(work);
                match pixel {
                    PixelType::Photons16 => Pixels::I16(&w.counts16),
                    PixelType::Photons32 => Pixels::I32(&w.counts32),
                    _ => Pixels::F32(&w.image),
                }
            }
            Held::Counted(d) => Pixels::Counts { bytes: d.bytes(), size: d.pixel_bytes() },
        }
    }

    /// The Bragg spots found (intensity in the file's unit), and whether it is a hit.
    pub fn spots(&self) -> (&[Spot], bool) {
        match &self.held {
            Held::Graph { work, .. } => (&held(work).spots, held(work).hit),
            Held::Counted(d) => d.spots(),
        }
    }
}

fn held(work: &Option<Box<Work>>) -> &Work {
    work.as_ref().expect("held until dropped")
}

impl Drop for Processed {
    fn drop(&mut self) {
        if let Held::Graph { work, pool, .. } = &mut self.held {
            if let Some(wk) = work.take() {
                // the graph may have ended: then the buffer just goes
                let _ = pool.send(wk);
            }
        }
    }
}
