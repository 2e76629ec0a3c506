//! Re-planning when receivers stop answering: the frames still to come over the receivers
//! left, where the transfer mode allows it with the buffers they already have.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;

use rdaq_manager::{Epoch, Plan, Topology};
use rdaq_proto::telegram::ModuleDtp;

use super::client::Api;
use super::session::Configured;
use crate::detector::DtpUpload;

/// Why there is no new plan: no receiver is left (the acquisition cannot go on), or the
/// receivers left cannot take the frames of those gone (theirs are lost; the run goes on).
pub(super) enum Replan {
    NoneLeft(String),
    Refused(String),
}

/// Re-plans the frames still to come over the receivers left, if the transfer mode allows it
/// with the buffers they already have. Returns the new epoch, or why there is none.
pub(super) fn replan(api: &Api, det_ctl: SocketAddr, t: &Topology, c: &Configured, live: &[usize], dead: &BTreeSet<String>, frontier: u64) -> Result<Epoch, Replan> {
    let reason = format!("{} stopped answering", dead.iter().cloned().collect::<Vec<_>>().join(", "));
    if live.is_empty() {
        return Err(Replan::NoneLeft(reason));
    }
    let mut t2 = t.clone();
    t2.transfer.receivers = Some(live.iter().map(|&r| t.receivers[r].name.clone()).collect());
    let plan2 = Plan::new(&t2).map_err(|e| Replan::Refused(format!("cannot re-plan over the receivers left ({e}); their frames are lost")))?;
    // only plans that keep every remaining receiver's buffers as they are
    let mut maps2 = Vec::new();
    for (rp, (_, req2)) in plan2.receivers.iter().zip(plan2.buffer_requests(&t2)) {
        match c.requests.iter().position(|(r, req)| *r == rp.receiver && *req == req2) {
            Some(i) => maps2.push(c.maps[i].clone()),
            None => return Err(Replan::Refused(format!("re-planning would change {}'s buffers during the run; not re-planned", t.receivers[rp.receiver].name))),
        }
    }
    let receivers = t2.transfer.receivers.clone().unwrap_or_default();
    let mut from = frontier + 2;
    for _ in 0..10 {
        let positions = ring_positions(&c.epochs.last().expect("initial epoch").dtps, from);
        let dtps = plan2.module_dtps_from(&t2, &maps2, from, |name| positions.get(name).copied().unwrap_or(0)).map_err(|e| Replan::Refused(format!("cannot re-plan: {e}")))?;
        match api.send::<serde_json::Value>("PUT", det_ctl, "/dtp", &DtpUpload { from_frame: Some(from), dtps: dtps.clone() }) {
            Ok(_) => return Ok(Epoch { from_frame: from, receivers, reason, dtps }),
            Err(e) => {
                tracing::warn!(from_frame = from, "re-plan refused ({e:#}), trying later");
                from += 5;
            }
        }
    }
    Err(Replan::Refused("the detector refused every re-plan; the dead receivers' frames are lost".into()))
}

/// Where each receiver's ring stands at frame `until` under `dtps` (over all modules).
pub(super) fn ring_positions(dtps: &[ModuleDtp], until: u64) -> HashMap<String, u64> {
    let mut pos = HashMap::new();
    for d in dtps {
        for (name, k) in d.ring_next(until) {
            let e = pos.entry(name.to_string()).or_insert(0);
            *e = (*e).max(k);
        }
    }
    pos
}
