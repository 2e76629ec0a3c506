//! Misuse of the receiver's safe API ends in a clear error, never in undefined behaviour:
//! a batch size out of range, a frame token given to a receiver it did not come from, a
//! batch longer than announced. (A forged token and a second release do not compile: see
//! the `compile_fail` examples of `rdaq_receiver::frame`.)

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdaq_proto::datagram::{Flags, Header, HEADER_LEN};
use rdaq_receiver::arena::Arena;
use rdaq_receiver::batch::Batch;
use rdaq_receiver::engine::MAX_BATCH;
use rdaq_receiver::grid::Grid;
use rdaq_receiver::placement::Placement;
use rdaq_receiver::source::{Source, SourceKind};
use rdaq_receiver::{FrameError, FrameStatus, IncompletePolicy, Receiver, ReceiverConfig, ReceiverError};

const CELL: u32 = 1024;

fn config() -> ReceiverConfig {
    ReceiverConfig { data_port: 0, modules: 1, module_bytes: CELL as u64, payload_bytes: CELL, slots: 2, key_seed: Some(7), ..ReceiverConfig::default() }
}

#[test]
fn a_batch_out_of_range_is_a_configuration_error() {
    for batch in [0, MAX_BATCH + 1] {
        match Receiver::start(ReceiverConfig { batch, ..config() }) {
            Err(e @ ReceiverError::Batch { .. }) => {
                assert_eq!(e.to_string(), format!("invalid receiver configuration: batch {batch} must be 1..={MAX_BATCH}"))
            }
            Err(e) => panic!("batch {batch}: {e}"),
            Ok(_) => panic!("batch {batch} was taken"),
        }
    }
    assert!(Receiver::start(ReceiverConfig { batch: MAX_BATCH, ..config() }).is_ok());
}

/// Sends frame `frame` (one datagram) to the receiver and waits for it.
fn one_frame(rx: &Receiver, frame: u64) -> rdaq_receiver::FrameReady {
    let map = rx.buffer_map();
    let buf = &map.buffers[(frame % map.buffers.len() as u64) as usize];
    let h = Header { flags: Flags::empty(), module: 0, buffer: buf.id, key: buf.key, offset: 0, length: CELL, seq: frame as u32, frame, dataset: 0, imm: 0 };
    let mut d = vec![frame as u8; HEADER_LEN + CELL as usize];
    h.encode((&mut d[..HEADER_LEN]).try_into().unwrap());
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.send_to(&d, SocketAddr::from(([127, 0, 0, 1], map.data_ports[0]))).unwrap();
    rx.frames().recv_timeout(Duration::from_secs(10)).expect("the frame arrives")
}

#[test]
fn a_frame_given_to_another_receiver_is_refused() {
    let (a, b) = (Receiver::start(config()).unwrap(), Receiver::start(config()).unwrap());
    let (fa, fb) = (one_frame(&a, 1), one_frame(&b, 1));
    assert_eq!((fa.slot(), fa.status()), (fb.slot(), FrameStatus::Complete), "the same slot in both");
    assert_eq!(b.data(&fa).unwrap_err(), FrameError::OtherReceiver { frame: 1 });
    assert_eq!(b.release(fa).unwrap_err(), FrameError::OtherReceiver { frame: 1 });
    // b's slot stays b's consumer's: frame 3 needs it and is refused while fb is held
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let map = b.buffer_map();
    let buf = &map.buffers[1];
    let h = Header { flags: Flags::empty(), module: 0, buffer: buf.id, key: buf.key, offset: 0, length: CELL, seq: 3, frame: 3, dataset: 0, imm: 0 };
    let mut d = vec![3u8; HEADER_LEN + CELL as usize];
    h.encode((&mut d[..HEADER_LEN]).try_into().unwrap());
    s.send_to(&d, SocketAddr::from(([127, 0, 0, 1], map.data_ports[0]))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.counters().frames_refused == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(b.counters().frames_refused, 1);
    assert!(b.data(&fb).unwrap().iter().all(|&x| x == 1), "the held frame is untouched");
    b.release(fb).unwrap();
}

/// A batch that claims more datagrams than placement was built for.
struct Long(Vec<u8>);

impl Batch for Long {
    fn count(&self) -> usize {
        9
    }
    fn header(&self, _: usize) -> &[u8] {
        &self.0[..HEADER_LEN]
    }
    fn datagram_len(&self, _: usize) -> usize {
        self.0.len()
    }
    fn truncated(&self, _: usize) -> bool {
        false
    }
    fn source(&self, _: usize) -> Option<SocketAddr> {
        None
    }
    fn payload(&self, _: usize) -> &[u8] {
        &self.0[HEADER_LEN..]
    }
}

#[test]
#[should_panic(expected = "a batch of 9 datagrams, where at most 8 were announced")]
fn a_batch_longer_than_announced_stops_with_a_message() {
    let grid = Grid::new(1, CELL as u64 * 16, CELL as u64);
    let arena = Arc::new(Arena::new(2, grid.slot_bytes() as usize).unwrap());
    let mut p = Placement::new(arena, grid, &[0], 0, vec![1, 2], IncompletePolicy::Keep, 8);
    let mut src = Source::new(SourceKind::Rdaq, 0, 0, &grid, None);
    p.place_batch(&Long(vec![0; HEADER_LEN + CELL as usize]), &mut src, Instant::now());
}

#[test]
#[should_panic(expected = "batch 0 must be 1..=1024")]
fn placement_without_batch_space_is_refused() {
    let grid = Grid::new(1, CELL as u64, CELL as u64);
    let arena = Arc::new(Arena::new(1, grid.slot_bytes() as usize).unwrap());
    Placement::new(arena, grid, &[0], 0, vec![1], IncompletePolicy::Keep, 0);
}

#[test]
fn an_sls_source_naming_cells_outside_its_module_writes_nothing() {
    use rdaq_proto::sls::{SlsHeader, DET_TYPE_JUNGFRAU, JUNGFRAU_PACKET_PAYLOAD, SLS_HEADER_LEN, SLS_HEADER_VERSION};
    let cell = JUNGFRAU_PACKET_PAYLOAD as u64;
    let grid = Grid::new(1, 4 * cell, cell);
    let arena = Arc::new(Arena::new(1, grid.slot_bytes() as usize).unwrap());
    let mut p = Placement::new(arena.clone(), grid, &[0], 0, vec![1], IncompletePolicy::Keep, 8);
    let h = SlsHeader { frame_number: 1, packet_number: 3, det_type: DET_TYPE_JUNGFRAU, version: SLS_HEADER_VERSION, ..SlsHeader::default() };
    let mut d = vec![0x5a; SLS_HEADER_LEN + JUNGFRAU_PACKET_PAYLOAD];
    h.encode((&mut d[..SLS_HEADER_LEN]).try_into().unwrap());
    // a hand-made rule: packets 0..8 of this port go to cells 2.. of a 4-cell module
    let kind = SourceKind::Sls { module: 0, first_cell: 2, first_packet: 0, packets: 8 };
    assert_eq!(p.place_datagram(&d, kind, Instant::now()), Err(rdaq_receiver::DropReason::OutOfBounds));
    assert!(arena.guards_intact());
}

#[test]
fn sls_packets_placed_by_header_land_where_row_column_and_packet_say_or_are_dropped() {
    use rdaq_proto::sls::{SlsHeader, SLS_HEADER_LEN, SLS_HEADER_VERSION};
    use rdaq_receiver::{DropReason, PortGrid};
    // two modules side by side, each 2 x 2 ports of 3 packets of 64 bytes
    let g = PortGrid { det_type: 1, payload: 64, packets: 3, port_rows: 2, port_cols: 2, module_cols: 2 };
    let grid = Grid::new(2, g.module_bytes(), 64);
    let arena = Arc::new(Arena::new(2, grid.slot_bytes() as usize).unwrap());
    let mut p = Placement::new(arena.clone(), grid, &[0, 1], 0, vec![1, 2], IncompletePolicy::Keep, 8);
    let kind = SourceKind::SlsByHeader { port: 0, grid: g };
    let mut x = 99u64;
    let mut next = |n: u64| {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    for _ in 0..2000 {
        let h = SlsHeader {
            frame_number: next(2),
            packet_number: next(5) as u32,
            row: next(4) as u16,
            column: next(6) as u16,
            det_type: [1, 1, 1, 3][next(4) as usize],
            version: SLS_HEADER_VERSION,
            ..SlsHeader::default()
        };
        let payload = [64, 64, 64, 63][next(4) as usize];
        let mut d = vec![(next(200) + 1) as u8; SLS_HEADER_LEN + payload];
        h.encode((&mut d[..SLS_HEADER_LEN]).try_into().unwrap());
        let got = p.place_datagram(&d, kind, Instant::now());
        let valid = h.det_type == 1 && payload == 64 && h.packet_number < 3 && h.row < 2 && h.column < 4;
        match got {
            Ok(t) => {
                assert!(valid, "{h:?} was placed");
                let (module, port) = ((h.column / 2) as u32, (h.row % 2 * 2 + h.column % 2) as u32);
                assert_eq!((t.slot as u64, t.cell), (h.frame_number, module * 12 + port * 3 + h.packet_number));
            }
            Err(DropReason::Duplicate | DropReason::Stale | DropReason::RingFull) => assert!(valid),
            Err(r) => assert!(!valid, "{h:?} dropped as {r:?}"),
        }
        assert!(arena.guards_intact());
    }
}
