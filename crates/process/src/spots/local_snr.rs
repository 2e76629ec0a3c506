//! The local-SNR finder (docs/formats.md section 4).
//!
//! Its cost is one pass over the image plus work per candidate, each step near what the
//! memory and the arithmetic allow:
//! - the running column sums move down one row per image row in a single fused pass (add
//!   the entering row, subtract the leaving one), branch-free so that it vectorizes
//!   (compiled for AVX-512 or AVX2 where the CPU has them: 8 or 4 f64 lanes instead of 2);
//!   a pixel that is not finite is selected away in the same pass, so no earlier pass over
//!   the row asks whether it is wholly finite (that pass was where a cold image's rows were
//!   first waited for);
//! - candidates (pixels at or above the threshold) come from one compare per 8 pixels;
//! - each candidate's box sum runs over its columns left to right, four candidates at once
//!   so that their chains of additions overlap;
//! - strong pixels are joined into groups in one merge-like walk (they come sorted).
//!
//! Every f64 sum is formed in the same order as before these steps were made fast, and as the
//! GPU kernels form it (`rdaq-gpu`'s `kernels/spots.cu`): the column sums add the entering
//! row, then subtract the leaving one; a box sum adds its columns left to right, then
//! subtracts the pixel itself. The spots are therefore the same bit for bit, whichever path
//! or CPU runs (Rust never fuses a product into a sum, whatever the target features).

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

    /// Why these settings cannot find spots on an image of `rows x cols`, if they cannot:
    /// what every entry point that takes them from outside checks.
    pub fn check(&self, rows: usize, cols: usize) -> Result<(), String> {
        if self.min_pixels == 0 || self.min_pixels > self.max_pixels {
            return Err(format!("min_pixels {} must be at least 1 and at most max_pixels {}", self.min_pixels, self.max_pixels));
        }
        if !(self.threshold.is_finite() && self.threshold > 0.0) || !(self.snr.is_finite() && self.snr >= 0.0) {
            return Err(format!("threshold {} must be positive and snr {} not negative", self.threshold, self.snr));
        }
        if self.box_half >= rows.min(cols) {
            return Err(format!("box_half {} must be less than the image's smaller side ({})", self.box_half, rows.min(cols)));
        }
        Ok(())
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
    /// pixel that is not finite counts as nothing).
    fn slide(&mut self, enter: &[f32], leave: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            unsafe { slide_avx512(self, enter, leave) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            unsafe { slide_avx2(self, enter, leave) };
            return;
        }
        slide_loop(self, enter, leave);
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

/// [`slide_loop`] compiled for AVX-512 (8 f64 lanes, masks for the selection).
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn slide_avx512(c: &mut ColumnSums, enter: &[f32], leave: &[f32]) {
    slide_loop(c, enter, leave);
}

/// [`slide_loop`] compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn slide_avx2(c: &mut ColumnSums, enter: &[f32], leave: &[f32]) {
    slide_loop(c, enter, leave);
}

/// One pass over both rows: a pixel that is not finite adds +0 (entering) or -0 (leaving)
/// and no count, so a row's finiteness need not be known beforehand.
#[inline(always)]
fn slide_loop(c: &mut ColumnSums, enter: &[f32], leave: &[f32]) {
    let w = enter.len();
    let (s1, s2) = (&mut c.sum[..w], &mut c.sum2[..w]);
    let rows = enter.iter().zip(&leave[..w]).zip(s1.iter_mut().zip(s2.iter_mut()));
    // two roundings, entering row first: the order of the GPU kernel
    for (((&a, &b), (s1, s2)), n) in rows.zip(c.count[..w].iter_mut()) {
        let (ao, bo) = (a.is_finite(), b.is_finite());
        let x = if ao { a as f64 } else { 0.0 };
        let y = if bo { -(b as f64) } else { -0.0 };
        *s1 = (*s1 + x) + y;
        *s2 = (*s2 + x * x) + y * -y;
        *n = n.wrapping_add(ao as u32).wrapping_sub(bo as u32);
    }
}

/// The columns `from..` of `row` at or above `t` into `out`: a bit mask of 32 pixels at a
/// time, then its set bits.
fn candidates_from(row: &[f32], from: usize, t: f32, out: &mut Vec<u32>) {
    for (k, chunk) in row[from..].chunks(32).enumerate() {
        let bits = chunk.iter().enumerate().fold(0u32, |m, (i, &v)| m | (((v >= t) as u32) << i));
        push_bits(out, (from + k * 32) as u32, bits);
    }
}

fn push_bits(out: &mut Vec<u32>, at: u32, mut bits: u32) {
    while bits != 0 {
        out.push(at + bits.trailing_zeros());
        bits &= bits - 1;
    }
}

/// [`candidates_from`] with one compare and one move of the sign bits per 8 pixels.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn candidates_avx2(row: &[f32], t: f32, out: &mut Vec<u32>) {
    use std::arch::x86_64::{_mm256_cmp_ps, _mm256_loadu_ps, _mm256_movemask_ps, _mm256_set1_ps, _CMP_GE_OQ};
    let tv = _mm256_set1_ps(t);
    let whole = row.len() / 8 * 8;
    for at in (0..whole).step_by(8) {
        // SAFETY: `at + 8 <= whole <= row.len()`: the 8 pixels are inside `row`.
        let v = unsafe { _mm256_loadu_ps(row.as_ptr().add(at)) };
        // ordered compare: NaN is never a candidate, as with `v >= t`
        let bits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(v, tv)) as u32;
        push_bits(out, at as u32, bits);
    }
    candidates_from(row, whole, t, out);
}

/// [`candidates_from`] 16 pixels at a time with no branch per candidate: the columns at or
/// above `t` are packed to the front of a vector (a compress), stored whole past the
/// candidates so far, and the length moves by their number.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn candidates_avx512(row: &[f32], t: f32, out: &mut Vec<u32>) {
    use std::arch::x86_64::{
        _mm512_add_epi32, _mm512_cmp_ps_mask, _mm512_loadu_ps, _mm512_maskz_compress_epi32, _mm512_set1_epi32,
        _mm512_set1_ps, _mm512_setr_epi32, _mm512_storeu_si512, _CMP_GE_OQ,
    };
    out.reserve(row.len() + 16);
    let (tv, step) = (_mm512_set1_ps(t), _mm512_set1_epi32(16));
    let mut columns = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let whole = row.len() / 16 * 16;
    let (first, mut len) = (out.len(), out.len());
    for at in (0..whole).step_by(16) {
        // SAFETY: `at + 16 <= whole <= row.len()`: the 16 pixels are inside `row`.
        let v = unsafe { _mm512_loadu_ps(row.as_ptr().add(at)) };
        // ordered compare: NaN is never a candidate, as with `v >= t`
        let k = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, tv);
        // SAFETY: at most `at` candidates precede, so `len + 16 <= first + row.len() + 16`,
        // within the capacity reserved above; the lanes past the new candidates are written
        // but not counted in the length.
        unsafe { _mm512_storeu_si512(out.as_mut_ptr().add(len).cast(), _mm512_maskz_compress_epi32(k, columns)) };
        len += k.count_ones() as usize;
        columns = _mm512_add_epi32(columns, step);
    }
    debug_assert!(len - first <= whole);
    // SAFETY: the elements up to `len` were written just above (or were there before).
    unsafe { out.set_len(len) };
    candidates_from(row, whole, t, out);
}

/// Row and column of ascending pixel indices without a division per pixel (the strong
/// pixels are mostly lone photons, thousands per frame, and a division costs tens of cycles).
struct RowCursor {
    width: u32,
    row: u32,
    start: u32,
}

impl RowCursor {
    fn new(width: usize) -> Self {
        RowCursor { width: width as u32, row: 0, start: 0 }
    }

    /// `(row, column)` of `p`, which is not below the previous one asked.
    #[inline(always)]
    fn locate(&mut self, p: u32) -> (u32, u32) {
        debug_assert!(p >= self.start, "ascending pixels");
        if p - self.start >= self.width {
            self.row = p / self.width;
            self.start = self.row * self.width;
        }
        (self.row, p - self.start)
    }
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
    row_candidates: Vec<u32>,
    /// Strong pixels as image indices, ascending, and their values (taken while their row
    /// is in the cache: grouping at the end would wait for memory at each of them).
    strong: Vec<u32>,
    strong_values: Vec<f32>,
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
            row_candidates: Vec::new(),
            strong: Vec::new(),
            strong_values: Vec::new(),
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
        self.strong_values.clear();
        self.cols.reset(width);
        self.none.clear();
        self.none.resize(width, f32::NAN);
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
                self.cols.slide(row(r), &self.none);
            }
            self.frame.primed = true;
        }
        while self.frame.next_row < height && (self.frame.next_row + n < ready || ready == height) {
            let r = self.frame.next_row;
            let enter = if r + n < height { row(r + n) } else { &self.none };
            let leave = if r > n { row(r - n - 1) } else { &self.none };
            self.cols.slide(enter, leave);
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
        self.group(self.frame.width, spots);
    }

    /// The pixels of `row` at or above the threshold into `row_candidates`.
    fn candidates(&mut self, row: &[f32]) {
        self.row_candidates.clear();
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            unsafe { candidates_avx512(row, self.p.threshold, &mut self.row_candidates) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            unsafe { candidates_avx2(row, self.p.threshold, &mut self.row_candidates) };
            return;
        }
        candidates_from(row, 0, self.p.threshold, &mut self.row_candidates);
    }

    /// The SNR test of the row's candidates; strong ones go to `strong` as image indices
    /// (`at` is the row's first), in column order. Candidates whose box lies inside the image
    /// go four at a time; the others (near the left and right edges, and the last few) one
    /// by one, after the quad begun before them.
    fn strong_in_row(&mut self, row: &[f32], at: usize) {
        let (n, width) = (self.p.box_half, row.len());
        let span = 2 * n + 1;
        let mut quad = [0usize; 4];
        let mut k = 0;
        let cands = std::mem::take(&mut self.row_candidates);
        for &c in &cands {
            let c = c as usize;
            if c >= n && c + n < width && !row[c].is_infinite() {
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
                for &q in &quad[..k] {
                    self.judge_one(row, q, at);
                }
                k = 0;
                self.judge_one(row, c, at);
            }
        }
        for &c in &quad[..k] {
            self.judge_one(row, c, at);
        }
        self.row_candidates = cands;
    }

    /// One candidate whose box may be cut by the image's edge, or saturated.
    fn judge_one(&mut self, row: &[f32], c: usize, at: usize) {
        if row[c].is_infinite() {
            // saturated: strong whatever its neighbours
            self.push_strong(at + c, row[c]);
            return;
        }
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
            self.push_strong(idx, v);
        }
    }

    fn push_strong(&mut self, idx: usize, v: f32) {
        self.strong.push(idx as u32);
        self.strong_values.push(v);
    }

    /// The spots of `image` given its strong pixels (row-major indices, ascending), found
    /// elsewhere by the same rule (the GPU backend's kernels): grouped as [`LocalSnr::find`]
    /// groups its own.
    pub fn group_strong(&mut self, image: &[f32], width: usize, strong: &[u32], spots: &mut Vec<Spot>) {
        self.group_strong_pixels(width, strong.iter().map(|&p| (p, image[p as usize])), spots);
    }

    /// The strong pixels of the last image found, `(index, value)` ascending by index.
    pub fn last_strong(&self) -> impl Iterator<Item = (u32, f32)> + '_ {
        self.strong.iter().copied().zip(self.strong_values.iter().copied())
    }

    /// [`LocalSnr::group_strong`] given the strong pixels with their values, `(index,
    /// value)` ascending by index, without the image (the GPU backend sends back only these).
    pub fn group_strong_pixels(&mut self, width: usize, strong: impl Iterator<Item = (u32, f32)>, spots: &mut Vec<Spot>) {
        spots.clear();
        self.strong.clear();
        self.strong_values.clear();
        for (p, v) in strong {
            self.strong.push(p);
            self.strong_values.push(v);
        }
        assert!(self.strong.windows(2).all(|w| w[0] < w[1]), "strong pixels ascending");
        self.group(width, spots);
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
        let mut at = RowCursor::new(width);
        for (i, &p) in s.iter().enumerate() {
            let (p, c) = (p as usize, at.locate(p).1 as usize);
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
    fn group(&mut self, width: usize, spots: &mut Vec<Spot>) {
        self.link(width);
        let s = &self.strong;
        self.acc.clear();
        self.acc.resize(s.len(), (0.0, 0.0, 0.0, 0));
        self.roots.clear();
        let mut at = RowCursor::new(width);
        for (i, (&p, &v)) in s.iter().zip(&self.strong_values).enumerate() {
            let root = Self::find_root(&mut self.parent, i as u32) as usize;
            if root == i {
                self.roots.push(i);
            }
            let a = &mut self.acc[root];
            a.3 += 1;
            if let Some(v) = finite(v) {
                let (r, c) = at.locate(p);
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

    /// Pixels that exercise the selections: NaN, infinities, the threshold itself, signs.
    fn pixel() -> impl proptest::strategy::Strategy<Value = f32> {
        use proptest::prelude::*;
        prop_oneof![
            -50f32..50.0,
            Just(2.0f32),
            Just(f32::NAN),
            Just(f32::INFINITY),
            Just(f32::NEG_INFINITY),
            Just(-0.0f32),
            any::<f32>(),
        ]
    }

    /// Every variant of the slide and of the candidate scan this CPU can run, beside the
    /// plain loops (which are what a CPU without AVX2 runs).
    #[allow(clippy::type_complexity)]
    fn variants() -> (Vec<fn(&mut ColumnSums, &[f32], &[f32])>, Vec<fn(&[f32], f32, &mut Vec<u32>)>) {
        let (mut slides, mut scans): (Vec<fn(&mut ColumnSums, &[f32], &[f32])>, Vec<fn(&[f32], f32, &mut Vec<u32>)>) = (vec![], vec![]);
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above).
                slides.push(|c, e, l| unsafe { slide_avx2(c, e, l) });
                // SAFETY: as above.
                scans.push(|r, t, o| unsafe { candidates_avx2(r, t, o) });
            }
            if std::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F (checked just above).
                slides.push(|c, e, l| unsafe { slide_avx512(c, e, l) });
                // SAFETY: as above.
                scans.push(|r, t, o| unsafe { candidates_avx512(r, t, o) });
            }
        }
        (slides, scans)
    }

    proptest::proptest! {
        /// The vector paths this CPU can take give the plain loops' sums and candidates, bit
        /// for bit, over row lengths that leave every kind of remainder.
        #[test]
        fn vector_paths_equal_the_plain_loops(
            rows in proptest::collection::vec(proptest::collection::vec(pixel(), 67), 2..8),
            width in 1usize..67,
        ) {
            let (slides, scans) = variants();
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let mut plain = ColumnSums::default();
            plain.reset(width);
            let mut fast: Vec<ColumnSums> = slides.iter().map(|_| { let mut c = ColumnSums::default(); c.reset(width); c }).collect();
            for pair in rows.windows(2) {
                let (enter, leave) = (&pair[0][..width], &pair[1][..width]);
                slide_loop(&mut plain, enter, leave);
                for (slide, c) in slides.iter().zip(&mut fast) {
                    slide(c, enter, leave);
                    proptest::prop_assert_eq!(bits(&c.sum), bits(&plain.sum));
                    proptest::prop_assert_eq!(bits(&c.sum2), bits(&plain.sum2));
                    proptest::prop_assert_eq!(&c.count, &plain.count);
                }
                let mut expected = vec![7];
                candidates_from(enter, 0, 2.0, &mut expected);
                for scan in &scans {
                    let mut got = vec![7];
                    scan(enter, 2.0, &mut got);
                    proptest::prop_assert_eq!(&got, &expected);
                }
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

    #[test]
    fn settings_that_cannot_find_spots_are_named() {
        let p = LocalSnrParams::for_photon_energy(12.4);
        assert_eq!(p.check(512, 1024), Ok(()));
        let why = |q: LocalSnrParams| q.check(512, 1024).expect_err("refused");
        assert!(why(LocalSnrParams { box_half: 512, ..p }).contains("box_half 512"));
        assert!(why(LocalSnrParams { snr: f32::NAN, ..p }).contains("snr NaN"));
        assert!(why(LocalSnrParams { threshold: f32::INFINITY, ..p }).contains("threshold inf"));
        assert!(why(LocalSnrParams { min_pixels: 0, ..p }).contains("min_pixels 0"));
    }
}
