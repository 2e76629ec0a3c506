//! A module's image from its raw port images, as a description says: the receiver leaves
//! the port images one after the other in the slot (port `r * cols + c` at `(r, c)` of the
//! module's port grid, packed at the bit depth); [`ModuleLayout::decode`] unpacks 4- and
//! 12-bit pixels, puts each port block in its place, flips the rows of flipped port rows,
//! and, with gap pixels, spreads the chips apart and halves the counts of chip-edge pixels
//! into their gap neighbours.

use crate::description::{Chips, Description, NibbleOrder};
use crate::geometry::MASK_GAP;

/// How one detector's module frames become module images.
#[derive(Clone, Debug, PartialEq)]
pub struct ModuleLayout {
    bits: u32,
    nibbles: NibbleOrder,
    port_rows: usize,
    port_cols: usize,
    port_w: usize,
    port_h: usize,
    flip: Vec<bool>,
    /// Chip size and gaps, when gap pixels are on.
    chips: Option<(usize, usize, Chips)>,
    width: usize,
    height: usize,
}

impl ModuleLayout {
    /// The layout of `d`'s modules at `bits` per pixel, with chip gap pixels if `gaps`.
    pub fn new(d: &Description, bits: u32, gaps: bool) -> Result<ModuleLayout, String> {
        if !d.pixel.bit_depths.contains(&bits) {
            return Err(format!("{} sends {:?}-bit pixels, not {bits}", d.name, d.pixel.bit_depths));
        }
        let chips = match (&d.chips, gaps) {
            (Some(c), true) => Some((d.module.width / c.cols, d.module.height / c.rows, c.clone())),
            (None, true) => return Err(format!("{} has no chips to put gap pixels between", d.name)),
            (_, false) => None,
        };
        if chips.as_ref().is_some_and(|(cw, _, _)| bits % 8 != 0 && cw % 2 != 0) {
            return Err("4- and 12-bit pixels come in pairs: chips need an even width".into());
        }
        // a port row is unpacked in runs that stay inside one chip
        if chips.as_ref().is_some_and(|(cw, _, _)| d.ports.width % cw != 0 && cw % d.ports.width != 0) {
            return Err(format!("ports {} pixels wide cannot be cut at chips of {} columns", d.ports.width, d.module.width / d.chips.as_ref().map_or(1, |c| c.cols)));
        }
        let (width, height) = match &chips {
            Some((_, _, c)) => (d.module.width + (c.cols - 1) * c.gap_x, d.module.height + (c.rows - 1) * c.gap_y),
            None => (d.module.width, d.module.height),
        };
        let p = &d.ports;
        let flip = (0..p.rows).map(|r| d.flipped(r)).collect();
        Ok(ModuleLayout { bits, nibbles: d.pixel.nibble_order, port_rows: p.rows, port_cols: p.cols, port_w: p.width, port_h: p.height, flip, chips, width, height })
    }

    /// Bytes of one pixel of the module image: 1 for 4 and 8 bits, 2 for 12 and 16, 4 for 32.
    pub fn pixel_bytes(&self) -> usize {
        match self.bits {
            0..=8 => 1,
            9..=16 => 2,
            _ => 4,
        }
    }

    /// The bit depth of the pixels as sent.
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// Ports per module, as a grid of (rows, columns).
    pub fn port_grid(&self) -> (usize, usize) {
        (self.port_rows, self.port_cols)
    }

    /// Pixel rows of a port image.
    pub fn port_height(&self) -> usize {
        self.port_h
    }

    /// Where row `i` of port `p` lands in the module (without gap pixels): its module row
    /// (flipped port rows turned) and its first column.
    pub fn port_row_at(&self, p: usize, i: usize) -> (usize, usize) {
        let (pr, pc) = (p / self.port_cols, p % self.port_cols);
        (self.module_row(pr, i), pc * self.port_w)
    }

    /// Bytes of one port image as sent (packed).
    pub fn port_bytes(&self) -> usize {
        self.port_w * self.port_h * self.bits as usize / 8
    }

    /// Bytes of a module frame as the receiver holds it: every port image.
    pub fn raw_bytes(&self) -> usize {
        self.port_rows * self.port_cols * self.port_bytes()
    }

    /// Module image width and height in pixels (gap pixels included).
    pub fn width(&self) -> usize {
        self.width
    }

    pub fn height(&self) -> usize {
        self.height
    }

    /// Where module pixel (x, y) (without gaps) lands in the module image.
    fn at(&self, x: usize, y: usize) -> (usize, usize) {
        match &self.chips {
            Some((cw, ch, c)) => (x + x / cw * c.gap_x, y + y / ch * c.gap_y),
            None => (x, y),
        }
    }

    /// The module image row that row `i` of port row `pr` lands on (before gaps).
    fn module_row(&self, pr: usize, i: usize) -> usize {
        pr * self.port_h + if self.flip[pr] { self.port_h - 1 - i } else { i }
    }

    /// Unpacks the raw module frame `raw` ([`ModuleLayout::raw_bytes`]) into the module
    /// image `out` (width x height pixels of [`ModuleLayout::pixel_bytes`], little-endian).
    /// Each pixel of `out` is written: gap pixels get their share of the edge counts, or 0.
    pub fn decode(&self, raw: &[u8], out: &mut [u8]) {
        let pb = self.pixel_bytes();
        assert_eq!(raw.len(), self.raw_bytes(), "a raw module frame");
        assert_eq!(out.len(), self.width * self.height * pb, "a module image");
        let row_bytes = self.port_w * self.bits as usize / 8;
        // runs of a port row that stay inside one chip (the whole row without gap pixels)
        let run = self.chips.as_ref().map_or(self.port_w, |(cw, _, _)| *cw.min(&self.port_w));
        if self.chips.is_some() {
            out.fill(0);
        }
        for (p, port) in raw.chunks_exact(self.port_bytes()).enumerate() {
            let (pr, pc) = (p / self.port_cols, p % self.port_cols);
            for (i, src) in port.chunks_exact(row_bytes).enumerate() {
                let y = self.module_row(pr, i);
                for x0 in (0..self.port_w).step_by(run) {
                    let (ox, oy) = self.at(pc * self.port_w + x0, y);
                    let at = (oy * self.width + ox) * pb;
                    let s = x0 * self.bits as usize / 8;
                    self.unpack(&src[s..s + run * self.bits as usize / 8], &mut out[at..at + run * pb]);
                }
            }
        }
        if let Some((cw, ch, c)) = &self.chips {
            self.share_edges(out, *cw, *ch, c);
        }
    }

    /// Unpacks packed pixels `src` into `dst` (whole pixels of the output size).
    fn unpack(&self, src: &[u8], dst: &mut [u8]) {
        match self.bits {
            4 => {
                let hi_first = self.nibbles == NibbleOrder::HighFirst;
                for (b, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
                    let (lo, hi) = (b & 0x0f, b >> 4);
                    (d[0], d[1]) = if hi_first { (hi, lo) } else { (lo, hi) };
                }
            }
            12 => {
                for (t, d) in src.chunks_exact(3).zip(dst.chunks_exact_mut(4)) {
                    let p0 = t[0] as u16 | ((t[1] & 0x0f) as u16) << 8;
                    let p1 = (t[1] >> 4) as u16 | (t[2] as u16) << 4;
                    d[..2].copy_from_slice(&p0.to_le_bytes());
                    d[2..].copy_from_slice(&p1.to_le_bytes());
                }
            }
            _ => dst.copy_from_slice(src),
        }
    }

    /// Appends pixels packed at the bit depth as the detector sends them: the inverse of
    /// unpacking (an emulated detector's packets).
    pub fn pack(&self, mut px: impl Iterator<Item = u32>, out: &mut Vec<u8>) {
        match self.bits {
            4 => {
                while let (Some(a), Some(b)) = (px.next(), px.next()) {
                    let (first, second) = if self.nibbles == NibbleOrder::HighFirst { (a << 4, b) } else { (a, b << 4) };
                    out.push((first | second) as u8);
                }
            }
            12 => {
                while let (Some(a), Some(b)) = (px.next(), px.next()) {
                    out.extend_from_slice(&[a as u8, ((a >> 8) | (b << 4)) as u8, (b >> 4) as u8]);
                }
            }
            b => px.for_each(|v| out.extend_from_slice(&v.to_le_bytes()[..b as usize / 8])),
        }
    }

    /// Halves each chip-edge pixel's count with its gap neighbour: columns first, then rows,
    /// so that the corner gap pixels get a quarter (integer halving each time).
    fn share_edges(&self, out: &mut [u8], cw: usize, ch: usize, c: &Chips) {
        let (pb, w) = (self.pixel_bytes(), self.width);
        let mut halve = |from: usize, to: usize| {
            let v = get(out, from, pb) / 2;
            set(out, from, pb, v);
            set(out, to, pb, v);
        };
        if c.gap_x > 0 {
            for y in (0..self.height).filter(|y| y % (ch + c.gap_y) < ch) {
                for k in 1..c.cols {
                    let left = y * w + k * cw + (k - 1) * c.gap_x - 1;
                    let right = left + c.gap_x + 1;
                    halve(left, left + 1);
                    halve(right, right - 1);
                }
            }
        }
        if c.gap_y > 0 {
            for k in 1..c.rows {
                let top = k * ch + (k - 1) * c.gap_y - 1;
                let bottom = top + c.gap_y + 1;
                for x in 0..w {
                    halve(top * w + x, (top + 1) * w + x);
                    halve(bottom * w + x, (bottom - 1) * w + x);
                }
            }
        }
    }

    /// Pixels of a port row.
    pub fn port_width(&self) -> usize {
        self.port_w
    }

    /// For each port-wide segment of the module image (without gap pixels; row-major:
    /// image row `y`, then port column), the index of the raw module frame's pixel where
    /// the port row that fills it starts: port blocks in place, flipped port rows turned.
    /// Within a segment, a descrambled detector's readout order says which pixel is which.
    pub fn segment_sources(&self) -> Vec<u32> {
        let mut src = vec![0u32; self.port_rows * self.port_h * self.port_cols];
        for p in 0..self.port_rows * self.port_cols {
            for i in 0..self.port_h {
                let (y, x0) = self.port_row_at(p, i);
                src[y * self.port_cols + x0 / self.port_w] = ((p * self.port_h + i) * self.port_w) as u32;
            }
        }
        src
    }

    /// NXmx pixel_mask bits of the module image: [`MASK_GAP`] on the gap pixels between
    /// chips; `None` without gap pixels.
    pub fn gap_mask(&self) -> Option<Vec<u32>> {
        let (cw, ch, c) = self.chips.as_ref()?;
        let gap = |v: usize, size: usize, g: usize| v % (size + g) >= size;
        let (w, h) = (self.width, self.height);
        Some((0..h).flat_map(|y| (0..w).map(move |x| if gap(x, *cw, c.gap_x) || gap(y, *ch, c.gap_y) { MASK_GAP } else { 0 })).collect())
    }

    /// Calls `f(first, len)` for each run of module-image pixels that raw bytes
    /// `start..end` of a module frame feed (gap pixels inside a run included): with
    /// [`Span::Pixels`] exactly the pixels any bit of them belongs to, with [`Span::Rows`] the
    /// whole port-image rows they touch (a descrambled readout permutes words within a row).
    pub fn raw_span(&self, start: usize, end: usize, span: Span, mut f: impl FnMut(usize, usize)) {
        let (pb, bits, w) = (self.port_bytes(), self.bits as usize, self.port_w);
        let mut at = start;
        while at < end {
            let (p, off) = (at / pb, at % pb);
            let (pr, pc) = (p / self.port_cols, p % self.port_cols);
            let stop = (end - p * pb).min(pb);
            // the port's pixels first..last, in its row-major order
            let (first, last) = match span {
                Span::Pixels => (off * 8 / bits, (stop * 8).div_ceil(bits)),
                Span::Rows => {
                    let rb = w * bits / 8;
                    (off / rb * w, stop.div_ceil(rb) * w)
                }
            };
            let mut i = first;
            while i < last {
                let (row, col) = (i / w, i % w);
                let n = (w - col).min(last - i);
                let y = self.module_row(pr, row);
                let (x0, oy) = self.at(pc * w + col, y);
                let (x1, _) = self.at(pc * w + col + n - 1, y);
                f(oy * self.width + x0, x1 + 1 - x0);
                i += n;
            }
            at = (p + 1) * pb;
        }
    }
}

/// How finely [`ModuleLayout::raw_span`] maps raw bytes to pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    Pixels,
    Rows,
}

fn get(b: &[u8], i: usize, pb: usize) -> u32 {
    let mut w = [0u8; 4];
    w[..pb].copy_from_slice(&b[i * pb..(i + 1) * pb]);
    u32::from_le_bytes(w)
}

fn set(b: &mut [u8], i: usize, pb: usize, v: u32) {
    b[i * pb..(i + 1) * pb].copy_from_slice(&v.to_le_bytes()[..pb]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eiger() -> Description {
        Description::load("eiger").unwrap()
    }

    /// Port images whose pixel at port row i, column j of port p reads `v(p, i, j)`, packed.
    fn packed(l: &ModuleLayout, v: impl Fn(usize, usize, usize) -> u32) -> Vec<u8> {
        let mut raw = Vec::new();
        for p in 0..4 {
            let px: Vec<u32> = (0..l.port_h).flat_map(|i| (0..l.port_w).map(move |j| (i, j))).map(|(i, j)| v(p, i, j) & ((1u64 << l.bits) - 1) as u32).collect();
            match l.bits {
                4 => raw.extend(px.chunks(2).map(|q| (q[0] << 4 | q[1]) as u8)),
                12 => raw.extend(px.chunks(2).flat_map(|q| [q[0] as u8, (q[0] >> 8 | (q[1] & 0xf) << 4) as u8, (q[1] >> 4) as u8])),
                b => raw.extend(px.iter().flat_map(|x| x.to_le_bytes()[..b as usize / 8].to_vec())),
            }
        }
        raw
    }

    #[test]
    fn every_bit_depth_places_and_flips_the_ports() {
        let d = eiger();
        for bits in [4, 8, 12, 16, 32] {
            let l = ModuleLayout::new(&d, bits, false).unwrap();
            let v = |p: usize, i: usize, j: usize| (p * 7 + i * 3 + j) as u32;
            let raw = packed(&l, v);
            assert_eq!(raw.len(), l.raw_bytes());
            let mut out = vec![0u8; 1024 * 512 * l.pixel_bytes()];
            l.decode(&raw, &mut out);
            let mask = ((1u64 << bits) - 1) as u32;
            for (x, y) in [(0, 0), (511, 255), (512, 3), (1023, 255), (5, 256), (700, 511), (1023, 300)] {
                let (pr, pc) = (y / 256, x / 512);
                let i = if pr == 1 { 255 - (y - 256) } else { y };
                assert_eq!(get(&out, y * 1024 + x, l.pixel_bytes()), v(pr * 2 + pc, i, x % 512) & mask, "{bits} bits at ({x}, {y})");
            }
        }
    }

    #[test]
    fn gap_pixels_share_edge_counts() {
        let l = ModuleLayout::new(&eiger(), 16, true).unwrap();
        assert_eq!((l.width(), l.height()), (1030, 514));
        let raw = packed(&l, |_, _, _| 100);
        let mut out = vec![0u8; 1030 * 514 * 2];
        l.decode(&raw, &mut out);
        let px = |x: usize, y: usize| get(&out, y * 1030 + x, 2);
        assert_eq!((px(0, 0), px(254, 0), px(255, 0), px(256, 0), px(257, 0), px(258, 0)), (100, 100, 50, 50, 50, 50));
        assert_eq!((px(10, 255), px(10, 256), px(10, 257), px(10, 258)), (50, 50, 50, 50));
        assert_eq!((px(255, 255), px(256, 256), px(257, 257)), (25, 25, 25));
        assert_eq!((px(1029, 513), px(771, 100)), (100, 50));
        let mask = l.gap_mask().unwrap();
        assert_eq!(mask.iter().filter(|&&m| m == MASK_GAP).count(), 1030 * 514 - 1024 * 512);
        assert_eq!((mask[256], mask[255], mask[257 * 1030 + 3]), (MASK_GAP, 0, MASK_GAP));
    }

    #[test]
    fn raw_spans_cover_the_pixels_or_rows_a_packet_fed() {
        let l = ModuleLayout::new(&eiger(), 16, false).unwrap();
        let mut runs = Vec::new();
        // the last port (bottom, right): its first 1024 bytes are its row 0, module row 511
        l.raw_span(3 * l.port_bytes(), 3 * l.port_bytes() + 1024, Span::Pixels, |a, n| runs.push((a, n)));
        assert_eq!(runs, [(511 * 1024 + 512, 512)]);
        runs.clear();
        l.raw_span(1000, 1100, Span::Rows, |a, n| runs.push((a, n)));
        assert_eq!(runs, [(0, 512), (1024, 512)]);
        runs.clear();
        // bytes 1000..1100 are pixels 500..550: the end of row 0 and the start of row 1
        l.raw_span(1000, 1100, Span::Pixels, |a, n| runs.push((a, n)));
        assert_eq!(runs, [(500, 12), (1024, 38)]);
        // 12 bits: byte 1000 holds part of pixel 666 (bits 7992..8004)
        let l12 = ModuleLayout::new(&eiger(), 12, true).unwrap();
        runs.clear();
        l12.raw_span(1000, 1003, Span::Pixels, |a, n| runs.push((a, n)));
        // and 3 bytes feed pixels 666..669: row 1, columns 154..157 (before the first chip gap)
        assert_eq!(runs, [(1030 + 154, 3)]);
    }
}
