//! Pedestal tracking of dark frames on several cores: the image's pixels are cut into bands
//! of consecutive pixels, one per pedestal stage, chained so that each dark frame visits every
//! band in turn. Every band sees the dark frames in the source's order, so the sums are those
//! of one tracker (aare's order of operations, per pixel), and k bands track k frames at once.
//! When the pedestal is due, each band writes its part into a shared image and the last band
//! publishes it; with a publication every dark frame, a band ahead in the chain may already
//! have written its part of a later frame (the converters take either: the pedestal moves by a
//! fraction of its noise from one dark frame to the next).

use rdaq_detector::Geometry;
use rdaq_process::pedestal::Pedestal;

/// What a pedestal stage tracks dark frames with: the CPU's tracker of one band, or the
/// GPU's of the whole image.
pub(super) trait DarkTracker: Send {
    /// Adds its pixels of one complete dark frame, the slot's module words.
    fn push_frame(&mut self, g: &Geometry, words: &[u16]);
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
    fn push_frame(&mut self, _: &Geometry, _: &[u16]) {
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
    fn push_frame(&mut self, g: &Geometry, words: &[u16]) {
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
                b.push_frame(&g, &words);
            }
        }
        let (mut a, mut b) = (vec![0f32; pixels], vec![1f32; pixels]);
        assert!(one[0].mean_into(&mut a));
        assert!(three.iter_mut().all(|t| t.mean_into(&mut b)));
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}
