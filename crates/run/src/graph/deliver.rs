//! Processed frames handed to a program in this process (the Python package): each written
//! frame's pooled buffer, with its photon counts, goes out on a bounded channel instead of
//! straight back to the pool, and returns to the pool when the holder drops it. Nothing is
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
    work: Option<Box<Work>>,
    pixel: PixelType,
    pool: Sender<Box<Work>>,
}

/// A frame's pixels as the files hold them: photon counts (int16 or int32, with the files'
/// saturation and no-data markers) or keV.
pub enum Pixels<'a> {
    I16(&'a [i16]),
    I32(&'a [i32]),
    F32(&'a [f32]),
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
        Processed { work: Some(wk), pixel, pool }
    }

    fn work(&self) -> &Work {
        self.work.as_ref().expect("held until dropped")
    }

    /// The frame number.
    pub fn frame(&self) -> u64 {
        self.work().frame
    }

    /// The image's pixels, row-major, as the file holds them.
    pub fn pixels(&self) -> Pixels<'_> {
        let w = self.work();
        match self.pixel {
            PixelType::Photons16 => Pixels::I16(&w.counts16),
            PixelType::Photons32 => Pixels::I32(&w.counts32),
            _ => Pixels::F32(&w.image),
        }
    }

    /// The Bragg spots found (intensity in the file's unit), and whether it is a hit.
    pub fn spots(&self) -> (&[Spot], bool) {
        (&self.work().spots, self.work().hit)
    }
}

impl Drop for Processed {
    fn drop(&mut self) {
        if let Some(wk) = self.work.take() {
            // the graph may have ended: then the buffer just goes
            let _ = self.pool.send(wk);
        }
    }
}
