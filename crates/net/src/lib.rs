//! Network engines. All sockets of rdaq live here; the wire formats live in `rdaq-proto`.
//!
//! - [`socket`]: UDP socket setup (large receive buffers with `SO_RCVBUFFORCE`, GSO probe).
//! - [`send`]: [`send::BatchSender`], `sendmmsg` batches with UDP generic segmentation offload.
//! - [`recv`]: [`recv::MmsgReceiver`], `recvmmsg` batches whose payloads land where the caller
//!   says (the receiver predicts the destination, so in-order data is placed without a copy).
//! - [`pace`]: sleeping and spinning until a deadline, for frame-rate pacing.

pub mod pace;
pub mod recv;
pub mod send;
pub mod socket;
