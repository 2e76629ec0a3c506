//! Online processing of detector frames (DESIGN.md: process).
//!
//! - [`convert`]: JUNGFRAU raw words to energy (keV) or photon counts, with the conventions
//!   for special words, the invalid gain code and masked pixels.
//!
//! Work in progress for issue 5: pedestal tracking, spot finding, compression and the
//! pipeline graph are not here yet.

pub mod convert;

pub use convert::{Calibration, CalibrationError, Converter, Count, InvalidGain};
