//! Whole images from the parts that the receivers of a spatial plan hold. Each part (its
//! modules stacked in one column, with the detector's gaps) is decompressed, its modules put
//! in their places of the whole detector's image, and the image compressed again as the
//! data files hold it (bitshuffle + LZ4, what Stream V2 carries). Spot positions and missing
//! pixels follow their modules; the modules no part brought hold the no-data value and are
//! marked missing, so that a frame one receiver did not send is marked, not dropped.

use rdaq_detector::Geometry;
use rdaq_process::bitshuffle::{self, ChunkError, Codec, Compressor};
use rdaq_sink::{DetectorPart, PixelType};
use rdaq_stream::Image;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PartError {
    #[error("its image does not decompress: {0}")]
    Chunk(#[from] ChunkError),
    #[error("its image says it has {got} bytes, its modules make {want}")]
    Size { got: usize, want: usize },
    #[error("{got}-byte pixels, the series' start said {want}")]
    Pixel { got: usize, want: usize },
    #[error("module {0} came in two parts of one frame (receivers that hold the same modules take turns, or take every frame?)")]
    Twice(u16),
}

/// Joins parts into whole images of one detector; keeps its buffers between frames.
pub struct PartJoiner {
    detector: Geometry,
    pixel: PixelType,
    no_data: Vec<u8>,
    image: Vec<u8>,
    held: Vec<bool>,
    compressor: Compressor,
}

impl PartJoiner {
    /// A joiner of parts of `detector` (the whole detector's grid and module size) whose
    /// pixels are `pixel`.
    pub fn new(detector: Geometry, pixel: PixelType) -> PartJoiner {
        let no_data = pixel.no_data();
        let image = no_data.repeat(detector.height() * detector.width());
        let compressor = Compressor::new(pixel.bytes(), 0, Codec::Lz4);
        PartJoiner { detector, pixel, no_data, image, held: vec![false; detector.modules as usize], compressor }
    }

    pub fn detector(&self) -> Geometry {
        self.detector
    }

    /// The whole image of one frame from the parts of it that came (each with the part of
    /// the detector its source holds): modules in their places, the others missing. The
    /// image's number is the first part's frame number; its `image_id` is 0 (the joined
    /// series numbers it). A part that cannot be placed fails the frame.
    pub fn join(&mut self, parts: &[(&DetectorPart, Image)]) -> Result<Image, PartError> {
        self.held.fill(false);
        let mut whole = Image { frame_number: parts.first().map_or(0, |p| p.1.frame_number), elem: self.pixel.bytes(), ..Image::default() };
        let mut spots: Option<(Vec<_>, bool)> = None;
        for (part, img) in parts {
            self.place(part, img)?;
            self.missing_of(part, &img.missing, &mut whole.missing);
            if let Some((s, hit)) = &img.spots {
                let (all, any) = spots.get_or_insert_with(|| (Vec::new(), false));
                all.extend(s.iter().map(|s| {
                    let (x, y) = part.to_detector(s.x as f64, s.y as f64);
                    rdaq_process::spots::Spot { x: x as f32, y: y as f32, ..*s }
                }));
                *any |= hit;
            }
            let (a, b) = img.time_ns;
            whole.time_ns = if whole.time_ns == (0, 0) { (a, b) } else { (whole.time_ns.0.min(a), whole.time_ns.1.max(b)) };
        }
        for m in 0..self.detector.modules {
            if self.held[m as usize] {
                continue;
            }
            self.fill_no_data(m);
            self.detector.module_span(m, 0, self.detector.module_pixels(), |at, len| whole.missing.push((at, len)));
        }
        whole.missing = merged(std::mem::take(&mut whole.missing));
        whole.spots = spots;
        self.compressor.compress(&self.image, &mut whole.chunk);
        Ok(whole)
    }

    /// Copies part `img`'s modules into their places of the whole image.
    fn place(&mut self, part: &DetectorPart, img: &Image) -> Result<(), PartError> {
        let pb = self.pixel.bytes();
        if img.elem != pb {
            return Err(PartError::Pixel { got: img.elem, want: pb });
        }
        let g = part.geometry();
        let want = g.height() * g.width() * pb;
        // the chunk's header says its size: checked before anything is allocated for it
        let claimed = img.chunk.get(..8).map_or(0, |b| u64::from_be_bytes(b.try_into().expect("8 bytes")) as usize);
        if claimed != want {
            return Err(PartError::Size { got: claimed, want });
        }
        let pixels = bitshuffle::decompress(&img.chunk, pb, Codec::Lz4)?;
        for (i, &m) in part.module_ids.iter().enumerate() {
            if std::mem::replace(&mut self.held[m as usize], true) {
                return Err(PartError::Twice(m));
            }
            let ((p0, _), (r0, c0)) = (g.origin(i as u16), self.detector.origin(m));
            let row = g.module_width * pb;
            for r in 0..g.module_height {
                let (from, at) = ((p0 + r) * g.width() * pb, ((r0 + r) * self.detector.width() + c0) * pb);
                self.image[at..at + row].copy_from_slice(&pixels[from..from + row]);
            }
        }
        Ok(())
    }

    /// Module `m`'s pixels of the whole image set to the no-data value.
    fn fill_no_data(&mut self, m: u16) {
        let (image, no_data, pb) = (&mut self.image, &self.no_data, self.pixel.bytes());
        self.detector.module_span(m, 0, self.detector.module_pixels(), |at, len| {
            image[at * pb..(at + len) * pb].chunks_exact_mut(pb).for_each(|p| p.copy_from_slice(no_data));
        });
    }

    /// The runs of `missing` (pixels of the part's image) as runs of the whole image;
    /// pixels in the gaps between the part's modules are no module's, and dropped.
    fn missing_of(&self, part: &DetectorPart, missing: &[(usize, usize)], out: &mut Vec<(usize, usize)>) {
        let g = part.geometry();
        let (w, pitch) = (g.width(), g.module_height + g.gap_y);
        for &(start, len) in missing {
            let mut p = start;
            while p < start + len {
                let (r, c) = (p / w, p % w);
                let run = (w - c).min(start + len - p);
                if let Some(&m) = part.module_ids.get(r / pitch).filter(|_| r % pitch < g.module_height) {
                    let (r0, c0) = self.detector.origin(m);
                    out.push(((r0 + r % pitch) * self.detector.width() + c0 + c, run));
                }
                p += run;
            }
        }
    }
}

/// Runs sorted, touching or overlapping ones made one.
fn merged(mut runs: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    runs.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(runs.len());
    for (s, n) in runs {
        match out.last_mut() {
            Some((ls, ln)) if *ls + *ln >= s => *ln = (*ln).max(s + n - *ls),
            _ => out.push((s, n)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdaq_process::spots::Spot;

    /// A 4-module detector, 2 x 2 modules of 6 x 4 pixels with gaps of 1 and 2.
    fn detector() -> Geometry {
        Geometry::new(4, 2, 1, 2).unwrap().with_module_size(6, 4)
    }

    /// Part `ids`'s image of 16-bit pixels: each module pixel holds `1000 * (module + 1) +`
    /// its index in the module; gaps hold 0xffff.
    fn part_image(ids: &[u16], frame: u64) -> (DetectorPart, Image) {
        let part = DetectorPart { module_ids: ids.to_vec(), detector: detector() };
        let g = part.geometry();
        let mut px = vec![0xffffu16; g.height() * g.width()];
        for (i, &m) in ids.iter().enumerate() {
            g.module_runs(i as u16, |from, at, len| (0..len).for_each(|k| px[at + k] = 1000 * (m + 1) + (from + k) as u16));
        }
        let bytes: Vec<u8> = px.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut chunk = Vec::new();
        Compressor::new(2, 0, Codec::Lz4).compress(&bytes, &mut chunk);
        (part, Image { frame_number: frame, elem: 2, chunk, ..Image::default() })
    }

    fn pixels(img: &Image) -> Vec<u16> {
        bitshuffle::decompress(&img.chunk, 2, Codec::Lz4).unwrap().chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect()
    }

    #[test]
    fn two_parts_make_the_image_one_receiver_of_every_module_would() {
        let d = detector();
        let (a, ia) = part_image(&[0, 1], 7);
        let (b, ib) = part_image(&[2, 3], 7);
        let mut j = PartJoiner::new(d, PixelType::Raw);
        let whole = j.join(&[(&b, ib), (&a, ia)]).unwrap();
        let mut want = vec![0xffffu16; d.height() * d.width()];
        for m in 0..4 {
            d.module_runs(m, |from, at, len| (0..len).for_each(|k| want[at + k] = 1000 * (m + 1) + (from + k) as u16));
        }
        assert_eq!(pixels(&whole), want);
        assert_eq!((whole.frame_number, whole.missing.len()), (7, 0));
    }

    #[test]
    fn a_part_that_did_not_come_is_marked_missing_and_holds_no_data() {
        let d = detector();
        let (a, ia) = part_image(&[1, 2], 3);
        let mut j = PartJoiner::new(d, PixelType::Raw);
        let whole = j.join(&[(&a, ia)]).unwrap();
        let px = pixels(&whole);
        let mut marked = vec![false; px.len()];
        whole.missing.iter().for_each(|&(s, n)| marked[s..s + n].fill(true));
        for m in 0..4u16 {
            d.module_runs(m, |_, at, len| {
                let absent = m == 0 || m == 3;
                assert!(marked[at..at + len].iter().all(|&x| x == absent), "module {m}");
                assert!(!absent || px[at..at + len].iter().all(|&v| v == 0xffff), "module {m} no data");
            });
        }
        // a partial part's own missing runs land in the module's place of the whole
        let (b, mut ib) = part_image(&[0, 1], 4);
        let g = b.geometry();
        ib.missing = vec![(g.origin(1).0 * g.width() + 2, 3)];
        let (c, ic) = part_image(&[2, 3], 4);
        let whole = j.join(&[(&b, ib), (&c, ic)]).unwrap();
        let (r0, c0) = d.origin(1);
        assert_eq!(whole.missing, vec![(r0 * d.width() + c0 + 2, 3)]);
    }

    #[test]
    fn spots_move_with_their_modules_and_a_module_twice_is_refused() {
        let d = detector();
        let spotted = || {
            let (a, mut ia) = part_image(&[2, 3], 1);
            let pitch = (a.geometry().module_height + a.geometry().gap_y) as f32;
            ia.spots = Some((vec![Spot { x: 1.5, y: pitch + 2.25, intensity: 9.0, pixels: 3 }], true));
            (a, ia)
        };
        let mut j = PartJoiner::new(d, PixelType::Raw);
        let (a, ia) = spotted();
        let whole = j.join(&[(&a, ia)]).unwrap();
        let (r0, c0) = d.origin(3);
        let (spots, hit) = whole.spots.unwrap();
        assert!(hit);
        assert_eq!((spots[0].x, spots[0].y, spots[0].intensity), (c0 as f32 + 1.5, r0 as f32 + 2.25, 9.0));
        let ((a, ia), (b, ib)) = (spotted(), spotted());
        assert!(matches!(j.join(&[(&a, ia), (&b, ib)]), Err(PartError::Twice(2))));
    }

    #[test]
    fn a_part_of_another_size_is_refused_before_it_is_decompressed() {
        let (a, mut ia) = part_image(&[0, 1], 1);
        ia.chunk[..8].copy_from_slice(&(1u64 << 40).to_be_bytes());
        let mut j = PartJoiner::new(detector(), PixelType::Raw);
        assert!(matches!(j.join(&[(&a, ia)]), Err(PartError::Size { got, .. }) if got == 1 << 40));
    }

    #[test]
    fn runs_are_merged_in_order() {
        assert_eq!(merged(vec![(10, 2), (0, 3), (3, 4), (12, 1), (20, 1)]), vec![(0, 7), (10, 3), (20, 1)]);
    }
}
