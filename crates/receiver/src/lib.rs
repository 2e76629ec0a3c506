//! The data receiver (DR): owns registered local buffers, checks every datagram against the
//! buffer it names (key, bounds, packet grid), places payloads, tracks a packet bitmap per
//! frame and hands complete (or timed-out) frames to the consumer by slot ownership.
//!
//! - [`arena`]: the one memory allocation of a receiver, cut into frame slots with guards.
//! - [`grid`]: the packet grid of a frame slot (modules x datagrams).
//! - [`counters`]: every datagram is counted once: placed or dropped with a reason.
//! - [`target`]: where a datagram goes, from its header alone (rdaq and sls formats).
//! - [`source`]: a data channel: reading rules, predicted next cell, loss window, requests.
//! - [`batch`]: the datagrams of one receive call, as placement reads them.
//! - [`placement`]: the sans-socket core: slot state, bitmaps, placing, completion.
//! - [`frame`]: the finished frame handed to the consumer, an unforgeable slot token.
//! - [`window`]: loss detection per data channel over sequence numbers.
//! - [`ledger`]: which frame numbers were finished or refused, for the frames never seen.
//! - [`diagnose`]: hints that name a wrong setting (interfaces, read rows, a silent port).
//! - [`config`]: a receiver's configuration and the formats' rules (rdaq, sls, RoCEv2),
//!   checked before anything is bound.
//! - [`engine`]: the receive thread: sockets, batches, predicted landing, timeouts.
//! - [`coalesce`]: when the receive thread reads next (few wake-ups for slow streams).

pub mod arena;
pub use rdaq_net::batch;
pub use rdaq_net::engine::EngineKind;
pub mod coalesce;
pub mod config;
pub mod counters;
pub mod diagnose;
pub mod engine;
pub mod frame;
pub mod grid;
pub mod ledger;
pub mod memory;
pub mod placement;
pub mod source;
pub mod target;
pub mod window;

pub use counters::{Counters, DropReason};
pub use source::PortGrid;
pub use engine::{Format, IncompletePolicy, Outcome, Receiver, ReceiverConfig, ReceiverError};
pub use ledger::{FrameSet, Ledger};
pub use frame::{FrameError, FrameReady, FrameStatus, MISSING_BYTE};
