//! The check after a data file is closed: its first frame, read back through HDF5's filter
//! pipeline as any reader reads it (the dataset's stored filter and cd_values decide how it
//! decodes), must equal the frame the writer compressed. A file whose filter settings do
//! not describe its chunks would otherwise be counted as written and be unreadable.

use std::path::Path;

use rdaq_process::bitshuffle::decompress;

use crate::meta::NxmxMeta;
use crate::reader::FrameReader;

/// Reads frame 0 of the closed data file `path` and compares it with `chunk`, the chunk the
/// writer wrote for it (decoded with the series' own codec and element size). The error
/// names the file and says what differs.
pub(crate) fn first_frame(path: &Path, meta: &NxmxMeta, chunk: &[u8]) -> Result<(), String> {
    let fail = |why: String| format!("{}: frame 0 read back through HDF5 {why}: readers would not see what was written", path.display());
    let want = decompress(chunk, meta.pixel.bytes(), meta.codec).map_err(|e| fail(format!("cannot be compared: the written chunk does not decode ({e})")))?;
    let reader = FrameReader::open(path, "entry/data/data").map_err(|e| fail(format!("fails ({e})")))?;
    let got = reader.read_bytes(0, meta.pixel).map_err(|e| fail(format!("fails ({e})")))?;
    if got != want {
        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        return Err(fail(format!("differs from the frame written ({} bytes read, {} written; first difference at byte {at})", got.len(), want.len())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdaq_process::bitshuffle::Compressor;

    #[test]
    fn a_data_file_that_does_not_read_back_as_written_is_named() {
        let dir = std::env::temp_dir().join(format!("rdaq-readback-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let meta = NxmxMeta::receiver(rdaq_detector::Geometry::new(1, 1, 0, 0).unwrap());
        let pixels: Vec<u8> = (0..meta.image_bytes()).map(|i| (i * 31 % 253) as u8).collect();
        let mut w = crate::NxmxWriter::create(&dir.join("r_master.h5"), &meta, false).unwrap();
        w.write_frame(7, &pixels, &[]).unwrap();
        let closed = w.finish().unwrap();
        assert_eq!(closed.unreadable, None, "the file reads back as written");
        let data = &closed.data_files[0];
        let mut chunk = Vec::new();
        Compressor::new(2, 0, meta.codec).compress(&pixels, &mut chunk);
        first_frame(data, &meta, &chunk).unwrap();
        let mut other = pixels.clone();
        other[1000] ^= 1;
        Compressor::new(2, 0, meta.codec).compress(&other, &mut chunk);
        let e = first_frame(data, &meta, &chunk).unwrap_err();
        assert!(e.contains("r_data_000001.h5") && e.contains("first difference at byte 1000"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
