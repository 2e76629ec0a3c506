//! Loss, corruption and retransmission end to end over loopback: the emulator's fault
//! injector spoils the stream; with a history every frame is recovered bit-exact; without
//! one, each frame that could not be recovered is reported with exactly the cells the
//! injector dropped, marked under the keep policy.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rdaq_emulator::{Control, EmulatorConfig, EmulatorReport, Fate, FaultConfig, Faults};
use rdaq_proto::telegram::ModuleDtp;
use rdaq_receiver::{FrameStatus, MISSING_BYTE};
use rdaq_receiver::{Counters, DropReason, IncompletePolicy, Receiver, ReceiverConfig};

const FRAME_BYTES: u64 = 64 * 1024;
const CELL: u32 = 8192;
const CELLS: u32 = (FRAME_BYTES / CELL as u64) as u32;

/// One loopback acquisition between an emulated module and a checksumming receiver; per
/// frame handed on: (status, missing cells, xxh3, whether missing cells hold the mark).
type Seen = HashMap<u64, (FrameStatus, Vec<u32>, u64, bool)>;

fn acquire(frames: u64, history_frames: u64, faults: FaultConfig) -> (Seen, EmulatorReport, Counters) {
    let mut rx = Receiver::start(ReceiverConfig {
        data_port: 0,
        module_bytes: FRAME_BYTES,
        payload_bytes: CELL,
        // more slots than frames: no frame waiting for its timeout is overtaken in the ring
        slots: 512,
        checksum: true,
        policy: IncompletePolicy::Keep,
        frame_timeout: Duration::from_millis(400),
        linger: Duration::from_millis(100),
        ..ReceiverConfig::default()
    })
    .unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], rx.ports()[0]));
    let dtp = ModuleDtp::single(rx.buffer_map(), 0, addr);
    let cfg = EmulatorConfig {
        frames,
        rate_hz: Some(2000.0),
        module_bytes: FRAME_BYTES,
        history_bytes: history_frames * FRAME_BYTES,
        faults: Some(faults),
        ..EmulatorConfig::default()
    };
    let (report, seen) = std::thread::scope(|s| {
        let consumer = s.spawn(|| {
            let mut seen = Seen::new();
            for f in rx.frames().iter() {
                if f.status() == FrameStatus::Discarded {
                    continue;
                }
                let data = rx.data(&f).unwrap();
                let marked = f.missing().iter().all(|&c| {
                    let at = (c * CELL) as usize;
                    data[at..at + CELL as usize].iter().all(|&b| b == MISSING_BYTE)
                });
                seen.insert(f.frame(), (f.status(), f.missing().to_vec(), xxhash_rust::xxh3::xxh3_64(data), marked));
                rx.release(f).unwrap();
            }
            seen
        });
        let report = rdaq_emulator::run(&cfg, &[dtp], Arc::new(Control::default())).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        rx.stop();
        (report, consumer.join().unwrap())
    });
    let counters = rx.join().unwrap();
    assert!(rx.guards_intact());
    (seen, report, counters)
}

#[test]
fn lost_and_corrupted_datagrams_are_recovered_bit_exact() {
    let faults = FaultConfig { seed: 11, loss: 0.02, burst: 3.0, corrupt: 0.005, reorder: 0.02, duplicate: 0.005, ..FaultConfig::default() };
    let (seen, report, c) = acquire(400, 256, faults);
    assert!(report.faults.dropped > 20 && report.faults.corrupted > 3, "{:?}", report.faults);
    for e in &report.manifest {
        let (status, missing, hash, _) = seen.get(&e.frame).unwrap_or_else(|| panic!("frame {} never handed on: {c}", e.frame));
        assert_eq!(*status, FrameStatus::Complete, "frame {} missing {missing:?}: {c}", e.frame);
        assert_eq!(*hash, e.xxh3, "frame {} bytes", e.frame);
    }
    assert_eq!(c.dropped(DropReason::BadChecksum), report.faults.corrupted, "every corruption caught: {c}");
    assert!(c.placed_retransmitted >= report.faults.dropped, "{c}");
    assert!(c.frames_recovered > 0 && c.nacks_sent > 0 && c.frames_given_up == 0, "{c}");
    assert_eq!(report.retransmit.history_misses, 0);
}

#[test]
fn without_a_history_each_loss_is_reported_exactly() {
    let faults = FaultConfig { seed: 5, loss: 0.01, burst: 2.0, ..FaultConfig::default() };
    let frames = 300u64;
    let (seen, report, c) = acquire(frames, 0, faults.clone());
    // the injector's first-transmission fates are a pure function of the seed: the cells it
    // dropped are known exactly (one channel, sequence number = frame * CELLS + cell)
    let f = Faults::new(&faults, 0);
    let mut dropped: HashMap<u64, BTreeSet<u32>> = HashMap::new();
    for seq in 0..(frames as u32 * CELLS) {
        if f.fate(seq, 0) == Fate::Drop {
            dropped.entry((seq / CELLS) as u64).or_default().insert(seq % CELLS);
        }
    }
    assert!(!dropped.is_empty());
    for frame in 0..frames {
        let lost = dropped.get(&frame).cloned().unwrap_or_default();
        match seen.get(&frame) {
            None => assert_eq!(lost.len() as u32, CELLS, "frame {frame} was never seen, so all of it was lost"),
            Some((status, missing, _, marked)) => {
                assert_eq!(missing.iter().copied().collect::<BTreeSet<u32>>(), lost, "frame {frame}");
                assert_eq!(*status == FrameStatus::Complete, lost.is_empty(), "frame {frame}");
                assert!(marked, "frame {frame}: missing cells hold the missing byte");
            }
        }
    }
    let incomplete = dropped.values().filter(|l| (l.len() as u32) < CELLS).count() as u64;
    assert_eq!(c.frames_incomplete, incomplete, "{c}");
    assert_eq!(report.retransmit.resent, 0);
    assert!(c.nacks_sent > 0 && c.frames_given_up > 0, "requests were made and given up: {c}");
}
