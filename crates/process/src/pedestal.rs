//! Pedestal tracking (docs/formats.md section 1; Jungfraujoch PedestalCalc, aare `Pedestal`):
//! per pixel of one gain stage, a running window of `N` frames. For the first `N` frames
//! `S += x; S2 += x*x`; afterwards `S += x - S/N; S2 += x*x - S2/N`. The pedestal is
//! `S/n` and its variance `S2/n - P*P` (n = frames so far, at most `N`), in the order of
//! operations of aare so that the results are bit-exact with `aare.Pedestal_f` (f32 sums)
//! and `aare.Pedestal_d` (f64 sums).
//!
//! Frames whose gain bits do not match the stage being tracked are counted per pixel, not
//! averaged. [`Pedestal::mask`] flags pixels with too few frames, wrong-gain frames, or (G0)
//! an RMS above a limit.

use rdaq_detector::jungfrau::ADC_MAX;

/// The running sums' number type: f32 (aare `Pedestal_f`) or f64 (`Pedestal_d`).
pub trait Sum: Copy + Send + Sync + Default + 'static {
    fn from_adc(x: u16) -> Self;
    fn from_count(n: u32) -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn sqrt(self) -> Self;
    fn to_f32(self) -> f32;
}

macro_rules! impl_sum {
    ($t:ty) => {
        impl Sum for $t {
            #[inline(always)]
            fn from_adc(x: u16) -> Self {
                x as $t
            }
            #[inline(always)]
            fn from_count(n: u32) -> Self {
                n as $t
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self - o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                self / o
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn to_f32(self) -> f32 {
                self as f32
            }
        }
    };
}
impl_sum!(f32);
impl_sum!(f64);

/// NXmx pixel_mask bits the pedestal sets (docs/formats.md section 1).
pub mod mask_bits {
    /// Bit 1 "dead": fewer frames than the minimum.
    pub const TOO_FEW_FRAMES: u32 = 1 << 1;
    /// Bit 3 "over-responding": the pixel left the tracked gain stage in dark frames.
    pub const WRONG_GAIN: u32 = 1 << 3;
    /// Bit 4 "noisy": the G0 pedestal RMS is above the limit.
    pub const NOISY: u32 = 1 << 4;
}

/// The running pedestal of one gain stage (0, 1 or 2) over `pixels` pixels.
#[derive(Clone, Debug)]
pub struct Pedestal<S: Sum = f64> {
    stage: u8,
    window: u32,
    sum: Vec<S>,
    sum2: Vec<S>,
    samples: Vec<u32>,
    wrong_gain: Vec<u32>,
    frames: u64,
}

/// The gain code (word bits 15..14) of each stage.
const STAGE_CODE: [u16; 3] = [0, 1, 3];

/// Consecutive pixels of a [`Pedestal`], borrowed to take their words of a frame.
struct Band<'a, S: Sum> {
    code: u16,
    window: u32,
    sum: &'a mut [S],
    sum2: &'a mut [S],
    samples: &'a mut [u32],
    wrong: &'a mut [u32],
}

impl<S: Sum> Band<'_, S> {
    /// Adds the words of the band's pixels, one per pixel.
    fn push(self, raw: &[u16]) {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            unsafe { push_avx2(self, raw) };
            return;
        }
        push_blocks(self, raw);
    }
}

/// [`push_blocks`] compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn push_avx2<S: Sum>(b: Band<'_, S>, raw: &[u16]) {
    push_blocks(b, raw);
}

/// Pixels taken at a time. A block whose pixels all have a full window and whose words all
/// carry the tracked stage (nearly every block of a dark frame once the window has filled)
/// takes the running update alone: its counters are read, not written, which takes a quarter
/// of the memory traffic (38 bytes a pixel instead of 50) off the dark frames' work.
const BLOCK: usize = 64;

/// Each block of the band's pixels, by the steady update where it applies and by the
/// general one elsewhere.
#[inline(always)]
fn push_blocks<S: Sum>(b: Band<'_, S>, raw: &[u16]) {
    let Band { code, window, sum, sum2, samples, wrong } = b;
    // x / 2^k and x * 2^-k are the same rounding of the same number: for a window of a
    // power of two the reciprocal's product is aare's quotient, bit for bit
    let pow2 = window.is_power_of_two();
    let (n, recip) = (S::from_count(window), S::from_count(1).div(S::from_count(window)));
    let blocks = sum.chunks_mut(BLOCK).zip(sum2.chunks_mut(BLOCK)).zip(samples.chunks_mut(BLOCK)).zip(wrong.chunks_mut(BLOCK)).zip(raw.chunks(BLOCK));
    for ((((s, s2), k), bad), w) in blocks {
        let in_stage = w.iter().fold(true, |all, &w| all & (w >> 14 == code));
        let full = k.iter().fold(true, |all, &k| all & (k >= window));
        match (in_stage && full, pow2) {
            (true, true) => running(s, s2, w, |v| v.mul(recip)),
            (true, false) => running(s, s2, w, |v| v.div(n)),
            (false, _) => push_loop(Band { code, window, sum: s, sum2: s2, samples: k, wrong: bad }, w),
        }
    }
}

/// The running update of pixels whose window is full and whose words are all in the
/// tracked stage: `S += x - S/N; S2 += x*x - S2/N`, `over_n` dividing by `N`.
#[inline(always)]
fn running<S: Sum>(sum: &mut [S], sum2: &mut [S], raw: &[u16], over_n: impl Fn(S) -> S) {
    for ((s, s2), &w) in sum.iter_mut().zip(sum2.iter_mut()).zip(raw) {
        let x = S::from_adc(w & ADC_MAX);
        *s = s.add(x.sub(over_n(*s)));
        *s2 = s2.add(x.mul(x).sub(over_n(*s2)));
    }
}

/// The window's update of each pixel, branch-free so that it vectorizes: both updates are
/// computed and the one the pixel is in is kept (the same operations as aare's, in its order).
#[inline(always)]
fn push_loop<S: Sum>(b: Band<'_, S>, raw: &[u16]) {
    let n = S::from_count(b.window);
    let rows = raw.iter().zip(b.sum.iter_mut()).zip(b.sum2.iter_mut()).zip(b.samples.iter_mut()).zip(b.wrong.iter_mut());
    for ((((&w, s), s2), k), bad) in rows {
        let ok = w >> 14 == b.code;
        let x = S::from_adc(w & ADC_MAX);
        let filling = *k < b.window;
        let (fill, fill2) = (s.add(x), s2.add(x.mul(x)));
        let (run, run2) = (s.add(x.sub(s.div(n))), s2.add(x.mul(x).sub(s2.div(n))));
        let (new, new2) = if filling { (fill, fill2) } else { (run, run2) };
        *s = if ok { new } else { *s };
        *s2 = if ok { new2 } else { *s2 };
        *k += (ok & filling) as u32;
        *bad += !ok as u32;
    }
}

impl<S: Sum> Pedestal<S> {
    pub fn new(pixels: usize, stage: u8, window: u32) -> Self {
        assert!(stage < 3 && window > 0, "stage 0..2 and a window of at least one frame");
        Pedestal {
            stage,
            window,
            sum: vec![S::default(); pixels],
            sum2: vec![S::default(); pixels],
            samples: vec![0; pixels],
            wrong_gain: vec![0; pixels],
            frames: 0,
        }
    }

    pub fn pixels(&self) -> usize {
        self.samples.len()
    }

    /// Frames pushed so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Adds one dark frame of raw words.
    pub fn push(&mut self, raw: &[u16]) {
        self.push_at(0, raw);
        self.frames += 1;
    }

    /// Adds the words of pixels `first..first + raw.len()` of a frame (a module's span of an
    /// assembled image); call [`Pedestal::frame_done`] once per frame.
    pub fn push_at(&mut self, first: usize, raw: &[u16]) {
        let end = first + raw.len();
        assert!(end <= self.pixels(), "pixels inside the tracked image");
        let band = Band {
            code: STAGE_CODE[self.stage as usize],
            window: self.window,
            sum: &mut self.sum[first..end],
            sum2: &mut self.sum2[first..end],
            samples: &mut self.samples[first..end],
            wrong: &mut self.wrong_gain[first..end],
        };
        band.push(raw);
    }

    /// Counts a frame that was pushed with [`Pedestal::push_at`].
    pub fn frame_done(&mut self) {
        self.frames += 1;
    }

    #[inline]
    fn mean_of(&self, px: usize) -> S {
        match self.samples[px] {
            0 => S::default(),
            n => self.sum[px].div(S::from_count(n)),
        }
    }

    #[inline]
    fn variance_of(&self, px: usize) -> S {
        match self.samples[px] {
            0 => S::default(),
            n => {
                let m = self.mean_of(px);
                self.sum2[px].div(S::from_count(n)).sub(m.mul(m))
            }
        }
    }

    /// The pedestal per pixel (0 where no frame arrived).
    pub fn mean_into(&self, out: &mut [f32]) {
        assert_eq!(out.len(), self.pixels());
        for (px, o) in out.iter_mut().enumerate() {
            *o = self.mean_of(px).to_f32();
        }
    }

    /// The RMS per pixel, `sqrt(variance)` computed in the sums' type (as aare's `std`).
    /// The running update loses precision in f32 (a constant input can end with a slightly
    /// negative variance, which aare returns as is, and its std as NaN); such a variance
    /// counts as 0 here.
    pub fn rms_into(&self, out: &mut [f32]) {
        assert_eq!(out.len(), self.pixels());
        for (px, o) in out.iter_mut().enumerate() {
            *o = self.rms_of(px);
        }
    }

    #[inline]
    fn rms_of(&self, px: usize) -> f32 {
        let v = self.variance_of(px);
        if v.to_f32() > 0.0 {
            v.sqrt().to_f32()
        } else {
            0.0
        }
    }

    /// Frames per pixel that carried another gain stage.
    pub fn wrong_gain(&self) -> &[u32] {
        &self.wrong_gain
    }

    /// Frames per pixel in the window.
    pub fn samples(&self) -> &[u32] {
        &self.samples
    }

    /// ORs the mask bits of this stage into `mask`: fewer than `min_frames` frames, any
    /// wrong-gain frame, or (stage 0 only) an RMS above `max_rms_g0` ADU.
    pub fn mask(&self, min_frames: u32, max_rms_g0: f32, mask: &mut [u32]) {
        assert_eq!(mask.len(), self.pixels());
        for (px, m) in mask.iter_mut().enumerate() {
            if self.samples[px] < min_frames {
                *m |= mask_bits::TOO_FEW_FRAMES;
            }
            if self.wrong_gain[px] > 0 {
                *m |= mask_bits::WRONG_GAIN;
            }
            if self.stage == 0 && self.samples[px] > 0 && self.rms_of(px) > max_rms_g0 {
                *m |= mask_bits::NOISY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_pushed_in_pieces_update_as_every_pixel_does_alone() {
        // 300 pixels pushed in odd pieces, some words of the wrong gain, past the window:
        // each pixel's sums equal a one-pixel tracker's
        let (px, window) = (300usize, 3u32);
        let mut whole = Pedestal::<f64>::new(px, 0, window);
        let mut alone: Vec<Pedestal<f64>> = (0..px).map(|_| Pedestal::new(1, 0, window)).collect();
        for f in 0..9u32 {
            let raw: Vec<u16> = (0..px as u32).map(|i| {
                let adc = ((i * 7919 + f * 104729) % 4000) as u16;
                if (i + f) % 37 == 0 { adc | 0x4000 } else { adc }
            }).collect();
            for (a, b) in [(0, 7), (7, 64), (64, 256), (256, 300)] {
                whole.push_at(a, &raw[a..b]);
            }
            whole.frame_done();
            for (i, t) in alone.iter_mut().enumerate() {
                t.push(&raw[i..i + 1]);
            }
        }
        let (mut m, mut r) = (vec![0f32; px], vec![0f32; px]);
        whole.mean_into(&mut m);
        whole.rms_into(&mut r);
        for (i, t) in alone.iter().enumerate() {
            let (mut m1, mut r1) = ([0f32], [0f32]);
            t.mean_into(&mut m1);
            t.rms_into(&mut r1);
            assert_eq!((m[i].to_bits(), r[i].to_bits(), whole.wrong_gain[i], whole.samples[i]), (m1[0].to_bits(), r1[0].to_bits(), t.wrong_gain[0], t.samples[0]), "pixel {i}");
        }
    }

    /// aare's `Pedestal::push` for one pixel, written out plainly: the oracle of the
    /// vectorized updates.
    fn aare_push<S: Sum>(window: u32, code: u16, w: u16, (s, s2, k, bad): &mut (S, S, u32, u32)) {
        if w >> 14 != code {
            *bad += 1;
            return;
        }
        let x = S::from_adc(w & ADC_MAX);
        if *k < window {
            *s = s.add(x);
            *s2 = s2.add(x.mul(x));
            *k += 1;
        } else {
            *s = s.add(x.sub(s.div(S::from_count(*k))));
            *s2 = s2.add(x.mul(x).sub(s2.div(S::from_count(*k))));
        }
    }

    fn equals_aare_pixel_by_pixel<S: Sum>(window: u32, stage: u8) {
        // 1,000 pixels in pieces across the blocks' edges; a few pixels often leave the
        // stage, so some blocks take the general update and most the steady one
        let (px, frames) = (1000usize, 3 * window as usize + 5);
        let code = STAGE_CODE[stage as usize];
        let mut ours = Pedestal::<S>::new(px, stage, window);
        let mut oracle = vec![(S::default(), S::default(), 0u32, 0u32); px];
        for f in 0..frames as u32 {
            let raw: Vec<u16> = (0..px as u32).map(|i| {
                let adc = ((i * 7919 + f * 104_729) % 16_384) as u16;
                let other = if i % 97 == 3 && f % 3 == 0 { (code + 1) & 3 } else { code };
                adc | other << 14
            }).collect();
            for (a, b) in [(0, 5), (5, 64), (64, 200), (200, 201), (201, 777), (777, 1000)] {
                ours.push_at(a, &raw[a..b]);
            }
            ours.frame_done();
            for (o, &w) in oracle.iter_mut().zip(&raw) {
                aare_push(window, code, w, o);
            }
        }
        for (i, o) in oracle.iter().enumerate() {
            let got = (ours.sum[i].to_f32().to_bits(), ours.sum2[i].to_f32().to_bits(), ours.samples[i], ours.wrong_gain[i]);
            assert_eq!(got, (o.0.to_f32().to_bits(), o.1.to_f32().to_bits(), o.2, o.3), "pixel {i}, window {window}");
            assert!(ours.sum[i].sub(o.0).to_f32() == 0.0 && ours.sum2[i].sub(o.1).to_f32() == 0.0, "pixel {i}: the sums themselves");
        }
    }

    #[test]
    fn the_running_update_equals_aares_for_windows_of_a_power_of_two_and_others() {
        for window in [1, 16, 100, 128] {
            equals_aare_pixel_by_pixel::<f64>(window, 0);
            equals_aare_pixel_by_pixel::<f32>(window, 0);
        }
        equals_aare_pixel_by_pixel::<f64>(64, 1);
        equals_aare_pixel_by_pixel::<f64>(32, 2);
    }

    #[test]
    fn window_switches_from_sum_to_running_update() {
        let mut p = Pedestal::<f64>::new(1, 0, 4);
        for x in [10u16, 20, 30, 40] {
            p.push(&[x]);
        }
        let mut m = [0f32];
        p.mean_into(&mut m);
        assert_eq!(m[0], 25.0);
        p.push(&[100]);
        // S = 100 + (100 - 100/4) = 175 over 4 frames
        p.mean_into(&mut m);
        assert_eq!(m[0], 43.75);
        assert_eq!(p.samples(), &[4]);
    }

    #[test]
    fn constant_input_has_that_pedestal_and_no_noise() {
        let mut p = Pedestal::<f64>::new(3, 0, 128);
        for _ in 0..300 {
            p.push(&[2450, 2451, 3000]);
        }
        let mut m = [0f32; 3];
        p.mean_into(&mut m);
        assert_eq!(m, [2450.0, 2451.0, 3000.0]);
        let mut r = [1f32; 3];
        p.rms_into(&mut r);
        assert!(r.iter().all(|&x| x.abs() < 1e-3), "{r:?}");
        // f32 sums drift under the running update; the RMS stays a number
        let mut p = Pedestal::<f32>::new(3, 0, 128);
        for _ in 0..300 {
            p.push(&[2450, 2451, 3000]);
        }
        p.rms_into(&mut r);
        assert!(r.iter().all(|&x| x.is_finite() && x < 5.0), "{r:?}");
    }

    #[test]
    fn wrong_gain_frames_are_counted_not_averaged_and_masked() {
        let mut p = Pedestal::<f64>::new(2, 1, 8);
        for i in 0..10u16 {
            // pixel 0 is in G1 (code 01); pixel 1 switches to G2 every other frame
            let w1 = if i % 2 == 0 { 0x4000 | 13600 } else { 0xC000 | 14100 };
            p.push(&[0x4000 | 13600, w1]);
        }
        let mut m = [0f32; 2];
        p.mean_into(&mut m);
        assert_eq!(m, [13600.0, 13600.0]);
        assert_eq!(p.wrong_gain(), &[0, 5]);
        let mut mask = [0u32; 2];
        p.mask(8, 100.0, &mut mask);
        assert_eq!(mask, [0, mask_bits::TOO_FEW_FRAMES | mask_bits::WRONG_GAIN]);
    }

    #[test]
    fn noisy_g0_pixels_are_masked() {
        let mut p = Pedestal::<f64>::new(2, 0, 16);
        for i in 0..32u16 {
            p.push(&[2450 + i % 2, 2000 + (i % 2) * 400]);
        }
        let mut mask = [0u32; 2];
        p.mask(16, 100.0, &mut mask);
        assert_eq!(mask, [0, mask_bits::NOISY]);
    }
}
