//! The descramble stage of an integrating detector described as data (docs/detectors.md):
//! a raw module frame of 16-bit words, in readout order, becomes one plane per bit field of
//! the pixel word (gain, coarse, fine, ...) in image order, with the reset frame's value of
//! the fields that say so subtracted. One pass: each raw word (and its reset word) is read
//! once, gathered through a table made from the description.

use rdaq_detector::description::{Description, Field};
use rdaq_detector::ModuleLayout;

/// Pixels gathered per step: their words stay in L1 while every field's plane is written.
const STRIP: usize = 2048;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bits {
    shift: u32,
    mask: u16,
    subtract: bool,
}

/// One detector's descramble stage: which raw word each image pixel comes from, and the
/// fields each word is split into.
#[derive(Clone, Debug)]
pub struct Descrambler {
    /// Per image pixel, the index of its raw word (every entry below `src.len()`).
    src: Vec<u32>,
    fields: Vec<Bits>,
    names: Vec<String>,
    reset: bool,
}

impl Descrambler {
    /// `src[i]`: the raw word of image pixel `i` (a permutation of `0..src.len()`);
    /// `fields`: the bit fields, one output plane each.
    pub fn new(src: Vec<u32>, fields: &[Field], reset: bool) -> Result<Descrambler, String> {
        let mut seen = vec![false; src.len()];
        if !src.iter().all(|&s| (s as usize) < seen.len() && !std::mem::replace(&mut seen[s as usize], true)) {
            return Err("the readout order is not a permutation of the frame's pixels".into());
        }
        if fields.is_empty() || fields.iter().any(|f| f.bits == 0 || f.bits > 15 || f.shift + f.bits > 16) {
            return Err("fields must lie inside the 16-bit word, 1 to 15 bits each".into());
        }
        let bits = fields.iter().map(|f| Bits { shift: f.shift, mask: ((1u32 << f.bits) - 1) as u16, subtract: f.subtract_reset && reset }).collect();
        Ok(Descrambler { src, fields: bits, names: fields.iter().map(|f| f.name.clone()).collect(), reset })
    }

    /// The stage of a described detector's modules (`None` for one not descrambled).
    pub fn for_description(d: &Description) -> Result<Option<Descrambler>, String> {
        let Some(readout) = d.descrambled() else { return Ok(None) };
        let layout = ModuleLayout::new(d, 16, false)?;
        Descrambler::new(layout.source_index(&readout), &d.pixel.fields, readout.reset_frame).map(Some)
    }

    /// Pixels of a frame.
    pub fn pixels(&self) -> usize {
        self.src.len()
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
        let n = self.src.len();
        assert_eq!(data.len(), n, "a raw frame of {n} words");
        assert_eq!(out.len(), n * self.fields.len(), "{} planes of {n} pixels", self.fields.len());
        assert_eq!(reset.is_some(), self.reset, "a reset frame exactly when the detector sends them");
        if let Some(r) = reset {
            assert_eq!(r.len(), n, "a reset frame of {n} words");
        }
        let (mut d, mut r) = ([0u16; STRIP], [0u16; STRIP]);
        for at in (0..n).step_by(STRIP) {
            let len = STRIP.min(n - at);
            let idx = &self.src[at..at + len];
            gather(data, idx, &mut d[..len]);
            if let Some(reset) = reset {
                gather(reset, idx, &mut r[..len]);
            }
            for (k, f) in self.fields.iter().enumerate() {
                let plane = &mut out[k * n + at..k * n + at + len];
                split(f, &d[..len], f.subtract.then_some(&r[..len]), plane);
            }
        }
    }
}

/// `out[j] = words[idx[j]]`.
fn gather(words: &[u16], idx: &[u32], out: &mut [u16]) {
    for (o, &i) in out.iter_mut().zip(idx) {
        // SAFETY: `Descrambler::new` checked that every index is below `src.len()`, and
        // `run` checked that `words` (data or reset) has exactly that many words.
        *o = unsafe { *words.get_unchecked(i as usize) };
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
    }

    #[test]
    fn refuses_what_is_not_a_permutation() {
        let f = [Field { name: "a".into(), shift: 0, bits: 4, subtract_reset: false }];
        assert!(Descrambler::new(vec![0, 1, 1], &f, false).is_err());
        assert!(Descrambler::new(vec![0, 3, 1], &f, false).is_err());
        assert!(Descrambler::new(vec![2, 0, 1], &f, false).is_ok());
    }
}
