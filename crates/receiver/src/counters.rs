//! Counters of a receiver. Every datagram that reaches the receiver is counted exactly once:
//! placed, redundant (a retransmission no longer needed), or dropped with a [`DropReason`].

use std::fmt;

/// Why a datagram was dropped. Nothing of a dropped datagram reaches a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Shorter than a header.
    Truncated,
    /// Longer than header + the largest payload the receiver accepts.
    Oversized,
    BadMagic,
    BadVersion,
    /// Reserved flag bits or fields set.
    BadHeader,
    /// Declared payload length differs from the datagram's.
    LengthMismatch,
    UnknownBuffer,
    BadKey,
    UnknownModule,
    UnknownDataset,
    /// Would write outside the buffer it names.
    OutOfBounds,
    /// Inside the buffer but not exactly one packet cell of its module.
    Misaligned,
    /// An sls packet that is not a valid JUNGFRAU packet.
    BadSlsPacket,
    /// A valid sls packet whose packet number its port does not expect: another interface's
    /// packet, or rows outside the readout (`--interfaces`, `--read-rows`).
    UnexpectedPacket,
    /// For a frame older than the one its slot already holds or held.
    Stale,
    /// Its frame was refused: the slot was still held by the consumer when the frame's first
    /// datagram came (the ring was full; see [`Counters::frames_refused`]).
    RingFull,
    /// Its cell was already filled.
    Duplicate,
    /// Its checksum does not match its bytes (corrupted on the way).
    BadChecksum,
    /// It carries a checksum and the receiver expects none, or the other way round.
    ChecksumMode,
    /// It came from an address the receiver was not configured to accept.
    UnknownSource,
    /// RoCEv2: the invariant CRC does not match (corrupted on the way).
    BadIcrc,
    /// RoCEv2: not a packet rdaq takes (headers, opcode, pad or length).
    RoceMalformed,
    /// RoCEv2: for a queue pair the receiver does not have.
    UnknownQp,
    /// RoCEv2: ahead of the expected PSN (a packet before it was lost; a NAK asks the sender
    /// to go back).
    OutOfSequence,
    /// RoCEv2: behind the expected PSN (already taken: a go-back resend).
    PsnDuplicate,
    /// RoCEv2: a WRITE out of opcode sequence, or a length that does not fit its message.
    InvalidRequest,
    /// RoCEv2: an R_Key or VA range no registered buffer grants.
    RemoteAccess,
    /// RoCEv2: the immediate names another frame than the queue pair counted.
    ImmMismatch,
}

impl DropReason {
    pub const ALL: [DropReason; 28] = [
        DropReason::Truncated,
        DropReason::Oversized,
        DropReason::BadMagic,
        DropReason::BadVersion,
        DropReason::BadHeader,
        DropReason::LengthMismatch,
        DropReason::UnknownBuffer,
        DropReason::BadKey,
        DropReason::UnknownModule,
        DropReason::UnknownDataset,
        DropReason::OutOfBounds,
        DropReason::Misaligned,
        DropReason::BadSlsPacket,
        DropReason::UnexpectedPacket,
        DropReason::Stale,
        DropReason::RingFull,
        DropReason::Duplicate,
        DropReason::BadChecksum,
        DropReason::ChecksumMode,
        DropReason::UnknownSource,
        DropReason::BadIcrc,
        DropReason::RoceMalformed,
        DropReason::UnknownQp,
        DropReason::OutOfSequence,
        DropReason::PsnDuplicate,
        DropReason::InvalidRequest,
        DropReason::RemoteAccess,
        DropReason::ImmMismatch,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DropReason::Truncated => "truncated",
            DropReason::Oversized => "oversized",
            DropReason::BadMagic => "bad_magic",
            DropReason::BadVersion => "bad_version",
            DropReason::BadHeader => "bad_header",
            DropReason::LengthMismatch => "length_mismatch",
            DropReason::UnknownBuffer => "unknown_buffer",
            DropReason::BadKey => "bad_key",
            DropReason::UnknownModule => "unknown_module",
            DropReason::UnknownDataset => "unknown_dataset",
            DropReason::OutOfBounds => "out_of_bounds",
            DropReason::Misaligned => "misaligned",
            DropReason::BadSlsPacket => "bad_sls_packet",
            DropReason::UnexpectedPacket => "unexpected_packet",
            DropReason::Stale => "stale",
            DropReason::RingFull => "ring_full",
            DropReason::Duplicate => "duplicate",
            DropReason::BadChecksum => "bad_checksum",
            DropReason::ChecksumMode => "checksum_mode",
            DropReason::UnknownSource => "unknown_source",
            DropReason::BadIcrc => "bad_icrc",
            DropReason::RoceMalformed => "roce_malformed",
            DropReason::UnknownQp => "unknown_qp",
            DropReason::OutOfSequence => "out_of_sequence",
            DropReason::PsnDuplicate => "psn_duplicate",
            DropReason::InvalidRequest => "invalid_request",
            DropReason::RemoteAccess => "remote_access",
            DropReason::ImmMismatch => "imm_mismatch",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Datagrams read from the sockets.
    pub datagrams: u64,
    /// Datagrams whose payload went into a frame.
    pub placed: u64,
    pub bytes_placed: u64,
    /// Placed datagrams that landed directly at their destination (no user-space copy).
    pub landed_in_place: u64,
    /// Placed datagrams copied into their cell by placement (from scratch, or back from
    /// evacuation): one user-space copy beside the kernel's.
    pub copied: u64,
    /// Of the copied: payloads that had landed in a wrongly predicted cell of the ring and
    /// were moved out before the batch was placed, so each cost a second user-space copy.
    pub evacuated: u64,
    pub frames_complete: u64,
    /// Incomplete frames handed on with missing cells marked (policy keep).
    pub frames_incomplete: u64,
    /// Incomplete frames dropped (policy discard).
    pub frames_discarded: u64,
    /// Frames refused whole because their slot was still held by the consumer when their
    /// first datagram came (the consumer was slower than the detector).
    pub frames_refused: u64,
    /// Cells missing in incomplete frames (kept or discarded).
    pub cells_missing: u64,
    /// recvmmsg calls, and calls that waited for data (poll) or for a batch to gather.
    pub recv_syscalls: u64,
    pub recv_waits: u64,
    /// Drops the kernel reported for the sockets (buffer full), read at the end.
    pub kernel_drops: u64,
    /// CPU time of the receive thread, and the times it went to sleep (its wake-ups), read
    /// at the end.
    pub cpu_time: std::time::Duration,
    pub sleeps: u64,
    /// Sequence numbers the loss windows declared missing.
    pub seq_missing: u64,
    /// Declared-missing sequence numbers that arrived afterwards (late or retransmitted).
    pub seq_recovered: u64,
    /// Datagrams that arrived behind a later one of their channel, within the lag.
    pub seq_reordered: u64,
    /// Loss reports not delivered because the consumer of them was behind.
    pub loss_reports_dropped: u64,
    /// Retransmission requests sent (RoCEv2: sequence-error NAKs), and the ranges they named.
    pub nacks_sent: u64,
    /// RoCEv2 acknowledgements sent (coalesced: one per queue pair per receive batch).
    pub acks_sent: u64,
    /// RoCEv2 ACKs and NAKs the interface's queue refused (lost; the sender's timeout
    /// recovers what they would have told it).
    pub replies_refused: u64,
    pub nack_ranges: u64,
    /// Ranges not asked for: the per-channel request queue was full, the rate limit was
    /// reached, or the send failed.
    pub nack_ranges_dropped: u64,
    /// Placed datagrams that were retransmissions.
    pub placed_retransmitted: u64,
    /// Retransmissions that came after their cell was filled or their frame finished
    /// (answers to a request overtaken by the original, or the sender's tail probes).
    pub redundant: u64,
    /// Frames completed thanks to at least one retransmitted datagram.
    pub frames_recovered: u64,
    /// Frames finished incomplete although retransmission was requested for them.
    pub frames_given_up: u64,
    pub dropped: [u64; DropReason::ALL.len()],
    /// Gauges of the ring when last published: slots being filled, slots held by the
    /// consumer, and all slots.
    pub slots_filling: u32,
    pub slots_handed: u32,
    pub slots: u32,
}

impl Counters {
    #[inline]
    pub fn drop(&mut self, r: DropReason) {
        self.dropped[r as usize] += 1;
    }

    pub fn dropped(&self, r: DropReason) -> u64 {
        self.dropped[r as usize]
    }

    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().sum()
    }

    /// The non-zero drop counters by name.
    pub fn drops_by_reason(&self) -> Vec<(&'static str, u64)> {
        DropReason::ALL.iter().filter(|r| self.dropped(**r) > 0).map(|r| (r.name(), self.dropped(*r))).collect()
    }

    /// Frames that left the receiver, in any state (refused frames not included).
    pub fn frames_finished(&self) -> u64 {
        self.frames_complete + self.frames_incomplete + self.frames_discarded
    }
}

impl Counters {
    /// These counters with what a RoCEv2 responder took and refused before placement: each
    /// refused packet is a datagram read and dropped with its reason.
    pub fn with_roce(mut self, s: &rdaq_net::xdp::RoceStats) -> Counters {
        use rdaq_net::roce::responder::RoceDrop;
        let r = &s.responder;
        for d in RoceDrop::ALL {
            let reason = match d {
                RoceDrop::Icrc => DropReason::BadIcrc,
                RoceDrop::Malformed => DropReason::RoceMalformed,
                RoceDrop::UnknownQp => DropReason::UnknownQp,
                RoceDrop::OutOfSequence => DropReason::OutOfSequence,
                RoceDrop::Duplicate => DropReason::PsnDuplicate,
                RoceDrop::InvalidRequest => DropReason::InvalidRequest,
                RoceDrop::RemoteAccess => DropReason::RemoteAccess,
                RoceDrop::ImmMismatch => DropReason::ImmMismatch,
            };
            self.dropped[reason as usize] += r.dropped(d);
            self.datagrams += r.dropped(d);
        }
        self.nacks_sent += r.naks;
        self.acks_sent += r.acks;
        self.replies_refused += s.replies_refused;
        self
    }
}

/// One counter: its name, what it counts, and where it is in [`Counters`].
pub struct Field {
    pub name: &'static str,
    pub help: &'static str,
    pub get: fn(&Counters) -> u64,
}

macro_rules! fields {
    ($($name:ident: $help:literal),* $(,)?) => {
        [$(Field { name: stringify!($name), help: $help, get: |c| c.$name }),*]
    };
}

/// The counters every API (`/status`, `/metrics`, the dashboard, Python) names, in the
/// order they list them, with what each counts.
pub const FIELDS: [Field; 23] = fields![
    datagrams: "Datagrams read from the data ports",
    placed: "Datagrams placed into frames",
    bytes_placed: "Payload bytes placed",
    landed_in_place: "Placed datagrams the kernel wrote at their destination",
    copied: "Placed datagrams copied once by placement",
    evacuated: "Of the copied: moved out of a wrongly predicted cell first (two copies)",
    frames_complete: "Frames completed",
    frames_incomplete: "Incomplete frames kept",
    frames_discarded: "Incomplete frames discarded",
    frames_refused: "Frames refused whole because the ring was full (consumer behind)",
    cells_missing: "Datagram cells missing in incomplete frames",
    kernel_drops: "Datagrams the kernel dropped (socket buffer full), as of the last finished acquisition",
    seq_missing: "Sequence numbers the loss windows declared missing",
    seq_recovered: "Declared-missing sequence numbers that arrived afterwards",
    nacks_sent: "Retransmission requests sent (RoCEv2: sequence-error NAKs)",
    acks_sent: "RoCEv2 acknowledgements sent",
    replies_refused: "RoCEv2 ACKs and NAKs the interface's queue refused (lost)",
    nack_ranges_dropped: "Missing ranges not asked for (queue full, rate limit, send failed)",
    placed_retransmitted: "Retransmitted datagrams placed",
    redundant: "Retransmissions no longer needed",
    frames_recovered: "Frames completed by retransmission",
    frames_given_up: "Frames left incomplete after retransmission requests",
    loss_reports_dropped: "Loss reports not delivered (consumer behind)",
];

impl Counters {
    /// As JSON, the shape `/status`, the stop answer, the dashboard and Python show: every
    /// field of [`FIELDS`], the drops in total and by reason, and the ring.
    pub fn to_json(&self) -> serde_json::Value {
        let mut m: serde_json::Map<String, serde_json::Value> = FIELDS.iter().map(|f| (f.name.to_string(), (f.get)(self).into())).collect();
        m.insert("dropped".into(), self.dropped_total().into());
        let by_reason: serde_json::Map<String, serde_json::Value> = self.drops_by_reason().into_iter().map(|(r, n)| (r.to_string(), n.into())).collect();
        m.insert("dropped_by_reason".into(), by_reason.into());
        m.insert("ring".into(), serde_json::json!({ "slots": self.slots, "filling": self.slots_filling, "handed": self.slots_handed }));
        m.into()
    }
}

impl fmt::Display for Counters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "datagrams {} placed {} ({} in place) dropped {} frames complete {} incomplete {} discarded {} refused {} kernel_drops {}",
            self.datagrams,
            self.placed,
            self.landed_in_place,
            self.dropped_total(),
            self.frames_complete,
            self.frames_incomplete,
            self.frames_discarded,
            self.frames_refused,
            self.kernel_drops
        )?;
        for (name, n) in self.drops_by_reason() {
            write!(f, " {name}={n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod json_tests {
    use super::*;

    #[test]
    fn each_counter_has_one_name_and_reads_its_own_field() {
        let names: std::collections::BTreeSet<_> = FIELDS.iter().map(|f| f.name).collect();
        assert_eq!(names.len(), FIELDS.len(), "names are unique");
        let c = Counters { frames_complete: 7, kernel_drops: 3, nacks_sent: 5, slots: 8, slots_handed: 2, ..Counters::default() };
        let j = c.to_json();
        assert_eq!(j.as_object().unwrap().len(), FIELDS.len() + 3);
        assert_eq!((j["frames_complete"].as_u64(), j["kernel_drops"].as_u64(), j["nacks_sent"].as_u64()), (Some(7), Some(3), Some(5)));
        assert_eq!(j["ring"], serde_json::json!({ "slots": 8, "filling": 0, "handed": 2 }));
        assert_eq!(j["dropped_by_reason"], serde_json::json!({}));
    }
}
