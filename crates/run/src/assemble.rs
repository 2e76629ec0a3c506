//! A finished frame's slot as the detector image: JUNGFRAU module frames are 16-bit module
//! images already and are only put in place; a detector described by its layout (EIGER) has
//! each module's port images decoded first ([`ModuleLayout::decode`]).

use rdaq_detector::{as_bytes_mut, as_words, Geometry, ModuleLayout};
use rdaq_receiver::{FrameReady, Receiver};

/// Builds detector images of one geometry, reusing its buffers from frame to frame.
pub struct Assembler {
    geometry: Geometry,
    layout: Option<ModuleLayout>,
    /// The decoded module images (described detectors only).
    modules: Vec<u8>,
    /// The detector image, in 16-bit words so that JUNGFRAU's stay aligned.
    image: Vec<u16>,
}

impl Assembler {
    /// An assembler of `geometry`'s images; `layout` decodes module frames first. With
    /// `buffers` false it holds no memory (frames are only counted).
    pub fn new(geometry: Geometry, layout: Option<ModuleLayout>, buffers: bool) -> Assembler {
        let pb = layout.as_ref().map_or(2, ModuleLayout::pixel_bytes);
        let pixels = if buffers { geometry.height() * geometry.width() } else { 0 };
        let modules = match &layout {
            Some(l) if buffers => vec![0u8; l.width() * l.height() * pb * geometry.modules as usize],
            _ => Vec::new(),
        };
        Assembler { geometry, layout, modules, image: vec![0u16; (pixels * pb).div_ceil(2)] }
    }

    /// Bytes of one pixel of the image.
    pub fn pixel_bytes(&self) -> usize {
        self.layout.as_ref().map_or(2, ModuleLayout::pixel_bytes)
    }

    /// The image of a slot's data (its modules one after the other).
    pub fn assemble(&mut self, raw: &[u8]) -> &[u8] {
        let g = self.geometry;
        let n = g.height() * g.width() * self.pixel_bytes();
        let image = &mut as_bytes_mut(&mut self.image)[..n];
        match &self.layout {
            None => {
                let (words, mp) = (as_words(raw), g.module_pixels());
                g.assemble_bytes(2, |m| rdaq_detector::as_bytes(&words[m as usize * mp..(m as usize + 1) * mp]), image);
            }
            Some(l) => {
                let (rb, mb) = (l.raw_bytes(), l.width() * l.height() * l.pixel_bytes());
                for (m, out) in self.modules.chunks_exact_mut(mb).enumerate() {
                    l.decode(&raw[m * rb..(m + 1) * rb], out);
                }
                let modules = &self.modules;
                g.assemble_bytes(l.pixel_bytes(), |m| &modules[m as usize * mb..(m as usize + 1) * mb], image);
            }
        }
        image
    }

    /// The image as 16-bit words (JUNGFRAU's raw frames; `None` for other pixel sizes).
    pub fn words(&self) -> Option<&[u16]> {
        self.layout.is_none().then_some(&self.image[..])
    }

    /// Byte ranges of the image that the frame's missing cells feed.
    pub fn missing(&self, rx: &Receiver, f: &FrameReady) -> Vec<(usize, usize)> {
        let (grid, g, pb) = (rx.grid(), &self.geometry, self.pixel_bytes());
        let mut out = Vec::new();
        for &c in f.missing() {
            let (off, len) = (grid.cell_offset(c) as usize, grid.cell_len(c) as usize);
            let mut runs = |m: usize, a: usize, n: usize| g.module_span(m as u16, a, a + n, |at, run| out.push((at * pb, run * pb)));
            match &self.layout {
                None => {
                    let mb = g.module_bytes();
                    let m = off / mb;
                    runs(m, (off - m * mb) / 2, len / 2);
                }
                Some(l) => {
                    let m = off / l.raw_bytes();
                    let at = off - m * l.raw_bytes();
                    l.raw_span(at, at + len, |a, n| runs(m, a, n));
                }
            }
        }
        out
    }
}
