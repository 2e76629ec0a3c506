//! Sinks: where frames leave rdaq.
//!
//! - [`bitshuffle`]: the bitshuffle bit transposition and the bitshuffle+LZ4 chunk format of
//!   HDF5 filter 32008 (FORMATS.md section 3), written here because no maintained Rust
//!   crate implements it; LZ4 blocks come from `lz4_flex`.
//! - [`nxmx`]: the NXmx HDF5 file writer, one compressed frame per chunk by direct chunk
//!   write, with the minimal NXmx metadata of FORMATS.md section 4.

pub mod bitshuffle;
pub mod nxmx;

pub use nxmx::{NxmxMeta, NxmxWriter, SinkError};
