//! What the receiver hands to its consumer: a finished frame, as an ownership token of the
//! slot that holds it.
//!
//! A [`FrameReady`] cannot be built, copied or cloned outside this crate, and giving it back
//! ([`crate::Receiver::release`]) consumes it: the slot it names is the consumer's from the
//! moment the receiver hands it on until the one release, and safe code cannot read a slot
//! the receive thread is writing.
//!
//! ```compile_fail,E0451
//! // a frame cannot be forged: its fields are private
//! let f = rdaq_receiver::FrameReady { slot: 0, frame: 1 };
//! ```
//!
//! ```compile_fail,E0382
//! // nor released twice: release consumes it
//! fn twice(rx: &rdaq_receiver::Receiver, f: rdaq_receiver::FrameReady) {
//!     let _ = rx.release(f);
//!     let _ = rx.release(f);
//! }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

/// What happens to a frame that is still incomplete when its timeout expires, when a newer
/// frame needs its slot, or at the end of the acquisition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncompletePolicy {
    /// Drop it; its slot is free again at once.
    Discard,
    /// Hand it on with every missing cell filled with [`MISSING_BYTE`] and its missing cells listed.
    Keep,
}

impl std::str::FromStr for IncompletePolicy {
    type Err = String;
    /// `keep` or `discard`, as every configuration names them.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "keep" => Ok(IncompletePolicy::Keep),
            "discard" => Ok(IncompletePolicy::Discard),
            other => Err(format!("policy must be \"keep\" or \"discard\", not {other:?}")),
        }
    }
}

/// Byte written over missing cells under [`IncompletePolicy::Keep`]: 0xFFFF words are the
/// JUNGFRAU error word, so missing pixels can never be mistaken for data.
pub const MISSING_BYTE: u8 = 0xff;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameStatus {
    Complete,
    /// Handed on with missing cells marked.
    Incomplete,
    /// Dropped; the slot was not handed on and holds no data for the consumer.
    Discarded,
}

/// Why a frame's data cannot be read or its slot given back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The frame was discarded: its slot was never handed on.
    #[error("frame {frame} was discarded and has no data")]
    Discarded { frame: u64 },
    /// The frame came from another receiver (or placement), whose slots these are not.
    #[error("frame {frame} belongs to another receiver")]
    OtherReceiver { frame: u64 },
}

/// Identity of one placement (and its receiver): what a frame token is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Owner(u64);

impl Owner {
    /// A new identity, distinct from every other in this process.
    pub(crate) fn new() -> Owner {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Owner(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// A finished frame. For `Complete` and `Incomplete` it is the consumer's ownership of the
/// slot holding the frame until it is released; the fields are private so that no other
/// value can claim a slot.
#[derive(Debug, PartialEq, Eq)]
pub struct FrameReady {
    pub(crate) owner: Owner,
    pub(crate) slot: u32,
    pub(crate) frame: u64,
    pub(crate) status: FrameStatus,
    pub(crate) received_cells: u32,
    pub(crate) total_cells: u32,
    pub(crate) missing: Vec<u32>,
    pub(crate) imm: Option<u32>,
    pub(crate) first_datagram: std::time::Instant,
    pub(crate) finished: std::time::Instant,
}

impl FrameReady {
    /// The local buffer (slot of the ring) that holds it.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    pub fn frame(&self) -> u64 {
        self.frame
    }

    pub fn status(&self) -> FrameStatus {
        self.status
    }

    /// Cells (datagrams) placed.
    pub fn received_cells(&self) -> u32 {
        self.received_cells
    }

    /// Cells of a whole frame.
    pub fn total_cells(&self) -> u32 {
        self.total_cells
    }

    /// Missing cells (empty when complete); cell `c` covers `Grid::cell_offset(c)`.
    pub fn missing(&self) -> &[u32] {
        &self.missing
    }

    /// Immediate value of the frame's last datagram, if it carried one.
    pub fn imm(&self) -> Option<u32> {
        self.imm
    }

    /// When its first datagram was placed (the start of the frame at the receiver).
    pub fn first_datagram(&self) -> std::time::Instant {
        self.first_datagram
    }

    /// When the receiver finished it: complete, or given up under the policy.
    pub fn finished(&self) -> std::time::Instant {
        self.finished
    }

    /// Checks that the token came from `owner`.
    pub(crate) fn check_owner(&self, owner: Owner) -> Result<(), FrameError> {
        if self.owner == owner {
            Ok(())
        } else {
            Err(FrameError::OtherReceiver { frame: self.frame })
        }
    }
}
