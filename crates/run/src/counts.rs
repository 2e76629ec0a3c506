//! Spot finding and the hit veto on a counting detector's frames (EIGER, or any description
//! of kind "counting", with `process.mode = "spots"`). Its counts need no conversion, so the
//! raw consumer's assemble workers find the spots in each assembled image, a count a photon,
//! with the local-SNR finder of JUNGFRAU's graph: the pixels the NXmx mask marks (gaps, the
//! detector's own) are left out as NaN and the saturated ones (at the detector's largest
//! count) as +inf, as a JUNGFRAU's error and saturated words convert; or with peakfinder8
//! (`process.finder`), the whole image one panel, each pixel's radius from the beam centre,
//! as `rdaq process spots --finder peakfinder8` runs it on the file. The write stage writes
//! the hits (every frame with the veto off) with their spot lists, and the board counts them.

use std::sync::Arc;

use rdaq_process::spots::{count_saturation, is_hit, mask_counts, LocalSnr, LocalSnrParams, Peakfinder8, Peakfinder8Params, Spot, SpotFinder};
use rdaq_sink::PixelType;

use crate::board::{Board, Glance, ProcessCounts};
use crate::graph::ProcessReport;

/// The finder of a counting detector's spots, its thresholds in counts.
#[derive(Clone, Debug)]
pub enum CountFinderKind {
    Local(LocalSnrParams),
    /// peakfinder8 over the whole image as one panel, with each pixel's radius.
    Peakfinder8(Peakfinder8Params, Arc<Vec<f32>>),
}

/// What a counting detector's frames are judged by.
#[derive(Clone, Debug)]
pub struct Finding {
    pub finder: CountFinderKind,
    pub min_spots: usize,
    pub veto: bool,
    /// Every image pixel's NXmx mask bits (non-zero: left out).
    pub mask: Arc<Vec<u32>>,
    /// The counts' bits: the detector saturates at its largest count.
    pub bits: u8,
}

impl Finding {
    /// The bytes of a count in the assembled image (the file's pixel).
    pub fn pixel_bytes(&self) -> usize {
        PixelType::Counts(self.bits).bytes()
    }
}

/// An assemble worker's finder, kept from frame to frame.
pub(crate) struct CountFinder {
    finding: Arc<Finding>,
    finder: SpotFinder,
    saturation: f32,
    image: Vec<f32>,
}

/// What the finder judged of a frame.
pub(crate) struct Judged {
    pub hit: bool,
    pub vetoed: bool,
}

impl CountFinder {
    pub fn new(finding: Arc<Finding>) -> CountFinder {
        let finder = match &finding.finder {
            CountFinderKind::Local(p) => SpotFinder::Local(LocalSnr::new(*p)),
            // every pixel searched, as offline: the masked ones are NaN, which no test passes
            CountFinderKind::Peakfinder8(p, radius) => SpotFinder::Peakfinder8(Peakfinder8::new(*p, radius.to_vec(), &vec![true; radius.len()])),
        };
        CountFinder { finder, saturation: count_saturation(finding.bits), finding, image: Vec::new() }
    }

    /// A glance at the frame judged last (its counts, the left-out pixels without a value,
    /// its spots), for the dashboard.
    pub fn glance(&self, frame: u64, width: usize, height: usize, spots: &[Spot]) -> Glance {
        let values = self.image.iter().map(|&v| if v.is_finite() { v } else { f32::NAN }).collect();
        Glance { frame, width, height, values, spots: spots.iter().map(|s| (s.x, s.y)).collect(), unit: "counts" }
    }

    /// Finds the spots of the assembled image `bytes` (`width` x `height` little-endian
    /// counts) into `spots`, judges the frame and counts it on `board`.
    pub fn judge(&mut self, bytes: &[u8], width: usize, height: usize, spots: &mut Vec<Spot>, board: Option<&Board>) -> Judged {
        self.image.clear();
        match self.finding.pixel_bytes() {
            1 => self.image.extend(bytes.iter().map(|&b| b as f32)),
            2 => self.image.extend(bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]) as f32)),
            _ => self.image.extend(bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)),
        }
        mask_counts(&mut self.image, &self.finding.mask, self.saturation);
        self.finder.find(&self.image, width, height, spots);
        let hit = is_hit(spots, self.finding.min_spots);
        let vetoed = self.finding.veto && !hit;
        if let Some(b) = board {
            let c = &b.process;
            ProcessCounts::add(&c.signal_frames, 1);
            ProcessCounts::add(&c.spots_found, spots.len() as u64);
            if hit {
                ProcessCounts::add(&c.hits, 1);
            } else if vetoed {
                ProcessCounts::add(&c.vetoed, 1);
            }
        }
        Judged { hit, vetoed }
    }
}

/// The processing report of a counting detector's frames: the board's counts, the frames
/// written and compressed.
pub fn report(finding: &Finding, board: &Board, frames_written: u64, frames_compressed: u64, pool_waits: u64) -> ProcessReport {
    let mut r = ProcessReport { frames_written, frames_compressed, veto: finding.veto, min_spots: finding.min_spots, pool_waits, ..ProcessReport::default() };
    r.take_counts(&board.process);
    r
}
