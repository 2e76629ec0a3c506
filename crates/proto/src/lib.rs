//! Wire formats of rdaq, sans I/O: pure types and functions, no sockets, no allocation.
//!
//! - [`datagram`]: the rdaq datagram, our RDMA-over-UDP format (RASHPA style: the datagram
//!   names its destination buffer, key and offset; the receiver only checks and places).
//! - [`sls`]: the native JUNGFRAU (slsDetectorPackage) UDP header.
//! - [`nack`]: retransmission requests from a receiver to a module's controller.
//! - [`roce`]: RoCEv2 (BTH, RETH, ImmDt, AETH, the ICRC), for RDMA WRITE streams from
//!   RoCE senders.
//! - [`seq`]: wrap-safe sequence number arithmetic.
//! - [`telegram`]: configuration documents (buffer requests and maps, module DTPs).
//! - [`events`]: the event channel's events and a bounded event log.
//! - [`names`]: the file and directory names a request carries; [`metadata`]: what it
//!   says of the experiment (photon energy, distance, beam centre, sample); [`times`]: the count and
//!   frame times it carries.
//!
//! The byte layouts are documented in `docs/protocol.md`.

#![forbid(unsafe_code)]

pub mod datagram;
pub mod events;
pub mod nack;
pub mod metadata;
pub mod names;
pub mod roce;
pub mod seq;
pub mod sls;
pub mod telegram;
pub mod times;

pub use datagram::{checksum, DecodeError, Flags, Header, CHECKSUM_LEN, HEADER_LEN, MAGIC, MAX_PAYLOAD, VERSION};
pub use sls::{SlsError, SlsHeader, SLS_HEADER_LEN};
