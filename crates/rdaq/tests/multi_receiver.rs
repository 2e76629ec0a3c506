//! Several receivers on one host (loopback), configured from the system manager's plan:
//! the emulated modules follow their DTPs and every module frame lands exactly where the plan
//! says, bit-exact against the emulator's manifest.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rdaq_detector::MODULE_BYTES;
use rdaq_emulator::{EmulatorConfig, Progress};
use rdaq_manager::{Plan, Topology};
use rdaq_receiver::placement::FrameStatus;
use rdaq_receiver::{Format, Receiver, ReceiverConfig};

const FRAMES: u64 = 12;

fn topology(mode: &str, extra: &str) -> Topology {
    let mut s = format!("[detector]\nmodules = 4\nmodule_cols = 2\n[transfer]\nmode = \"{mode}\"\n{extra}\n");
    for i in 0..2 {
        s += &format!(
            "[[receivers]]\nname = \"dr{i}\"\ncontrol = \"127.0.0.1:{}\"\ndata = \"127.0.0.1\"\ndata_port = 0\nmemory_mib = 32\n",
            7000 + i
        );
    }
    Topology::from_toml(&s).unwrap()
}

/// Per receiver: (frame, status, xxh3 of each module position of the slot).
type Seen = Vec<(u64, FrameStatus, Vec<u64>)>;

fn acquire(t: &Topology) -> (Plan, Vec<Seen>, HashMap<(u64, u16), u64>) {
    let plan = Plan::new(t).unwrap();
    let mut receivers: Vec<Receiver> = plan
        .buffer_requests(t)
        .into_iter()
        .map(|(_, req)| {
            Receiver::start(ReceiverConfig {
                format: Format::Rdaq,
                data_port: req.data_port,
                modules: req.modules.len() as u16,
                module_ids: req.modules.clone(),
                module_bytes: req.module_bytes,
                payload_bytes: req.payload_bytes,
                slots: req.slots as usize,
                linger: Duration::from_millis(300),
                ..ReceiverConfig::default()
            })
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
                        let data = rx.data(&f);
                        let hashes = data.chunks(MODULE_BYTES).map(xxhash_rust::xxh3::xxh3_64).collect();
                        seen.push((f.frame, f.status, hashes));
                        rx.release(f);
                    }
                    seen
                })
            })
            .collect();
        let report = rdaq_emulator::run(&cfg, &dtps, Arc::new(Progress::default())).unwrap();
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
