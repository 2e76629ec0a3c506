//! One data file of a series (`<name>_data_000001.h5`): `/entry/data/data` with one
//! compressed frame per chunk, written by direct chunk write with filter 32008 registered
//! OPTIONAL (writing needs no plugin; readers with hdf5plugin decode it), beside the
//! per-frame tables (frame number, completeness, for incomplete frames a mask of the
//! missing pixels) and with spot finding the spot lists and hit flags in `/entry/result_1`
//! (the CXI peak-list layout CrystFEL reads with `peak_list`).
//!
//! The file is written in HDF5's single-writer/multiple-reader mode (SWMR): every object
//! exists before the first frame, and HDF5 orders its metadata writes so that the file on
//! disk is consistent at every flush. A reader (`h5py.File(path, "r", swmr=True)`) follows
//! the file while it grows, and after the writer is killed it still reads every frame up
//! to the writer's last flush.

use std::path::Path;

use hdf5::{Dataset, File, Group};
use rdaq_process::bitshuffle::{Codec, Compressor};
use rdaq_process::spots::Spot;

use crate::meta::{NxmxMeta, PixelType};
use crate::nexus::{frame_stack, nx_group, rows_with_chunks, str_attr, write_chunk};
use crate::spot_list::{SpotLists, GROW};

/// NXmx pixel_mask bit 1 ("dead"), used for pixels whose data was lost in transfer.
pub const MASK_MISSING: u32 = 1 << 1;

pub(crate) struct DataFile {
    file: File,
    data: Dataset,
    tables: Tables,
    results: Option<SpotLists>,
    meta_hw: (usize, usize),
    mask_words: Compressor,
    mask_chunk: Vec<u8>,
    mask_buf: Vec<u32>,
}

/// The per-frame tables of `/entry/data`, buffered until the next flush.
struct Tables {
    frame_number: Dataset,
    complete: Dataset,
    incomplete_mask: Dataset,
    incomplete_number: Dataset,
    numbers: Vec<u64>,
    flags: Vec<u8>,
    incomplete: Vec<u64>,
    /// Rows of `numbers` and `flags` in the file.
    written: usize,
    incomplete_written: usize,
}

impl DataFile {
    /// Creates the file with every dataset it will hold and starts SWMR writing, under the
    /// staging name beside `path` (claimed by the caller), and then renames it to `path`: a
    /// writer killed before SWMR writing started leaves no file of that name that a SWMR
    /// reader cannot open, only the claimed empty one and the hidden leftover.
    pub fn create(path: &Path, meta: &NxmxMeta, first_image: u64) -> hdf5::Result<DataFile> {
        let tmp = crate::claim::claim_staging(path).map_err(|e| hdf5::Error::from(e.to_string()))?;
        let file = crate::deferred::create(&tmp)?;
        let entry = nx_group(&file, "entry", "NXentry")?;
        let (data, tables) = data_group(&entry, meta, first_image)?;
        let results = if meta.max_spots > 0 { Some(SpotLists::create(&entry, meta.max_spots, Some(meta.pixel.units()), true)?) } else { None };
        file.start_swmr()?;
        std::fs::rename(&tmp, path).map_err(|e| hdf5::Error::from(format!("cannot rename {} to {}: {e}", tmp.display(), path.display())))?;
        Ok(DataFile {
            file,
            data,
            tables,
            results,
            meta_hw: (meta.geometry.height(), meta.geometry.width()),
            mask_words: Compressor::new(4, 0, Codec::Lz4),
            mask_chunk: Vec::new(),
            mask_buf: Vec::new(),
        })
    }

    /// Appends one compressed frame; `missing` lists the runs of pixels (first, count) that
    /// carry no data, inside the image (checked by the writer). Returns the bytes written.
    pub fn append(&mut self, frame_number: u64, chunk: &[u8], missing: &[(usize, usize)]) -> hdf5::Result<u64> {
        let (h, w) = self.meta_hw;
        // one row at a time: a failed write leaves at most its own row behind
        let k = self.frames();
        self.data.resize((k + 1, h, w))?;
        write_chunk(&self.data, k, chunk)?;
        let mut bytes = chunk.len() as u64;
        if !missing.is_empty() {
            bytes += self.write_mask(missing)?;
            self.tables.incomplete.push(frame_number);
        }
        self.tables.numbers.push(frame_number);
        self.tables.flags.push(missing.is_empty() as u8);
        Ok(bytes)
    }

    /// Frames whose chunks are in the file (one frame number each).
    pub fn frames(&self) -> usize {
        self.tables.numbers.len()
    }

    /// The frames written out by the last flush, and the frame numbers of the incomplete ones
    /// among them.
    pub fn flushed(&self) -> (u64, &[u64]) {
        (self.tables.written as u64, &self.tables.incomplete[..self.tables.incomplete_written])
    }

    /// Records the spots and the hit decision of the frame appended last.
    pub fn spots(&mut self, spots: &[Spot], total: usize, hit: bool) -> bool {
        let Some(r) = self.results.as_mut() else { return false };
        r.push(spots, total, hit);
        true
    }

    /// Writes the buffered table rows and spot lists and flushes the file: what a reader
    /// (or a reader after a crash) sees is consistent up to here.
    pub fn flush(&mut self) -> hdf5::Result<()> {
        self.tables.write()?;
        if let Some(r) = self.results.as_mut() {
            r.write()?;
        }
        self.file.flush()
    }

    fn write_mask(&mut self, missing: &[(usize, usize)]) -> hdf5::Result<u64> {
        let (h, w) = self.meta_hw;
        self.mask_buf.clear();
        self.mask_buf.resize(h * w, 0);
        for &(start, len) in missing {
            self.mask_buf[start..start + len].fill(MASK_MISSING);
        }
        let k = self.tables.incomplete.len();
        self.tables.incomplete_mask.resize((k + 1, h, w))?;
        // SAFETY: u32 has no padding; the host is little-endian like the HDF5 type.
        let bytes = unsafe { std::slice::from_raw_parts(self.mask_buf.as_ptr().cast::<u8>(), self.mask_buf.len() * 4) };
        self.mask_words.compress(bytes, &mut self.mask_chunk);
        write_chunk(&self.tables.incomplete_mask, k, &self.mask_chunk)?;
        Ok(self.mask_chunk.len() as u64)
    }

    /// After a failed write, keeps only the first frames whose chunks HDF5 really holds (a
    /// full disk can cost the index entry of a chunk written just before), so that no frame
    /// reads as zeros.
    pub fn trim_to_allocated(&mut self) {
        let frames = self.frames();
        let n = rows_with_chunks(&self.data).min(frames);
        if n < frames {
            self.tables.truncate(n);
            if let Some(r) = self.results.as_mut() {
                r.truncate(n);
            }
        }
    }

    /// Flushes and trims the frame stack to the frames written. Returns the frames kept, the
    /// frame numbers of the incomplete ones, and why the stack kept a failed frame's row,
    /// when HDF5 could not drop it (after a full disk).
    pub fn finish(mut self, failed: bool) -> hdf5::Result<(u64, Vec<u64>, Option<String>)> {
        if failed {
            self.trim_to_allocated();
        }
        self.flush()?;
        let (h, w) = self.meta_hw;
        let untrimmed = match self.data.resize((self.frames(), h, w)) {
            Ok(()) => None,
            // HDF5 met the full disk mid-update and cannot drop the failed frame's row; the
            // tables say which rows are frames, and the rest of the file closes
            Err(err) if failed => Some(err.to_string()),
            Err(err) => return Err(err),
        };
        self.file.flush()?;
        Ok((self.frames() as u64, std::mem::take(&mut self.tables.incomplete), untrimmed))
    }
}

/// `/entry/data`: the frame stack of the series' pixel type (one frame per chunk) and the
/// per-frame tables.
fn data_group(entry: &Group, meta: &NxmxMeta, first_image: u64) -> hdf5::Result<(Dataset, Tables)> {
    let (h, w) = (meta.geometry.height(), meta.geometry.width());
    let g = nx_group(entry, "data", "NXdata")?;
    str_attr(&g, "signal", "data")?;
    let data = match meta.pixel {
        PixelType::Raw => frame_stack::<u16>(&g, "data", h, w, meta.codec)?,
        PixelType::Kev => frame_stack::<f32>(&g, "data", h, w, meta.codec)?,
        PixelType::Photons16 | PixelType::Fields => frame_stack::<i16>(&g, "data", h, w, meta.codec)?,
        PixelType::Photons32 => frame_stack::<i32>(&g, "data", h, w, meta.codec)?,
        PixelType::Counts(_) => match meta.pixel.bytes() {
            1 => frame_stack::<u8>(&g, "data", h, w, meta.codec)?,
            2 => frame_stack::<u16>(&g, "data", h, w, meta.codec)?,
            _ => frame_stack::<u32>(&g, "data", h, w, meta.codec)?,
        },
    };
    str_attr(&data, "units", meta.pixel.units())?;
    // the series' image number of this file's first image (1-based, as Dectris counts)
    data.new_attr::<u64>().create("image_nr_low")?.write_scalar(&(first_image + 1))?;
    let tables = Tables {
        frame_number: g.new_dataset::<u64>().chunk(GROW).shape(0..).create("frame_number")?,
        complete: g.new_dataset::<u8>().chunk(GROW).shape(0..).create("frame_complete")?,
        incomplete_mask: frame_stack::<u32>(&g, "incomplete_pixel_mask", h, w, Codec::Lz4)?,
        incomplete_number: g.new_dataset::<u64>().chunk(GROW).shape(0..).create("incomplete_frame_number")?,
        numbers: Vec::new(),
        flags: Vec::new(),
        incomplete: Vec::new(),
        written: 0,
        incomplete_written: 0,
    };
    Ok((data, tables))
}

impl Tables {
    fn write(&mut self) -> hdf5::Result<()> {
        let (a, b) = (self.written, self.numbers.len());
        if b > a {
            self.frame_number.resize(b)?;
            self.frame_number.write_slice(&self.numbers[a..b], a..b)?;
            self.complete.resize(b)?;
            self.complete.write_slice(&self.flags[a..b], a..b)?;
            self.written = b;
        }
        let (a, b) = (self.incomplete_written, self.incomplete.len());
        if b > a {
            self.incomplete_number.resize(b)?;
            self.incomplete_number.write_slice(&self.incomplete[a..b], a..b)?;
            self.incomplete_written = b;
        }
        Ok(())
    }

    fn truncate(&mut self, n: usize) {
        self.numbers.truncate(n);
        self.flags.truncate(n);
        let kept: std::collections::HashSet<u64> = self.numbers.iter().copied().collect();
        self.incomplete.retain(|f| kept.contains(f));
        self.written = self.written.min(n);
        self.incomplete_written = self.incomplete_written.min(self.incomplete.len());
    }
}
