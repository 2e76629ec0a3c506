//! The size a chunk of the dataset being read decodes to, for the bitshuffle filter that
//! HDF5 calls in the middle of a read.
//!
//! HDF5 does not tell a filter the chunk's size, and takes whatever a filter returns as a
//! whole chunk: a crafted chunk that decodes to less makes HDF5 read past the buffer (a
//! segfault). So every read of a dataset that may be bitshuffled goes through [`reading`],
//! which says the size for the filter to check; a read that did not is refused by the filter.

use std::cell::Cell;

thread_local! {
    /// Set by [`reading`] for the reads it runs: HDF5 runs filters on the reading thread.
    static CHUNK_BYTES: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The bytes one chunk of `ds` holds: its chunk shape, or for a dataset without chunks (a
/// virtual stack of frames) one frame, the chunk of every file rdaq writes.
pub fn chunk_bytes(ds: &hdf5::Dataset) -> hdf5::Result<usize> {
    let elem = ds.dtype()?.size();
    let dims = ds.chunk().unwrap_or_else(|| ds.shape().iter().enumerate().map(|(i, &n)| if i == 0 { n.min(1) } else { n }).collect());
    Ok(dims.iter().product::<usize>() * elem)
}

/// Runs `read`, HDF5 reads of `ds`, with its chunk size known to the filter.
pub fn reading<R>(ds: &hdf5::Dataset, read: impl FnOnce() -> hdf5::Result<R>) -> hdf5::Result<R> {
    let bytes = chunk_bytes(ds)?;
    let before = CHUNK_BYTES.with(|c| c.replace(Some(bytes)));
    let r = read();
    CHUNK_BYTES.with(|c| c.set(before));
    r
}

/// The chunk size [`reading`] set on this thread (none outside it).
pub fn expected() -> Option<usize> {
    CHUNK_BYTES.with(Cell::get)
}
