//! Multi-module detector geometry: identical modules on a grid with gaps between them
//! (docs/formats.md section 1: default gaps 8 px in x, 36 px in y; a 4M is 8 modules, arranged by
//! configuration), and assembly of module frames into the full image.

use crate::jungfrau::{MODULE_COLS, MODULE_ROWS};

/// Default gaps between modules (pixels), fast and slow axis.
pub const DEFAULT_GAP_X: usize = 8;
pub const DEFAULT_GAP_Y: usize = 36;

/// Defaults of the geometry fields, for the file and wire types that carry them (serde's
/// `default = "..."` takes a function).
pub fn default_module_cols() -> u16 {
    1
}
pub fn default_gap_x() -> usize {
    DEFAULT_GAP_X
}
pub fn default_gap_y() -> usize {
    DEFAULT_GAP_Y
}

/// Gap pixels carry this word in assembled raw images (the JUNGFRAU error word), and are
/// flagged with [`MASK_GAP`] in the pixel mask.
pub const GAP_WORD: u16 = 0xffff;
/// NXmx pixel_mask bit 0: gap between modules.
pub const MASK_GAP: u32 = 1 << 0;

/// Gap pixels between modules, at most: a module's width (real detectors have a few).
pub const MAX_GAP: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Geometry {
    pub modules: u16,
    /// Modules per grid row (along the fast axis).
    pub module_cols: u16,
    pub gap_x: usize,
    pub gap_y: usize,
    /// Pixel rows of each module's frame: 512, or fewer in a partial readout (`readnrows`).
    pub module_height: usize,
    /// Pixel columns of each module's image: 1024 (JUNGFRAU, EIGER), more with chip gaps.
    pub module_width: usize,
}

impl Geometry {
    /// `modules` modules, `module_cols` per grid row, with the given gaps. `None` when the
    /// modules do not fill whole grid rows.
    pub fn new(modules: u16, module_cols: u16, gap_x: usize, gap_y: usize) -> Option<Geometry> {
        (modules > 0 && module_cols > 0 && modules % module_cols == 0)
            .then_some(Geometry { modules, module_cols, gap_x, gap_y, module_height: MODULE_ROWS, module_width: MODULE_COLS })
    }

    /// The same detector with module frames of `rows` pixel rows (a partial readout).
    pub fn with_module_height(self, rows: usize) -> Geometry {
        assert!(rows > 0 && rows <= MODULE_ROWS, "a module frame has 1 to {MODULE_ROWS} rows");
        Geometry { module_height: rows, ..self }
    }

    /// The same detector with module images of `width x height` pixels (another
    /// detector's modules, or chip gap pixels inside them).
    pub fn with_module_size(self, width: usize, height: usize) -> Geometry {
        assert!(width > 0 && height > 0, "a module image has pixels");
        Geometry { module_width: width, module_height: height, ..self }
    }

    /// Pixels of one module frame.
    pub fn module_pixels(&self) -> usize {
        self.module_height * self.module_width
    }

    /// Bytes of one module frame of 16-bit words.
    pub fn module_bytes(&self) -> usize {
        self.module_pixels() * 2
    }

    pub fn module_rows(&self) -> usize {
        (self.modules / self.module_cols) as usize
    }

    /// Full image width (fast axis) in pixels.
    pub fn width(&self) -> usize {
        let c = self.module_cols as usize;
        c * self.module_width + (c - 1) * self.gap_x
    }

    /// Full image height (slow axis) in pixels.
    pub fn height(&self) -> usize {
        let r = self.module_rows();
        r * self.module_height + (r - 1) * self.gap_y
    }

    /// Pixel (row, column) of module `m`'s first pixel in the full image.
    pub fn origin(&self, m: u16) -> (usize, usize) {
        let (gr, gc) = ((m / self.module_cols) as usize, (m % self.module_cols) as usize);
        (gr * (self.module_height + self.gap_y), gc * (self.module_width + self.gap_x))
    }

    /// Calls `f(image_pixel, len)` for each run of the full image that module `m`'s pixels
    /// `[start, end)` (row-major within the module) cover.
    pub fn module_span(&self, m: u16, start: usize, end: usize, mut f: impl FnMut(usize, usize)) {
        let (r0, c0) = self.origin(m);
        let mut p = start;
        while p < end {
            let (r, c) = (p / self.module_width, p % self.module_width);
            let run = (self.module_width - c).min(end - p);
            f((r0 + r) * self.width() + c0 + c, run);
            p += run;
        }
    }

    /// Calls `f(module_pixel, image_pixel, len)` for each row run of module `m`: its pixels
    /// `module_pixel..+len` sit at `image_pixel..+len` of the full image.
    pub fn module_runs(&self, m: u16, mut f: impl FnMut(usize, usize, usize)) {
        let mut at = 0;
        self.module_span(m, 0, self.module_pixels(), |image, run| {
            f(at, image, run);
            at += run;
        });
    }

    /// The row runs of every module in image order: (word in a slot of the modules' frames
    /// one after the other, image pixel, length). The pixels between runs are gaps.
    pub fn runs_in_image_order(&self) -> Vec<(usize, usize, usize)> {
        let mut runs = Vec::new();
        for m in 0..self.modules {
            self.module_runs(m, |from, at, run| runs.push((m as usize * self.module_pixels() + from, at, run)));
        }
        runs.sort_unstable_by_key(|r| r.1);
        runs
    }

    /// For each image pixel (row-major), the index of its word among a frame's module words
    /// (the modules one after the other, as a receiver slot holds them), or -1 for a gap
    /// pixel: the map the GPU assembles images with.
    pub fn pixel_map(&self) -> Vec<i32> {
        let mut map = vec![-1i32; self.height() * self.width()];
        for (from, at, run) in self.runs_in_image_order() {
            for (k, m) in map[at..at + run].iter_mut().enumerate() {
                *m = (from + k) as i32;
            }
        }
        map
    }

    /// The pixel mask of the full image: [`MASK_GAP`] on every gap pixel.
    pub fn gap_mask(&self) -> Vec<u32> {
        let mut mask = vec![MASK_GAP; self.height() * self.width()];
        for m in 0..self.modules {
            let (r0, c0) = self.origin(m);
            for r in 0..self.module_height {
                let at = (r0 + r) * self.width() + c0;
                mask[at..at + self.module_width].fill(0);
            }
        }
        mask
    }

    /// Assembles module images of `pb`-byte pixels into `out` (height x width pixels):
    /// module `m`'s come from `module(m)`; gap pixels get all bits set (the largest value
    /// of the pixel type, [`GAP_WORD`] for 16 bits). Each pixel is written exactly once.
    pub fn assemble_bytes<'a>(&self, pb: usize, mut module: impl FnMut(u16) -> &'a [u8], out: &mut [u8]) {
        let (w, mw) = (self.width() * pb, self.module_width * pb);
        assert_eq!(out.len(), self.height() * w, "output is the full image");
        for gr in 0..self.module_rows() {
            let row0 = gr * (self.module_height + self.gap_y);
            let mods: Vec<&[u8]> = (0..self.module_cols).map(|gc| module(gr as u16 * self.module_cols + gc)).collect();
            for r in 0..self.module_height {
                let line = &mut out[(row0 + r) * w..(row0 + r + 1) * w];
                for (gc, m) in mods.iter().enumerate() {
                    let c0 = gc * (mw + self.gap_x * pb);
                    line[c0..c0 + mw].copy_from_slice(&m[r * mw..(r + 1) * mw]);
                    if gc + 1 < mods.len() {
                        line[c0 + mw..c0 + mw + self.gap_x * pb].fill(0xff);
                    }
                }
            }
            if gr + 1 < self.module_rows() {
                out[(row0 + self.module_height) * w..(row0 + self.module_height + self.gap_y) * w].fill(0xff);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jungfrau::MODULE_PIXELS;
    use crate::{as_bytes, as_bytes_mut};

    #[test]
    fn the_pixel_map_names_every_module_word_once_and_marks_the_gaps() {
        let g = Geometry::new(4, 2, DEFAULT_GAP_X, DEFAULT_GAP_Y).unwrap();
        let map = g.pixel_map();
        let mask = g.gap_mask();
        let mut seen = vec![false; 4 * g.module_pixels()];
        for (px, &w) in map.iter().enumerate() {
            assert_eq!(w < 0, mask[px] & MASK_GAP != 0, "pixel {px}: a gap exactly where the mask says");
            if w >= 0 {
                assert!(!std::mem::replace(&mut seen[w as usize], true), "word {w} twice");
            }
        }
        assert!(seen.iter().all(|&s| s), "every word of the frame somewhere");
    }

    #[test]
    fn a_4m_is_8_modules_with_gaps() {
        let g = Geometry::new(8, 2, 8, 36).unwrap();
        assert_eq!((g.width(), g.height()), (2 * 1024 + 8, 4 * 512 + 3 * 36));
        assert_eq!(g.origin(3), (548, 1032));
        assert!(Geometry::new(7, 2, 8, 36).is_none());
    }

    #[test]
    fn a_partial_readout_has_shorter_modules() {
        let g = Geometry::new(2, 1, 8, 36).unwrap().with_module_height(256);
        assert_eq!((g.width(), g.height(), g.origin(1)), (1024, 2 * 256 + 36, (256 + 36, 0)));
        let frames: Vec<Vec<u16>> = (0..2u16).map(|m| vec![m + 1; g.module_pixels()]).collect();
        let mut out = vec![0u16; g.height() * g.width()];
        g.assemble_bytes(2, |m| as_bytes(&frames[m as usize]), as_bytes_mut(&mut out));
        assert!(out[..256 * 1024].iter().all(|&w| w == 1) && out[(256 + 36) * 1024..].iter().all(|&w| w == 2));
        assert!(out[256 * 1024..(256 + 36) * 1024].iter().all(|&w| w == GAP_WORD));
    }

    #[test]
    fn module_spans_map_to_image_runs() {
        let g = Geometry::new(2, 2, 8, 36).unwrap();
        let mut runs = Vec::new();
        g.module_span(1, 1020, 1030, |at, len| runs.push((at, len)));
        assert_eq!(runs, vec![(1032 + 1020, 4), (g.width() + 1032, 6)]);
    }

    #[test]
    fn assembly_places_every_module_and_marks_gaps() {
        let g = Geometry::new(4, 2, 8, 36).unwrap();
        let frames: Vec<Vec<u16>> = (0..4u16).map(|m| (0..MODULE_PIXELS).map(|i| (m * 1000) + (i % 997) as u16).collect()).collect();
        let mut out = vec![0u16; g.height() * g.width()];
        g.assemble_bytes(2, |m| as_bytes(&frames[m as usize]), as_bytes_mut(&mut out));
        let mask = g.gap_mask();
        for m in 0..4u16 {
            let (r0, c0) = g.origin(m);
            for r in [0, 17, 511] {
                for c in [0, 500, 1023] {
                    assert_eq!(out[(r0 + r) * g.width() + c0 + c], frames[m as usize][r * 1024 + c]);
                    assert_eq!(mask[(r0 + r) * g.width() + c0 + c], 0);
                }
            }
        }
        let gaps = mask.iter().filter(|&&b| b == MASK_GAP).count();
        assert_eq!(gaps, g.height() * g.width() - 4 * MODULE_PIXELS);
        assert_eq!(out.iter().zip(&mask).filter(|(&w, &b)| b == MASK_GAP && w != GAP_WORD).count(), 0);
    }
}
