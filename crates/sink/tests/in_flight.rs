//! The bytes handed to the data files' I/O threads count as taken until they are written: a
//! writer's free-space check adds them to what it needs, since they take their room on the
//! disk only when copied. Alone in its test binary: the count is the process's.

mod common;

use rdaq_process::bitshuffle::{Codec, Compressor};
use rdaq_sink::deferred::bytes_in_flight;
use rdaq_sink::{NxmxMeta, NxmxWriter, SharedChunk};

#[test]
fn chunks_being_copied_are_counted_until_they_are_written() {
    assert_eq!(bytes_in_flight(), 0, "nothing handed on yet");
    let dir = std::env::temp_dir().join(format!("rdaq-sink-in-flight-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let m = NxmxMeta { max_spots: 0, number_of_images: Some(40), ..common::meta() };
    let mut wr = NxmxWriter::create(&dir.join("c_master.h5"), &m, false).unwrap();
    let pixels = m.geometry.height() * m.geometry.width();
    let mut comp = Compressor::new(2, 0, Codec::Lz4);
    let chunks: Vec<SharedChunk> = (0..40u32)
        .map(|f| {
            let mut chunk = Vec::new();
            comp.compress(&(0..pixels * 2).map(|i| ((i as u32 * 7 + f) % 251) as u8).collect::<Vec<_>>(), &mut chunk);
            SharedChunk::new(chunk)
        })
        .collect();
    let total: u64 = chunks.iter().map(|c| c.read().len() as u64).sum();
    let mut most = 0;
    for (i, c) in chunks.iter().enumerate() {
        wr.write_shared(i as u64, c, &[]).unwrap();
        most = most.max(bytes_in_flight());
    }
    assert_eq!(wr.chunks_handed_on, 40);
    assert!(most <= total, "at most what was handed on: {most} of {total}");
    wr.finish().unwrap();
    assert_eq!(bytes_in_flight(), 0, "each chunk's bytes counted out once, when written");
    std::fs::remove_dir_all(&dir).unwrap();
}
