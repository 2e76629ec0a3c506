//! Deterministic synthetic JUNGFRAU frames: per-pixel pedestals and gains, electronic noise,
//! a Poisson photon background and Gaussian Bragg spots, encoded to raw words by the inverse
//! of the conversion. The same seed, module and frame number always give the same bytes.

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

const NOISE_TABLE: usize = 2048;

/// Generates the frames of one module.
pub struct ModuleSynth {
    cfg: SynthConfig,
    module: u16,
    cal: ModuleCalibration,
    /// Electronic noise in G0 ADU per pixel (gain * noise).
    noise_adc: Vec<f32>,
    /// Standard normal draws indexed by 11 random bits.
    normals: Vec<f32>,
    /// P(no background photon) scaled to 53 bits, for the branch-light fast path.
    zero_photon_threshold: u64,
    spot_scratch: Vec<(u32, f32)>,
}

impl ModuleSynth {
    pub fn new(cfg: SynthConfig, module: u16) -> Self {
        let cal = ModuleCalibration::synthetic(cfg.seed, module);
        let noise_adc = cal.gain[0].iter().map(|g| g * cfg.noise_kev).collect();
        let kn = rng::key(&[cfg.seed, 0x401_5e]);
        let normals = (0..NOISE_TABLE as u64).map(|i| rng::normal(rng::at(kn, i))).collect();
        let zero_photon_threshold = ((-cfg.background_photons).exp() * (1u64 << 53) as f64) as u64;
        ModuleSynth { cfg, module, cal, noise_adc, normals, zero_photon_threshold, spot_scratch: Vec::new() }
    }

    pub fn calibration(&self) -> &ModuleCalibration {
        &self.cal
    }

    pub fn module(&self) -> u16 {
        self.module
    }

    /// The Bragg spots of a frame (the ground truth for spot finders).
    pub fn spots(&self, frame: u64) -> Vec<Spot> {
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
        let e_ph = self.cfg.photon_energy_kev;
        let p0 = &self.cal.pedestal[0];
        for (px, w) in out.iter_mut().enumerate() {
            let h = rng::at(k, px as u64);
            let z = self.normals[(h & (NOISE_TABLE as u64 - 1)) as usize];
            if h >> 11 < self.zero_photon_threshold {
                // no photon: G0, pedestal plus noise (the common case)
                *w = (p0[px] + z * self.noise_adc[px]).round().clamp(0.0, 16383.0) as u16;
            } else {
                let n = rng::poisson(self.cfg.background_photons, h) as f32;
                *w = self.cal.encode(px, n * e_ph + z * self.cfg.noise_kev);
            }
        }
        self.add_spots(frame, k, out);
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
            let z = self.normals[(h & (NOISE_TABLE as u64 - 1)) as usize];
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jungfrau::Gain;

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
