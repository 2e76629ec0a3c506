//! Sinks: where frames leave rdaq.
//!
//! - [`nxmx`]: the NXmx HDF5 file writer, one compressed frame per chunk by direct chunk
//!   write, with the minimal NXmx metadata of FORMATS.md section 4.
//! - [`space`]: free disk space, and the reserve that lets a writer close its file after the
//!   disk filled up.

pub mod nxmx;
pub mod space;

pub use nxmx::{frame_stack, Closed, os_error, write_chunk, NxmxMeta, NxmxWriter, PixelType, SinkError, RESERVE_BYTES};
