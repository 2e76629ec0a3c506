//! Deterministic synthetic JUNGFRAU frames: per-pixel pedestals and gains, electronic noise,
//! a Poisson photon background and Gaussian Bragg spots, encoded to raw words by the inverse
//! of the conversion. The same seed, module and frame number always give the same bytes.
//!
//! A beam chopper ([`Chopper`]) makes some frames dark (noise only: no photon at all), and
//! of the signal frames only a fraction are hits (a crystal in the beam: Bragg spots); the
//! others carry the background alone.

use crate::jungfrau::{ModuleCalibration, MODULE_COLS, MODULE_PIXELS, MODULE_ROWS};
use crate::rng;

#[cfg(target_endian = "big")]
compile_error!("rdaq assumes a little-endian host: JUNGFRAU words are little-endian on the wire");

/// What the synthetic detector sees.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthConfig {
    pub seed: u64,
    pub photon_energy_kev: f32,
    /// Mean background photons per pixel per frame.
    pub background_photons: f64,
    /// Mean number of Bragg spots per module frame.
    pub spots_per_frame: f64,
    /// Spot intensity range in photons (log-uniform).
    pub spot_photons: (f64, f64),
    /// Gaussian spot width in pixels.
    pub spot_sigma_px: f64,
    /// Electronic noise, keV RMS.
    pub noise_kev: f32,
    /// Which frames are dark.
    pub chopper: Chopper,
    /// Fraction of signal frames with a crystal in the beam (the same frames for every module).
    pub hit_fraction: f64,
}

/// The beam chopper's schedule: repeating `dark` dark frames then `signal` signal frames,
/// from frame 0. `dark = 0`: no chopper, every frame is a signal frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Chopper {
    pub dark: u32,
    pub signal: u32,
}

impl Chopper {
    pub fn is_dark(&self, frame: u64) -> bool {
        self.dark > 0 && frame % (self.dark as u64 + self.signal as u64) < self.dark as u64
    }
}

impl Default for SynthConfig {
    fn default() -> Self {
        SynthConfig {
            seed: 1,
            photon_energy_kev: 12.4,
            background_photons: 0.01,
            spots_per_frame: 30.0,
            spot_photons: (50.0, 5000.0),
            spot_sigma_px: 1.0,
            noise_kev: 0.3,
            chopper: Chopper::default(),
            hit_fraction: 1.0,
        }
    }
}

/// A Bragg spot: centre (column x, row y) in module pixels and total photons.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spot {
    pub x: f64,
    pub y: f64,
    pub photons: f64,
}

/// Length of a module's table of normal draws (a power of two above the pixel count).
const NOISE_TABLE: usize = 1 << 20;

/// Generates the frames of one module.
pub struct ModuleSynth {
    cfg: SynthConfig,
    module: u16,
    cal: ModuleCalibration,
    /// Electronic noise in G0 ADU per pixel (gain * noise).
    noise_adc: Vec<f32>,
    /// Standard normal draws; frame `f` reads them from a shift that depends on `f`, so each
    /// pixel sees a fresh draw per frame while the noise pass stays a branch-free loop.
    normals: Vec<f32>,
    spot_scratch: Vec<(u32, f32)>,
}

impl ModuleSynth {
    pub fn new(cfg: SynthConfig, module: u16) -> Self {
        let cal = ModuleCalibration::synthetic(cfg.seed, module);
        let noise_adc = cal.gain[0].iter().map(|g| g * cfg.noise_kev).collect();
        let kn = rng::key(&[cfg.seed, module as u64, 0x401_5e]);
        let normals = (0..NOISE_TABLE as u64).map(|i| rng::normal(rng::at(kn, i))).collect();
        ModuleSynth { cfg, module, cal, noise_adc, normals, spot_scratch: Vec::new() }
    }

    pub fn calibration(&self) -> &ModuleCalibration {
        &self.cal
    }

    pub fn module(&self) -> u16 {
        self.module
    }

    /// Whether a frame is dark (no photons).
    pub fn is_dark(&self, frame: u64) -> bool {
        self.cfg.chopper.is_dark(frame)
    }

    /// Whether a signal frame has a crystal in the beam (decided per frame, not per module).
    pub fn is_hit(&self, frame: u64) -> bool {
        !self.is_dark(frame) && rng::unit(rng::at(rng::key(&[self.cfg.seed, 0x417]), frame)) < self.cfg.hit_fraction
    }

    /// The Bragg spots of a frame (the ground truth for spot finders).
    pub fn spots(&self, frame: u64) -> Vec<Spot> {
        if !self.is_hit(frame) {
            return Vec::new();
        }
        let mut s = rng::Stream::new(rng::key(&[self.cfg.seed, self.module as u64, frame, 0x5b07]));
        let n = s.poisson(self.cfg.spots_per_frame);
        let (lo, hi) = self.cfg.spot_photons;
        (0..n)
            .map(|_| Spot {
                x: s.unit() * MODULE_COLS as f64,
                y: s.unit() * MODULE_ROWS as f64,
                photons: lo * (hi / lo).powf(s.unit()),
            })
            .collect()
    }

    /// Writes frame `frame` as raw words into `out` (length [`MODULE_PIXELS`]).
    pub fn frame(&mut self, frame: u64, out: &mut [u16]) {
        assert_eq!(out.len(), MODULE_PIXELS, "a module frame is {MODULE_PIXELS} words");
        let k = rng::key(&[self.cfg.seed, self.module as u64, frame, 0xf7a3e]);
        self.noise(rng::at(k, 0) as usize % NOISE_TABLE, out);
        if self.is_dark(frame) {
            return;
        }
        self.background_photons(k, out);
        self.add_spots(frame, k, out);
    }

    /// Every pixel: G0 pedestal plus electronic noise, no photon.
    fn noise(&self, shift: usize, out: &mut [u16]) {
        // two straight runs (before and after the table wraps) so each loop vectorizes
        let first = (NOISE_TABLE - shift).min(MODULE_PIXELS);
        let runs = [(0, &self.normals[shift..shift + first]), (first, &self.normals[..MODULE_PIXELS - first])];
        for (at, z) in runs {
            let n = z.len();
            let (w, p, a) = (&mut out[at..at + n], &self.cal.pedestal[0][at..at + n], &self.noise_adc[at..at + n]);
            for i in 0..n {
                // clamp, then round half up by truncation (non-negative here); f32::round is
                // a libm call on baseline x86-64
                w[i] = ((p[i] + z[i] * a[i]).clamp(0.0, 16383.0) + 0.5) as u16;
            }
        }
    }

    /// Pixels hit by background photons: positions by geometric gaps (each pixel is hit
    /// with probability 1 - exp(-mean)), the count in a hit pixel from Poisson given >= 1.
    fn background_photons(&self, k: u64, out: &mut [u16]) {
        let lambda = self.cfg.background_photons;
        if lambda <= 0.0 {
            return;
        }
        let p_hit = 1.0 - (-lambda).exp();
        let log_miss = (1.0 - p_hit).ln();
        let mut s = rng::Stream::new(rng::key(&[k, 0xb9]));
        let e_ph = self.cfg.photon_energy_kev;
        let mut px = 0usize;
        loop {
            let gap = ((1.0 - s.unit()).ln() / log_miss).floor();
            if !gap.is_finite() || gap >= (MODULE_PIXELS - px) as f64 {
                return;
            }
            px += gap as usize;
            // Poisson conditioned on at least one photon, by inversion from P(0)
            let u = (-lambda).exp() + s.unit() * p_hit;
            let n = rng::poisson(lambda, ((u * (1u64 << 53) as f64) as u64) << 11).max(1) as f32;
            out[px] = self.cal.encode(px, n * e_ph + s.normal() * self.cfg.noise_kev);
            px += 1;
        }
    }

    fn add_spots(&mut self, frame: u64, k: u64, out: &mut [u16]) {
        let sigma = self.cfg.spot_sigma_px;
        let reach = (4.0 * sigma).ceil() as i64;
        let spots = self.spots(frame);
        let scratch = &mut self.spot_scratch;
        scratch.clear();
        for spot in spots {
            let norm = spot.photons / (2.0 * std::f64::consts::PI * sigma * sigma);
            let (cx, cy) = (spot.x.floor() as i64, spot.y.floor() as i64);
            for r in (cy - reach).max(0)..=(cy + reach).min(MODULE_ROWS as i64 - 1) {
                for c in (cx - reach).max(0)..=(cx + reach).min(MODULE_COLS as i64 - 1) {
                    let dx = c as f64 + 0.5 - spot.x;
                    let dy = r as f64 + 0.5 - spot.y;
                    let lambda = norm * (-(dx * dx + dy * dy) / (2.0 * sigma * sigma)).exp();
                    scratch.push(((r as usize * MODULE_COLS + c as usize) as u32, lambda as f32));
                }
            }
        }
        scratch.sort_unstable_by_key(|&(px, _)| px);
        let e_ph = self.cfg.photon_energy_kev;
        let mut i = 0;
        while i < scratch.len() {
            let px = scratch[i].0;
            let mut lambda = self.cfg.background_photons;
            while i < scratch.len() && scratch[i].0 == px {
                lambda += scratch[i].1 as f64;
                i += 1;
            }
            let h = rng::at(k, px as u64);
            let z = rng::normal(rng::at(k ^ 0x2_0000_0000, px as u64));
            let n = rng::poisson(lambda, h) as f32;
            out[px as usize] = self.cal.encode(px as usize, n * e_ph + z * self.cfg.noise_kev);
        }
    }
}

/// The little-endian bytes of a frame of words, as they travel on the wire.
pub fn as_bytes(words: &[u16]) -> &[u8] {
    // SAFETY: u16 has no padding and any byte pattern is a valid u8; the length is doubled
    // and the lifetime tied to `words`. The host is little-endian (checked at compile time),
    // so the in-memory bytes are the wire bytes.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 2) }
}

/// The bytes of a frame of words, to be written in place.
pub fn as_bytes_mut(words: &mut [u16]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; any byte pattern written is a valid u16, and the exclusive
    // borrow of `words` is held for the lifetime of the bytes.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), words.len() * 2) }
}

/// The 16-bit words of little-endian bytes as they came off the wire, without a copy.
/// Panics unless `bytes` is 2-aligned and of even length (frame slots always are).
pub fn as_words(bytes: &[u8]) -> &[u16] {
    assert!(bytes.as_ptr() as usize % 2 == 0 && bytes.len() % 2 == 0, "word-aligned whole words");
    // SAFETY: alignment and length checked above; any bit pattern is a valid u16; the
    // lifetime is tied to `bytes`; the host is little-endian (checked at compile time).
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<u16>(), bytes.len() / 2) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jungfrau::Gain;

    /// The views without a copy read and write what the words hold (run under Miri by
    /// `make miri`: the casts keep to their words' bounds and alignment).
    #[test]
    fn byte_views_are_the_little_endian_words() {
        let mut words = vec![0x0102u16, 0xa0b0, 0xffff];
        assert_eq!(as_bytes(&words), [2, 1, 0xb0, 0xa0, 0xff, 0xff]);
        as_bytes_mut(&mut words)[1] = 7;
        assert_eq!(words[0], 0x0702);
        let bytes = as_bytes(&words).to_vec();
        let aligned: Vec<u16> = as_words(as_bytes(&words)).to_vec();
        assert_eq!((aligned, bytes.len()), (words.clone(), 6));
        let odd = std::panic::catch_unwind(|| as_words(&as_bytes(&words)[1..5]).len());
        assert!(odd.is_err(), "a misaligned view is refused, not read");
    }

    #[test]
    fn deterministic_and_distinct() {
        let mut a = ModuleSynth::new(SynthConfig::default(), 0);
        let mut b = ModuleSynth::new(SynthConfig::default(), 0);
        let (mut fa, mut fb) = (vec![0u16; MODULE_PIXELS], vec![0u16; MODULE_PIXELS]);
        a.frame(7, &mut fa);
        b.frame(7, &mut fb);
        assert!(fa == fb, "same seed, module and frame give the same words");
        b.frame(8, &mut fb);
        assert!(fa != fb, "another frame differs");
        let mut c = ModuleSynth::new(SynthConfig::default(), 1);
        c.frame(7, &mut fb);
        assert!(fa != fb, "another module differs");
    }

    #[test]
    fn frames_look_like_jungfrau() {
        let mut s = ModuleSynth::new(SynthConfig::default(), 0);
        let mut f = vec![0u16; MODULE_PIXELS];
        s.frame(3, &mut f);
        let g0 = f.iter().filter(|&&w| Gain::of_word(w) == Some(Gain::G0)).count();
        assert!(g0 > MODULE_PIXELS * 99 / 100, "mostly G0: {g0}");
        let mean_adc = f.iter().map(|&w| (w & 0x3fff) as f64).sum::<f64>() / MODULE_PIXELS as f64;
        assert!((2300.0..2700.0).contains(&mean_adc), "pedestal level {mean_adc}");
        // the brightest spots put pixels above a few photons
        let cal = s.calibration();
        let spots = s.spots(3);
        assert!(!spots.is_empty());
        let brightest = spots.iter().max_by(|a, b| a.photons.total_cmp(&b.photons)).unwrap();
        let px = brightest.y as usize * MODULE_COLS + brightest.x as usize;
        let e = cal.energy_kev(px, f[px]).unwrap();
        assert!(e > 5.0 * 12.4, "spot centre holds photons: {e} keV for {brightest:?}");
    }
}
