//! A JUNGFRAU pedestal run, as PSI's users take one: dark frames in G0, then with the gain
//! forced to G1 and then G2. Every frame goes to the three stages' [`Pedestal`]s; each takes
//! a pixel's word only when its gain bits say its stage, so each pixel's pedestal of a stage
//! comes from the frames it spent in that stage, whatever the order. The result is a
//! calibration file the next acquisition converts with.

use crate::calfile::CalFile;
use crate::convert::Calibration;
use crate::pedestal::{mask_bits, Pedestal};

/// The three stages' pedestals of a pedestal run over an image of `rows x cols` pixels.
pub struct PedestalRun {
    rows: usize,
    cols: usize,
    stages: [Pedestal<f64>; 3],
    /// Frames left out: incomplete ones, whose missing pixels are no dark signal.
    left_out: u64,
}

impl PedestalRun {
    /// A run whose stages each keep a running window of `window` frames.
    pub fn new(rows: usize, cols: usize, window: u32) -> PedestalRun {
        let px = rows * cols;
        PedestalRun { rows, cols, stages: [0, 1, 2].map(|s| Pedestal::new(px, s, window)), left_out: 0 }
    }

    /// Takes one dark frame's raw words (the image, `rows x cols`).
    pub fn push(&mut self, raw: &[u16]) {
        for p in &mut self.stages {
            p.push(raw);
        }
    }

    /// Frames taken.
    pub fn frames(&self) -> u64 {
        self.stages[0].frames()
    }

    /// Counts a frame left out (incomplete).
    pub fn leave_out(&mut self) {
        self.left_out += 1;
    }

    /// Frames left out.
    pub fn left_out(&self) -> u64 {
        self.left_out
    }

    /// The calibration: each stage's pedestal, RMS and frame count, the `gain` given, and a
    /// mask: `mask` (gaps, say) with the pixels that had fewer than `min_frames` frames in a
    /// stage (their pedestal is `fallback`'s) or a G0 RMS above `max_rms_g0` ADU. Frames in
    /// other stages are what a pedestal run is made of: they mask nothing.
    pub fn calibration(&self, gain: [Vec<f32>; 3], mut mask: Vec<u32>, fallback: [f32; 3], min_frames: u32, max_rms_g0: f32) -> CalFile {
        let px = self.rows * self.cols;
        assert!(mask.len() == px && gain.iter().all(|g| g.len() == px), "a mask and gains of the image");
        let mut pedestal = [vec![0.0; px], vec![0.0; px], vec![0.0; px]];
        let mut rms = [vec![0.0; px], vec![0.0; px], vec![0.0; px]];
        let mut frames = [0u32; 3];
        for (s, p) in self.stages.iter().enumerate() {
            p.mean_into(&mut pedestal[s]);
            p.rms_into(&mut rms[s]);
            frames[s] = p.samples().iter().copied().max().unwrap_or(0);
            for (px, &n) in p.samples().iter().enumerate() {
                if n < min_frames.max(1) {
                    mask[px] |= mask_bits::TOO_FEW_FRAMES;
                }
                if n == 0 {
                    pedestal[s][px] = fallback[s];
                }
                if s == 0 && n > 0 && rms[0][px] > max_rms_g0 {
                    mask[px] |= mask_bits::NOISY;
                }
            }
        }
        CalFile { rows: self.rows, cols: self.cols, cal: Calibration { pedestal, gain, mask }, rms: Some(rms), frames: Some(frames) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stage_takes_the_frames_of_its_gain() {
        let (rows, cols) = (2, 3);
        let mut run = PedestalRun::new(rows, cols, 100);
        // two G0 frames, one G1, one G2; pixel 5 never leaves G0
        let frames: [[u16; 6]; 4] = [[10, 10, 10, 10, 10, 10], [12, 12, 12, 12, 12, 12], [0x4000 | 100; 6], [0xC000 | 200; 6]];
        for mut f in frames {
            if f[0] & 0xC000 != 0 {
                f[5] = 30;
            }
            run.push(&f);
        }
        let cf = run.calibration([vec![1.0; 6], vec![1.0; 6], vec![1.0; 6]], vec![0; 6], [1.0, 2.0, 3.0], 1, 100.0);
        assert_eq!(cf.cal.pedestal[0][0], 11.0);
        assert_eq!((cf.cal.pedestal[1][0], cf.cal.pedestal[2][0]), (100.0, 200.0));
        assert_eq!(cf.cal.pedestal[0][5], 20.5, "pixel 5: four G0 frames");
        assert_eq!((cf.cal.pedestal[1][5], cf.cal.pedestal[2][5]), (2.0, 3.0), "no G1 or G2 frame: the fallback");
        assert_eq!(cf.cal.mask[0], 0);
        assert_eq!(cf.cal.mask[5], mask_bits::TOO_FEW_FRAMES);
        assert_eq!(cf.frames, Some([4, 1, 1]));
    }
}
