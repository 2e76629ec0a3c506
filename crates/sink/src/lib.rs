//! Sinks: where frames leave rdaq.
//!
//! - [`nxmx`]: the NXmx HDF5 file writer, one compressed frame per chunk by direct chunk
//!   write, with the minimal NXmx metadata of FORMATS.md section 4.

pub mod nxmx;

pub use nxmx::{frame_stack, write_chunk, NxmxMeta, NxmxWriter, PixelType, SinkError};
