//! The processing stages on HDF5 files, as `rdaq process` and the Python package run them:
//! raw JUNGFRAU frames converted to keV or photon counts ([`convert`]), a calibration from
//! a dark run ([`pedestal`]), Bragg spots found in converted frames ([`spots`]).
//!
//! Inputs are 3-D datasets (frames, rows, cols) read through [`rdaq_sink::FrameReader`]:
//! plain HDF5 datasets, or rdaq's own bitshuffle chunks. Every stage writes one new file
//! through an [`Output`], which never leaves a partial file behind.

pub mod convert;
pub mod output;
pub mod pedestal;
pub mod spots;

pub use convert::{convert, raw_run, run_invalid_gain, ConvertOptions, Counts, Unit};
pub use output::Output;
pub use pedestal::{pedestal, PedestalOptions, Pedestalled, Sums};
pub use spots::{counted, read_radius_map, run_finder, run_peakfinder8, spots, Counted, Finder, Radius, RunFinder};
