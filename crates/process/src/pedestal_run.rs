//! A JUNGFRAU pedestal run, as PSI's users take one: dark frames in G0, then with the gain
//! forced to G1 and then G2. Each pixel's word goes to the stage its gain bits say, so each
//! pixel's pedestal of a stage comes from the frames it spent in that stage, whatever the
//! order, over all the frames (no running window). The result is a calibration file the next
//! acquisition converts with.
//!
//! A frame is taken in one pass over its pixels, each adding to its own stage's sums only, in
//! bands of pixels on several threads: at a detector's rate the sums (20 bytes a pixel and
//! stage) are the memory traffic, and one core took a few dozen 1-megapixel frames a second
//! when every frame went through all three stages' windows.

use rdaq_detector::jungfrau::ADC_MAX;

use crate::calfile::CalFile;
use crate::convert::Calibration;
use crate::pedestal::mask_bits;

/// Pixels a thread takes at least: fewer are not worth a thread of their own.
const MIN_BAND_PIXELS: usize = 1 << 16;

/// One stage's sums over the image: each pixel's words in that stage, their squares (f64:
/// exact for any run of 14-bit words shorter than 2^25 frames) and how many.
struct StageSums {
    sum: Vec<f64>,
    sum2: Vec<f64>,
    samples: Vec<u32>,
}

impl StageSums {
    fn new(px: usize) -> StageSums {
        StageSums { sum: vec![0.0; px], sum2: vec![0.0; px], samples: vec![0; px] }
    }

    /// Each pixel's mean (f32) and RMS (`sqrt(variance)` in f64; a variance that is not
    /// above 0 gives 0), as the running pedestal computes them.
    fn mean_rms(&self, mean: &mut [f32], rms: &mut [f32]) {
        for px in 0..self.sum.len() {
            let n = self.samples[px];
            if n == 0 {
                (mean[px], rms[px]) = (0.0, 0.0);
                continue;
            }
            let m = self.sum[px] / n as f64;
            let v = self.sum2[px] / n as f64 - m * m;
            mean[px] = m as f32;
            rms[px] = if v as f32 > 0.0 { v.sqrt() as f32 } else { 0.0 };
        }
    }
}

/// The three stages' sums of a pedestal run over an image of `rows x cols` pixels.
pub struct PedestalRun {
    rows: usize,
    cols: usize,
    stages: [StageSums; 3],
    frames: u64,
    /// Frames left out: incomplete ones, whose missing pixels are no dark signal.
    left_out: u64,
    threads: usize,
}

impl PedestalRun {
    /// A run over `rows x cols` pixels whose frames are taken by up to `threads` threads.
    pub fn new(rows: usize, cols: usize, threads: usize) -> PedestalRun {
        let px = rows * cols;
        PedestalRun { rows, cols, stages: [0, 1, 2].map(|_| StageSums::new(px)), frames: 0, left_out: 0, threads: threads.max(1) }
    }

    /// Takes one dark frame's raw words (the image, `rows x cols`).
    pub fn push(&mut self, raw: &[u16]) {
        let px = self.rows * self.cols;
        assert_eq!(raw.len(), px, "a frame of the run's image");
        let per = px.div_ceil(self.threads.min(px.div_ceil(MIN_BAND_PIXELS)).max(1)).max(1);
        let [g0, g1, g2] = &mut self.stages;
        let sums = banded([&mut g0.sum[..], &mut g1.sum[..], &mut g2.sum[..]], per);
        let squares = banded([&mut g0.sum2[..], &mut g1.sum2[..], &mut g2.sum2[..]], per);
        let samples = banded([&mut g0.samples[..], &mut g1.samples[..], &mut g2.samples[..]], per);
        let mut work = raw.chunks(per).zip(sums).zip(squares).zip(samples).map(|(((w, s), q), n)| (w, s, q, n)).peekable();
        let (w, s, q, n) = work.next().expect("a frame has pixels");
        if work.peek().is_none() {
            add_band(w, s, q, n);
        } else {
            std::thread::scope(|scope| {
                for (w, s, q, n) in work {
                    scope.spawn(move || add_band(w, s, q, n));
                }
                add_band(w, s, q, n);
            });
        }
        self.frames += 1;
    }

    /// Frames taken.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Counts a frame left out (incomplete).
    pub fn leave_out(&mut self) {
        self.left_out += 1;
    }

    /// Frames left out.
    pub fn left_out(&self) -> u64 {
        self.left_out
    }

    /// The share of the pixels that were in each stage in at least one frame.
    pub fn measured_shares(&self) -> [f64; 3] {
        let px = (self.rows * self.cols).max(1) as f64;
        self.stages.each_ref().map(|st| st.samples.iter().filter(|&&n| n > 0).count() as f64 / px)
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
        for (s, st) in self.stages.iter().enumerate() {
            st.mean_rms(&mut pedestal[s], &mut rms[s]);
            frames[s] = st.samples.iter().copied().max().unwrap_or(0);
            for (px, &n) in st.samples.iter().enumerate() {
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

/// The three stages' slices of `per` pixels each, band by band.
fn banded<T>([a, b, c]: [&mut [T]; 3], per: usize) -> impl Iterator<Item = [&mut [T]; 3]> {
    a.chunks_mut(per).zip(b.chunks_mut(per)).zip(c.chunks_mut(per)).map(|((a, b), c)| [a, b, c])
}

/// Adds a band of a frame's words to the sums of each word's stage (gain bits 00: G0, 01: G1,
/// 11: G2; 10 is no stage and is left out).
fn add_band(raw: &[u16], sum: [&mut [f64]; 3], sum2: [&mut [f64]; 3], samples: [&mut [u32]; 3]) {
    let [s0, s1, s2] = sum;
    let [q0, q1, q2] = sum2;
    let [n0, n1, n2] = samples;
    for (px, &w) in raw.iter().enumerate() {
        let x = (w & ADC_MAX) as f64;
        let (s, q, n) = match w >> 14 {
            0 => (&mut s0[px], &mut q0[px], &mut n0[px]),
            1 => (&mut s1[px], &mut q1[px], &mut n1[px]),
            3 => (&mut s2[px], &mut q2[px], &mut n2[px]),
            _ => continue,
        };
        *s += x;
        *q += x * x;
        *n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stage_takes_the_frames_of_its_gain() {
        let (rows, cols) = (2, 3);
        let mut run = PedestalRun::new(rows, cols, 1);
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

    /// In bands on several threads, the sums are those of the running pedestal of each stage
    /// (its window never full), pedestal and RMS bit for bit.
    #[test]
    fn bands_on_threads_equal_each_stages_running_pedestal() {
        use crate::pedestal::Pedestal;
        let (rows, cols) = (3, MIN_BAND_PIXELS + 7);
        let px = rows * cols;
        let mut run = PedestalRun::new(rows, cols, 4);
        let mut oracle: [Pedestal<f64>; 3] = [0, 1, 2].map(|s| Pedestal::new(px, s, u32::MAX));
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..7 {
            let frame: Vec<u16> = (0..px)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 20) as u16
                })
                .collect();
            run.push(&frame);
            oracle.iter_mut().for_each(|p| p.push(&frame));
        }
        let cf = run.calibration([vec![1.0; px], vec![1.0; px], vec![1.0; px]], vec![0; px], [0.0; 3], 1, f32::MAX);
        let rms = cf.rms.expect("a run keeps its RMS");
        for (s, p) in oracle.iter().enumerate() {
            let (mut mean, mut r) = (vec![0.0; px], vec![0.0; px]);
            p.mean_into(&mut mean);
            p.rms_into(&mut r);
            let seen = |i: usize| p.samples()[i] > 0;
            assert!((0..px).filter(|&i| seen(i)).all(|i| mean[i].to_bits() == cf.cal.pedestal[s][i].to_bits()), "G{s} pedestal");
            assert!((0..px).all(|i| r[i].to_bits() == rms[s][i].to_bits()), "G{s} RMS");
            assert_eq!(cf.frames.expect("counted")[s], p.samples().iter().copied().max().unwrap_or(0));
        }
        assert_eq!(run.frames(), 7);
    }
}
