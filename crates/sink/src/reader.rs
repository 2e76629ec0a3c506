//! Frames read back from an HDF5 file, one at a time: any 3-D (frames, rows, cols) dataset,
//! and rdaq's own bitshuffle chunks (HDF5 filter 32008, one frame per chunk), which are read
//! raw and decoded here so that no HDF5 filter plugin is needed.

use std::path::{Path, PathBuf};

use hdf5::Dataset;
use rdaq_process::bitshuffle::{decompress, Codec};
use rdaq_process::Plain;

use crate::nexus::BSHUF_FILTER;

/// Why frames cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot open {path}: {source}")]
    Open { path: PathBuf, source: hdf5::Error },
    #[error("{path}: no dataset {dataset}: {source}")]
    NoDataset { path: PathBuf, dataset: String, source: hdf5::Error },
    #[error("{path}: {dataset} has shape {shape:?}, expected (frames, rows, cols)")]
    Shape { path: PathBuf, dataset: String, shape: Vec<usize> },
    #[error("frame {frame}: {message}")]
    Frame { frame: usize, message: String },
}

/// The frames of one 3-D dataset.
pub struct FrameReader {
    /// Keeps the file open while the dataset is read.
    _file: hdf5::File,
    ds: Dataset,
    pub frames: usize,
    pub rows: usize,
    pub cols: usize,
    /// The dataset's bitshuffle codec when its chunks are rdaq's (one frame per chunk).
    bitshuffle: Option<Codec>,
}

impl FrameReader {
    /// Opens dataset `dataset` of the file `path`.
    pub fn open(path: &Path, dataset: &str) -> Result<FrameReader, ReadError> {
        let file = hdf5::File::open(path).map_err(|source| ReadError::Open { path: path.into(), source })?;
        let ds = file.dataset(dataset).map_err(|source| ReadError::NoDataset { path: path.into(), dataset: dataset.into(), source })?;
        let s = ds.shape();
        if s.len() != 3 {
            return Err(ReadError::Shape { path: path.into(), dataset: dataset.into(), shape: s });
        }
        let bitshuffle = bitshuffle_codec(&ds);
        Ok(FrameReader { _file: file, frames: s[0], rows: s[1], cols: s[2], ds, bitshuffle })
    }

    /// Reads frame `i` into `out` (resized to one frame).
    pub fn read<T: hdf5::H5Type + Plain + Default>(&self, i: usize, out: &mut Vec<T>) -> Result<(), ReadError> {
        let fail = |message: String| ReadError::Frame { frame: i, message };
        let px = self.rows * self.cols;
        if let Some(codec) = self.bitshuffle {
            let raw = read_raw_chunk(&self.ds, i).map_err(|e| fail(format!("reading its chunk: {e}")))?;
            let bytes = decompress(&raw, std::mem::size_of::<T>(), codec).map_err(|e| fail(format!("decoding: {e}")))?;
            if bytes.len() != px * std::mem::size_of::<T>() {
                return Err(fail(format!("decodes to {} bytes", bytes.len())));
            }
            out.clear();
            out.resize(px, T::default());
            // SAFETY: `out` holds `px` elements of a `Plain` type (no padding, any byte
            // pattern valid) and `bytes` is exactly that long (checked above); the host is
            // little-endian like the file.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr().cast::<u8>(), bytes.len()) };
        } else {
            let a: ndarray::Array3<T> = self.ds.read_slice(ndarray::s![i..i + 1, .., ..]).map_err(|e| fail(format!("reading: {e}")))?;
            out.clear();
            out.extend(a.iter().copied());
        }
        Ok(())
    }
}

/// The codec of filter 32008 when the dataset has it (cd_values[4]: 2 LZ4, 3 Zstd).
fn bitshuffle_codec(ds: &Dataset) -> Option<Codec> {
    let dcpl = ds.dcpl().ok()?;
    let mut flags = 0u32;
    let mut n: usize = 8;
    let mut cd = [0u32; 8];
    let mut name = [0 as std::os::raw::c_char; 16];
    let mut config = 0u32;
    // SAFETY: every out-pointer points at a live local of the declared size; `n` says how
    // many cd values fit; HDF5's global lock is held (`sync`).
    let rc = hdf5::sync::sync(|| unsafe {
        hdf5_sys::h5p::H5Pget_filter_by_id2(dcpl.id(), BSHUF_FILTER, &mut flags, &mut n, cd.as_mut_ptr(), name.len(), name.as_mut_ptr(), &mut config)
    });
    if rc < 0 {
        return None;
    }
    Some(if n > 4 && cd[4] == 3 { Codec::Zstd(if n > 5 { cd[5] as i32 } else { 0 }) } else { Codec::Lz4 })
}

fn read_raw_chunk(ds: &Dataset, i: usize) -> Result<Vec<u8>, String> {
    let info = ds.chunk_info(i).ok_or_else(|| format!("no chunk {i}"))?;
    let mut buf = vec![0u8; info.size as usize];
    let mut filter_mask = 0u32;
    // SAFETY: the offset has one entry per dimension and `buf` is the chunk's stored size;
    // HDF5's global lock is held (`sync`).
    let rc = hdf5::sync::sync(|| unsafe {
        hdf5_sys::h5d::H5Dread_chunk(ds.id(), hdf5_sys::h5p::H5P_DEFAULT, info.offset.as_ptr(), &mut filter_mask, buf.as_mut_ptr().cast())
    });
    if rc < 0 {
        return Err("H5Dread_chunk failed".into());
    }
    Ok(buf)
}
