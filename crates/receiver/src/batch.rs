//! The datagrams of one receive call, as placement reads them. Placement does not depend on
//! how they were received: the engine's `recvmmsg` batches implement [`Batch`] (in
//! `engine`), and so can a test's hand-made datagrams.

use std::net::SocketAddr;

/// Datagrams received in one call, each split into the header area and the payload where it
/// landed.
pub trait Batch {
    /// How many datagrams the call received.
    fn count(&self) -> usize;
    /// Header bytes of datagram `i` (shorter than the header length when the datagram was).
    fn header(&self, i: usize) -> &[u8];
    /// Length of datagram `i` as received (header + payload).
    fn datagram_len(&self, i: usize) -> usize;
    /// Whether datagram `i` was cut because it was longer than header + landing.
    fn truncated(&self, i: usize) -> bool;
    /// The address datagram `i` came from.
    fn source(&self, i: usize) -> Option<SocketAddr>;
    /// The payload of datagram `i` where it landed (in the receiver's ring when the
    /// prediction named a cell there).
    fn payload(&self, i: usize) -> &[u8];
}
