//! peakfinder8 as cfelpyutils builds it (docs/formats.md section 4).

use super::radial::RadialLanes;
use super::Spot;

/// One ASIC (panel) of the image as peakfinder8 walks it: its size, the image width, and
/// its offset in the image.
#[derive(Clone, Copy)]
struct Panel {
    afs: i32,
    ass: i32,
    wfs: i32,
    ofs: i32,
    oss: i32,
}

/// Parameters of peakfinder8 (names as in cfelpyutils' `Peakfinder8PeakDetection`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Peakfinder8Params {
    pub max_num_peaks: usize,
    pub asic_nx: usize,
    pub asic_ny: usize,
    pub nasics_x: usize,
    pub nasics_y: usize,
    pub adc_threshold: f32,
    pub minimum_snr: f32,
    pub min_pixel_count: usize,
    pub max_pixel_count: usize,
    pub local_bg_radius: i32,
    /// Pixels with radius outside `min_res..=max_res` are not searched.
    pub min_res: f32,
    pub max_res: f32,
}

impl Peakfinder8Params {
    /// docs/formats.md section 4 defaults for a JUNGFRAU module (8 ASICs of 256 x 256).
    pub fn jungfrau_module() -> Self {
        Peakfinder8Params {
            max_num_peaks: 2048,
            asic_nx: 256,
            asic_ny: 256,
            nasics_x: 4,
            nasics_y: 2,
            adc_threshold: 800.0,
            minimum_snr: 5.0,
            min_pixel_count: 2,
            max_pixel_count: 200,
            local_bg_radius: 3,
            min_res: 0.0,
            max_res: f32::MAX,
        }
    }
}

/// peakfinder8 with its scratch buffers. The radius map and the mask (true: search) are
/// fixed per detector.
pub struct Peakfinder8 {
    p: Peakfinder8Params,
    radius: Vec<f32>,
    bin: Vec<u32>,
    mask: Vec<bool>,
    rthreshold: Vec<f32>,
    lthreshold: Vec<f32>,
    roffset: Vec<f32>,
    rsigma: Vec<f32>,
    rcount: Vec<i32>,
    /// The searched pixels laid out by radial bin, for the radial sums.
    lanes: RadialLanes,
    in_peak: Vec<u8>,
    peak_fs: Vec<i32>,
    peak_ss: Vec<i32>,
    peak_pixels: Vec<usize>,
}

/// C's `rint` under the default rounding mode: to nearest, ties to even.
#[inline(always)]
fn rint(x: f32) -> i32 {
    x.round_ties_even() as i32
}

impl Peakfinder8 {
    /// `radius` is each pixel's distance from the beam centre in pixels; `mask` true for
    /// pixels to search (both `nasics_y*asic_ny x nasics_x*asic_nx`, row-major).
    pub fn new(p: Peakfinder8Params, radius: Vec<f32>, mask: &[bool]) -> Self {
        let pixels = p.asic_nx * p.nasics_x * p.asic_ny * p.nasics_y;
        assert!(radius.len() == pixels && mask.len() == pixels, "radius map and mask of the image size");
        assert!(p.min_pixel_count >= 1 && p.max_pixel_count >= p.min_pixel_count, "pixel counts");
        let mask: Vec<bool> = mask.iter().zip(&radius).map(|(&m, &r)| m && r >= p.min_res && r <= p.max_res).collect();
        let max_r = radius.iter().fold(-1e9f32, |a, &r| a.max(r));
        let bins = max_r.ceil() as usize + 1;
        let bin: Vec<u32> = radius.iter().map(|&r| rint(r) as u32).collect();
        let lanes = RadialLanes::new(&bin, &mask, bins);
        Peakfinder8 {
            p,
            radius,
            bin,
            mask,
            rthreshold: vec![0.0; bins],
            lthreshold: vec![0.0; bins],
            roffset: vec![0.0; bins],
            rsigma: vec![0.0; bins],
            rcount: vec![0; bins],
            lanes,
            in_peak: vec![0; pixels],
            peak_fs: vec![0; pixels],
            peak_ss: vec![0; pixels],
            peak_pixels: vec![0; p.max_pixel_count],
        }
    }

    /// The radius map of an image with the beam at `(cx, cy)` (pixel indices, fast, slow),
    /// computed in f64 and rounded to f32 once, as cfelpyutils' users build it with numpy:
    /// computed in f32, a fractional centre puts some pixels into another radial bin.
    pub fn radius_map(width: usize, height: usize, cx: f64, cy: f64) -> Vec<f32> {
        let mut out = Vec::with_capacity(width * height);
        for r in 0..height {
            for c in 0..width {
                let (dx, dy) = (c as f64 - cx, r as f64 - cy);
                out.push((dx * dx + dy * dy).sqrt() as f32);
            }
        }
        out
    }

    /// Five rounds of each bin's mean and sigma over its pixels between the thresholds of
    /// the round before, and the thresholds they give.
    fn radial_stats(&mut self, data: &[f32]) {
        self.rthreshold.fill(1e9);
        self.lthreshold.fill(-1e9);
        self.lanes.load(data);
        for _ in 0..5 {
            self.roffset.fill(0.0);
            self.rsigma.fill(0.0);
            self.rcount.fill(0);
            self.lanes.sums(&self.lthreshold, &self.rthreshold, &mut self.roffset, &mut self.rsigma, &mut self.rcount);
            for b in 0..self.roffset.len() {
                if self.rcount[b] == 0 {
                    self.roffset[b] = 0.0;
                    self.rsigma[b] = 0.0;
                    self.rthreshold[b] = f32::MAX;
                    self.lthreshold[b] = f32::MIN_POSITIVE;
                } else {
                    let n = self.rcount[b] as f32;
                    let off = self.roffset[b] / n;
                    let mut sig = self.rsigma[b] / n - off * off;
                    if sig >= 0.0 {
                        sig = sig.sqrt();
                    }
                    self.roffset[b] = off;
                    self.rsigma[b] = sig;
                    self.rthreshold[b] = off + self.p.minimum_snr * sig;
                    self.lthreshold[b] = off - self.p.minimum_snr * sig;
                    if self.rthreshold[b] < self.p.adc_threshold {
                        self.rthreshold[b] = self.p.adc_threshold;
                    }
                }
            }
        }
    }

    /// Finds the peaks of one image into `peaks` (cleared first), at most `max_num_peaks`.
    /// Positions are peakfinder8's (pixel index units); intensity is the background-
    /// subtracted integrated intensity.
    pub fn find(&mut self, data: &[f32], peaks: &mut Vec<Spot>) {
        assert_eq!(data.len(), self.mask.len(), "image of the configured size");
        peaks.clear();
        self.radial_stats(data);
        self.in_peak.fill(0);
        // no seed is below every bin's threshold (NaN thresholds, which no value exceeds,
        // are left out by `min`)
        let floor = self.rthreshold.iter().fold(f32::INFINITY, |m, &t| m.min(t));
        let mut count = 0usize;
        for aiss in 0..self.p.nasics_y {
            for aifs in 0..self.p.nasics_x {
                self.panel(data, aifs, aiss, floor, &mut count, peaks);
            }
        }
    }

    /// Seeds, grows and measures the peaks of one panel; `floor` is the lowest threshold of
    /// any bin.
    fn panel(&mut self, data: &[f32], aifs: usize, aiss: usize, floor: f32, count: &mut usize, peaks: &mut Vec<Spot>) {
        let (afs, ass) = (self.p.asic_nx as i32, self.p.asic_ny as i32);
        let o = Panel { afs, ass, wfs: (self.p.asic_nx * self.p.nasics_x) as i32, ofs: aifs as i32 * afs, oss: aiss as i32 * ass };
        for pxss in 1..ass - 1 {
            let row = ((pxss + o.oss) * o.wfs + o.ofs) as usize;
            for pxfs in 1..afs - 1 {
                let idx = row + pxfs as usize;
                // most pixels are ruled out by the lowest threshold, without their bin
                let v = data[idx];
                if !(v > floor && v > self.rthreshold[self.bin[idx] as usize] && self.in_peak[idx] == 0 && self.mask[idx]) {
                    continue;
                }
                let (npix, sums) = self.flood(data, pxfs, pxss, idx, o);
                if npix < self.p.min_pixel_count || npix > self.p.max_pixel_count || sums[0].abs() < 1e-10 {
                    continue;
                }
                let Some(spot) = self.measure(data, npix, sums, o) else { continue };
                for &ci in &self.peak_pixels[..npix.min(self.p.max_pixel_count)] {
                    self.in_peak[ci] = 2;
                }
                if *count < self.p.max_num_peaks {
                    peaks.push(spot);
                }
                *count += 1;
            }
        }
    }

    /// Grows a peak from the seed at panel pixel `(pxfs, pxss)` (image index `idx`) in the
    /// reference's visiting order: its pixel count, and the sums of intensity over the
    /// radial offset and of intensity times fast and slow position. Its pixels are in
    /// `peak_pixels` (at most `max_pixel_count`).
    fn flood(&mut self, data: &[f32], pxfs: i32, pxss: i32, idx: usize, o: Panel) -> (usize, [f32; 3]) {
        self.peak_fs[0] = pxfs;
        self.peak_ss[0] = pxss;
        self.peak_pixels[0] = idx;
        let mut npix = 0usize;
        let (mut sum_i, mut sum_fs, mut sum_ss) = (0f32, 0f32, 0f32);
        loop {
            let before = npix;
            let mut k = 0;
            while k <= npix {
                for (dfs, dss) in [(0, 0), (-1, -1), (0, -1), (1, -1), (-1, 0), (1, 0), (-1, 1), (0, 1), (1, 1)] {
                    let (fs, ss) = (self.peak_fs[k] + dfs, self.peak_ss[k] + dss);
                    if fs < 0 || fs >= o.afs || ss < 0 || ss >= o.ass {
                        continue;
                    }
                    let (gfs, gss) = (fs + o.ofs, ss + o.oss);
                    let pi = (gfs + gss * o.wfs) as usize;
                    let b = self.bin[pi] as usize;
                    if data[pi] > self.rthreshold[b] && self.in_peak[pi] == 0 && self.mask[pi] {
                        let ci = data[pi] - self.roffset[b];
                        sum_i += ci;
                        sum_fs += ci * gfs as f32;
                        sum_ss += ci * gss as f32;
                        self.peak_ss[npix] = ss;
                        self.peak_fs[npix] = fs;
                        self.in_peak[pi] = 1;
                        if npix < self.p.max_pixel_count {
                            self.peak_pixels[npix] = pi;
                        }
                        npix += 1;
                    }
                }
                k += 1;
            }
            if npix == before {
                return (npix, [sum_i, sum_fs, sum_ss]);
            }
        }
    }

    /// The integrated-SNR test of a grown peak against its local background, and its centre
    /// of mass; `None` when it fails or its centre lies outside the panel.
    fn measure(&self, data: &[f32], npix: usize, [sum_i, sum_fs, sum_ss]: [f32; 3], o: Panel) -> Option<Spot> {
        let com_fs = sum_fs / sum_i.abs();
        let com_ss = sum_ss / sum_i.abs();
        let com_idx = (rint(com_fs) + rint(com_ss) * o.wfs) as usize;
        let (cfs, css) = (rint(com_fs) - o.ofs, rint(com_ss) - o.oss);
        let (local_offset, local_sigma, bg_max) = self.background_ring(data, cfs, css, o.ofs, o.oss, com_idx);
        let (mut tot, mut tot_raw, mut max_i, mut sfs, mut sss) = (0f32, 0f32, 0f32, 0f32, 0f32);
        for &ci in &self.peak_pixels[..npix.min(self.p.max_pixel_count)] {
            let raw = data[ci];
            let v = raw - local_offset;
            tot += v;
            tot_raw += raw;
            sfs += raw * (ci as i32 % o.wfs) as f32;
            sss += raw * (ci as i32 / o.wfs) as f32;
            if v > max_i {
                max_i = v;
            }
        }
        if tot_raw.abs() < 1e-10 {
            return None;
        }
        let (pfs, pss) = (sfs / tot_raw.abs(), sss / tot_raw.abs());
        let snr = if local_sigma.abs() > 1e-10 { tot / local_sigma } else { 0.0 };
        if snr < self.p.minimum_snr || max_i < bg_max - local_offset {
            return None;
        }
        if pfs < o.ofs as f32 || pfs > (o.ofs + o.afs - 1) as f32 || pss < o.oss as f32 || pss > (o.oss + o.ass - 1) as f32 {
            return None;
        }
        Some(Spot { x: pfs, y: pss, intensity: tot, pixels: npix as u32 })
    }

    /// The local background around a peak: mean, sigma and maximum of the pixels below their
    /// radial threshold and outside peaks, within radius `2 * local_bg_radius`.
    fn background_ring(&self, data: &[f32], cfs: i32, css: i32, ofs: i32, oss: i32, com_idx: usize) -> (f32, f32, f32) {
        let (afs, ass) = (self.p.asic_nx as i32, self.p.asic_ny as i32);
        let wfs = (self.p.asic_nx * self.p.nasics_x) as i32;
        let w = 2 * self.p.local_bg_radius;
        let (mut s, mut s2, mut np, mut bg_max) = (0f32, 0f32, 0i32, 0f32);
        for dss in -w..w {
            for dfs in -w..w {
                if cfs + dfs < 0 || cfs + dfs >= afs || css + dss < 0 || css + dss >= ass {
                    continue;
                }
                if (((dfs * dfs + dss * dss) as f64).sqrt()) > w as f64 {
                    continue;
                }
                let pi = ((cfs + dfs + ofs) + (css + dss + oss) * wfs) as usize;
                let v = data[pi];
                if v < self.rthreshold[self.bin[pi] as usize] && self.in_peak[pi] == 0 && self.mask[pi] {
                    np += 1;
                    s += v;
                    s2 += v * v;
                    if v > bg_max {
                        bg_max = v;
                    }
                }
            }
        }
        if np == 0 {
            let b = rint(self.radius[com_idx]) as usize;
            return (self.roffset[b], 0.01, bg_max);
        }
        let off = s / np as f32;
        let var = s2 / np as f32 - off * off;
        (off, if var >= 0.0 { var.sqrt() } else { 0.01 }, bg_max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spots::blob;

    #[test]
    fn peakfinder8_finds_a_peak_above_flat_background() {
        let p = Peakfinder8Params { asic_nx: 64, asic_ny: 64, nasics_x: 2, nasics_y: 1, adc_threshold: 10.0, ..Peakfinder8Params::jungfrau_module() };
        let (w, h) = (128, 64);
        let mut img: Vec<f32> = (0..w * h).map(|i| ((i * 7919) % 7) as f32).collect();
        blob(&mut img, w, 30.5, 20.5, 2000.0);
        let radius = Peakfinder8::radius_map(w, h, 64.0, 32.0);
        let mut pf = Peakfinder8::new(p, radius, &vec![true; w * h]);
        let mut peaks = Vec::new();
        pf.find(&img, &mut peaks);
        assert_eq!(peaks.len(), 1, "{peaks:?}");
        // pixel-index centre of mass: the blob centre minus half a pixel
        assert!((peaks[0].x - 30.0).abs() < 0.1 && (peaks[0].y - 20.0).abs() < 0.1, "{:?}", peaks[0]);
    }
}
