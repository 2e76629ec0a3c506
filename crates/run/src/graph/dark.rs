//! Pedestal tracking of dark frames on several cores: the image's pixels are cut into bands
//! of consecutive pixels, one per pedestal stage, chained so that each dark frame visits every
//! band in turn. Every band sees the dark frames in the source's order, so the sums are those
//! of one tracker (aare's order of operations, per pixel), and k bands track k frames at once.
//! When the pedestal is due, each band writes its part into a shared image and the last band
//! publishes it; with a publication every dark frame, a band ahead in the chain may already
//! have written its part of a later frame (the converters take either: the pedestal moves by a
//! fraction of its noise from one dark frame to the next).

use std::collections::VecDeque;

use rdaq_detector::Geometry;
use rdaq_process::pedestal::Pedestal;

/// What a pedestal stage tracks dark frames with: the CPU's tracker of one band, or the
/// GPU's of the whole image.
pub(super) trait DarkTracker: Send {
    /// Adds its pixels of one complete dark frame, the slot's module words.
    ///
    /// # Safety
    /// The tracker may read `words` after this returns (the GPU's queues several frames):
    /// the caller keeps them alive and unwritten until [`DarkTracker::reading`] no longer
    /// counts this frame, or the tracker is dropped.
    unsafe fn push_frame(&mut self, g: &Geometry, words: &[u16]);
    /// Waits until at most `keep` of the frames pushed are still being read; returns how
    /// many are (the last ones pushed). The CPU's trackers have read a frame when its push
    /// returns.
    fn reading(&mut self, _keep: usize) -> usize {
        0
    }
    /// Dark frames added so far.
    fn frames(&self) -> u64;
    /// Writes its pixels' G0 pedestal into the image `out` (gap pixels, never sampled, are
    /// replaced on publishing); false when it has none to give and wrote nothing (a GPU
    /// tracker whose device failed just then: nothing is published).
    fn mean_into(&mut self, out: &mut [f32]) -> bool;
}

/// A tracker that only counts the dark frames, for the serial-ceiling benchmark
/// ([`super::Canned`]): the bands hand frames on and publish as they would, without the
/// pixels' work.
#[derive(Default)]
pub(super) struct Counted {
    frames: u64,
}

impl DarkTracker for Counted {
    unsafe fn push_frame(&mut self, _: &Geometry, _: &[u16]) {
        self.frames += 1;
    }

    fn frames(&self) -> u64 {
        self.frames
    }

    fn mean_into(&mut self, _: &mut [f32]) -> bool {
        true
    }
}

/// The CPU tracker of image pixels `lo..hi`.
pub(super) struct Band {
    lo: usize,
    hi: usize,
    tracker: Pedestal<f64>,
    mean: Vec<f32>,
}

impl Band {
    /// The `k` bands of an image of `pixels` pixels (the last may be shorter).
    pub(super) fn split(pixels: usize, k: usize, window: u32) -> Vec<Band> {
        let len = pixels.div_ceil(k.max(1)).max(1);
        (0..pixels)
            .step_by(len)
            .map(|lo| {
                let hi = (lo + len).min(pixels);
                Band { lo, hi, tracker: Pedestal::new(hi - lo, 0, window), mean: vec![0.0; hi - lo] }
            })
            .collect()
    }
}

impl DarkTracker for Band {
    unsafe fn push_frame(&mut self, g: &Geometry, words: &[u16]) {
        let mp = g.module_pixels();
        for m in 0..g.modules {
            let module = &words[m as usize * mp..(m as usize + 1) * mp];
            g.module_runs(m, |from, at, run| {
                // the part of this run of image pixels [at, at + run) inside the band
                let (s, e) = (at.max(self.lo), (at + run).min(self.hi));
                if s < e {
                    self.tracker.push_at(s - self.lo, &module[from + (s - at)..from + (e - at)]);
                }
            });
        }
        self.tracker.frame_done();
    }

    fn frames(&self) -> u64 {
        self.tracker.frames()
    }

    fn mean_into(&mut self, out: &mut [f32]) -> bool {
        self.tracker.mean_into(&mut self.mean);
        out[self.lo..self.hi].copy_from_slice(&self.mean);
        true
    }
}

/// A CPU tracker that reads its frames late, as the GPU's does: up to `in_flight` pushed
/// frames wait, unread, in their slots until [`DarkTracker::reading`] lets fewer wait. It is
/// the GPU stand-in's, so that the graph's holding and releasing of dark frames' slots is
/// exercised without a GPU: it panics when a frame's words changed while it waited (its
/// slot was given back too early and taken by a later frame).
pub(super) struct Deferred<T> {
    inner: T,
    geometry: Geometry,
    /// Each waiting frame's words and their digest when pushed.
    waiting: VecDeque<(*const u16, usize, u64)>,
    in_flight: usize,
}

/// FNV-1a of the words: tells a frame's words from another frame's.
fn digest(words: &[u16]) -> u64 {
    words.iter().fold(0xcbf2_9ce4_8422_2325, |h, &w| (h ^ u64::from(w)).wrapping_mul(0x0100_0000_01b3))
}

// SAFETY: the pointers are to slots of the receiver's ring, which every thread may read;
// `push_frame`'s contract keeps them valid while they wait here.
unsafe impl<T: Send> Send for Deferred<T> {}

impl<T: DarkTracker> Deferred<T> {
    pub(super) fn new(inner: T, geometry: Geometry, in_flight: usize) -> Deferred<T> {
        Deferred { inner, geometry, waiting: VecDeque::new(), in_flight: in_flight.max(1) }
    }
}

impl<T: DarkTracker> DarkTracker for Deferred<T> {
    unsafe fn push_frame(&mut self, _: &Geometry, words: &[u16]) {
        self.reading(self.in_flight - 1);
        self.waiting.push_back((words.as_ptr(), words.len(), digest(words)));
    }

    fn reading(&mut self, keep: usize) -> usize {
        while self.waiting.len() > keep {
            let (p, len, pushed) = self.waiting.pop_front().expect("more than keep wait");
            // SAFETY: `push_frame`'s caller keeps the frame's words valid and unwritten until
            // this function no longer counts it, that is, until after this read.
            let words = unsafe { std::slice::from_raw_parts(p, len) };
            assert_eq!(digest(words), pushed, "a dark frame's slot was given back while its tracker still read it");
            // SAFETY: the inner tracker is a CPU one: it has read the words when it returns.
            unsafe { self.inner.push_frame(&self.geometry, words) };
        }
        self.waiting.len()
    }

    fn frames(&self) -> u64 {
        self.inner.frames() + self.waiting.len() as u64
    }

    fn mean_into(&mut self, out: &mut [f32]) -> bool {
        self.reading(0);
        self.inner.mean_into(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_track_what_one_tracker_tracks() {
        let g = Geometry::new(2, 1, 2, 2).expect("a 2-module detector with gaps");
        let pixels = g.height() * g.width();
        let mut one = Band::split(pixels, 1, 3);
        let mut three = Band::split(pixels, 3, 3);
        assert_eq!(three.last().map(|b| b.hi), Some(pixels));
        let mut words = vec![0u16; 2 * g.module_pixels()];
        for f in 0..5u16 {
            words.iter_mut().enumerate().for_each(|(i, w)| *w = ((i as u16).wrapping_mul(7) ^ f.wrapping_mul(13)) & 0x3FFF);
            for b in one.iter_mut().chain(three.iter_mut()) {
                // SAFETY: a CPU band has read the words when its push returns.
                unsafe { b.push_frame(&g, &words) };
            }
        }
        let (mut a, mut b) = (vec![0f32; pixels], vec![1f32; pixels]);
        assert!(one[0].mean_into(&mut a));
        assert!(three.iter_mut().all(|t| t.mean_into(&mut b)));
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }

    #[test]
    fn a_deferred_tracker_reads_late_and_tracks_what_a_band_tracks() {
        let g = Geometry::new(2, 1, 2, 2).expect("a 2-module detector with gaps");
        let pixels = g.height() * g.width();
        let frames: Vec<Vec<u16>> = (0..7u16).map(|f| (0..2 * g.module_pixels()).map(|i| ((i as u16).wrapping_mul(5) ^ f.wrapping_mul(11)) & 0x3FFF).collect()).collect();
        let mut band = Band::split(pixels, 1, 4).pop().expect("one band");
        let mut late = Deferred::new(Band::split(pixels, 1, 4).pop().expect("one band"), g, 3);
        let mut waiting = Vec::new();
        for words in &frames {
            // SAFETY: `frames` outlives both trackers and nothing writes them.
            unsafe {
                band.push_frame(&g, words);
                late.push_frame(&g, words);
            }
            waiting.push(late.reading(2));
        }
        // never more than in_flight wait, and as many as were allowed to
        assert_eq!(waiting, vec![1, 2, 2, 2, 2, 2, 2]);
        assert_eq!(late.frames(), band.frames());
        assert_eq!(late.reading(1), 1);
        let (mut a, mut b) = (vec![0f32; pixels], vec![1f32; pixels]);
        assert!(band.mean_into(&mut a) && late.mean_into(&mut b));
        assert_eq!(late.reading(0), 0, "the mean reads every frame first");
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}
