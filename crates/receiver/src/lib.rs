//! The data receiver (DR): owns registered local buffers, checks every datagram against the
//! buffer it names (key, bounds, packet grid), places payloads, tracks a packet bitmap per
//! frame and hands complete (or timed-out) frames to the consumer by slot ownership.
//!
//! - [`arena`]: the one memory allocation of a receiver, cut into frame slots with guards.
//! - [`grid`]: the packet grid of a frame slot (modules x datagrams).
//! - [`counters`]: every datagram is counted once: placed or dropped with a reason.
//! - [`placement`]: the sans-socket core: targets, slot state, bitmaps, completion.
//! - [`window`]: loss detection per data channel over sequence numbers.
//! - [`ledger`]: which frame numbers were finished or refused, for the frames never seen.
//! - [`diagnose`]: hints that name a wrong setting (interfaces, read rows, a silent port).
//! - [`engine`]: the receive thread: sockets, batches, predicted landing, timeouts.
//! - [`coalesce`]: when the receive thread reads next (few wake-ups for slow streams).

pub mod arena;
pub mod coalesce;
pub mod counters;
pub mod diagnose;
pub mod engine;
pub mod grid;
pub mod ledger;
pub mod placement;
pub mod window;

pub use counters::{Counters, DropReason};
pub use engine::{Format, IncompletePolicy, Outcome, Receiver, ReceiverConfig, ReceiverError};
pub use ledger::{FrameSet, Ledger};
pub use placement::FrameReady;
