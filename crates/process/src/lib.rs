//! Online processing of detector frames (DESIGN.md: process).
//!
//! - [`convert`]: JUNGFRAU raw words to energy (keV) or photon counts, with the conventions
//!   for special words, the invalid gain code and masked pixels.
//! - [`calfile`]: calibration files (HDF5).
//! - [`pedestal`]: pedestal tracking over a running window of dark frames, per gain stage.
//! - [`pipeline`]: the graph of stages, bounded rings and worker pools.
//! - [`spots`]: Bragg spot finding (local SNR; peakfinder8) and the hit veto.
//! - [`bitshuffle`]: bitshuffle + LZ4 / Zstd chunks (HDF5 filter 32008).
//! - [`sparse`]: the CSR form of the pixels above a threshold.

pub mod bitshuffle;
pub mod calfile;
pub mod convert;
pub mod pedestal;
pub mod pipeline;
pub mod sparse;
pub mod spots;

pub use convert::{kev_to_photons, Calibration, CalibrationError, Converter, Count, InvalidGain};
