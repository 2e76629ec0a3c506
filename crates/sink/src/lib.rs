//! Sinks: where frames leave rdaq.
//!
//! - [`nxmx`]: the NXmx HDF5 file writer, one compressed frame per chunk by direct chunk
//!   write, with the minimal NXmx metadata of `docs/formats.md`.
//! - [`reader`]: frames read back from a file, rdaq's bitshuffle chunks decoded without a
//!   filter plugin.
//! - [`space`]: free disk space, and the reserve that lets a writer close its file after the
//!   disk filled up.

pub mod nxmx;
pub mod reader;
pub mod space;

pub use reader::{FrameReader, ReadError};
pub use nxmx::{frame_stack, Closed, os_error, write_chunk, NxmxMeta, NxmxWriter, PixelType, SinkError, RESERVE_BYTES};
