//! Sinks: where frames leave rdaq.
//!
//! - [`nxmx`]: the NXmx series writer: a master file ([`master`], metadata from
//!   [`instrument`]) and SWMR data files ([`data_file`]), one compressed frame per chunk by
//!   direct chunk write, in the layout of `docs/formats.md`.
//! - [`nexus`]: the NeXus/HDF5 building blocks they share; [`spot_list`]: the spot lists
//!   (CXI peak-list layout) of a data file or of a file of them alone.
//! - [`claim`]: output names created exclusively, never through a symbolic link.
//! - [`filter`]: bitshuffle (filter 32008) registered in-process from rdaq's codec, so that
//!   what is written and read does not depend on a plugin in the environment.
//! - [`reader`]: frames read back from a file through HDF5 (any 3-D dataset); the writer's
//!   check that each closed data file reads back as written (`readback`).
//! - [`join`]: one master over the series of several receivers, frames in order.
//! - [`recover`]: a crashed writer's series made whole again (`rdaq recover`).
//! - [`space`]: free disk space, and the reserve that lets a writer close its files after
//!   the disk filled up.

pub mod claim;
pub mod data_file;
pub mod deferred;
pub mod filter;
pub mod instrument;
pub mod join;
pub mod master;
pub mod meta;
pub mod nexus;
pub mod nxmx;
pub mod reader;
pub(crate) mod readback;
pub mod recover;
pub mod space;
pub mod spot_list;

pub use claim::ClaimError;
pub use data_file::MASK_MISSING;
pub use deferred::SharedChunk;
pub use master::{data_file_name, Part};
pub use meta::{DetectorPart, NxmxMeta, PixelType, ProcessingMeta, Rotation, IMAGES_PER_FILE};
pub use filter::BSHUF_FILTER;
pub use nexus::{frame_stack, os_error, write_chunk};
pub use nxmx::{Closed, NxmxWriter, SinkError, FLUSH_EVERY, RESERVE_BYTES};
pub use reader::{FrameReader, ReadError};
pub use spot_list::SpotLists;
