//! The fuzz target of the receive path: a time-bounded loop that drives the datagram and
//! NACK decoders and placement (with and without checksums) with arbitrary and mutated
//! datagrams and checks, after every one, the bounds invariant: the guard regions are
//! intact, a placed datagram changes exactly its cell, and nothing else changes except the
//! missing cells of a frame that its arrival finished (a newer frame overtaking it in the
//! ring), which are marked with the missing byte.
//!
//! CI runs it for a few seconds; a long run (its command is in the README):
//! `RDAQ_FUZZ_SECS=600 cargo test --release -p rdaq-receiver --test fuzz -- --nocapture`.
//! `RDAQ_FUZZ_SEED` repeats a run; a failure prints the seed and the datagram.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdaq_proto::datagram::{checksum, Flags, Header, CHECKSUM_LEN, HEADER_LEN};
use rdaq_receiver::arena::Arena;
use rdaq_receiver::grid::Grid;
use rdaq_receiver::placement::Placement;
use rdaq_receiver::source::SourceKind;
use rdaq_receiver::{FrameReady, FrameStatus, MISSING_BYTE};
use rdaq_receiver::IncompletePolicy;

const MODULES: u16 = 2;
const MODULE_BYTES: u64 = 3500;
const CELL: u64 = 1000;
const SLOTS: usize = 3;
const BASE: u32 = 10;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// A valid datagram for a random cell (the last cell of a module is short), with or without
/// the checksum extension.
fn valid(rng: &mut Rng, with_checksum: bool, epoch: u64) -> Vec<u8> {
    let slot = rng.below(SLOTS as u64) as u32;
    let module = rng.below(MODULES as u64) as u16;
    let grid = Grid::new(MODULES, MODULE_BYTES, CELL);
    let k = rng.below(grid.cells_per_module as u64) as u32;
    let cell = module as u32 * grid.cells_per_module + k;
    let len = grid.cell_len(cell) as usize;
    let h = Header {
        flags: if with_checksum { Flags::CHECKSUM } else { Flags::empty() }.with(if rng.below(4) == 0 { Flags::RETRANSMIT } else { Flags::empty() }),
        module,
        buffer: BASE + slot,
        key: 0x5eed_0000 + slot,
        offset: grid.cell_offset(cell),
        length: len as u32,
        seq: rng.next() as u32,
        frame: epoch + rng.below(6),
        dataset: 0,
        imm: 0,
    };
    let hl = h.header_len();
    let mut d = vec![0u8; hl + len];
    let fill = rng.next() as u8;
    d[hl..].fill(fill);
    h.encode((&mut d[..HEADER_LEN]).try_into().unwrap());
    if with_checksum {
        let head: [u8; HEADER_LEN] = d[..HEADER_LEN].try_into().unwrap();
        let c = checksum(&head, &d[hl..]);
        d[HEADER_LEN..HEADER_LEN + CHECKSUM_LEN].copy_from_slice(&c.to_le_bytes());
    }
    d
}

/// Applies a few random mutations: bit flips, byte sets, interesting values in header
/// fields, cuts, extensions.
fn mutate(rng: &mut Rng, d: &mut Vec<u8>) {
    for _ in 0..rng.below(4) {
        match rng.below(6) {
            0 if !d.is_empty() => {
                let i = rng.below(d.len() as u64) as usize;
                d[i] ^= 1 << rng.below(8);
            }
            1 if !d.is_empty() => {
                let i = rng.below(d.len().min(HEADER_LEN + CHECKSUM_LEN) as u64) as usize;
                d[i] = rng.next() as u8;
            }
            2 if d.len() >= HEADER_LEN => {
                // a header field set to a boundary value
                let fields = [(6, 2), (8, 4), (12, 4), (16, 8), (24, 4), (28, 4), (32, 8), (40, 2)];
                let (at, n) = fields[rng.below(fields.len() as u64) as usize];
                let vals = [0u64, 1, u64::MAX, MODULE_BYTES, MODULE_BYTES * MODULES as u64, CELL, CELL - 1, BASE as u64, rng.next()];
                let v = vals[rng.below(vals.len() as u64) as usize];
                d[at..at + n].copy_from_slice(&v.to_le_bytes()[..n]);
            }
            3 => {
                let n = rng.below(d.len() as u64 + 1) as usize;
                d.truncate(n);
            }
            4 => {
                for _ in 0..rng.below(80) {
                    d.push(rng.next() as u8);
                }
            }
            _ => {}
        }
    }
}

/// Copies every slot (they are contiguous) into `out`.
fn snapshot(arena: &Arena, out: &mut Vec<u8>) {
    // SAFETY: only this thread uses the arena and no slot is being written; the slots are
    // contiguous from slot 0 on.
    let all = unsafe { std::slice::from_raw_parts(arena.slot_ptr(0), SLOTS * arena.slot_bytes()) };
    out.clear();
    out.extend_from_slice(all);
}

/// One placement under test, with or without checksums, and the frames it handed on.
struct Lane {
    arena: Arc<Arena>,
    p: Placement,
    checksum: bool,
    handed: Vec<FrameReady>,
}

/// The ring's bytes before and after a datagram, and which of them may have changed.
#[derive(Default)]
struct Memory {
    before: Vec<u8>,
    after: Vec<u8>,
    marked: Vec<bool>,
}

/// Places datagram `d` on the lane and checks that the guards hold and that no byte
/// changed outside the placed cell and the marked missing cells of frames it finished.
/// Returns whether it was placed; `ctx` describes the case for a failure.
fn place_and_check(l: &mut Lane, m: &mut Memory, d: &[u8], ctx: &dyn Fn(&str) -> String) -> bool {
    let grid = *l.p.grid();
    snapshot(&l.arena, &mut m.before);
    let r = l.p.place_datagram(d, SourceKind::Rdaq, Instant::now());
    let ctx = || ctx(&format!("{r:?}"));
    assert!(l.arena.guards_intact(), "guards: {}", ctx());
    snapshot(&l.arena, &mut m.after);
    let cell_range = |slot: u32, cell: u32| {
        let off = slot as usize * grid.slot_bytes() as usize + grid.cell_offset(cell) as usize;
        off..off + grid.cell_len(cell) as usize
    };
    m.marked.clear();
    m.marked.resize(m.after.len(), false);
    for f in l.p.take_ready() {
        assert!(f.status() != FrameStatus::Incomplete || !f.missing().is_empty(), "{}", ctx());
        if f.status() == FrameStatus::Incomplete {
            for &c in f.missing() {
                let r = cell_range(f.slot(), c);
                assert!(m.after[r.clone()].iter().all(|&b| b == MISSING_BYTE), "missing cell not marked: {}", ctx());
                m.marked[r].fill(true);
            }
        }
        if f.status() != FrameStatus::Discarded {
            l.handed.push(f);
        }
    }
    if let Ok(t) = r {
        let r = cell_range(t.slot, t.cell);
        let hl = if l.checksum { HEADER_LEN + CHECKSUM_LEN } else { HEADER_LEN };
        assert_eq!(&m.after[r.clone()], &d[hl..], "{}", ctx());
        m.marked[r].fill(true);
    }
    let stray = (0..m.after.len()).find(|&i| m.after[i] != m.before[i] && !m.marked[i]);
    assert!(stray.is_none(), "byte {stray:?} changed outside the placed cell and marked cells: {}", ctx());
    r.is_ok()
}

#[test]
fn fuzz_decoders_and_placement() {
    let secs = env("RDAQ_FUZZ_SECS").unwrap_or(3);
    let seed = env("RDAQ_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) ^ std::process::id() as u64
    });
    let mut rng = Rng(seed | 1);
    let grid = Grid::new(MODULES, MODULE_BYTES, CELL);
    let keys: Vec<u32> = (0..SLOTS as u32).map(|i| 0x5eed_0000 + i).collect();
    let mut lanes: Vec<Lane> = [false, true]
        .into_iter()
        .map(|checksum| {
            let arena = Arc::new(Arena::new(SLOTS, grid.slot_bytes() as usize).unwrap());
            let p = Placement::new(arena.clone(), grid, &[0, 1], BASE, keys.clone(), IncompletePolicy::Keep, 8).with_checksum(checksum);
            Lane { arena, p, checksum, handed: Vec::new() }
        })
        .collect();
    let mut mem = Memory::default();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut cases, mut placed) = (0u64, 0u64);
    while Instant::now() < deadline {
        for _ in 0..256 {
            let lane = rng.below(2) as usize;
            let l = &mut lanes[lane];
            let mut d = if rng.below(8) == 0 {
                (0..rng.below(1200)).map(|_| rng.next() as u8).collect()
            } else {
                let with_checksum = if rng.below(16) == 0 { !l.checksum } else { l.checksum };
                valid(&mut rng, with_checksum, cases / 64)
            };
            mutate(&mut rng, &mut d);
            let _ = Header::parse(&d);
            let _ = rdaq_proto::nack::decode(&d).map(|(_, e)| e.count());
            let ctx = |r: &str| format!("seed {seed} case {cases} lane {lane}: {r} datagram {d:02x?}");
            placed += place_and_check(l, &mut mem, &d, &ctx) as u64;
            cases += 1;
        }
        // let frames finish and slots come back, so that every slot state is exercised
        for l in lanes.iter_mut() {
            if rng.below(4) == 0 {
                l.p.finish_all();
                l.handed.extend(l.p.take_ready().filter(|f| f.status() != FrameStatus::Discarded));
            }
            for f in l.handed.drain(..) {
                l.p.release(f).expect("a handed frame can be released");
            }
        }
    }
    println!("fuzz: {cases} datagrams in {secs} s (seed {seed}), {placed} placed, all within their cells");
    assert!(placed > 0 && cases > placed, "the generator reaches both outcomes");
}
