//! Frames read back from an HDF5 file, one at a time: any 3-D (frames, rows, cols) dataset,
//! read through HDF5's filter pipeline (a master's virtual dataset too), with bitshuffle
//! decoded by rdaq's registered filter ([`crate::filter`]): no plugin and no environment
//! variable is needed.

use std::path::{Path, PathBuf};

use hdf5::Dataset;
use rdaq_process::{bytes_of, chunk_size, Plain};

use crate::meta::PixelType;

/// Why frames cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot open {path}: {source}")]
    Open { path: PathBuf, source: hdf5::Error },
    #[error("{path}: no dataset {dataset}: {source}")]
    NoDataset { path: PathBuf, dataset: String, source: hdf5::Error },
    #[error("{path}: {dataset} has shape {shape:?}, expected (frames, rows, cols)")]
    Shape { path: PathBuf, dataset: String, shape: Vec<usize> },
    #[error("{path}: frame {frame}: {message}")]
    Frame { path: PathBuf, frame: usize, message: String },
}

/// The frames of one 3-D dataset.
pub struct FrameReader {
    /// Keeps the file open while the dataset is read.
    _file: hdf5::File,
    /// The file, for errors.
    path: PathBuf,
    ds: Dataset,
    pub frames: usize,
    pub rows: usize,
    pub cols: usize,
}

impl FrameReader {
    /// Opens dataset `dataset` of the file `path`.
    pub fn open(path: &Path, dataset: &str) -> Result<FrameReader, ReadError> {
        crate::filter::register().map_err(|e| ReadError::Open { path: path.into(), source: e.into() })?;
        let file = hdf5::File::open(path).map_err(|source| ReadError::Open { path: path.into(), source })?;
        let ds = file.dataset(dataset).map_err(|source| ReadError::NoDataset { path: path.into(), dataset: dataset.into(), source })?;
        let s = ds.shape();
        if s.len() != 3 {
            return Err(ReadError::Shape { path: path.into(), dataset: dataset.into(), shape: s });
        }
        Ok(FrameReader { _file: file, path: path.to_path_buf(), frames: s[0], rows: s[1], cols: s[2], ds })
    }

    /// Reads frame `i` into `out` (resized to one frame).
    pub fn read<T: hdf5::H5Type + Plain + Default>(&self, i: usize, out: &mut Vec<T>) -> Result<(), ReadError> {
        if i >= self.frames {
            return Err(ReadError::Frame { path: self.path.clone(), frame: i, message: format!("the dataset holds {} frames", self.frames) });
        }
        let a: ndarray::Array3<T> = chunk_size::reading(&self.ds, || self.ds.read_slice(ndarray::s![i..i + 1, .., ..])).map_err(|e| {
            let why = crate::filter::take_refusal().map_or(String::new(), |w| format!(" (bitshuffle: {w})"));
            ReadError::Frame { path: self.path.clone(), frame: i, message: format!("reading: {e}{why}") }
        })?;
        out.clear();
        out.extend(a.iter().copied());
        Ok(())
    }

    /// Frame `i` as the little-endian bytes of `pixel`'s element type (read as that type,
    /// so that no value is converted).
    pub fn read_bytes(&self, i: usize, pixel: PixelType) -> Result<Vec<u8>, ReadError> {
        fn bytes<T: hdf5::H5Type + Plain + Default>(r: &FrameReader, i: usize) -> Result<Vec<u8>, ReadError> {
            let mut v = Vec::<T>::new();
            r.read(i, &mut v)?;
            Ok(bytes_of(&v).to_vec())
        }
        match pixel {
            PixelType::Raw => bytes::<u16>(self, i),
            PixelType::Kev => bytes::<f32>(self, i),
            PixelType::Photons16 | PixelType::Fields => bytes::<i16>(self, i),
            PixelType::Photons32 => bytes::<i32>(self, i),
            PixelType::Counts(_) => match pixel.bytes() {
                1 => bytes::<u8>(self, i),
                2 => bytes::<u16>(self, i),
                _ => bytes::<u32>(self, i),
            },
        }
    }
}
