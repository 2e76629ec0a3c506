//! The JUNGFRAU module model (docs/formats.md section 1): geometry, pixel words with gain bits,
//! and a per-pixel calibration (pedestal and gain for each of the three gain stages).

use crate::rng;

pub const MODULE_ROWS: usize = 512;
pub const MODULE_COLS: usize = 1024;
pub const MODULE_PIXELS: usize = MODULE_ROWS * MODULE_COLS;
/// The pixel pitch (both directions).
pub const PIXEL_SIZE_M: f64 = 75e-6;
/// Bytes of one raw module frame (16-bit words).
pub const MODULE_BYTES: usize = MODULE_PIXELS * 2;
/// Largest ADC value (14 bits).
pub const ADC_MAX: u16 = 0x3fff;
/// Jungfraujoch's special words.
pub const WORD_SATURATED: u16 = 0xc000;
pub const WORD_ERROR: u16 = 0xffff;

/// A gain stage. G1 and G2 have negative gains: the ADC value falls below the pedestal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Gain {
    G0 = 0,
    G1 = 1,
    G2 = 2,
}

impl Gain {
    pub const ALL: [Gain; 3] = [Gain::G0, Gain::G1, Gain::G2];

    /// The two gain bits (15..14) of a pixel word: 00 G0, 01 G1, 11 G2.
    pub const fn bits(self) -> u16 {
        match self {
            Gain::G0 => 0x0000,
            Gain::G1 => 0x4000,
            Gain::G2 => 0xc000,
        }
    }

    /// Gain stage of a word; `None` for the invalid code 10.
    pub const fn of_word(word: u16) -> Option<Gain> {
        match word >> 14 {
            0 => Some(Gain::G0),
            1 => Some(Gain::G1),
            3 => Some(Gain::G2),
            _ => None,
        }
    }
}

/// Typical calibration values (PSI): pedestal medians in ADU and gains in ADU/keV.
pub const TYPICAL_PEDESTAL: [f32; 3] = [2450.0, 13600.0, 14100.0];
pub const TYPICAL_GAIN: [f32; 3] = [41.0, -1.439, -0.1145];

/// Per-pixel pedestals and gains of one module, indexed `[gain][pixel]`.
pub struct ModuleCalibration {
    pub pedestal: [Vec<f32>; 3],
    pub gain: [Vec<f32>; 3],
}

/// G0 is used while the ADC stays below this value; above it the module switches to G1.
const G0_SWITCH_ADC: f32 = 14_000.0;
/// G1 is used while its ADC stays above this value; below it the module switches to G2.
const G1_FLOOR_ADC: f32 = 1_000.0;

impl ModuleCalibration {
    /// A deterministic synthetic calibration: typical values with per-pixel spread
    /// (pedestal sigma 3% G0, 2% G1/G2; gain sigma 2%), fixed by `seed` and `module`.
    pub fn synthetic(seed: u64, module: u16) -> Self {
        Self::synthetic_pixels(seed, module, MODULE_PIXELS)
    }

    /// The first `pixels` pixels of [`ModuleCalibration::synthetic`] (the same values), for
    /// tests of fewer pixels than a module (under Miri a whole module takes minutes).
    pub fn synthetic_pixels(seed: u64, module: u16, pixels: usize) -> Self {
        let spread_p = [0.03f32, 0.02, 0.02];
        let spread_g = 0.02f32;
        let mut pedestal: [Vec<f32>; 3] = Default::default();
        let mut gain: [Vec<f32>; 3] = Default::default();
        for g in 0..3 {
            let kp = rng::key(&[seed, module as u64, 0xca1, g as u64]);
            let kg = rng::key(&[seed, module as u64, 0x9a1, g as u64]);
            pedestal[g] = (0..pixels as u64)
                .map(|i| TYPICAL_PEDESTAL[g] * (1.0 + spread_p[g] * rng::normal(rng::at(kp, i))))
                .collect();
            gain[g] = (0..pixels as u64)
                .map(|i| TYPICAL_GAIN[g] * (1.0 + spread_g * rng::normal(rng::at(kg, i))))
                .collect();
        }
        ModuleCalibration { pedestal, gain }
    }

    /// The raw word a pixel reads for deposited energy `e_kev`: the lowest gain stage whose
    /// ADC value stays in range, `adc = round(P + E * G)` (the inverse of the conversion),
    /// clamped to 14 bits. Energies beyond G2's range read as the saturation word.
    #[inline]
    pub fn encode(&self, px: usize, e_kev: f32) -> u16 {
        let adc0 = self.pedestal[0][px] + e_kev * self.gain[0][px];
        if adc0 < G0_SWITCH_ADC {
            return adc_word(Gain::G0, adc0);
        }
        let adc1 = self.pedestal[1][px] + e_kev * self.gain[1][px];
        if adc1 > G1_FLOOR_ADC {
            return adc_word(Gain::G1, adc1);
        }
        let adc2 = self.pedestal[2][px] + e_kev * self.gain[2][px];
        if adc2 < 1.0 {
            return WORD_SATURATED;
        }
        adc_word(Gain::G2, adc2)
    }

    /// The model's energy for a word: `(adc - P[g]) / G[g]`; `None` for the invalid gain
    /// code and the special words. The reference the processing stages are tested against.
    pub fn energy_kev(&self, px: usize, word: u16) -> Option<f32> {
        if word == WORD_SATURATED || word == WORD_ERROR || word == Gain::G1.bits() {
            return None;
        }
        let g = Gain::of_word(word)? as usize;
        let adc = (word & ADC_MAX) as f32;
        Some((adc - self.pedestal[g][px]) / self.gain[g][px])
    }
}

#[inline(always)]
fn adc_word(g: Gain, adc: f32) -> u16 {
    // clamp to 14 bits, then round half away from zero (by truncation: non-negative now);
    // G1 with ADC 0 is an error word
    let a = (adc.clamp(0.0, ADC_MAX as f32) + 0.5) as u16;
    let a = if g == Gain::G1 && a == 0 { 1 } else { a };
    g.bits() | a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_then_convert_recovers_energy_in_every_gain() {
        let cal = ModuleCalibration::synthetic(1, 0);
        for px in [0usize, 12345, MODULE_PIXELS - 1] {
            for &e in &[0.0f32, 12.4, 100.0, 300.0, 400.0, 2_000.0, 8_000.0, 20_000.0, 60_000.0] {
                let w = cal.encode(px, e);
                let back = cal.energy_kev(px, w).expect("valid word");
                // one ADU of rounding in the stage used, over that stage's gain
                let g = Gain::of_word(w).unwrap() as usize;
                let tol = 0.5 / cal.gain[g][px].abs() + 1e-3 * e;
                assert!((back - e).abs() <= tol, "px {px} e {e} word {w:#06x} back {back}");
            }
        }
    }

    #[test]
    fn gain_stages_switch_with_energy() {
        let cal = ModuleCalibration::synthetic(1, 0);
        assert_eq!(Gain::of_word(cal.encode(5, 10.0)), Some(Gain::G0));
        assert_eq!(Gain::of_word(cal.encode(5, 1_000.0)), Some(Gain::G1));
        assert_eq!(Gain::of_word(cal.encode(5, 50_000.0)), Some(Gain::G2));
        assert_eq!(cal.encode(5, 1e7), WORD_SATURATED);
        assert_eq!(Gain::of_word(0x8000), None);
    }
}
