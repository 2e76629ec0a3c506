//! JUNGFRAU conversion (docs/formats.md section 1): raw 16-bit words (gain bits 15..14, ADC
//! 13..0) to energy in keV, `E = (adc - P[g]) / G[g]`, or to photon counts for a photon
//! energy, `n = E / E_photon` rounded half away from zero, saturating.
//!
//! Conventions (configurable where docs/formats.md says implementations disagree):
//! - The invalid gain code 10 is an error by default ([`InvalidGain`]); aare converts it as
//!   G0, which [`InvalidGain::AsG0`] reproduces.
//! - The special words 0xC000 (saturated), 0x4000 (G1 with ADC 0) and 0xFFFF (error), and
//!   masked pixels, are not converted. In keV they become +inf (saturated) or NaN (error,
//!   masked); in photon counts the type's maximum (saturated) or minimum (error, masked), so
//!   that a real count saturates one below them.
//! - The arithmetic is the formula's in f32, subtraction then division (not a multiplication
//!   by a reciprocal), so the keV result is bit-exact with aare's `apply_calibration`.

use std::sync::Arc;

use rdaq_detector::jungfrau::{ADC_MAX, WORD_ERROR, WORD_SATURATED};
use thiserror::Error;

/// What the invalid gain code 10 means.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InvalidGain {
    /// An error pixel (Jungfraujoch's choice).
    #[default]
    Error,
    /// Converted with the G0 calibration (aare's choice).
    AsG0,
    /// Converted with the G2 calibration.
    AsG2,
}

impl InvalidGain {
    /// The policy named `name`: `error`, `g0` or `g2`.
    pub fn parse(name: &str) -> Result<InvalidGain, crate::UnknownName> {
        match name {
            "error" => Ok(InvalidGain::Error),
            "g0" => Ok(InvalidGain::AsG0),
            "g2" => Ok(InvalidGain::AsG2),
            _ => Err(crate::UnknownName { what: "invalid gain policy", name: name.into(), expected: "error, g0 or g2" }),
        }
    }
}

/// The G1 word with ADC 0: Jungfraujoch's marker of a broken readout.
const WORD_G1_ZERO: u16 = 0x4000;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum CalibrationError {
    #[error("calibration arrays hold {got} pixels, the module has {want}")]
    Size { got: usize, want: usize },
    #[error("{what} of pixel {pixel} in gain {gain} is not a finite number (or a zero gain)")]
    NotFinite { what: &'static str, pixel: usize, gain: usize },
}

/// Per-pixel calibration of one module: pedestal (ADU) and gain (ADU/keV) for each gain
/// stage, indexed `[gain][pixel]`, and a pixel mask (non-zero: do not convert).
#[derive(Clone, Debug)]
pub struct Calibration {
    pub pedestal: [Vec<f32>; 3],
    pub gain: [Vec<f32>; 3],
    pub mask: Vec<u32>,
}

impl Calibration {
    /// The largest |keV| any word of an unmasked pixel converts to (ADC 0 or 16383 in any
    /// gain stage): what decides whether photon counts fit a type.
    pub fn max_kev(&self) -> f32 {
        let mut max = 0f32;
        for g in 0..3 {
            for ((&p, &gain), &m) in self.pedestal[g].iter().zip(&self.gain[g]).zip(&self.mask) {
                if m == 0 {
                    let e = [(0.0 - p) / gain, (ADC_MAX as f32 - p) / gain];
                    max = max.max(e[0].abs()).max(e[1].abs());
                }
            }
        }
        max
    }

    /// A module's calibration (one module frame of pixels) with no pixel masked.
    pub fn unmasked(m: &rdaq_detector::jungfrau::ModuleCalibration) -> Calibration {
        let pixels = m.pedestal[0].len();
        Calibration { pedestal: m.pedestal.clone(), gain: m.gain.clone(), mask: vec![0; pixels] }
    }

    /// Checks sizes and values: every array has `pixels` entries, pedestals are finite and
    /// gains finite and non-zero.
    pub fn check(&self, pixels: usize) -> Result<(), CalibrationError> {
        for a in self.pedestal.iter().chain(self.gain.iter()).map(Vec::len).chain([self.mask.len()]) {
            if a != pixels {
                return Err(CalibrationError::Size { got: a, want: pixels });
            }
        }
        for g in 0..3 {
            if let Some(pixel) = self.pedestal[g].iter().position(|p| !p.is_finite()) {
                return Err(CalibrationError::NotFinite { what: "pedestal", pixel, gain: g });
            }
            if let Some(pixel) = self.gain[g].iter().position(|x| !x.is_finite() || *x == 0.0) {
                return Err(CalibrationError::NotFinite { what: "gain", pixel, gain: g });
            }
        }
        Ok(())
    }
}

/// Photon count types: the saturation and error markers and the conversion with saturation.
pub trait Count: Copy + Default + Send + Sync {
    const SATURATED: Self;
    const ERROR: Self;
    /// Rounds half away from zero and saturates one inside the markers.
    fn from_f32(x: f32) -> Self;
}

/// `x` rounded half away from zero, without a libm call: truncate, then step away from
/// zero when the (exact) remainder is at least one half. Equal to `f32::round` for every
/// `x` that is finite with |x| < 2^31, and vectorizable. Beyond, `x` is clamped to
/// ±(2^31 - 128), the largest f32 inside the i32 range; NaN counts as 0.
#[inline(always)]
fn round_half_away(x: f32) -> i32 {
    let x = if x.is_nan() { 0.0 } else { x.clamp(-2_147_483_520.0, 2_147_483_520.0) };
    // SAFETY: `x` is finite and inside the i32 range (just above); the unchecked
    // truncation then vectorizes where `as` (saturating, NaN-checking) does not.
    let t = unsafe { x.to_int_unchecked::<i32>() };
    let frac = x - t as f32;
    t + (frac >= 0.5) as i32 - (frac <= -0.5) as i32
}

impl Count for i16 {
    const SATURATED: i16 = i16::MAX;
    const ERROR: i16 = i16::MIN;
    #[inline(always)]
    fn from_f32(x: f32) -> i16 {
        // clamping to integer bounds first gives the same as rounding first
        round_half_away(x.clamp(i16::MIN as f32 + 1.0, i16::MAX as f32 - 1.0)) as i16
    }
}

impl Count for i32 {
    const SATURATED: i32 = i32::MAX;
    const ERROR: i32 = i32::MIN;
    #[inline(always)]
    fn from_f32(x: f32) -> i32 {
        // f32 cannot represent i32::MAX - 1: round_half_away clamps at 2^31 - 128
        round_half_away(x)
    }
}

/// Photon counts from keV values as [`Converter::to_photons`] makes them (the same f32
/// division and rounding): +inf is saturated, NaN an error or masked pixel.
pub fn kev_to_photons<T: Count>(kev: &[f32], photon_kev: f32, out: &mut [T]) {
    assert_eq!(kev.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { kev_to_photons_avx2(kev, photon_kev, out) };
        return;
    }
    kev_to_photons_loop(kev, photon_kev, out);
}

/// [`kev_to_photons_loop`] compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn kev_to_photons_avx2<T: Count>(kev: &[f32], photon_kev: f32, out: &mut [T]) {
    kev_to_photons_loop(kev, photon_kev, out);
}

#[inline(always)]
fn kev_to_photons_loop<T: Count>(kev: &[f32], photon_kev: f32, out: &mut [T]) {
    for (o, &e) in out.iter_mut().zip(kev) {
        // the markers by selection (NaN fails both comparisons), so the loop has no branch
        let n = T::from_f32(if e.is_finite() { e / photon_kev } else { 0.0 });
        *o = if e.is_nan() { T::ERROR } else if e == f32::INFINITY { T::SATURATED } else { n };
    }
}

/// What a word is, before any arithmetic.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Value(usize),
    Saturated,
    Error,
}

/// The conversion of a module or an assembled image (the calibration's pixels).
pub struct Converter {
    cal: Arc<Calibration>,
    /// The G0 pedestal in use: the calibration's, or a tracked one published since
    /// ([`Converter::with_g0`]).
    g0: G0Pedestal,
    invalid: InvalidGain,
    /// One bit per pixel: masked (kept apart from the u32 mask so that the fast path reads
    /// 1/8 byte per pixel for it, not 4).
    masked: Arc<Vec<u64>>,
}

/// A G0 pedestal, finite at every pixel: what a pedestal tracker publishes to converters that
/// share everything else of their calibration. Checked once where it is made, and handed
/// out by reference count, so publishing it costs one image, not a calibration per worker.
#[derive(Clone, Debug)]
pub struct G0Pedestal(Arc<Vec<f32>>);

impl G0Pedestal {
    pub fn new(values: Vec<f32>) -> Result<G0Pedestal, CalibrationError> {
        if let Some(pixel) = values.iter().position(|p| !p.is_finite()) {
            return Err(CalibrationError::NotFinite { what: "pedestal", pixel, gain: 0 });
        }
        Ok(G0Pedestal(Arc::new(values)))
    }

    pub fn values(&self) -> &[f32] {
        &self.0
    }

    /// The values' buffer back, unless another holder shares it (then the pedestal itself).
    pub fn into_values(self) -> Result<Vec<f32>, G0Pedestal> {
        Arc::try_unwrap(self.0).map_err(G0Pedestal)
    }
}

/// Pixels per block of the fast path: the block is converted as G0, then the pixels that
/// are not plain G0 words (other gains, special words, masked) are redone one by one.
const BLOCK: usize = 512;

impl Converter {
    pub fn new(cal: Calibration, invalid: InvalidGain) -> Result<Converter, CalibrationError> {
        Self::shared(Arc::new(cal), invalid)
    }

    /// A converter on a calibration shared with others (a pipeline's workers, which take
    /// a new one when the tracked pedestal is published).
    pub fn shared(cal: Arc<Calibration>, invalid: InvalidGain) -> Result<Converter, CalibrationError> {
        cal.check(cal.mask.len())?;
        let mut masked = vec![0u64; cal.mask.len().div_ceil(64)];
        for (px, &m) in cal.mask.iter().enumerate() {
            if m != 0 {
                masked[px / 64] |= 1 << (px % 64);
            }
        }
        let g0 = G0Pedestal(Arc::new(cal.pedestal[0].clone()));
        Ok(Converter { cal, g0, invalid, masked: Arc::new(masked) })
    }

    /// This converter with the G0 pedestal `g0` (a tracked pedestal, published): its gains,
    /// mask and other pedestals shared, nothing checked again but the size.
    pub fn with_g0(&self, g0: G0Pedestal) -> Result<Converter, CalibrationError> {
        if g0.values().len() != self.pixels() {
            return Err(CalibrationError::Size { got: g0.values().len(), want: self.pixels() });
        }
        Ok(Converter { cal: self.cal.clone(), g0, invalid: self.invalid, masked: self.masked.clone() })
    }

    #[inline(always)]
    fn is_masked(&self, px: usize) -> bool {
        self.masked[px / 64] >> (px % 64) & 1 == 1
    }

    /// Whether any pixel of `first..first + n` is masked.
    #[inline(always)]
    fn any_masked(&self, first: usize, n: usize) -> bool {
        let (a, b) = (first / 64, (first + n - 1) / 64);
        (a..=b).any(|k| {
            let lo = if k == a { first % 64 } else { 0 };
            let hi = if k == b { (first + n - 1) % 64 } else { 63 };
            let m = (u64::MAX >> (63 - hi)) & (u64::MAX << lo);
            self.masked[k] & m != 0
        })
    }

    pub fn pixels(&self) -> usize {
        self.cal.mask.len()
    }

    #[inline(always)]
    fn kind(&self, word: u16, masked: bool) -> Kind {
        if masked || word == WORD_ERROR || word == WORD_G1_ZERO {
            return Kind::Error;
        }
        if word == WORD_SATURATED {
            return Kind::Saturated;
        }
        match (word >> 14, self.invalid) {
            (0, _) => Kind::Value(0),
            (1, _) => Kind::Value(1),
            (3, _) => Kind::Value(2),
            (_, InvalidGain::AsG0) => Kind::Value(0),
            (_, InvalidGain::AsG2) => Kind::Value(2),
            (_, InvalidGain::Error) => Kind::Error,
        }
    }

    #[inline(always)]
    fn kev(&self, px: usize, g: usize, word: u16) -> f32 {
        let pedestal = if g == 0 { self.g0.values()[px] } else { self.cal.pedestal[g][px] };
        ((word & ADC_MAX) as f32 - pedestal) / self.cal.gain[g][px]
    }

    /// Converts a whole frame (the calibration's pixels) to keV.
    pub fn to_kev(&self, raw: &[u16], out: &mut [f32]) {
        assert!(raw.len() == self.pixels(), "one frame in");
        self.to_kev_at(0, raw, out);
    }

    /// Converts the words of pixels `first..first + raw.len()` (a module's row in an
    /// assembled image) to keV.
    pub fn to_kev_at(&self, first: usize, raw: &[u16], out: &mut [f32]) {
        assert!(raw.len() == out.len() && first + raw.len() <= self.pixels(), "pixels inside the calibration");
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            unsafe { self.to_kev_avx2(first, raw, out) };
            return;
        }
        self.to_kev_blocks(first, raw, out);
    }

    /// Converts a frame's module words (`words`, the modules one after the other) into the
    /// assembled image `image` along `runs`: (word in `words`, image pixel, length) each, as
    /// a geometry's `runs_in_image_order` lists them. Pixels between runs are left as they are.
    pub fn to_kev_runs(&self, runs: &[(usize, usize, usize)], words: &[u16], image: &mut [f32]) {
        for &(src, at, run) in runs {
            self.to_kev_at(at, &words[src..src + run], &mut image[at..at + run]);
        }
    }

    /// [`Converter::to_kev_blocks`] compiled for AVX2.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn to_kev_avx2(&self, first: usize, raw: &[u16], out: &mut [f32]) {
        self.to_kev_blocks(first, raw, out);
    }

    /// The fast path: each block as G0 in a loop the compiler vectorizes, then the block's
    /// exceptions (any word with gain bits, or a masked pixel) one by one.
    #[inline(always)]
    fn to_kev_blocks(&self, first: usize, raw: &[u16], out: &mut [f32]) {
        let (p0, g0) = (&self.g0.values()[first..first + raw.len()], &self.cal.gain[0][first..first + raw.len()]);
        for (b, (w, o)) in raw.chunks(BLOCK).zip(out.chunks_mut(BLOCK)).enumerate() {
            let at = b * BLOCK;
            let (p, g) = (&p0[at..at + w.len()], &g0[at..at + w.len()]);
            let mut gain_bits = 0u16;
            for i in 0..w.len() {
                gain_bits |= w[i];
                o[i] = (w[i] as f32 - p[i]) / g[i];
            }
            if gain_bits >> 14 != 0 || self.any_masked(first + at, w.len()) {
                for i in 0..w.len() {
                    let px = first + at + i;
                    if w[i] >> 14 != 0 || self.is_masked(px) {
                        o[i] = self.kev_word(px, w[i]);
                    }
                }
            }
        }
    }

    /// One word, every case.
    #[inline]
    fn kev_word(&self, px: usize, w: u16) -> f32 {
        match self.kind(w, self.is_masked(px)) {
            Kind::Value(g) => self.kev(px, g, w),
            Kind::Saturated => f32::INFINITY,
            Kind::Error => f32::NAN,
        }
    }

    /// Converts a whole frame to photon counts of `photon_kev` each: keV as
    /// [`Converter::to_kev`], then [`kev_to_photons`], a block at a time.
    pub fn to_photons<T: Count>(&self, raw: &[u16], photon_kev: f32, out: &mut [T]) {
        assert!(raw.len() == self.pixels() && out.len() == self.pixels(), "one frame in and out");
        assert!(photon_kev.is_finite() && photon_kev > 0.0, "a positive photon energy");
        let mut kev = [0f32; 1024];
        for (k, (w, o)) in raw.chunks(1024).zip(out.chunks_mut(1024)).enumerate() {
            let kev = &mut kev[..w.len()];
            self.to_kev_at(k * 1024, w, kev);
            kev_to_photons(kev, photon_kev, o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdaq_detector::jungfrau::{ModuleCalibration, MODULE_PIXELS};
    use rdaq_detector::rng;

    fn calibration(pixels: usize) -> Calibration {
        let m = ModuleCalibration::synthetic_pixels(3, 0, pixels);
        Calibration { pedestal: m.pedestal, gain: m.gain, mask: vec![0; pixels] }
    }

    #[test]
    fn kev_matches_the_detector_model_for_every_valid_word() {
        let n = 4096;
        let conv = Converter::new(calibration(n), InvalidGain::Error).unwrap();
        let model = ModuleCalibration::synthetic(3, 0);
        let raw: Vec<u16> = (0..n as u64).map(|i| rng::at(77, i) as u16).collect();
        let mut out = vec![0f32; n];
        conv.to_kev(&raw, &mut out);
        for px in 0..n {
            match model.energy_kev(px, raw[px]) {
                Some(e) => assert_eq!(out[px].to_bits(), e.to_bits(), "pixel {px} word {:#06x}", raw[px]),
                None if raw[px] == WORD_SATURATED => assert_eq!(out[px], f32::INFINITY),
                None => assert!(out[px].is_nan(), "pixel {px} word {:#06x}", raw[px]),
            }
        }
    }

    #[test]
    fn a_published_g0_pedestal_converts_as_a_calibration_that_holds_it() {
        let n = 4096;
        let mut cal = calibration(n);
        cal.mask[7] = 1;
        let conv = Converter::new(cal.clone(), InvalidGain::Error).unwrap();
        let tracked: Vec<f32> = (0..n).map(|px| cal.pedestal[0][px] + (px % 13) as f32 - 6.0).collect();
        let followed = conv.with_g0(G0Pedestal::new(tracked.clone()).unwrap()).unwrap();
        cal.pedestal[0] = tracked;
        let whole = Converter::new(cal.clone(), InvalidGain::Error).unwrap();
        let raw: Vec<u16> = (0..n as u64).map(|i| rng::at(78, i) as u16).collect();
        let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
        followed.to_kev(&raw, &mut a);
        whole.to_kev(&raw, &mut b);
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "the same keV, bit for bit, every gain and the mask");
        assert!(matches!(G0Pedestal::new(vec![0.0, f32::NAN]), Err(CalibrationError::NotFinite { pixel: 1, .. })));
        assert!(matches!(conv.with_g0(G0Pedestal::new(vec![0.0; n - 1]).unwrap()), Err(CalibrationError::Size { .. })));
    }

    #[test]
    fn special_words_invalid_gain_and_mask() {
        let mut cal = calibration(6);
        cal.mask[5] = 1 << 1;
        let raw = [WORD_SATURATED, WORD_ERROR, WORD_G1_ZERO, 0x8000 | 1000, 0x8000 | 1000, 0x0100];
        let mut out = [0f32; 6];
        let conv = Converter::new(cal.clone(), InvalidGain::Error).unwrap();
        conv.to_kev(&raw, &mut out);
        assert_eq!(out[0], f32::INFINITY);
        assert!(out[1].is_nan() && out[2].is_nan() && out[3].is_nan() && out[5].is_nan());
        let conv = Converter::new(cal.clone(), InvalidGain::AsG0).unwrap();
        conv.to_kev(&raw, &mut out);
        assert_eq!(out[4], (1000.0 - cal.pedestal[0][4]) / cal.gain[0][4]);
        let conv = Converter::new(cal.clone(), InvalidGain::AsG2).unwrap();
        conv.to_kev(&raw, &mut out);
        assert_eq!(out[4], (1000.0 - cal.pedestal[2][4]) / cal.gain[2][4]);
        let mut counts = [0i16; 6];
        conv.to_photons(&raw, 12.4, &mut counts);
        assert_eq!((counts[0], counts[1], counts[5]), (i16::MAX, i16::MIN, i16::MIN));
    }

    #[test]
    fn photon_counts_round_half_away_from_zero_and_saturate() {
        // pedestal 0, gain 1 ADU/keV, photon 1 keV: the count is the ADC value, or minus it
        let one = |g: f32| Calibration { pedestal: [vec![0.0; 4], vec![0.0; 4], vec![0.0; 4]], gain: [vec![g; 4], vec![g; 4], vec![g; 4]], mask: vec![0; 4] };
        let conv = Converter::new(one(2.0), InvalidGain::Error).unwrap();
        let mut c = [0i16; 4];
        conv.to_photons(&[5, 3, 1, 0x3fff], 1.0, &mut c); // 2.5, 1.5, 0.5, 8191.5
        assert_eq!(c, [3, 2, 1, 8192]);
        let conv = Converter::new(one(-2.0), InvalidGain::Error).unwrap();
        conv.to_photons(&[5, 3, 1, 0], 1.0, &mut c);
        assert_eq!(c, [-3, -2, -1, 0]);
        let conv = Converter::new(one(0.01), InvalidGain::Error).unwrap();
        conv.to_photons(&[0x3fff, 1, 2, 3], 1.0, &mut c);
        assert_eq!(c[0], i16::MAX - 1, "saturates below the saturation marker");
        let mut w = [0i32; 4];
        conv.to_photons(&[0x3fff, 1, 2, 3], 1.0, &mut w);
        assert_eq!(w, [1_638_300, 100, 200, 300]);
    }

    #[test]
    fn rounding_without_libm_equals_round() {
        let mut xs = vec![0.5f32, -0.5, 1.5, -1.5, 2.5, 0.49999997, -0.49999997, 8388607.5, -8388607.5, 16777215.0, 1e9, -1e9, 2147483520.0];
        xs.extend((0..200_000u64).map(|i| f32::from_bits(rng::at(9, i) as u32)).filter(|x| x.is_finite() && x.abs() < 2.1e9));
        for x in xs {
            assert_eq!(round_half_away(x), x.round() as i32, "{x}");
            assert_eq!(i16::from_f32(x), x.round().clamp(-32767.0, 32766.0) as i16, "{x}");
        }
    }

    #[test]
    fn the_fast_path_equals_the_word_by_word_conversion() {
        let n = 4096 + 17;
        let mut cal = calibration(n);
        for px in [3, 64, 65, 700, 4100] {
            cal.mask[px] = 1 << 4;
        }
        let conv = Converter::new(cal, InvalidGain::AsG2).unwrap();
        // mostly G0 words, some blocks all G0, some with exceptions
        let raw: Vec<u16> = (0..n as u64).map(|i| { let r = rng::at(79, i); if r % 13 == 0 { r as u16 } else { (r as u16) & 0x3fff } }).collect();
        for first in [0, 1, 63] {
            let mut out = vec![0f32; n - first];
            conv.to_kev_at(first, &raw[first..], &mut out);
            for (i, o) in out.iter().enumerate() {
                let want = conv.kev_word(first + i, raw[first + i]);
                assert!(o.to_bits() == want.to_bits() || (o.is_nan() && want.is_nan()), "pixel {} word {:#06x}: {o} vs {want}", first + i, raw[first + i]);
            }
        }
    }

    #[test]
    fn counts_from_kev_equal_counts_from_words() {
        let n = 4096;
        let conv = Converter::new(calibration(n), InvalidGain::Error).unwrap();
        let raw: Vec<u16> = (0..n as u64).map(|i| rng::at(78, i) as u16).collect();
        let (mut kev, mut a, mut b) = (vec![0f32; n], vec![0i16; n], vec![0i16; n]);
        conv.to_kev(&raw, &mut kev);
        conv.to_photons(&raw, 12.4, &mut a);
        kev_to_photons(&kev, 12.4, &mut b);
        assert_eq!(a, b);
        let mut half = vec![0f32; n / 2];
        conv.to_kev_at(n / 2, &raw[n / 2..], &mut half);
        assert_eq!(half.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), kev[n / 2..].iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }

    #[test]
    fn bad_calibrations_are_refused() {
        let mut cal = calibration(8);
        cal.gain[1][3] = 0.0;
        assert_eq!(Converter::new(cal, InvalidGain::Error).err(), Some(CalibrationError::NotFinite { what: "gain", pixel: 3, gain: 1 }));
        let mut cal = calibration(8);
        cal.pedestal[2].pop();
        assert!(matches!(Converter::new(cal, InvalidGain::Error), Err(CalibrationError::Size { got: 7, want: 8 })));
        assert_eq!(calibration(MODULE_PIXELS).check(MODULE_PIXELS), Ok(()));
    }
}
