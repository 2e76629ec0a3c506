//! The system manager (SM), sans I/O: what the detector and the receivers are
//! ([`topology`]) and what its detector sends ([`sends`]), one address space over all their buffers ([`ras`]), which module's data
//! goes where, frame by frame ([`dtp`]), and while it runs which receivers count as dead and
//! at the end which frames count as received ([`watch`]). The acquisition service that a
//! control system arms and triggers, dataset after dataset, is [`service`]. TOML documents are parsed with
//! errors that name the field ([`tomldoc`]). A topology is checked in two steps: the document
//! ([`Topology::from_toml`]), then what its plan needs of each receiver ([`Plan::new`]). The
//! control plane that uploads these to the modules and receivers is `rdaq-control`.

#![forbid(unsafe_code)]

pub mod dtp;
pub mod ras;
pub mod sends;
pub mod service;
pub mod tomldoc;
pub mod topology;
pub mod watch;

pub use dtp::{Destination, Plan};
pub use ras::AddressSpace;
pub use sends::Sends;
pub use topology::{Topology, TopologyError, TransferMode};
pub use watch::{tally, Epoch, Heartbeats, Reported};
