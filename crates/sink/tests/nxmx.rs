//! The writer's file reads back through the HDF5 library: the chunk bytes are read raw and
//! decoded here (apart from the filter rdaq registers; h5py + hdf5plugin decode them in the
//! Python end-to-end tests).

use rdaq_process::bitshuffle::{decompress, Codec};
use rdaq_process::spots::Spot;
use rdaq_sink::{NxmxMeta, NxmxWriter, PixelType};

mod common;
use common::meta;

#[test]
fn frames_and_tables_land_in_the_file() {
    let dir = std::env::temp_dir().join(format!("rdaq-sink-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t_master.h5");
    let (h, w) = (512, 2 * 1024 + 8);
    let m = NxmxMeta { max_spots: 0, number_of_images: Some(40), ..meta() };
    let mut wr = NxmxWriter::create(&path, &m, false).unwrap();
    let frames: Vec<Vec<u8>> = (0..40u32).map(|f| (0..h * w * 2).map(|i| ((i as u32 * 7 + f) % 251) as u8).collect()).collect();
    for (i, f) in frames.iter().enumerate() {
        let missing = if i == 5 { vec![(128, 256)] } else { vec![] };
        wr.write_frame(1000 + i as u64, f, &missing).unwrap();
    }
    assert!(wr.write_frame(0, &frames[0][..10], &[]).is_err(), "wrong size is refused");
    let closed = wr.finish().unwrap();
    assert_eq!(closed.frames, 40);
    let names: Vec<_> = closed.data_files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["t_data_000001.h5", "t_data_000002.h5", "t_data_000003.h5"], "16 images per file");

    // the master joins the data files: one virtual array, and a link per file
    let file = hdf5::File::open(&path).unwrap();
    let ds = file.dataset("entry/data/data").unwrap();
    assert_eq!(ds.shape(), vec![40, h, w]);
    assert_eq!(ds.layout(), hdf5::plist::dataset_create::Layout::Virtual);
    assert_eq!(file.dataset("entry/data/data_000003").unwrap().shape(), vec![8, h, w]);
    let fnum: Vec<u64> = file.dataset("entry/data/frame_number").unwrap().read_raw().unwrap();
    assert_eq!(fnum, (1000..1040).collect::<Vec<_>>());
    let complete: Vec<u8> = file.dataset("entry/data/frame_complete").unwrap().read_raw().unwrap();
    assert_eq!(complete.iter().filter(|&&c| c == 0).count(), 1);
    let incomplete: Vec<u64> = file.dataset("entry/data/incomplete_frame_number").unwrap().read_raw().unwrap();
    assert_eq!(incomplete, [1005]);
    assert_eq!(file.dataset("entry/data/incomplete_pixel_mask").unwrap().shape(), vec![1, h, w], "joined from the data files");
    // the chunks are opaque to HDF5 without the plugin: read them raw from the data files
    for i in [0usize, 5, 17, 39] {
        let df = hdf5::File::open(&closed.data_files[i / 16]).unwrap();
        let (_mask, raw) = read_chunk(&df.dataset("entry/data/data").unwrap(), i % 16);
        assert_eq!(decompress(&raw, 2, Codec::Lz4).unwrap(), frames[i], "frame {i}");
    }
    let first = hdf5::File::open(&closed.data_files[0]).unwrap();
    let mask_ds = first.dataset("entry/data/incomplete_pixel_mask").unwrap();
    let (_, raw) = read_chunk(&mask_ds, 0);
    let mask = decompress(&raw, 4, Codec::Lz4).unwrap();
    let m: Vec<u32> = mask.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    assert!(m[128..384].iter().all(|&v| v == 2) && m[..128].iter().all(|&v| v == 0) && m[384..].iter().all(|&v| v == 0));
    let gaps: Vec<u32> = file.dataset("entry/instrument/detector/pixel_mask").unwrap().read_raw().unwrap();
    assert_eq!(gaps[1024..1032], [1; 8], "the 8-pixel gap between the two modules");
    let origin: Vec<i32> = file.dataset("entry/instrument/detector/module_1/data_origin").unwrap().read_raw().unwrap();
    assert_eq!(origin, vec![0, 1032]);
    let sample: hdf5::types::VarLenUnicode = file.dataset("entry/sample/name").unwrap().read_scalar().unwrap();
    assert_eq!(sample.as_str(), "lyso");
    let mode: hdf5::types::VarLenUnicode = file.dataset("entry/instrument/detector/detectorSpecific/trigger_mode").unwrap().read_scalar().unwrap();
    assert_eq!(mode.as_str(), "exte", "a gate in Dectris's code");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn converted_frames_and_spot_lists() {
    let dir = std::env::temp_dir().join(format!("rdaq-sink-kev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("k_master.h5");
    let m = NxmxMeta { max_spots: 4, images_per_file: 1000, pixel: PixelType::Kev, codec: Codec::Zstd(3), geometry: rdaq_detector::Geometry::new(1, 1, 8, 36).unwrap(), ..meta() };
    let mut wr = NxmxWriter::create(&path, &m, false).unwrap();
    let (h, w) = (512, 1024);
    // 300 frames: more than one block of buffered spot lists
    let mut last = Vec::new();
    for f in 0..300u32 {
        let img: Vec<f32> = (0..h * w).map(|i| ((i as u32 ^ f) % 97) as f32 * 0.5).collect();
        let bytes: Vec<u8> = img.iter().flat_map(|v| v.to_le_bytes()).collect();
        wr.write_frame(f as u64, &bytes, &[]).unwrap();
        let spots: Vec<Spot> = (0..f % 6).map(|k| Spot { x: k as f32, y: f as f32, intensity: 10.0 * k as f32, pixels: k + 1 }).collect();
        wr.write_spots(&spots, spots.len(), spots.len() >= 3).unwrap();
        last = bytes;
    }
    wr.finish().unwrap();
    {
        {
            let file = hdf5::File::open(&path).unwrap();
            let ds = file.dataset("entry/data/data").unwrap();
            assert_eq!(ds.shape(), vec![300, h, w]);
            let data = hdf5::File::open(dir.join("k_data_000001.h5")).unwrap();
            let (_, raw) = read_chunk(&data.dataset("entry/data/data").unwrap(), 299);
            assert_eq!(decompress(&raw, 4, Codec::Zstd(3)).unwrap(), last);
            let n: Vec<u32> = file.dataset("entry/result_1/nPeaks").unwrap().read_raw().unwrap();
            assert_eq!(n, (0..300u32).map(|f| f % 6).collect::<Vec<_>>());
            let hit: Vec<u8> = file.dataset("entry/result_1/hit").unwrap().read_raw().unwrap();
            assert_eq!(hit[5], 1);
            assert_eq!(hit[2], 0);
            let x = file.dataset("entry/result_1/peakXPosRaw").unwrap();
            assert_eq!(x.shape(), vec![300, 4], "at most max_spots per frame");
            let px: Vec<u32> = file.dataset("entry/result_1/peakNPixels").unwrap().read_raw().unwrap();
            assert_eq!(&px[299 * 4..], &[1, 2, 3, 4], "frame 299 had 5 spots, 4 kept");
            let y: Vec<f32> = file.dataset("entry/result_1/peakYPosRaw").unwrap().read_raw().unwrap();
            assert_eq!(y[257 * 4], 257.0);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The mask of missing pixels is per pixel whatever the pixel type (1, 2 and 4 bytes, signed,
/// unsigned and float), and a run outside the image is refused, not written.
#[test]
fn missing_pixels_are_masked_for_every_pixel_type() {
    let dir = std::env::temp_dir().join(format!("rdaq-sink-mask-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let geometry = rdaq_detector::Geometry::new(1, 1, 0, 0).unwrap().with_module_size(1030, 514);
    let pixels = 1030 * 514;
    let types = [PixelType::Counts(4), PixelType::Counts(8), PixelType::Counts(12), PixelType::Counts(32), PixelType::Raw, PixelType::Photons16, PixelType::Photons32, PixelType::Kev, PixelType::Fields];
    for (k, pixel) in types.into_iter().enumerate() {
        let path = dir.join(format!("m{k}_master.h5"));
        let m = NxmxMeta { geometry, pixel, max_spots: 0, ..meta() };
        let mut wr = NxmxWriter::create(&path, &m, false).unwrap();
        let img = vec![0u8; m.image_bytes()];
        // the last pixels of the image, and a run in its first row
        let missing = [(7, 3), (pixels - 1030, 1030)];
        wr.write_frame(0, &img, &missing).unwrap();
        let e = wr.write_frame(1, &img, &[(pixels - 2, 3)]).unwrap_err();
        assert!(matches!(e, rdaq_sink::SinkError::MissingPixels { frame: 1, .. }), "{e}");
        let closed = wr.finish().unwrap();
        assert_eq!(closed.frames, 1, "{pixel:?}: the refused frame was not written");
        let df = hdf5::File::open(&closed.data_files[0]).unwrap();
        let (_, raw) = read_chunk(&df.dataset("entry/data/incomplete_pixel_mask").unwrap(), 0);
        let mask: Vec<u32> = decompress(&raw, 4, Codec::Lz4).unwrap().chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        let set: Vec<usize> = (0..pixels).filter(|&i| mask[i] == 2).collect();
        let want: Vec<usize> = (7..10).chain(pixels - 1030..pixels).collect();
        assert_eq!(set, want, "{pixel:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn read_chunk(ds: &hdf5::Dataset, i: usize) -> (u32, Vec<u8>) {
    let offset = [i as u64, 0, 0];
    // chunks are written in frame order, so chunk index i is frame i
    let info = ds.chunk_info(i).expect("chunk exists");
    assert_eq!(info.offset, offset);
    let mut buf = vec![0u8; info.size as usize];
    let mut filter_mask = 0u32;
    // SAFETY: `ds` is open, `offset` names one chunk's origin (rank entries) and `buf` holds
    // the chunk's stored size, as H5Dget_chunk_info reported it.
    let rc = unsafe {
        hdf5_sys::h5d::H5Dread_chunk(ds.id(), hdf5_sys::h5p::H5P_DEFAULT, offset.as_ptr(), &mut filter_mask, buf.as_mut_ptr().cast())
    };
    assert!(rc >= 0);
    (filter_mask, buf)
}

/// A series never takes over a name: an existing master is refused, a link at a data file's
/// name is not followed (nothing is created where it points, writing stops with the reason),
/// and `overwrite` replaces regular files only.
#[test]
fn names_are_claimed_not_taken_over() {
    let dir = std::env::temp_dir().join(format!("rdaq-sink-claim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let m = NxmxMeta { geometry: rdaq_detector::Geometry::new(1, 1, 0, 0).unwrap(), max_spots: 0, ..meta() };
    let img = vec![0u8; m.image_bytes()];
    let master = dir.join("c_master.h5");
    NxmxWriter::create(&master, &m, false).unwrap().finish().unwrap();
    let e = NxmxWriter::create(&master, &m, false).err().expect("the master exists");
    assert!(matches!(e, rdaq_sink::SinkError::Claim(rdaq_sink::ClaimError::Exists(_))), "{e}");
    let elsewhere = dir.join("elsewhere.h5");
    std::os::unix::fs::symlink(&elsewhere, dir.join("c_data_000001.h5")).unwrap();
    let mut w = NxmxWriter::create(&master, &m, true).unwrap();
    let e = w.write_frame(0, &img, &[]).unwrap_err().to_string();
    assert!(e.contains("c_data_000001.h5") && e.contains("symbolic link"), "{e}");
    assert!(!elsewhere.exists(), "nothing was created where the link points");
    assert_eq!(w.finish().unwrap().frames, 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Chunks handed to the I/O threads land in the file as written: one buffer changed between
/// frames (each change waits for the last write of it), several buffers in turn, a frame with
/// missing pixels among them; the master's tables name every frame.
#[test]
fn shared_chunks_written_by_the_io_threads_read_back() {
    let dir = std::env::temp_dir().join(format!("rdaq-sink-shared-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s_master.h5");
    let (h, w) = (512, 2 * 1024 + 8);
    let m = NxmxMeta { max_spots: 0, number_of_images: Some(40), ..meta() };
    let mut wr = NxmxWriter::create(&path, &m, false).unwrap();
    let frames: Vec<Vec<u8>> = (0..40u32).map(|f| (0..h * w * 2).map(|i| ((i as u32 * 13 + f * 3) % 241) as u8).collect()).collect();
    let mut comp = rdaq_process::bitshuffle::Compressor::new(2, 0, Codec::Lz4);
    let mut buffers = vec![rdaq_sink::SharedChunk::default(); 3];
    let (before, _) = rdaq_sink::deferred::counters();
    for (i, f) in frames.iter().enumerate() {
        // frames 0-19 reuse one buffer; 20-39 take three in turn
        let b = if i < 20 { &mut buffers[0] } else { &mut buffers[i % 3] };
        comp.compress(f, &mut b.make_mut());
        let missing = if i == 7 { vec![(10, 20)] } else { vec![] };
        wr.write_shared(500 + i as u64, b, &missing).unwrap();
    }
    let (after, _) = rdaq_sink::deferred::counters();
    assert!(after - before >= 40, "every chunk went to the I/O threads ({} of 40)", after - before);
    assert_eq!(wr.chunks_handed_on, 40);
    let closed = wr.finish().unwrap();
    assert_eq!(closed.frames, 40);
    for (i, f) in frames.iter().enumerate() {
        let df = hdf5::File::open(&closed.data_files[i / 16]).unwrap();
        let (mask, raw) = read_chunk(&df.dataset("entry/data/data").unwrap(), i % 16);
        assert_eq!(mask, 0);
        assert_eq!(&decompress(&raw, 2, Codec::Lz4).unwrap(), f, "frame {i}");
    }
    let file = hdf5::File::open(&path).unwrap();
    let fnum: Vec<u64> = file.dataset("entry/data/frame_number").unwrap().read_raw().unwrap();
    assert_eq!(fnum, (500..540).collect::<Vec<_>>());
    let incomplete: Vec<u64> = file.dataset("entry/data/incomplete_frame_number").unwrap().read_raw().unwrap();
    assert_eq!(incomplete, [507]);
    std::fs::remove_dir_all(&dir).unwrap();
}
