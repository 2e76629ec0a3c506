//! The local-SNR finder (docs/formats.md section 4).
//!
//! Its cost is one pass over the image plus work per candidate, each step near what the
//! memory and the arithmetic allow:
//! - the running column sums move down one row per image row in a single fused pass (add
//!   the entering row, subtract the leaving one), branch-free so that it vectorizes
//!   (compiled for AVX2 where the CPU has it: 4 f64 lanes instead of 2);
//! - candidates (pixels at or above the threshold) come from a bit mask of 32 pixels at a
//!   time; rows known to be wholly finite slide without the finiteness selection;
//! - each candidate's box sum runs over its columns left to right, four candidates at once
//!   so that their chains of additions overlap;
//! - strong pixels are joined into groups in one merge-like walk (they come sorted).
//!
//! Every f64 sum is formed in the same order as before these steps were made fast, and as the
//! GPU kernels form it (`rdaq-gpu`'s `kernels/spots.cu`): the column sums add the entering
//! row, then subtract the leaving one; a box sum adds its columns left to right, then
//! subtracts the pixel itself. The spots are therefore the same bit for bit, whichever path
//! or CPU runs (no FMA is enabled, so no product is fused into a sum).

use super::Spot;

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

/// The running sums over the box's rows, one entry per image column.
#[derive(Default)]
struct ColumnSums {
    sum: Vec<f64>,
    sum2: Vec<f64>,
    count: Vec<u32>,
}

impl ColumnSums {
    fn reset(&mut self, width: usize) {
        for v in [&mut self.sum, &mut self.sum2] {
            v.clear();
            v.resize(width, 0.0);
        }
        self.count.clear();
        self.count.resize(width, 0);
    }

    /// Adds the row `enter` and subtracts the row `leave` (a row of NaN stands for none: a
    /// pixel that is not finite counts as nothing). `finite` says whether both rows are
    /// wholly finite: then no count changes, and the loop has no selection in it.
    fn slide(&mut self, enter: &[f32], leave: &[f32], finite: bool) {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            unsafe { slide_avx2(self, enter, leave, finite) };
            return;
        }
        slide_loop(self, enter, leave, finite);
    }

    /// The box's sums at the columns `lo..lo + len` of four candidates at once, each
    /// formed left to right: `(sum, sum of squares, count)` per candidate.
    #[inline(never)]
    fn box4(&self, lo: [usize; 4], len: usize) -> ([f64; 4], [f64; 4], [u32; 4]) {
        let [a0, a1, a2, a3] = lo.map(|l| &self.sum[l..l + len]);
        let [b0, b1, b2, b3] = lo.map(|l| &self.sum2[l..l + len]);
        let (mut s0, mut s1, mut s2, mut s3) = (0f64, 0f64, 0f64, 0f64);
        let (mut q0, mut q1, mut q2, mut q3) = (0f64, 0f64, 0f64, 0f64);
        for k in 0..len {
            (s0, s1, s2, s3) = (s0 + a0[k], s1 + a1[k], s2 + a2[k], s3 + a3[k]);
            (q0, q1, q2, q3) = (q0 + b0[k], q1 + b1[k], q2 + b2[k], q3 + b3[k]);
        }
        let n = lo.map(|l| self.count[l..l + len].iter().sum());
        ([s0, s1, s2, s3], [q0, q1, q2, q3], n)
    }
}

/// [`slide_loop`] compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn slide_avx2(c: &mut ColumnSums, enter: &[f32], leave: &[f32], finite: bool) {
    slide_loop(c, enter, leave, finite);
}

#[inline(always)]
fn slide_loop(c: &mut ColumnSums, enter: &[f32], leave: &[f32], finite: bool) {
    let w = enter.len();
    let (s1, s2) = (&mut c.sum[..w], &mut c.sum2[..w]);
    let rows = enter.iter().zip(&leave[..w]).zip(s1.iter_mut().zip(s2.iter_mut()));
    // two roundings, entering row first: the order of the GPU kernel
    if finite {
        for ((&a, &b), (s1, s2)) in rows {
            let (x, y) = (a as f64, -(b as f64));
            *s1 = (*s1 + x) + y;
            *s2 = (*s2 + x * x) + y * -y;
        }
        return;
    }
    for (((&a, &b), (s1, s2)), n) in rows.zip(c.count[..w].iter_mut()) {
        let (ao, bo) = (a.is_finite(), b.is_finite());
        let x = if ao { a as f64 } else { 0.0 };
        let y = if bo { -(b as f64) } else { -0.0 };
        *s1 = (*s1 + x) + y;
        *s2 = (*s2 + x * x) + y * -y;
        *n = n.wrapping_add(ao as u32).wrapping_sub(bo as u32);
    }
}

/// Whether every pixel of `row` is finite (vectorizes: no early exit).
fn all_finite(row: &[f32]) -> bool {
    row.iter().fold(true, |a, v| a & v.is_finite())
}

/// Where the finder is in the image it works on.
#[derive(Default, Clone, Copy)]
struct Frame {
    width: usize,
    height: usize,
    /// The next row to test.
    next_row: usize,
    /// The first `box_half` rows are in the column sums.
    primed: bool,
}

/// The local-SNR finder with its scratch buffers (reused from frame to frame).
pub struct LocalSnr {
    p: LocalSnrParams,
    frame: Frame,
    cols: ColumnSums,
    /// A row of NaN: what enters or leaves the box beyond the image's edges.
    none: Vec<f32>,
    /// Per image row: wholly finite (found as the row enters the box).
    finite_rows: Vec<bool>,
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
            frame: Frame::default(),
            cols: ColumnSums::default(),
            none: Vec::new(),
            finite_rows: Vec::new(),
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

    /// Finds the spots of a row-major `height x width` image into `spots` (cleared first).
    pub fn find(&mut self, image: &[f32], width: usize, height: usize, spots: &mut Vec<Spot>) {
        self.begin(width, height);
        self.end(image, spots);
    }

    /// Starts an image of `height x width` whose rows are made in order: [`LocalSnr::rows_ready`]
    /// then works on each row as soon as the rows its box needs are final, while they are
    /// still in the cache of the core that made them, and [`LocalSnr::end`] gives the spots.
    /// The result is [`LocalSnr::find`]'s, whatever the steps.
    pub fn begin(&mut self, width: usize, height: usize) {
        self.frame = Frame { width, height, next_row: 0, primed: false };
        self.strong.clear();
        self.cols.reset(width);
        self.none.clear();
        self.none.resize(width, f32::NAN);
        self.finite_rows.clear();
    }

    /// Rows `0..ready` of `image` (the whole image's buffer) are final.
    pub fn rows_ready(&mut self, image: &[f32], ready: usize) {
        let Frame { width, height, .. } = self.frame;
        assert_eq!(image.len(), width * height, "image of height x width");
        let (n, ready) = (self.p.box_half, ready.min(height));
        let row = |r: usize| &image[r * width..(r + 1) * width];
        // the column sums cover rows r-n..=r+n; rows enter and leave as the box moves down
        if !self.frame.primed {
            if ready < n.min(height) {
                return;
            }
            for r in 0..n.min(height) {
                self.finite_rows.push(all_finite(row(r)));
                self.cols.slide(row(r), &self.none, false);
            }
            self.frame.primed = true;
        }
        while self.frame.next_row < height && (self.frame.next_row + n < ready || ready == height) {
            let r = self.frame.next_row;
            let enter = (r + n < height).then(|| row(r + n));
            if let Some(e) = enter {
                self.finite_rows.push(all_finite(e));
            }
            let leave = (r > n).then(|| row(r - n - 1));
            let finite = enter.is_some() && leave.is_some() && self.finite_rows[r + n] && self.finite_rows[r - n - 1];
            self.cols.slide(enter.unwrap_or(&self.none), leave.unwrap_or(&self.none), finite);
            self.candidates(row(r));
            self.strong_in_row(row(r), r * width);
            self.frame.next_row += 1;
        }
    }

    /// Every row of `image` is final: the rest of the work, and the spots into `spots`
    /// (cleared first).
    pub fn end(&mut self, image: &[f32], spots: &mut Vec<Spot>) {
        self.rows_ready(image, self.frame.height);
        spots.clear();
        self.group(image, self.frame.width, spots);
    }

    /// The pixels of `row` at or above the threshold into `row_candidates`: a bit mask of
    /// 32 pixels at a time (vectorizes), then its set bits.
    fn candidates(&mut self, row: &[f32]) {
        let t = self.p.threshold;
        self.row_candidates.clear();
        for (k, chunk) in row.chunks(32).enumerate() {
            let mut bits = chunk.iter().enumerate().fold(0u32, |m, (i, &v)| m | (((v >= t) as u32) << i));
            while bits != 0 {
                self.row_candidates.push((k * 32) as u32 + bits.trailing_zeros());
                bits &= bits - 1;
            }
        }
    }

    /// The SNR test of the row's candidates; strong ones go to `strong` as image indices
    /// (`at` is the row's first). Candidates whose box lies inside the image go four at a
    /// time; the others (near the left and right edges, and the last few) one by one.
    fn strong_in_row(&mut self, row: &[f32], at: usize) {
        let (n, width) = (self.p.box_half, row.len());
        let span = 2 * n + 1;
        let mut quad = [0usize; 4];
        let mut k = 0;
        let cands = std::mem::take(&mut self.row_candidates);
        for &c in &cands {
            let c = c as usize;
            let v = row[c];
            if v.is_infinite() {
                // saturated: strong whatever its neighbours
                self.strong.push((at + c) as u32);
            } else if c >= n && c + n < width {
                quad[k] = c;
                k += 1;
                if k == 4 {
                    let (s, s2, cnt) = self.cols.box4(quad.map(|c| c - n), span);
                    for j in 0..4 {
                        self.judge(row[quad[j]], s[j], s2[j], cnt[j], at + quad[j]);
                    }
                    k = 0;
                }
            } else {
                self.judge_one(row, c, at);
            }
        }
        for &c in &quad[..k] {
            self.judge_one(row, c, at);
        }
        self.row_candidates = cands;
        // the strong pixels of a row come in column order (the quads may have reordered them)
        let first = self.strong.partition_point(|&p| (p as usize) < at);
        self.strong[first..].sort_unstable();
    }

    /// One candidate whose box may be cut by the image's edge.
    fn judge_one(&mut self, row: &[f32], c: usize, at: usize) {
        let n = self.p.box_half;
        let (lo, hi) = (c.saturating_sub(n), (c + n + 1).min(row.len()));
        let (s, s2, cnt) = (self.cols.sum[lo..hi].iter().sum(), self.cols.sum2[lo..hi].iter().sum(), self.cols.count[lo..hi].iter().sum());
        self.judge(row[c], s, s2, cnt, at + c);
    }

    /// The SNR test of pixel `idx` of value `v`, given its box's sums with itself in them.
    #[inline(always)]
    fn judge(&mut self, v: f32, s: f64, s2: f64, cnt: u32, idx: usize) {
        let x = v as f64;
        let cnt = cnt - 1;
        if cnt == 0 {
            return;
        }
        let snr = self.p.snr as f64;
        let mean = (s - x) / cnt as f64;
        let var = ((s2 - x * x) / cnt as f64 - mean * mean).max(0.0);
        let d = x - mean;
        if d > 0.0 && d * d > snr * snr * var {
            self.strong.push(idx as u32);
        }
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

    /// Joins strong pixels `i` and `j`: the earlier root stays the root, so groups come
    /// out in scan order.
    fn join(parent: &mut [u32], i: usize, j: usize) {
        let (a, b) = (Self::find_root(parent, i as u32), Self::find_root(parent, j as u32));
        let (lo, hi) = (a.min(b), a.max(b));
        parent[hi as usize] = lo;
    }

    /// Links each strong pixel (sorted, row-major) to its strong neighbours on the left and
    /// in the row above, in one walk: the first candidate of the row above only moves forward.
    fn link(&mut self, width: usize) {
        let s = &self.strong;
        self.parent.clear();
        self.parent.extend(0..s.len() as u32);
        let mut up = 0usize;
        for (i, &p) in s.iter().enumerate() {
            // 32-bit division: several times cheaper than 64-bit on common CPUs
            let (p, c) = (p as usize, (p % width as u32) as usize);
            if c > 0 && i > 0 && s[i - 1] as usize == p - 1 {
                Self::join(&mut self.parent, i, i - 1);
            }
            if p < width {
                continue;
            }
            let (first, last) = (p - width - (c > 0) as usize, p - width + (c + 1 < width) as usize);
            // s[i] = p > last, so `up` stops at i at the latest
            while (s[up] as usize) < first {
                up += 1;
            }
            for (j, &q) in s.iter().enumerate().take(i).skip(up) {
                if q as usize > last {
                    break;
                }
                Self::join(&mut self.parent, i, j);
            }
        }
    }

    /// Joins the strong pixels (sorted, row-major) into 8-connected groups and keeps those
    /// of allowed size as spots, in order of their first pixel.
    fn group(&mut self, image: &[f32], width: usize, spots: &mut Vec<Spot>) {
        self.link(width);
        let s = &self.strong;
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
                let (r, c) = (p / width as u32, p % width as u32);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spots::{blob, is_hit};

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
    fn rows_given_in_steps_give_the_spots_of_the_whole_image() {
        let (w, h) = (120, 90);
        let mut img: Vec<f32> = (0..w * h).map(|i| ((i * 7919) % 23) as f32 * 0.05).collect();
        for (x, y) in [(20.3, 10.5), (60.5, 44.2), (100.1, 80.9), (5.5, 2.5)] {
            blob(&mut img, w, x, y, 400.0);
        }
        img[40 * w + 7] = f32::NAN;
        img[41 * w + 70] = f32::INFINITY;
        let p = LocalSnrParams { threshold: 1.0, snr: 3.0, box_half: 6, min_pixels: 2, max_pixels: 200 };
        let (mut whole, mut stepped) = (Vec::new(), Vec::new());
        LocalSnr::new(p).find(&img, w, h, &mut whole);
        assert!(whole.len() >= 4, "{whole:?}");
        for step in [1, 3, 7, 16, 89, 200] {
            let mut f = LocalSnr::new(p);
            f.begin(w, h);
            for ready in (0..=h).step_by(step) {
                f.rows_ready(&img, ready);
            }
            f.end(&img, &mut stepped);
            assert_eq!(whole, stepped, "rows given {step} at a time");
        }
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
}
