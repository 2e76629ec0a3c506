//! Several receivers on one host (loopback), configured from the system manager's plan:
//! the emulated modules follow their DTPs and every module frame lands exactly where the plan
//! says, bit-exact against the emulator's manifest.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rdaq_detector::MODULE_BYTES;
use rdaq_emulator::{Control, EmulatorConfig};
use rdaq_manager::{Plan, Topology};
use rdaq_receiver::FrameStatus;
use rdaq_receiver::{Receiver, ReceiverConfig};

const FRAMES: u64 = 12;

/// One acquisition at a time: in parallel on a 2-core machine the module threads fall far
/// enough behind each other to overrun the rings (counted drops, but not what these tests are
/// about).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn topology(mode: &str, extra: &str) -> Topology {
    let mut s = format!("[detector]\nmodules = 4\nmodule_cols = 2\n[transfer]\nmode = \"{mode}\"\n{extra}\n");
    for i in 0..2 {
        s += &format!(
            "[[receivers]]\nname = \"dr{i}\"\ncontrol = \"127.0.0.1:{}\"\ndata = \"127.0.0.1\"\ndata_port = 0\nmemory_mib = 128\n",
            7000 + i
        );
    }
    Topology::from_toml(&s).unwrap()
}

/// Per receiver: (frame, status, xxh3 of each module position of the slot).
type Seen = Vec<(u64, FrameStatus, Vec<u64>)>;

fn acquire(t: &Topology) -> (Plan, Vec<Seen>, HashMap<(u64, u16), u64>) {
    acquire_with(t, |_, _, _, _| {})
}

/// Runs an acquisition; `during(control, plan, maps, dtps)` runs once the emulator started.
fn acquire_with(
    t: &Topology,
    during: impl FnOnce(&Control, &Plan, &[rdaq_proto::telegram::BufferMap], &[rdaq_proto::telegram::ModuleDtp]) + Send,
) -> (Plan, Vec<Seen>, HashMap<(u64, u16), u64>) {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let plan = Plan::new(t).unwrap();
    let mut receivers: Vec<Receiver> = plan
        .buffer_requests(t)
        .into_iter()
        .map(|(_, req)| {
            Receiver::start(ReceiverConfig { linger: Duration::from_millis(300), ..ReceiverConfig::for_request(&req) })
            .unwrap()
        })
        .collect();
    let maps: Vec<_> = receivers.iter().map(|r| r.buffer_map().clone()).collect();
    let dtps = plan.module_dtps(t, &maps).unwrap();
    let cfg = EmulatorConfig { modules: 4, frames: FRAMES, rate_hz: Some(200.0), ..EmulatorConfig::default() };
    let (report, seen) = std::thread::scope(|s| {
        let consumers: Vec<_> = receivers
            .iter()
            .map(|rx| {
                s.spawn(move || {
                    let mut seen = Seen::new();
                    for f in rx.frames().iter() {
                        let data = rx.data(&f).unwrap();
                        let hashes = data.chunks(MODULE_BYTES).map(xxhash_rust::xxh3::xxh3_64).collect();
                        seen.push((f.frame(), f.status(), hashes));
                        rx.release(f).unwrap();
                    }
                    seen
                })
            })
            .collect();
        let control = Arc::new(Control::default());
        let emu = {
            let (control, dtps, cfg) = (control.clone(), &dtps, &cfg);
            s.spawn(move || rdaq_emulator::run(cfg, dtps, control).unwrap())
        };
        during(&control, &plan, &maps, &dtps);
        let report = emu.join().unwrap();
        for rx in &receivers {
            rx.stop();
        }
        (report, consumers.into_iter().map(|c| c.join().unwrap()).collect::<Vec<_>>())
    });
    for rx in receivers.iter_mut() {
        let c = rx.join().unwrap();
        assert_eq!(c.dropped_total(), 0, "{c}");
    }
    let manifest = report.manifest.iter().map(|e| ((e.frame, e.module), e.xxh3)).collect();
    (plan, seen, manifest)
}

#[test]
fn temporal_mode_sends_each_frame_once_to_its_receiver() {
    let t = topology("temporal", "");
    let (plan, seen, manifest) = acquire(&t);
    let mut all_frames = Vec::new();
    for (r, frames) in seen.iter().enumerate() {
        for (frame, status, hashes) in frames {
            assert_eq!(*status, FrameStatus::Complete);
            let mut d = Vec::new();
            plan.destinations(0, *frame, &mut d);
            assert_eq!(d[0].receiver, r, "frame {frame} on the receiver its DTP names");
            for m in 0..4u16 {
                assert_eq!(hashes[m as usize], manifest[&(*frame, m)], "frame {frame} module {m}");
            }
            all_frames.push(*frame);
        }
    }
    all_frames.sort_unstable();
    assert_eq!(all_frames, (0..FRAMES).collect::<Vec<_>>(), "every frame exactly once");
}

#[test]
fn spatial_mode_gives_each_receiver_exactly_its_modules() {
    let t = topology("spatial", "");
    let (plan, seen, manifest) = acquire(&t);
    for (r, frames) in seen.iter().enumerate() {
        let modules = &plan.receivers[r].modules;
        assert_eq!(frames.len() as u64, FRAMES, "receiver {r} sees every frame");
        for (frame, status, hashes) in frames {
            assert_eq!(*status, FrameStatus::Complete);
            assert_eq!(hashes.len(), modules.len());
            for (pos, &m) in modules.iter().enumerate() {
                assert_eq!(hashes[pos], manifest[&(*frame, m)], "receiver {r} frame {frame} module {m}");
            }
        }
    }
    assert_eq!(plan.receivers[0].modules, vec![0, 1]);
}

#[test]
fn broadcast_mode_copies_everything_to_everyone() {
    let t = topology("broadcast", "");
    let (_, seen, manifest) = acquire(&t);
    for frames in &seen {
        assert_eq!(frames.len() as u64, FRAMES);
        for (frame, _, hashes) in frames {
            for m in 0..4u16 {
                assert_eq!(hashes[m as usize], manifest[&(*frame, m)]);
            }
        }
    }
}

#[test]
fn a_dtp_update_moves_the_rest_of_the_run() {
    let t = topology("temporal", "");
    // from frame 6 on, everything to dr1 alone (dr1's buffers do not change: reused)
    let mut t1 = t.clone();
    t1.transfer.receivers = Some(vec!["dr1".into()]);
    let (_, seen, manifest) = acquire_with(&t, |control, plan, maps, dtps| {
        let p1 = Plan::new(&t1).unwrap();
        let dr1 = plan.receivers.iter().position(|rp| t.receivers[rp.receiver].name == "dr1").unwrap();
        assert_eq!(p1.buffer_requests(&t1)[0].1, plan.buffer_requests(&t)[dr1].1, "same request: same buffers");
        // dr1's ring continues after the frames the first plan gave it before frame 6
        let next = dtps[0].ring_next(6);
        let start = |name: &str| next.iter().find(|(n, _)| *n == name).map_or(0, |(_, k)| *k);
        control.update(6, p1.module_dtps_from(&t1, &maps[dr1..dr1 + 1], 6, start).unwrap()).unwrap();
        assert!(control.update(6, Vec::new()).is_err(), "updates go forward");
    });
    let on = |r: usize| -> Vec<u64> {
        let mut v: Vec<u64> = seen[r].iter().map(|s| s.0).collect();
        v.sort_unstable();
        v
    };
    assert_eq!(on(0), vec![0, 2, 4]);
    assert_eq!(on(1), vec![1, 3, 5, 6, 7, 8, 9, 10, 11]);
    for frames in &seen {
        for (frame, status, hashes) in frames {
            assert_eq!(*status, FrameStatus::Complete);
            for m in 0..4u16 {
                assert_eq!(hashes[m as usize], manifest[&(*frame, m)]);
            }
        }
    }
}
