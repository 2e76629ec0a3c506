//! Online processing of detector frames (docs/concepts.md).
//!
//! - [`convert`]: JUNGFRAU raw words to energy (keV) or photon counts, with the conventions
//!   for special words, the invalid gain code and masked pixels.
//! - [`calfile`]: calibration files (HDF5).
//! - [`gainmap`]: PSI's per-module JUNGFRAU gain map files.
//! - [`descramble`]: a described integrating detector's raw frames into the planes of its
//!   pixel word's fields (readout order, bit fields, reset frames).
//! - [`pedestal`]: pedestal tracking over a running window of dark frames, per gain stage.
//! - [`pedestal_run`]: a pedestal run (G0, then forced G1 and G2) into a calibration.
//! - [`psi_pedestal`]: pedestal files of PSI's own tools (jungfrau_utils, sf-daq).
//! - [`pipeline`]: the graph of stages, bounded rings and worker pools.
//! - [`spots`]: Bragg spot finding (local SNR; peakfinder8) and the hit veto.
//! - [`bitshuffle`]: bitshuffle + LZ4 / Zstd chunks (HDF5 filter 32008).
//! - [`chunk_size`]: the size a chunk being read through HDF5 decodes to, for the filter.
//! - [`sparse`]: the CSR form of the pixels above a threshold.

pub mod bitshuffle;
pub mod calfile;
pub mod chunk_size;
pub mod convert;
pub mod descramble;
pub mod gainmap;
pub mod pedestal;
pub mod pedestal_run;
pub mod pipeline;
pub mod psi_pedestal;
pub mod sparse;
pub mod spots;

pub use convert::{kev_to_photons, Calibration, CalibrationError, Converter, Count, G0Pedestal, InvalidGain};

/// A setting named by a word that is not one of its choices.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {name:?}: expected {expected}")]
pub struct UnknownName {
    pub what: &'static str,
    pub name: String,
    pub expected: &'static str,
}

/// Numeric types without padding whose every byte pattern is valid: their slices can be
/// seen as bytes (pixels on their way to a compressor or a file).
pub trait Plain: Copy + private::Sealed {}

mod private {
    pub trait Sealed {}
}

macro_rules! plain {
    ($($t:ty),*) => {$(
        impl private::Sealed for $t {}
        impl Plain for $t {}
    )*};
}
plain!(u8, u16, i16, u32, i32, f32, f64);

/// The bytes of a slice of plain numbers, without a copy (host byte order: little-endian,
/// as the files and the wire).
pub fn bytes_of<T: Plain>(v: &[T]) -> &[u8] {
    // SAFETY: `Plain` is sealed to numeric types without padding, so every byte is
    // initialized; the length in bytes is exact and the lifetime tied to `v`.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// [`bytes_of`], to write: any bytes written make valid numbers.
pub fn bytes_of_mut<T: Plain>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as `bytes_of`, and every bit pattern is a valid value of the sealed numeric
    // types, so whatever is written leaves `v` valid; the borrow is exclusive.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}
