//! Bragg spot finding (docs/formats.md section 4) and the hit veto.
//!
//! - [`LocalSnr`]: a pixel is strong if it is at least `threshold` and
//!   `(I - mean)^2 > snr^2 * variance`, with `I > mean`, where mean and variance are taken
//!   over the `(2n+1)^2` box around it without the pixel itself and without pixels that are
//!   not finite (masked, error, gaps). Strong pixels are joined into 8-connected groups;
//!   groups of `min_pixels..=max_pixels` pixels are spots. The box statistics come from
//!   running column sums (two image rows per row, whatever the box size) summed over the
//!   box's columns at each candidate pixel (those above the threshold), so the cost is one
//!   pass over the image plus work per candidate.
//! - [`Peakfinder8`]: the peakfinder8 algorithm of Cheetah/CrystFEL as built in
//!   `cfelpyutils` (same parameters, same peaks): five iterations of radial statistics,
//!   seeds above `max(mean + min_snr*sigma, threshold)` of their radius bin, flood fill
//!   inside the ASIC, a local background ring, and the integrated-SNR test. Its arithmetic
//!   is in f32 in the order of the reference so that decisions at the margins agree.
//!
//! Positions: [`LocalSnr`] reports the intensity-weighted centroid in pixel coordinates where
//! pixel `(c, r)` covers `[c, c+1) x [r, r+1)` (its centre is at `c + 0.5`);
//! [`Peakfinder8`] reports peakfinder8's centre of mass of pixel indices (centre at `c`), as
//! cfelpyutils does.

pub mod local_snr;
pub mod peakfinder8;
mod radial;

pub use local_snr::{LocalSnr, LocalSnrParams};
pub use peakfinder8::{Peakfinder8, Peakfinder8Params};

/// A spot: centroid (x fast / column, y slow / row), summed intensity and pixel count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spot {
    pub x: f32,
    pub y: f32,
    pub intensity: f32,
    pub pixels: u32,
}

/// Either finder with its scratch buffers, as a run or a file's reader chose it.
pub enum SpotFinder {
    Local(LocalSnr),
    Peakfinder8(Peakfinder8),
}

impl SpotFinder {
    /// The spots of `image` (`width` x `height`, row-major) into `out`.
    pub fn find(&mut self, image: &[f32], width: usize, height: usize, out: &mut Vec<Spot>) {
        match self {
            SpotFinder::Local(f) => f.find(image, width, height, out),
            SpotFinder::Peakfinder8(f) => f.find(image, out),
        }
    }
}

/// The hit decision: a frame is kept if it has at least `min_spots` spots.
pub fn is_hit(spots: &[Spot], min_spots: usize) -> bool {
    spots.len() >= min_spots
}

/// The count at which a counting detector of `bits`-bit counts saturates (its largest).
pub fn count_saturation(bits: u8) -> f32 {
    if bits >= 32 {
        u32::MAX as f32
    } else {
        ((1u64 << bits) - 1) as f32
    }
}

/// A counting detector's image (counts, a photon each) as the finders take it: the pixels
/// `mask` marks (NXmx bits: gaps, the detector's own) NaN and the saturated ones (at or
/// above `saturation`) +inf, so that neither is a strong pixel nor background, as a
/// JUNGFRAU's error and saturated words convert.
pub fn mask_counts(image: &mut [f32], mask: &[u32], saturation: f32) {
    for (v, &m) in image.iter_mut().zip(mask) {
        if m != 0 {
            *v = f32::NAN;
        } else if *v >= saturation {
            *v = f32::INFINITY;
        }
    }
}


#[cfg(test)]
mod count_tests {
    use super::*;

    #[test]
    fn masked_and_saturated_counts_are_left_out() {
        let mut image = vec![1.0, 4095.0, 7.0, 5000.0];
        mask_counts(&mut image, &[0, 0, 1, 0], count_saturation(12));
        assert_eq!(image[0], 1.0);
        assert_eq!(image[1], f32::INFINITY);
        assert!(image[2].is_nan());
        assert_eq!(image[3], f32::INFINITY);
        assert_eq!(count_saturation(32), u32::MAX as f32);
    }
}

/// A Gaussian blob of `total` centred at `(cx, cy)` added to `image` (tests).
#[cfg(test)]
fn blob(image: &mut [f32], width: usize, cx: f32, cy: f32, total: f32) {
    let height = image.len() / width;
    for r in 0..height {
        for c in 0..width {
            let (dx, dy) = (c as f32 + 0.5 - cx, r as f32 + 0.5 - cy);
            image[r * width + c] += total / (2.0 * std::f32::consts::PI) * (-(dx * dx + dy * dy) / 2.0).exp();
        }
    }
}
