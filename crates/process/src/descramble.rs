//! The descramble stage of an integrating detector described as data (docs/detectors.md):
//! a raw module frame of 16-bit words, in readout order, becomes one plane per bit field of
//! the pixel word (gain, coarse, fine, ...) in image order, with the reset frame's value of
//! the fields that say so subtracted. One pass: each raw word (and its reset word) is read
//! once. The image is cut into segments of one port row each; a segment's words are
//! gathered from where its port row starts by the readout order (a table of one port row,
//! which stays in L1), then split into the planes.

use rdaq_detector::description::{is_permutation, Description, Field, Order};
use rdaq_detector::ModuleLayout;

/// The widest port row gathered in one step (wider ones are gathered in pieces).
const STRIP: usize = 2048;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bits {
    shift: u32,
    mask: u16,
    subtract: bool,
}

/// One detector's descramble stage: where each image segment's port row starts, the readout
/// position of each column, and the fields each word is split into.
#[derive(Clone, Debug)]
pub struct Descrambler {
    /// Per segment of `positions.len()` image pixels, the raw word its port row starts at
    /// (distinct multiples of the segment width, below the frame's words).
    starts: Vec<u32>,
    /// Per column of a segment, its readout position (a permutation of the columns).
    positions: Vec<u32>,
    fields: Vec<Bits>,
    names: Vec<String>,
    reset: bool,
    /// Interleaved ADCs in blocks of 8 x 8 (see [`Descrambler::with_interleave`]): the
    /// number of ADCs, when the gather is done as 8 x 8 transposes.
    interleave: Option<usize>,
}

impl Descrambler {
    /// `starts[s]`: the raw word where image segment `s`'s port row starts; `positions[c]`:
    /// the readout position of column `c` of a segment; `fields`: one output plane each.
    pub fn new(starts: Vec<u32>, positions: Vec<u32>, fields: &[Field], reset: bool) -> Result<Descrambler, String> {
        let w = positions.len();
        if w == 0 || !is_permutation(positions.iter().map(|&p| p as usize), w) {
            return Err("the readout order is not a permutation of a port row's columns".into());
        }
        let segments: Vec<u32> = starts.iter().map(|&s| s / w as u32).collect();
        if starts.iter().any(|&s| s as usize % w != 0) || !is_permutation(segments.iter().map(|&s| s as usize), starts.len()) {
            return Err("the port rows do not tile the frame once each".into());
        }
        if fields.is_empty() || fields.iter().any(|f| f.bits == 0 || f.bits > 15 || f.shift + f.bits > 16) {
            return Err("fields must lie inside the 16-bit word, 1 to 15 bits each".into());
        }
        let bits = fields.iter().map(|f| Bits { shift: f.shift, mask: ((1u32 << f.bits) - 1) as u16, subtract: f.subtract_reset && reset }).collect();
        Ok(Descrambler { starts, positions, fields: bits, names: fields.iter().map(|f| f.name.clone()).collect(), reset, interleave: None })
    }

    /// Gathers by 8 x 8 transposes of 16-bit words where the readout order is `adcs`
    /// interleaved ADCs (`Order::Interleave`), both `adcs` and the columns per ADC multiples
    /// of 8 and a port row at most one gather step: the same result as the table, several
    /// times faster. Unchanged otherwise, or when the positions are not that order.
    pub fn with_interleave(mut self, adcs: usize) -> Descrambler {
        let w = self.positions.len();
        let fits = adcs > 0 && adcs % 8 == 0 && w % adcs == 0 && (w / adcs) % 8 == 0 && w <= STRIP;
        let same = fits && self.positions.iter().enumerate().all(|(c, &k)| k as usize == (c % (w / adcs)) * adcs + c / (w / adcs));
        self.interleave = (same && cfg!(target_arch = "x86_64")).then_some(adcs);
        self
    }

    /// The stage of a described detector's modules (`None` for one not descrambled).
    pub fn for_description(d: &Description) -> Result<Option<Descrambler>, String> {
        let Some(readout) = d.descrambled() else { return Ok(None) };
        let layout = ModuleLayout::new(d, 16, false)?;
        let s = Descrambler::new(layout.segment_sources(), readout.positions(layout.port_width()), &d.pixel.fields, readout.reset_frame)?;
        Ok(Some(match readout.order {
            Order::Interleave => s.with_interleave(readout.adcs),
            _ => s,
        }))
    }

    /// Pixels of a frame.
    pub fn pixels(&self) -> usize {
        self.starts.len() * self.positions.len()
    }

    /// Output planes: one per field, in the description's order.
    pub fn planes(&self) -> usize {
        self.fields.len()
    }

    pub fn field_names(&self) -> &[String] {
        &self.names
    }

    /// Whether each data frame needs its reset frame.
    pub fn needs_reset(&self) -> bool {
        self.reset
    }

    /// Descrambles `data` (with `reset`, when the detector sends reset frames) into `out`:
    /// plane `k` (`out[k * pixels..][..pixels]`) holds field `k` of each pixel's word, in
    /// image order, minus the reset word's field where the field subtracts the reset.
    ///
    /// # Panics
    /// When a buffer's length is not the frame's, or a reset frame is missing or extra.
    pub fn run(&self, data: &[u16], reset: Option<&[u16]>, out: &mut [i16]) {
        let n = self.pixels();
        assert_eq!(data.len(), n, "a raw frame of {n} words");
        assert_eq!(out.len(), n * self.fields.len(), "{} planes of {n} pixels", self.fields.len());
        assert_eq!(reset.is_some(), self.reset, "a reset frame exactly when the detector sends them");
        if let Some(r) = reset {
            assert_eq!(r.len(), n, "a reset frame of {n} words");
        }
        let w = self.positions.len();
        let (mut d, mut r) = ([0u16; STRIP], [0u16; STRIP]);
        for (s, &start) in self.starts.iter().enumerate() {
            for c0 in (0..w).step_by(STRIP) {
                let len = STRIP.min(w - c0);
                let pos = &self.positions[c0..c0 + len];
                self.gather(data, start, pos, &mut d[..len]);
                if let Some(reset) = reset {
                    self.gather(reset, start, pos, &mut r[..len]);
                }
                let at = s * w + c0;
                for (k, f) in self.fields.iter().enumerate() {
                    split(f, &d[..len], f.subtract.then_some(&r[..len]), &mut out[k * n + at..k * n + at + len]);
                }
            }
        }
    }
}

impl Descrambler {
    /// `out[j] = words[start + pos[j]]`: by transposes for interleaved ADCs, else by the table.
    fn gather(&self, words: &[u16], start: u32, pos: &[u32], out: &mut [u16]) {
        match self.interleave {
            #[cfg(target_arch = "x86_64")]
            Some(adcs) => transposed(words, start as usize, adcs, out),
            _ => gather(words, start, pos, out),
        }
    }
}

/// `out[a * per + j] = words[start + j * adcs + a]` for a whole port row of `adcs` ADCs
/// with `per = out.len() / adcs` columns each, in 8 x 8 blocks of 16-bit words.
#[cfg(target_arch = "x86_64")]
fn transposed(words: &[u16], start: usize, adcs: usize, out: &mut [u16]) {
    use std::arch::x86_64::*;
    let per = out.len() / adcs;
    assert!(start + out.len() <= words.len() && adcs % 8 == 0 && per % 8 == 0 && per * adcs == out.len());
    for a0 in (0..adcs).step_by(8) {
        for j0 in (0..per).step_by(8) {
            // SAFETY: SSE2 is part of x86_64. Row j0 + i reads words
            // start + (j0 + i) * adcs + a0 .. +8, below start + per * adcs <= words.len()
            // (asserted above, as j0 + i < per and a0 + 8 <= adcs); column a0 + i writes
            // out[(a0 + i) * per + j0 .. +8], below adcs * per = out.len(). Unaligned loads
            // and stores take any address.
            unsafe {
                let src = words.as_ptr().add(start + j0 * adcs + a0);
                let r = |i: usize| _mm_loadu_si128(src.add(i * adcs).cast());
                let (t0, t1) = (_mm_unpacklo_epi16(r(0), r(1)), _mm_unpackhi_epi16(r(0), r(1)));
                let (t2, t3) = (_mm_unpacklo_epi16(r(2), r(3)), _mm_unpackhi_epi16(r(2), r(3)));
                let (t4, t5) = (_mm_unpacklo_epi16(r(4), r(5)), _mm_unpackhi_epi16(r(4), r(5)));
                let (t6, t7) = (_mm_unpacklo_epi16(r(6), r(7)), _mm_unpackhi_epi16(r(6), r(7)));
                let (u0, u1) = (_mm_unpacklo_epi32(t0, t2), _mm_unpackhi_epi32(t0, t2));
                let (u2, u3) = (_mm_unpacklo_epi32(t1, t3), _mm_unpackhi_epi32(t1, t3));
                let (u4, u5) = (_mm_unpacklo_epi32(t4, t6), _mm_unpackhi_epi32(t4, t6));
                let (u6, u7) = (_mm_unpacklo_epi32(t5, t7), _mm_unpackhi_epi32(t5, t7));
                let cols = [
                    _mm_unpacklo_epi64(u0, u4),
                    _mm_unpackhi_epi64(u0, u4),
                    _mm_unpacklo_epi64(u1, u5),
                    _mm_unpackhi_epi64(u1, u5),
                    _mm_unpacklo_epi64(u2, u6),
                    _mm_unpackhi_epi64(u2, u6),
                    _mm_unpacklo_epi64(u3, u7),
                    _mm_unpackhi_epi64(u3, u7),
                ];
                let dst = out.as_mut_ptr().add(a0 * per + j0);
                for (i, c) in cols.into_iter().enumerate() {
                    _mm_storeu_si128(dst.add(i * per).cast(), c);
                }
            }
        }
    }
}

/// `out[j] = words[start + pos[j]]`.
fn gather(words: &[u16], start: u32, pos: &[u32], out: &mut [u16]) {
    for (o, &p) in out.iter_mut().zip(pos) {
        // SAFETY: `Descrambler::new` checked that `start` is a multiple of the segment width
        // below `pixels()` and that every position is below the segment width, so the index
        // is below `pixels()`; `run` checked that `words` (data or reset) has that many.
        *o = unsafe { *words.get_unchecked(start as usize + p as usize) };
    }
}

/// One field of each word, minus the reset word's field when given (vectorizes).
fn split(f: &Bits, d: &[u16], r: Option<&[u16]>, out: &mut [i16]) {
    let field = |w: u16| ((w >> f.shift) & f.mask) as i16;
    match r {
        Some(r) => out.iter_mut().zip(d.iter().zip(r)).for_each(|(o, (&a, &b))| *o = field(a) - field(b)),
        None => out.iter_mut().zip(d).for_each(|(o, &a)| *o = field(a)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Description {
        Description::load("percival-like").unwrap()
    }

    /// A naive descramble, pixel by pixel from the description's own words.
    fn naive(d: &Description, data: &[u16], reset: &[u16]) -> Vec<i16> {
        let r = d.readout.clone().unwrap();
        let (pw, ph) = (d.ports.width, d.ports.height);
        let mw = d.module.width;
        let n = mw * d.module.height;
        let mut out = vec![0i16; n * d.pixel.fields.len()];
        for p in 0..d.ports.cols {
            for i in 0..ph {
                for k in 0..pw {
                    let raw = (p * ph + i) * pw + k;
                    let img = i * mw + p * pw + r.column(k, pw);
                    for (j, f) in d.pixel.fields.iter().enumerate() {
                        let v = |w: u16| ((w >> f.shift) & ((1 << f.bits) - 1)) as i16;
                        out[j * n + img] = v(data[raw]) - if f.subtract_reset { v(reset[raw]) } else { 0 };
                    }
                }
            }
        }
        out
    }

    #[test]
    fn descrambles_as_the_naive_reading_of_the_description() {
        let d = example();
        let s = Descrambler::for_description(&d).unwrap().unwrap();
        assert_eq!((s.pixels(), s.planes(), s.needs_reset()), (1024 * 512, 3, true));
        let mut x = 12345u32;
        let mut word = || {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            (x >> 8) as u16
        };
        let data: Vec<u16> = (0..s.pixels()).map(|_| word()).collect();
        let reset: Vec<u16> = (0..s.pixels()).map(|_| word()).collect();
        let mut out = vec![0i16; s.pixels() * 3];
        s.run(&data, Some(&reset), &mut out);
        assert_eq!(out, naive(&d, &data, &reset));
        // the gain plane is never reset-subtracted
        assert!(out[..s.pixels()].iter().all(|&g| (0..4).contains(&g)));
        // the transposes (x86_64) and the table give the same planes
        assert_eq!(s.interleave.is_some(), cfg!(target_arch = "x86_64"));
        let table = Descrambler { interleave: None, ..s.clone() };
        let mut by_table = vec![0i16; s.pixels() * 3];
        table.run(&data, Some(&reset), &mut by_table);
        assert_eq!(by_table, out);
        // any order a map gives
        let map: Vec<String> = (0..512).map(|c| ((c * 37) % 512).to_string()).collect();
        let text = rdaq_detector::description::BUILTIN[2].1.replace("order = \"interleave\"", &format!("order = \"map\"\nmap = [{}]", map.join(", ")));
        let m = Description::parse(&text, "map.toml").unwrap();
        let sm = Descrambler::for_description(&m).unwrap().unwrap();
        assert!(sm.interleave.is_none());
        sm.run(&data, Some(&reset), &mut out);
        assert_eq!(out, naive(&m, &data, &reset));
    }

    #[test]
    fn refuses_what_does_not_tile_the_frame() {
        let f = [Field { name: "a".into(), shift: 0, bits: 4, subtract_reset: false }];
        assert!(Descrambler::new(vec![0, 2], vec![0, 0], &f, false).is_err(), "a column twice");
        assert!(Descrambler::new(vec![0, 2], vec![0, 2], &f, false).is_err(), "a position past the row");
        assert!(Descrambler::new(vec![2, 2], vec![1, 0], &f, false).is_err(), "a port row twice");
        assert!(Descrambler::new(vec![1, 3], vec![1, 0], &f, false).is_err(), "a row starting mid-row");
        assert!(Descrambler::new(vec![0, 4], vec![1, 0], &f, false).is_err(), "a row past the frame");
        let s = Descrambler::new(vec![2, 0], vec![1, 0], &f, false).unwrap();
        let mut out = [0i16; 4];
        s.run(&[1, 2, 3, 4], None, &mut out);
        assert_eq!(out, [4, 3, 2, 1]);
    }
}
