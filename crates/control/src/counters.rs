//! A receiver's counters as every API names them: one table feeds `/status`, the stop
//! answer, the dashboard and `/metrics` (as `rdaq_<name>_total`, with its help text).

use rdaq_receiver::Counters;

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

/// The receiver's counters, in the order the APIs list them.
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

/// The counters as JSON: every field, the drops in total and by reason, and the ring.
pub fn json(c: &Counters) -> serde_json::Value {
    let mut m: serde_json::Map<String, serde_json::Value> = FIELDS.iter().map(|f| (f.name.to_string(), (f.get)(c).into())).collect();
    m.insert("dropped".into(), c.dropped_total().into());
    let by_reason: serde_json::Map<String, serde_json::Value> = c.drops_by_reason().into_iter().map(|(r, n)| (r.to_string(), n.into())).collect();
    m.insert("dropped_by_reason".into(), by_reason.into());
    m.insert("ring".into(), serde_json::json!({ "slots": c.slots, "filling": c.slots_filling, "handed": c.slots_handed }));
    m.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_counter_has_one_name_and_reads_its_own_field() {
        let names: std::collections::BTreeSet<_> = FIELDS.iter().map(|f| f.name).collect();
        assert_eq!(names.len(), FIELDS.len(), "names are unique");
        let c = Counters { frames_complete: 7, kernel_drops: 3, nacks_sent: 5, slots: 8, slots_handed: 2, ..Counters::default() };
        let j = json(&c);
        assert_eq!(j.as_object().unwrap().len(), FIELDS.len() + 3);
        assert_eq!((j["frames_complete"].as_u64(), j["kernel_drops"].as_u64(), j["nacks_sent"].as_u64()), (Some(7), Some(3), Some(5)));
        assert_eq!(j["ring"], serde_json::json!({ "slots": 8, "filling": 0, "handed": 2 }));
        assert_eq!(j["dropped_by_reason"], serde_json::json!({}));
    }
}
