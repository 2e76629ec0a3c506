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

/// A spot: centroid (x fast / column, y slow / row), summed intensity and pixel count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spot {
    pub x: f32,
    pub y: f32,
    pub intensity: f32,
    pub pixels: u32,
}

/// Parameters of the local-SNR finder, in the units of the image (keV or photons).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LocalSnrParams {
    pub threshold: f32,
    pub snr: f32,
    /// Box half-size n: the box is (2n+1)^2 pixels.
    pub box_half: usize,
    pub min_pixels: u32,
    pub max_pixels: u32,
}

impl LocalSnrParams {
    /// Defaults for an image in keV at this photon energy: threshold half a photon, SNR 3,
    /// a 31 x 31 box (large enough that a spot does not dominate its own statistics), 4 to
    /// 200 pixels (fewer than 4 connected pixels are what background photons make by chance).
    pub fn for_photon_energy(kev: f32) -> Self {
        LocalSnrParams { threshold: 0.5 * kev, snr: 3.0, box_half: 15, min_pixels: 4, max_pixels: 200 }
    }
}

/// The local-SNR finder with its scratch buffers (reused from frame to frame).
pub struct LocalSnr {
    p: LocalSnrParams,
    col_sum: Vec<f64>,
    col_sum2: Vec<f64>,
    col_n: Vec<u32>,
    row_candidates: Vec<u32>,
    strong: Vec<u32>,
    parent: Vec<u32>,
    acc: Vec<(f64, f64, f64, u32)>,
    roots: Vec<usize>,
}

#[inline(always)]
fn finite(v: f32) -> Option<f64> {
    v.is_finite().then_some(v as f64)
}

impl LocalSnr {
    pub fn new(p: LocalSnrParams) -> Self {
        assert!(p.min_pixels >= 1 && p.min_pixels <= p.max_pixels, "1 <= min_pixels <= max_pixels");
        LocalSnr {
            p,
            col_sum: Vec::new(),
            col_sum2: Vec::new(),
            col_n: Vec::new(),
            row_candidates: Vec::new(),
            strong: Vec::new(),
            parent: Vec::new(),
            acc: Vec::new(),
            roots: Vec::new(),
        }
    }

    pub fn params(&self) -> &LocalSnrParams {
        &self.p
    }

    /// Adds (`sign` 1) or removes (-1) a row from the column sums, branch-free so that it
    /// vectorizes: pixels that are not finite count as nothing.
    fn add_row(&mut self, row: &[f32], sign: f64) {
        let (s1, s2, n) = (&mut self.col_sum[..row.len()], &mut self.col_sum2[..row.len()], &mut self.col_n[..row.len()]);
        let dn = sign as i32;
        for c in 0..row.len() {
            let ok = row[c].is_finite();
            let x = if ok { row[c] as f64 } else { 0.0 };
            s1[c] += sign * x;
            s2[c] += sign * x * x;
            n[c] = n[c].wrapping_add_signed(dn * ok as i32);
        }
    }

    /// Finds the spots of a row-major `height x width` image into `spots` (cleared first).
    pub fn find(&mut self, image: &[f32], width: usize, height: usize, spots: &mut Vec<Spot>) {
        assert_eq!(image.len(), width * height, "image of height x width");
        spots.clear();
        self.strong.clear();
        let n = self.p.box_half;
        let t = self.p.threshold;
        self.col_sum.clear();
        self.col_sum.resize(width, 0.0);
        self.col_sum2.clear();
        self.col_sum2.resize(width, 0.0);
        self.col_n.clear();
        self.col_n.resize(width, 0);
        // the column sums cover rows r-n..=r; rows are added as the window moves down
        for r in 0..n.min(height) {
            self.add_row(&image[r * width..(r + 1) * width], 1.0);
        }
        let snr2 = (self.p.snr as f64) * (self.p.snr as f64);
        for r in 0..height {
            if r + n < height {
                self.add_row(&image[(r + n) * width..(r + n + 1) * width], 1.0);
            }
            if r > n {
                self.add_row(&image[(r - n - 1) * width..(r - n) * width], -1.0);
            }
            let row = &image[r * width..(r + 1) * width];
            // candidates: the cheap test first, 64 pixels at a time (vectorizes)
            self.row_candidates.clear();
            for (k, chunk) in row.chunks(64).enumerate() {
                if chunk.iter().fold(false, |a, &v| a | (v >= t)) {
                    for (i, &v) in chunk.iter().enumerate() {
                        if v >= t {
                            self.row_candidates.push((k * 64 + i) as u32);
                        }
                    }
                }
            }
            if self.row_candidates.is_empty() {
                continue;
            }
            for &c in &self.row_candidates {
                let c = c as usize;
                let v = row[c];
                if v.is_infinite() {
                    // saturated: strong whatever its neighbours
                    self.strong.push((r * width + c) as u32);
                    continue;
                }
                // the box: the window's columns of the column sums (a few per row are
                // candidates, so summing here costs less than prefix sums of every row)
                let (lo, hi) = (c.saturating_sub(n), (c + n + 1).min(width));
                let x = v as f64;
                let cnt = self.col_n[lo..hi].iter().sum::<u32>() - 1;
                if cnt == 0 {
                    continue;
                }
                let s = self.col_sum[lo..hi].iter().sum::<f64>() - x;
                let s2 = self.col_sum2[lo..hi].iter().sum::<f64>() - x * x;
                let mean = s / cnt as f64;
                let var = (s2 / cnt as f64 - mean * mean).max(0.0);
                let d = x - mean;
                if d > 0.0 && d * d > snr2 * var {
                    self.strong.push((r * width + c) as u32);
                }
            }
        }
        self.group(image, width, spots);
    }

    /// The spots of `image` given its strong pixels (row-major indices, ascending), found
    /// elsewhere by the same rule (the GPU backend's kernels): grouped as [`LocalSnr::find`]
    /// groups its own.
    pub fn group_strong(&mut self, image: &[f32], width: usize, strong: &[u32], spots: &mut Vec<Spot>) {
        assert!(strong.windows(2).all(|w| w[0] < w[1]), "strong pixels ascending");
        spots.clear();
        self.strong.clear();
        self.strong.extend_from_slice(strong);
        self.group(image, width, spots);
    }

    fn find_root(parent: &mut [u32], mut i: u32) -> u32 {
        while parent[i as usize] != i {
            let up = parent[parent[i as usize] as usize];
            parent[i as usize] = up;
            i = up;
        }
        i
    }

    /// Joins the strong pixels (sorted, row-major) into 8-connected groups and keeps those
    /// of allowed size as spots, in order of their first pixel.
    fn group(&mut self, image: &[f32], width: usize, spots: &mut Vec<Spot>) {
        let s = &self.strong;
        self.parent.clear();
        self.parent.extend(0..s.len() as u32);
        for (i, &p) in s.iter().enumerate() {
            let (r, c) = (p as usize / width, p as usize % width);
            let mut link = |q: usize| {
                if let Ok(j) = s[..i].binary_search(&(q as u32)) {
                    let (a, b) = (Self::find_root(&mut self.parent, i as u32), Self::find_root(&mut self.parent, j as u32));
                    // the earlier pixel stays the root, so groups come out in scan order
                    let (lo, hi) = (a.min(b), a.max(b));
                    self.parent[hi as usize] = lo;
                }
            };
            if c > 0 {
                link(p as usize - 1);
            }
            if r > 0 {
                let up = p as usize - width;
                if c > 0 {
                    link(up - 1);
                }
                link(up);
                if c + 1 < width {
                    link(up + 1);
                }
            }
        }
        self.acc.clear();
        self.acc.resize(s.len(), (0.0, 0.0, 0.0, 0));
        self.roots.clear();
        for (i, &p) in s.iter().enumerate() {
            let root = Self::find_root(&mut self.parent, i as u32) as usize;
            if root == i {
                self.roots.push(i);
            }
            let a = &mut self.acc[root];
            a.3 += 1;
            if let Some(v) = finite(image[p as usize]) {
                let (r, c) = (p as usize / width, p as usize % width);
                a.0 += v;
                a.1 += v * (c as f64 + 0.5);
                a.2 += v * (r as f64 + 0.5);
            }
        }
        for &root in &self.roots {
            let (sum, sx, sy, count) = self.acc[root];
            if count < self.p.min_pixels || count > self.p.max_pixels || sum <= 0.0 {
                continue;
            }
            spots.push(Spot { x: (sx / sum) as f32, y: (sy / sum) as f32, intensity: sum as f32, pixels: count });
        }
    }
}

/// The hit decision: a frame is kept if it has at least `min_spots` spots.
pub fn is_hit(spots: &[Spot], min_spots: usize) -> bool {
    spots.len() >= min_spots
}

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
        let bin = radius.iter().map(|&r| rint(r) as u32).collect();
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

    fn radial_stats(&mut self, data: &[f32]) {
        self.rthreshold.fill(1e9);
        self.lthreshold.fill(-1e9);
        for _ in 0..5 {
            self.roffset.fill(0.0);
            self.rsigma.fill(0.0);
            self.rcount.fill(0);
            for i in 0..data.len() {
                if !self.mask[i] {
                    continue;
                }
                let b = self.bin[i] as usize;
                let v = data[i];
                if v < self.rthreshold[b] && v > self.lthreshold[b] {
                    self.roffset[b] += v;
                    self.rsigma[b] += v * v;
                    self.rcount[b] += 1;
                }
            }
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
        let mut count = 0usize;
        for aiss in 0..self.p.nasics_y {
            for aifs in 0..self.p.nasics_x {
                self.panel(data, aifs, aiss, &mut count, peaks);
            }
        }
    }

    fn panel(&mut self, data: &[f32], aifs: usize, aiss: usize, count: &mut usize, peaks: &mut Vec<Spot>) {
        let (afs, ass) = (self.p.asic_nx as i32, self.p.asic_ny as i32);
        let o = Panel { afs, ass, wfs: (self.p.asic_nx * self.p.nasics_x) as i32, ofs: aifs as i32 * afs, oss: aiss as i32 * ass };
        for pxss in 1..ass - 1 {
            for pxfs in 1..afs - 1 {
                let idx = ((pxss + o.oss) * o.wfs + pxfs + o.ofs) as usize;
                if !(data[idx] > self.rthreshold[self.bin[idx] as usize] && self.in_peak[idx] == 0 && self.mask[idx]) {
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

    fn blob(image: &mut [f32], width: usize, cx: f32, cy: f32, total: f32) {
        let height = image.len() / width;
        for r in 0..height {
            for c in 0..width {
                let (dx, dy) = (c as f32 + 0.5 - cx, r as f32 + 0.5 - cy);
                image[r * width + c] += total / (2.0 * std::f32::consts::PI) * (-(dx * dx + dy * dy) / 2.0).exp();
            }
        }
    }

    #[test]
    fn local_snr_finds_isolated_spots_at_their_centroids() {
        let (w, h) = (200, 100);
        let mut img = vec![0f32; w * h];
        blob(&mut img, w, 50.3, 40.7, 1000.0);
        blob(&mut img, w, 150.5, 60.5, 300.0);
        img[10] = f32::NAN;
        let mut f = LocalSnr::new(LocalSnrParams { threshold: 1.0, snr: 3.0, box_half: 15, min_pixels: 2, max_pixels: 200 });
        let mut spots = Vec::new();
        f.find(&img, w, h, &mut spots);
        assert_eq!(spots.len(), 2, "{spots:?}");
        assert!((spots[0].x - 50.3).abs() < 0.1 && (spots[0].y - 40.7).abs() < 0.1, "{:?}", spots[0]);
        assert!((spots[1].x - 150.5).abs() < 0.05 && (spots[1].y - 60.5).abs() < 0.05, "{:?}", spots[1]);
        assert!(is_hit(&spots, 2) && !is_hit(&spots, 3));
    }

    #[test]
    fn groups_are_eight_connected_and_bounded() {
        let (w, h) = (40, 40);
        let mut img = vec![0f32; w * h];
        // a diagonal line of 3 pixels is one group; a lone pixel is too small
        for (r, c) in [(10, 10), (11, 11), (12, 12), (30, 5)] {
            img[r * w + c] = 100.0;
        }
        let mut f = LocalSnr::new(LocalSnrParams { threshold: 1.0, snr: 3.0, box_half: 5, min_pixels: 2, max_pixels: 3 });
        let mut spots = Vec::new();
        f.find(&img, w, h, &mut spots);
        assert_eq!(spots.len(), 1);
        assert_eq!(spots[0].pixels, 3);
        assert!((spots[0].x - 11.5).abs() < 1e-6 && (spots[0].y - 11.5).abs() < 1e-6);
        f = LocalSnr::new(LocalSnrParams { max_pixels: 2, ..*f.params() });
        f.find(&img, w, h, &mut spots);
        assert!(spots.is_empty());
    }

    #[test]
    fn box_statistics_match_a_direct_computation() {
        // a pixel that is strong only by its box: noise around it decides
        let (w, h) = (30, 30);
        let mut img: Vec<f32> = (0..w * h).map(|i| ((i * 7919) % 13) as f32 * 0.1).collect();
        img[15 * w + 15] = 5.0;
        let n = 4;
        let mut s = Vec::new();
        for r in 11..=19usize {
            for c in 11..=19usize {
                if (r, c) != (15, 15) {
                    s.push(img[r * w + c] as f64);
                }
            }
        }
        let mean = s.iter().sum::<f64>() / s.len() as f64;
        let var = s.iter().map(|x| x * x).sum::<f64>() / s.len() as f64 - mean * mean;
        let z = (5.0 - mean) / var.sqrt();
        for (snr, strong) in [(z as f32 - 0.01, true), (z as f32 + 0.01, false)] {
            let mut f = LocalSnr::new(LocalSnrParams { threshold: 2.0, snr, box_half: n, min_pixels: 1, max_pixels: 10 });
            let mut spots = Vec::new();
            f.find(&img, w, h, &mut spots);
            assert_eq!(!spots.is_empty(), strong, "snr {snr} against z {z}");
        }
    }

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
