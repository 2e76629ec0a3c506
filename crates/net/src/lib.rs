//! Network engines. All sockets of rdaq live here; the wire formats live in `rdaq-proto`.
//!
//! - [`socket`]: UDP socket setup (large receive buffers with `SO_RCVBUFFORCE`, GSO probe).
//! - [`send`]: [`send::BatchSender`], `sendmmsg` batches with UDP generic segmentation offload.
//! - [`engine`]: the receive-engine interface placement drives ([`engine::Engine`]), over
//!   three engines: [`recv`] (`recvmmsg` batches whose payloads land where the caller says:
//!   the receiver predicts the destination, so in-order data is placed without a copy),
//!   [`uring`] (the same through io_uring) and [`xdp`] (AF_XDP with an XDP program).
//! - [`batch`]: what placement reads of a received batch.
//! - [`pace`]: sleeping and spinning until a deadline, for frame-rate pacing.
//! - [`raw`]: whole Ethernet frames on one interface (`AF_PACKET`), for RoCEv2.
//! - [`roce`]: the RoCEv2 RC responder and requester of RDMA WRITE streams, sans I/O.

pub mod batch;
pub mod engine;
pub mod iface;
pub mod netns;
pub mod pace;
pub mod raw;
pub mod recv;
pub mod roce;
pub mod send;
pub mod socket;
pub mod tuning;
pub mod uring;
pub mod xdp;
