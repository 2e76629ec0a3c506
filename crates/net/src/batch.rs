//! The datagrams of one receive call, as placement reads them. Placement does not depend on
//! how they were received: every engine's batch implements [`Batch`] (see [`crate::engine`]),
//! and so can a test's hand-made datagrams.

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

/// The datagrams of a batch that one channel received, in arrival order: an engine that
/// serves several data ports from one queue (AF_XDP) hands each channel its share.
pub struct Subset<'a, B: Batch + ?Sized> {
    pub batch: &'a B,
    pub indices: &'a [u16],
}

impl<B: Batch + ?Sized> Batch for Subset<'_, B> {
    fn count(&self) -> usize {
        self.indices.len()
    }
    fn header(&self, i: usize) -> &[u8] {
        self.batch.header(self.indices[i] as usize)
    }
    fn datagram_len(&self, i: usize) -> usize {
        self.batch.datagram_len(self.indices[i] as usize)
    }
    fn truncated(&self, i: usize) -> bool {
        self.batch.truncated(self.indices[i] as usize)
    }
    fn source(&self, i: usize) -> Option<SocketAddr> {
        self.batch.source(self.indices[i] as usize)
    }
    fn payload(&self, i: usize) -> &[u8] {
        self.batch.payload(self.indices[i] as usize)
    }
}
