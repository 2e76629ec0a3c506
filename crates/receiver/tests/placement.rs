//! Placement without sockets: every hostile datagram is dropped with its reason and writes
//! nothing; incomplete frames follow the policy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rdaq_proto::datagram::{Flags, Header, HEADER_LEN};
use rdaq_receiver::arena::Arena;
use rdaq_receiver::grid::Grid;
use rdaq_receiver::placement::Placement;
use rdaq_receiver::source::SourceKind;
use rdaq_receiver::{FrameError, FrameStatus, MISSING_BYTE};
use rdaq_receiver::{DropReason, IncompletePolicy};

const MODULES: u16 = 2;
const MODULE_BYTES: u64 = 4 * 1000;
const CELL: u64 = 1000;
const SLOTS: usize = 3;
const BASE: u32 = 10;

fn setup(policy: IncompletePolicy) -> (Arc<Arena>, Placement) {
    let grid = Grid::new(MODULES, MODULE_BYTES, CELL);
    let arena = Arc::new(Arena::new(SLOTS, grid.slot_bytes() as usize).unwrap());
    let keys = (0..SLOTS as u32).map(|i| 0xabc0 + i).collect();
    (arena.clone(), Placement::new(arena, grid, &[0, 1], BASE, keys, policy, 8))
}

fn datagram(slot: u32, module: u16, cell_in_module: u64, frame: u64, fill: u8) -> Vec<u8> {
    let h = Header {
        flags: Flags::empty(),
        module,
        buffer: BASE + slot,
        key: 0xabc0 + slot,
        offset: module as u64 * MODULE_BYTES + cell_in_module * CELL,
        length: CELL as u32,
        seq: 0,
        frame,
        dataset: 0,
        imm: 0,
    };
    let mut d = vec![fill; HEADER_LEN + CELL as usize];
    h.encode((&mut d[..HEADER_LEN]).try_into().unwrap());
    d
}

fn snapshot(arena: &Arena) -> Vec<u8> {
    // SAFETY: placement writes only in the test's own calls, none of which runs while the
    // slices live.
    (0..SLOTS).flat_map(|i| unsafe { arena.slot(i) }.to_vec()).collect()
}

#[test]
fn a_full_frame_completes_with_exact_bytes() {
    let (arena, mut p) = setup(IncompletePolicy::Keep);
    let now = Instant::now();
    for m in 0..MODULES {
        for c in (0..4).rev() {
            p.place_datagram(&datagram(1, m, c, 7, (m as u8) * 10 + c as u8), SourceKind::Rdaq, now).unwrap();
        }
    }
    let mut ready: Vec<_> = p.take_ready().collect();
    assert_eq!(ready.len(), 1);
    let f = ready.pop().unwrap();
    assert_eq!((f.slot(), f.frame(), f.status()), (1, 7, FrameStatus::Complete));
    let data = p.data(&f).unwrap();
    // SAFETY: as in `snapshot`.
    assert_eq!(data.as_ptr(), unsafe { arena.slot(1) }.as_ptr());
    for m in 0..MODULES as usize {
        for c in 0..4 {
            let at = m * MODULE_BYTES as usize + c * CELL as usize;
            assert!(data[at..at + CELL as usize].iter().all(|&b| b == (m as u8) * 10 + c as u8));
        }
    }
    assert_eq!(p.counters.placed, 8);
    p.release(f).unwrap();
}

#[test]
fn a_frame_of_another_placement_is_neither_read_nor_released() {
    let (_, mut a) = setup(IncompletePolicy::Keep);
    let (_, mut b) = setup(IncompletePolicy::Keep);
    let now = Instant::now();
    for p in [&mut a, &mut b] {
        for m in 0..MODULES {
            for c in 0..4 {
                p.place_datagram(&datagram(1, m, c, 7, 1), SourceKind::Rdaq, now).unwrap();
            }
        }
    }
    let (fa, fb) = (a.take_ready().next().unwrap(), b.take_ready().next().unwrap());
    assert_eq!((fa.slot(), fa.frame()), (fb.slot(), fb.frame()), "the same slot and frame in both");
    assert_eq!(b.data(&fa), Err(FrameError::OtherReceiver { frame: 7 }));
    assert_eq!(b.release(fa), Err(FrameError::OtherReceiver { frame: 7 }));
    // b's slot is still handed: a datagram of a newer frame for it is refused, not written
    assert_eq!(b.place_datagram(&datagram(1, 0, 0, 10, 2), SourceKind::Rdaq, now), Err(DropReason::RingFull));
    assert!(b.data(&fb).unwrap().iter().all(|&x| x == 1));
    b.release(fb).unwrap();
}

#[test]
fn a_discarded_frame_has_no_data() {
    let (_, mut p) = setup(IncompletePolicy::Discard);
    p.place_datagram(&datagram(0, 0, 0, 3, 1), SourceKind::Rdaq, Instant::now()).unwrap();
    p.finish_all();
    let f = p.take_ready().next().unwrap();
    assert_eq!(f.status(), FrameStatus::Discarded);
    assert_eq!(p.data(&f), Err(FrameError::Discarded { frame: 3 }));
    p.release(f).unwrap();
}

#[test]
fn hostile_datagrams_are_dropped_by_reason_and_write_nothing() {
    let (arena, mut p) = setup(IncompletePolicy::Keep);
    let now = Instant::now();
    let before = snapshot(&arena);
    let good = datagram(0, 0, 0, 1, 0x55);
    let mut cases: Vec<(Vec<u8>, DropReason)> = Vec::new();
    cases.push((good[..20].to_vec(), DropReason::Truncated));
    cases.push((good[..HEADER_LEN + 10].to_vec(), DropReason::LengthMismatch));
    cases.push(({ let mut d = good.clone(); d.push(0); d }, DropReason::LengthMismatch));
    cases.push(({ let mut d = good.clone(); d[0] = b'X'; d }, DropReason::BadMagic));
    cases.push(({ let mut d = good.clone(); d[4] = 2; d }, DropReason::BadVersion));
    cases.push(({ let mut d = good.clone(); d[5] = 0x40; d }, DropReason::BadHeader));
    cases.push(({ let mut d = good.clone(); d[12] ^= 1; d }, DropReason::BadKey));
    cases.push(({ let mut d = good.clone(); d[8..12].copy_from_slice(&(BASE + 99).to_le_bytes()); d }, DropReason::UnknownBuffer));
    cases.push(({ let mut d = good.clone(); d[8..12].copy_from_slice(&(BASE - 1).to_le_bytes()); d }, DropReason::UnknownBuffer));
    let oob = MODULES as u64 * MODULE_BYTES - CELL / 2;
    cases.push(({ let mut d = good.clone(); d[16..24].copy_from_slice(&oob.to_le_bytes()); d }, DropReason::OutOfBounds));
    cases.push(({ let mut d = good.clone(); d[16..24].copy_from_slice(&(u64::MAX - 10).to_le_bytes()); d }, DropReason::OutOfBounds));
    cases.push(({ let mut d = good.clone(); d[16..24].copy_from_slice(&7u64.to_le_bytes()); d }, DropReason::Misaligned));
    cases.push(({ let mut d = good.clone(); d[16..24].copy_from_slice(&MODULE_BYTES.to_le_bytes()); d }, DropReason::Misaligned));
    cases.push(({ let mut d = good.clone(); d[6..8].copy_from_slice(&5u16.to_le_bytes()); d }, DropReason::UnknownModule));
    cases.push(({ let mut d = good.clone(); d[40] = 1; d }, DropReason::UnknownDataset));
    cases.push((vec![0u8; 3000], DropReason::BadMagic));
    for (d, reason) in &cases {
        assert_eq!(p.place_datagram(d, SourceKind::Rdaq, now), Err(*reason), "case {reason:?}");
    }
    assert_eq!(snapshot(&arena), before, "no byte of any buffer changed");
    assert!(arena.guards_intact());
    for r in DropReason::ALL {
        let expect = cases.iter().filter(|(_, c)| *c == r).count() as u64;
        assert_eq!(p.counters.dropped(r), expect, "{r:?}");
    }
    assert_eq!(p.counters.placed, 0);
    assert_eq!(p.counters.datagrams, cases.len() as u64);

    // duplicates and stale frames
    p.place_datagram(&good, SourceKind::Rdaq, now).unwrap();
    assert_eq!(p.place_datagram(&datagram(0, 0, 0, 1, 0x66), SourceKind::Rdaq, now), Err(DropReason::Duplicate));
    assert_eq!(p.place_datagram(&datagram(0, 0, 1, 0, 0x66), SourceKind::Rdaq, now), Err(DropReason::Stale));
    // SAFETY: as in `snapshot`.
    assert!(unsafe { arena.slot(0) }[..CELL as usize].iter().all(|&b| b == 0x55), "first copy wins");
}

#[test]
fn incomplete_frames_keep_marks_missing_cells() {
    let (_, mut p) = setup(IncompletePolicy::Keep);
    let t0 = Instant::now();
    for c in [0, 1, 3] {
        p.place_datagram(&datagram(2, 0, c, 5, 0x11), SourceKind::Rdaq, t0).unwrap();
    }
    p.place_datagram(&datagram(2, 1, 0, 5, 0x22), SourceKind::Rdaq, t0).unwrap();
    p.expire(t0 + Duration::from_millis(10), Duration::from_millis(100), &[]);
    assert_eq!(p.take_ready().count(), 0, "not yet timed out");
    p.expire(t0 + Duration::from_millis(200), Duration::from_millis(100), &[]);
    let f: Vec<_> = p.take_ready().collect();
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].status(), FrameStatus::Incomplete);
    assert_eq!(f[0].missing(), vec![2, 5, 6, 7]);
    assert_eq!(f[0].received_cells(), 4);
    let data = p.data(&f[0]).unwrap();
    let cell = |c: usize| &data[c * CELL as usize..(c + 1) * CELL as usize];
    assert!(cell(2).iter().all(|&b| b == MISSING_BYTE));
    assert!(cell(3).iter().all(|&b| b == 0x11));
    assert!(cell(4).iter().all(|&b| b == 0x22));
    assert!((5..8).all(|c| cell(c).iter().all(|&b| b == MISSING_BYTE)));
    assert_eq!(p.counters.frames_incomplete, 1);
    assert_eq!(p.counters.cells_missing, 4);
    // late datagrams of a handed frame are stale
    assert_eq!(p.place_datagram(&datagram(2, 0, 2, 5, 0), SourceKind::Rdaq, t0), Err(DropReason::Stale));
}

/// A frame whose slot the consumer still holds is refused whole, at its first datagram: its
/// other datagrams are refused even once the slot is free, nothing of it is written, and the
/// next frame for the slot is received whole.
#[test]
fn a_full_ring_refuses_whole_frames() {
    let (arena, mut p) = setup(IncompletePolicy::Keep);
    let t0 = Instant::now();
    let fill = |p: &mut Placement, slot: u32, frame: u64, cells: std::ops::Range<u64>| {
        let mut r = Vec::new();
        for m in 0..MODULES {
            for c in cells.clone() {
                r.push(p.place_datagram(&datagram(slot, m, c, frame, frame as u8), SourceKind::Rdaq, t0));
            }
        }
        r
    };
    assert!(fill(&mut p, 1, 4, 0..4).iter().all(Result::is_ok));
    let held: Vec<_> = p.take_ready().collect();
    assert_eq!(held.len(), 1, "frame 4 is handed and held");
    let before = snapshot(&arena);
    assert!(fill(&mut p, 1, 7, 0..2).iter().all(|r| *r == Err(DropReason::RingFull)));
    held.into_iter().try_for_each(|f| p.release(f)).unwrap();
    assert!(fill(&mut p, 1, 7, 2..4).iter().all(|r| *r == Err(DropReason::RingFull)), "the rest of a refused frame is refused too");
    assert_eq!(snapshot(&arena), before, "nothing of the refused frame was written");
    assert_eq!((p.counters.frames_refused, p.counters.dropped(DropReason::RingFull)), (1, 8));
    assert!(p.ledger.refused.contains(7) && !p.ledger.finished.contains(7) && p.ledger.finished.contains(4));
    assert_eq!(p.take_ready().count(), 0, "no partial frame is handed on");
    assert!(fill(&mut p, 1, 10, 0..4).iter().all(Result::is_ok));
    let f: Vec<_> = p.take_ready().collect();
    assert_eq!((f[0].frame(), f[0].status()), (10, FrameStatus::Complete));
}

/// A frame past its timeout waits while a module it lacks is still sending older frames
/// (late, not lost), and is finished once that module has gone silent for the timeout while
/// the others go on; when every module is quiet, it waits longer.
#[test]
fn expiry_waits_for_a_late_module_not_for_a_silent_one() {
    use rdaq_receiver::source::Source;
    let (_arena, mut p) = setup(IncompletePolicy::Keep);
    let t0 = Instant::now();
    let timeout = Duration::from_millis(100);
    for c in 0..4 {
        p.place_datagram(&datagram(0, 0, c, 9, 1), SourceKind::Rdaq, t0).unwrap();
    }
    let mut sources: Vec<Source> = (0..MODULES).map(|m| Source::new(SourceKind::Rdaq, m, m, p.grid(), None)).collect();
    sources[0].newest_frame = Some(9);
    sources[0].last_data = Some(t0);
    // module 1 is at frame 5 and still sending
    sources[1].newest_frame = Some(5);
    sources[1].last_data = Some(t0 + Duration::from_millis(150));
    p.expire(t0 + Duration::from_millis(200), timeout, &sources);
    assert_eq!(p.take_ready().count(), 0, "module 1 is late, not lost");
    // module 1 has begun frame 9 and is still sending it, slowly
    sources[0].last_data = Some(t0 + Duration::from_millis(240));
    sources[1].newest_frame = Some(9);
    sources[1].last_data = Some(t0 + Duration::from_millis(240));
    p.expire(t0 + Duration::from_millis(245), timeout, &sources);
    assert_eq!(p.take_ready().count(), 0, "module 1 is in the middle of the frame");
    sources[1].last_data = Some(t0 + Duration::from_millis(150));
    // module 1 went silent while module 0 goes on
    sources[0].last_data = Some(t0 + Duration::from_millis(250));
    p.expire(t0 + Duration::from_millis(260), timeout, &sources);
    let f: Vec<_> = p.take_ready().collect();
    assert_eq!((f.len(), f[0].frame(), f[0].status()), (1, 9, FrameStatus::Incomplete));
    assert_eq!(f[0].missing(), vec![4, 5, 6, 7]);
    // when every module is quiet (the detector stalled as a whole) the frame waits longer
    for c in 0..4 {
        p.place_datagram(&datagram(2, 0, c, 11, 1), SourceKind::Rdaq, t0).unwrap();
    }
    sources[0].newest_frame = Some(11);
    sources[0].last_data = Some(t0);
    sources[1].newest_frame = Some(10);
    sources[1].last_data = Some(t0);
    p.expire(t0 + Duration::from_millis(900), timeout, &sources);
    assert_eq!(p.take_ready().count(), 0, "all quiet: wait for the detector to resume");
    p.expire(t0 + timeout * rdaq_receiver::placement::QUIET_FACTOR, timeout, &sources);
    let f: Vec<_> = p.take_ready().collect();
    assert_eq!((f.len(), f[0].frame()), (1, 11), "up to a bound");
    // a module past the frame (it lost the datagrams) is not waited for either, once the
    // detector has been sending again for a timeout: a frame begun before a pause gets a
    // whole timeout of sending after it
    for c in 0..4 {
        p.place_datagram(&datagram(1, 0, c, 10, 1), SourceKind::Rdaq, t0).unwrap();
    }
    let resumed = t0 + Duration::from_millis(1100);
    sources[1].newest_frame = Some(12);
    sources[1].last_data = Some(resumed);
    p.expire(resumed, timeout, &sources);
    assert_eq!(p.take_ready().count(), 0, "the detector has only just resumed");
    sources[1].last_data = Some(resumed + Duration::from_millis(140));
    p.expire(resumed + Duration::from_millis(150), timeout, &sources);
    let f: Vec<_> = p.take_ready().collect();
    assert_eq!((f.len(), f[0].frame()), (1, 10));
}

/// A module never heard from may not have started: its frames wait for it up to the bound
/// of a stalled detector while the other module goes on sending.
#[test]
fn a_module_not_yet_heard_from_is_waited_for_up_to_a_bound() {
    use rdaq_receiver::placement::QUIET_FACTOR;
    use rdaq_receiver::source::Source;
    let (_arena, mut p) = setup(IncompletePolicy::Keep);
    let t0 = Instant::now();
    let timeout = Duration::from_millis(100);
    for c in 0..4 {
        p.place_datagram(&datagram(0, 0, c, 3, 1), SourceKind::Rdaq, t0).unwrap();
    }
    let mut sources: Vec<Source> = (0..MODULES).map(|m| Source::new(SourceKind::Rdaq, m, m, p.grid(), None)).collect();
    sources[0].newest_frame = Some(5);
    for ms in [0u64, 200, 500, 900] {
        sources[0].last_data = Some(t0 + Duration::from_millis(ms));
        p.expire(t0 + Duration::from_millis(ms), timeout, &sources);
    }
    assert_eq!(p.take_ready().count(), 0, "module 1 has not started: late, not lost");
    let end = t0 + timeout * QUIET_FACTOR;
    sources[0].last_data = Some(end);
    p.expire(end, timeout, &sources);
    assert_eq!(p.take_ready().count(), 1, "bounded");
}

#[test]
fn global_module_ids_map_to_slot_positions() {
    let grid = Grid::new(MODULES, MODULE_BYTES, CELL);
    let arena = Arc::new(Arena::new(SLOTS, grid.slot_bytes() as usize).unwrap());
    let keys = (0..SLOTS as u32).map(|i| 0xabc0 + i).collect();
    // this receiver holds modules 6 and 7 of a bigger detector, at positions 0 and 1
    let mut p = Placement::new(arena.clone(), grid, &[6, 7], BASE, keys, IncompletePolicy::Keep, 8);
    let mut d = datagram(0, 1, 2, 4, 0x3c);
    d[6..8].copy_from_slice(&7u16.to_le_bytes());
    let t = p.place_datagram(&d, SourceKind::Rdaq, Instant::now()).unwrap();
    assert_eq!(t.cell, 4 + 2);
    for wrong in [0u16, 1, 5, 8, 600] {
        d[6..8].copy_from_slice(&wrong.to_le_bytes());
        assert_eq!(p.place_datagram(&d, SourceKind::Rdaq, Instant::now()), Err(DropReason::UnknownModule), "module {wrong}");
    }
    // module 6 may not write module 7's part of the slot
    d[6..8].copy_from_slice(&6u16.to_le_bytes());
    assert_eq!(p.place_datagram(&d, SourceKind::Rdaq, Instant::now()), Err(DropReason::Misaligned));
}

#[test]
fn incomplete_frames_discard_frees_the_slot() {
    let (_arena, mut p) = setup(IncompletePolicy::Discard);
    let t0 = Instant::now();
    p.place_datagram(&datagram(0, 0, 0, 3, 1), SourceKind::Rdaq, t0).unwrap();
    // a newer frame for the same slot overtakes the unfinished one
    p.place_datagram(&datagram(0, 0, 0, 6, 1), SourceKind::Rdaq, t0).unwrap();
    let f: Vec<_> = p.take_ready().collect();
    assert_eq!((f.len(), f[0].frame(), f[0].status()), (1, 3, FrameStatus::Discarded));
    assert_eq!(f[0].missing().len(), 7);
    p.finish_all();
    let f: Vec<_> = p.take_ready().collect();
    assert_eq!((f[0].frame(), f[0].status()), (6, FrameStatus::Discarded));
    assert_eq!(p.counters.frames_discarded, 2);
    assert_eq!(p.counters.frames_finished(), 2);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]
    /// The bounds invariant: whatever arrives, nothing outside the buffers changes, and a
    /// dropped datagram changes nothing at all.
    #[test]
    fn arbitrary_bytes_never_escape_the_buffers(
        bytes in proptest::collection::vec(any::<u8>(), 0..1100),
        mutate_valid in any::<bool>(), at in 0usize..48, val: u8, slot in 0u32..4, cell in 0u64..5,
    ) {
        let (arena, mut p) = setup(IncompletePolicy::Keep);
        let d = if mutate_valid {
            let mut d = datagram(slot.min(2), 1, cell.min(3), 9, 0x77);
            d[at] = val;
            d
        } else {
            bytes
        };
        let before = snapshot(&arena);
        let r = p.place_datagram(&d, SourceKind::Rdaq, Instant::now());
        prop_assert!(arena.guards_intact());
        match r {
            Err(_) => prop_assert_eq!(snapshot(&arena), before),
            Ok(t) => {
                // exactly one cell of the named slot changed, and to the payload
                let g = Grid::new(MODULES, MODULE_BYTES, CELL);
                let off = t.slot as usize * g.slot_bytes() as usize + g.cell_offset(t.cell) as usize;
                let after = snapshot(&arena);
                prop_assert_eq!(&after[off..off + CELL as usize], &d[HEADER_LEN..]);
                prop_assert_eq!(&after[..off], &before[..off]);
                prop_assert_eq!(&after[off + CELL as usize..], &before[off + CELL as usize..]);
            }
        }
    }
}

/// A batch longer than the ring must not name any landing twice: two datagrams written into
/// one cell by the kernel would corrupt the one that belongs there (found by the hostile-input
/// test, where floods made batches of 64 on a ring of 32 cells per channel).
#[test]
fn predicted_landings_of_one_batch_are_distinct_even_past_the_ring() {
    use rdaq_receiver::source::Source;
    let (_, p) = setup(IncompletePolicy::Keep);
    let src = Source::new(SourceKind::Rdaq, 1, 1, p.grid(), None);
    let mut out = vec![None; 64];
    p.predict(&src, CELL as usize, &mut out);
    let named: Vec<*mut u8> = out.iter().flatten().copied().collect();
    let mut unique = named.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), named.len(), "a landing named twice");
    assert_eq!(named.len(), SLOTS * (MODULE_BYTES / CELL) as usize, "every cell of the module's ring is named once");
}

/// A batch whose payloads lie where a receive call put them: in the ring (at the cells the
/// prediction named) or elsewhere.
struct Landed<'a> {
    headers: Vec<Vec<u8>>,
    payloads: Vec<&'a [u8]>,
}

impl rdaq_receiver::batch::Batch for Landed<'_> {
    fn count(&self) -> usize {
        self.headers.len()
    }
    fn header(&self, i: usize) -> &[u8] {
        &self.headers[i]
    }
    fn datagram_len(&self, i: usize) -> usize {
        self.headers[i].len() + self.payloads[i].len()
    }
    fn truncated(&self, _: usize) -> bool {
        false
    }
    fn source(&self, _: usize) -> Option<std::net::SocketAddr> {
        None
    }
    fn payload(&self, i: usize) -> &[u8] {
        self.payloads[i]
    }
}

#[test]
fn payloads_landed_in_the_wrong_cells_are_moved_out_before_any_is_placed() {
    // the path of predicted landing: a receive call wrote the payloads of cells 0 and 1 of
    // frame 1 into each other's cells, and cell 2's where it belongs (run under Miri too)
    let (arena, mut p) = setup(IncompletePolicy::Keep);
    let grid = *p.grid();
    let cell_ptr = |c: u32| arena.slot_ptr(1).wrapping_add(grid.cell_offset(c) as usize);
    let landed_at = [1u32, 0, 2];
    for (c, &at) in landed_at.iter().enumerate() {
        // SAFETY: each write fills one whole cell of slot 1, which nothing else uses here.
        unsafe { std::ptr::write_bytes(cell_ptr(at), 0x10 + c as u8, CELL as usize) };
    }
    let headers = (0..3u64).map(|c| datagram(1, 0, c, 1, 0)[..HEADER_LEN].to_vec()).collect();
    // SAFETY: the slices cover whole cells of slot 1 that hold the bytes written above;
    // placement reads them before it writes any cell (that is what is tested).
    let payloads = landed_at.iter().map(|&at| unsafe { std::slice::from_raw_parts(cell_ptr(at).cast_const(), CELL as usize) }).collect();
    let mut src = rdaq_receiver::source::Source::new(SourceKind::Rdaq, 0, 0, &grid, None);
    p.place_batch(&Landed { headers, payloads }, &mut src, Instant::now());
    let c = p.counters;
    assert_eq!((c.placed, c.landed_in_place, c.copied, c.evacuated), (3, 1, 2, 2));
    // SAFETY: placement is done writing; nothing writes the arena while the slice lives.
    let data = unsafe { arena.slot(1) };
    for cell in 0..3usize {
        let bytes = &data[cell * CELL as usize..(cell + 1) * CELL as usize];
        assert!(bytes.iter().all(|&b| b == 0x10 + cell as u8), "cell {cell} holds its own payload");
    }
}
