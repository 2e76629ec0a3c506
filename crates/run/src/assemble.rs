//! A finished frame's slot as the detector image: JUNGFRAU module frames are 16-bit module
//! images already and are only put in place; a detector described by its layout (EIGER) has
//! each module's port images decoded first ([`ModuleLayout::decode`]); an integrating
//! detector described as data goes through the descramble stage ([`Descrambler`]), its
//! fields' planes stacked in each module's place.

use rdaq_detector::geometry::GAP_WORD;
use rdaq_detector::{as_bytes, as_bytes_mut, as_words, Geometry, ModuleLayout, Span};
use rdaq_process::bitshuffle::Compressor;
use rdaq_process::descramble::Descrambler;
use rdaq_receiver::{FrameReady, Receiver};

/// How a described detector's module frames become module images.
#[derive(Clone, Debug)]
pub enum Decoder {
    /// Port images unpacked and put in place (counting detectors).
    Layout(ModuleLayout),
    /// 16-bit words descrambled into the planes of their fields; the layout (16 bits, no
    /// gap pixels) says where a raw byte's pixels are.
    Descramble(ModuleLayout, Descrambler),
}

impl Decoder {
    fn layout(&self) -> &ModuleLayout {
        match self {
            Decoder::Layout(l) | Decoder::Descramble(l, _) => l,
        }
    }

    /// Bytes of one output pixel.
    fn pixel_bytes(&self) -> usize {
        match self {
            Decoder::Layout(l) => l.pixel_bytes(),
            Decoder::Descramble(..) => 2,
        }
    }

    /// Output planes per module (one image, or one per field).
    fn planes(&self) -> usize {
        match self {
            Decoder::Layout(_) => 1,
            Decoder::Descramble(_, s) => s.planes(),
        }
    }

    /// Width and height of a module's output (planes stacked along the slow axis).
    pub fn module_size(&self) -> (usize, usize) {
        let l = self.layout();
        (l.width(), l.height() * self.planes())
    }

    /// Whether each data frame needs the reset frame before it.
    pub fn needs_reset(&self) -> bool {
        matches!(self, Decoder::Descramble(_, s) if s.needs_reset())
    }
}

/// Builds detector images of one geometry into the caller's buffers, keeping its scratch
/// from frame to frame.
pub struct Assembler {
    geometry: Geometry,
    decoder: Option<Decoder>,
    /// The decoded module images (described detectors only), in 16-bit words so that the
    /// descramble stage's int16 planes stay aligned.
    modules: Vec<u16>,
    /// JUNGFRAU's module rows in image order (word in the slot, image pixel, length), for
    /// compressing an image straight from the slot (made on first use).
    runs: Vec<(usize, usize, usize)>,
}

impl Assembler {
    /// An assembler of `geometry`'s images; `decoder` decodes module frames first.
    pub fn new(geometry: Geometry, decoder: Option<Decoder>) -> Assembler {
        Assembler { geometry, decoder, modules: Vec::new(), runs: Vec::new() }
    }

    /// Bytes of one pixel of the image.
    pub fn pixel_bytes(&self) -> usize {
        self.decoder.as_ref().map_or(2, Decoder::pixel_bytes)
    }

    /// Whether images are JUNGFRAU's raw 16-bit words (no decoder).
    pub fn raw_words(&self) -> bool {
        self.decoder.is_none()
    }

    /// The image of a slot's data (its modules one after the other) in `image` (16-bit
    /// words, sized on first use so that JUNGFRAU's words stay aligned); `reset` is the reset
    /// frame's slot when the detector sends them. Returns the image's bytes.
    pub fn assemble<'i>(&mut self, raw: &[u8], reset: Option<&[u8]>, image: &'i mut Vec<u16>) -> &'i [u8] {
        let g = self.geometry;
        let pb = self.pixel_bytes();
        let n = g.height() * g.width() * pb;
        image.resize(n.div_ceil(2), 0);
        let image = &mut as_bytes_mut(image)[..n];
        let Some(dec) = &self.decoder else {
            let (words, mp) = (as_words(raw), g.module_pixels());
            g.assemble_bytes(2, |m| as_bytes(&words[m as usize * mp..(m as usize + 1) * mp]), image);
            return image;
        };
        let (rb, mb) = (dec.layout().raw_bytes(), g.module_pixels() * pb);
        self.modules.resize((mb * g.modules as usize).div_ceil(2), 0);
        let modules = &mut as_bytes_mut(&mut self.modules)[..mb * g.modules as usize];
        for (m, out) in modules.chunks_exact_mut(mb).enumerate() {
            let data = &raw[m * rb..(m + 1) * rb];
            match dec {
                Decoder::Layout(l) => l.decode(data, out),
                Decoder::Descramble(_, s) => {
                    let reset = reset.map(|r| as_words(&r[m * rb..(m + 1) * rb]));
                    s.run(as_words(data), reset, as_words_mut(out));
                }
            }
        }
        let modules = &*modules;
        g.assemble_bytes(pb, |m| &modules[m as usize * mb..(m as usize + 1) * mb], image);
        image
    }

    /// The chunk of the image of a slot of JUNGFRAU words (no decoder), compressed by `comp`
    /// into `chunk` straight from the slot: the image is made one compression block at a
    /// time in `staging` (which stays in the core's cache), never as a whole. The chunk is
    /// the one `comp` makes of [`Assembler::assemble`]'s image.
    pub fn compress_words(&mut self, raw: &[u8], comp: &mut Compressor, staging: &mut Vec<u16>, chunk: &mut Vec<u8>) {
        assert!(self.decoder.is_none(), "a JUNGFRAU's words (no decoder)");
        if self.runs.is_empty() {
            self.runs = self.geometry.runs_in_image_order();
        }
        let words = as_words(raw);
        let mut next = 0;
        let n = self.geometry.height() * self.geometry.width();
        comp.compress_from(n, staging, chunk, |at, block: &mut [u16]| fill_from_runs(words, &self.runs, &mut next, at, block));
    }

    /// Runs of image pixels (first, count; row-major) that the frame's missing cells feed
    /// (in every plane).
    pub fn missing(&self, rx: &Receiver, f: &FrameReady) -> Vec<(usize, usize)> {
        let (grid, g) = (rx.grid(), &self.geometry);
        let mut out = Vec::new();
        for &c in f.missing() {
            let (off, len) = (grid.cell_offset(c) as usize, grid.cell_len(c) as usize);
            let mut runs = |m: usize, a: usize, n: usize| g.module_span(m as u16, a, a + n, |at, run| out.push((at, run)));
            match &self.decoder {
                None => {
                    let mb = g.module_bytes();
                    let m = off / mb;
                    runs(m, (off - m * mb) / 2, len / 2);
                }
                Some(dec) => {
                    let l = dec.layout();
                    let (m, plane) = (off / l.raw_bytes(), l.width() * l.height());
                    let at = off - m * l.raw_bytes();
                    // a descrambled readout permutes the words of a row: mask whole rows
                    let span = if matches!(dec, Decoder::Layout(_)) { Span::Pixels } else { Span::Rows };
                    for k in 0..dec.planes() {
                        l.raw_span(at, at + len, span, |a, n| runs(m, k * plane + a, n));
                    }
                }
            }
        }
        out
    }
}

/// Image pixels `at..at + block.len()` made from the slot's `words`: the runs' words, gap
/// words between them. Blocks come in image order; `next` is the first run not yet used up.
fn fill_from_runs(words: &[u16], runs: &[(usize, usize, usize)], next: &mut usize, at: usize, block: &mut [u16]) {
    let (mut p, end, mut out) = (at, at + block.len(), 0);
    while p < end {
        while runs.get(*next).is_some_and(|&(_, start, len)| start + len <= p) {
            *next += 1;
        }
        let take = match runs.get(*next) {
            Some(&(src, start, len)) if start <= p => {
                let take = (start + len).min(end) - p;
                block[out..out + take].copy_from_slice(&words[src + (p - start)..][..take]);
                take
            }
            next_run => {
                let take = next_run.map_or(end, |r| r.1.min(end)) - p;
                block[out..out + take].fill(GAP_WORD);
                take
            }
        };
        (p, out) = (p + take, out + take);
    }
}

/// The int16 planes of a module image held in bytes (2-aligned: they lie in 16-bit words).
fn as_words_mut(b: &mut [u8]) -> &mut [i16] {
    assert!(b.as_ptr() as usize % 2 == 0 && b.len() % 2 == 0, "whole, aligned 16-bit words");
    // SAFETY: alignment and length checked above; any bit pattern is a valid i16; the
    // exclusive borrow of `b` is held for the lifetime of the words.
    unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<i16>(), b.len() / 2) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdaq_process::bitshuffle::Codec;

    /// Module grids with gaps both ways, and a partial readout.
    #[test]
    fn words_compressed_from_the_slot_give_the_assembled_images_chunk() {
        let grids = [Geometry::new(4, 2, 8, 36).unwrap(), Geometry::new(2, 1, 8, 36).unwrap().with_module_height(256), Geometry::new(1, 1, 8, 36).unwrap()];
        for g in grids {
            let words: Vec<u16> = (0..g.modules as usize * g.module_pixels()).map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7) as u16 & 0x3fff).collect();
            let raw = as_bytes(&words);
            let mut asm = Assembler::new(g, None);
            let mut comp = Compressor::new(2, 0, Codec::Lz4);
            let (mut image, mut whole, mut fused, mut staging) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            comp.compress(asm.assemble(raw, None, &mut image), &mut whole);
            asm.compress_words(raw, &mut comp, &mut staging, &mut fused);
            assert_eq!(fused, whole, "{g:?}");
        }
    }
}
