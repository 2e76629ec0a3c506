//! The NXmx series writer: a master file with the metadata ([`crate::master`]) and data
//! files of `images_per_file` images each ([`crate::data_file`]), as Dectris detectors and
//! Jungfraujoch write them. Pixels are raw 16-bit words, energies in keV (float32) or photon
//! counts (int16/int32), one compressed frame per chunk.
//!
//! Crash safety: the data files are written in SWMR mode and flushed at least every
//! [`FLUSH_EVERY`], and the master is written again after each flush, covering exactly the
//! frames flushed: a writer killed mid-run leaves a master whose every frame is in the data
//! files (open it with `swmr=True`: the last data file still carries the writer's flag), at
//! most one flush behind them. `rdaq recover` ([`crate::recover`]) then clears the flags,
//! trims the data files to their tables and writes the master for all they hold.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rdaq_process::bitshuffle::Compressor;
use rdaq_process::spots::Spot;
use thiserror::Error;

use crate::deferred::SharedChunk;
use crate::data_file::DataFile;
use crate::instrument::MaskChunk;
use crate::master::{data_file_name, write_master, Contents, Part};
use crate::meta::NxmxMeta;
use crate::space::Reserve;

#[derive(Debug, Error)]
pub enum SinkError {
    /// In one line (the operating system's error where there is one): not HDF5's stack.
    #[error("HDF5 error on {path}: {}", crate::nexus::brief(.error))]
    Hdf5 { path: PathBuf, error: hdf5::Error },
    #[error("frame has {got} bytes, the dataset expects {want}")]
    FrameSize { got: usize, want: usize },
    /// Writing a frame failed (a full disk, an I/O error). The writer stops: the files keep
    /// the frames written before, and [`NxmxWriter::finish`] still closes them cleanly.
    #[error("writing frame {frame} to {path} failed: {cause}")]
    Write { path: PathBuf, frame: u64, cause: String },
    /// A write after a failed one.
    #[error("{path}: writing stopped after an earlier failure")]
    Stopped { path: PathBuf },
    /// Missing pixels said to lie outside the image (a caller's or a sender's error).
    #[error("frame {frame}: missing pixels {start}..+{len} lie outside the image of {pixels} pixels")]
    MissingPixels { frame: u64, start: usize, len: usize, pixels: usize },
    /// The master's name is taken (or a link): nothing was written.
    #[error(transparent)]
    Claim(#[from] crate::claim::ClaimError),
    #[error("images_per_file must be at least 1")]
    ImagesPerFile,
    /// Spots for a series without spot lists (`max_spots` 0), or before its first frame.
    #[error("{path}: no spot list to add to (max_spots is 0, or no frame was written)")]
    NoSpotList { path: PathBuf },
}

/// Disk space the writer holds back from the start, given back when a write fails so that
/// the files' metadata can still be written and the files closed (see [`crate::space`]).
pub const RESERVE_BYTES: u64 = 8 << 20;
/// Free space a frame's chunk must leave on the filesystem, besides the reserve, for the
/// metadata that grows with it: below it the writer stops as if the disk were full, before
/// HDF5 meets the full disk in the middle of an update.
pub const HEADROOM_BYTES: u64 = 1 << 20;
/// The longest a written frame waits before it is flushed to the data file (and so survives
/// a crash of the writer).
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

pub struct NxmxWriter {
    master: PathBuf,
    meta: NxmxMeta,
    /// The master's pixel mask, deflated once.
    mask: MaskChunk,
    current: Option<DataFile>,
    /// Whether files of the series' names may be replaced (else each is created new).
    overwrite: bool,
    /// The data files closed so far.
    parts: Vec<Part>,
    incomplete: Vec<u64>,
    /// Frame numbers of the frames written, in order (one per frame written).
    numbers: Vec<u64>,
    words: Compressor,
    chunk: Vec<u8>,
    pub bytes_written: u64,
    /// Chunks of [`NxmxWriter::write_shared`] that the I/O threads wrote out, and the times
    /// the writer waited for them ([`crate::deferred::Handed`]).
    pub chunks_handed_on: u64,
    pub io_waits: u64,
    reserve: Option<Reserve>,
    /// Set by the first failed write; nothing is written after it.
    failed: bool,
    untrimmed: Option<String>,
    /// The chunk of the current data file's first frame, for the check after it is closed.
    first_chunk: Vec<u8>,
    /// Why a closed data file did not read back as written (the first such file).
    unreadable: Option<String>,
    last_flush: Instant,
}

impl NxmxWriter {
    /// Starts the series whose master file is `master`: claims its name ([`crate::claim`]:
    /// created new, or with `overwrite` replacing a regular file; never through a link),
    /// writes the master (no images yet), and holds [`RESERVE_BYTES`] of disk space beside
    /// it for closing the files. Each data file is claimed the same way when its first frame
    /// comes.
    pub fn create(master: &Path, meta: &NxmxMeta, overwrite: bool) -> Result<Self, SinkError> {
        if meta.images_per_file == 0 {
            return Err(SinkError::ImagesPerFile);
        }
        crate::claim::claim(master, overwrite)?;
        let mask = MaskChunk::new(meta);
        if let Err(source) = write_master(master, meta, &mask, &Contents { parts: &[], incomplete: &[], frames: &[], end_time: None }) {
            // the claim left an empty file of that name: nothing of this series stays
            let _ = std::fs::remove_file(master);
            return Err(SinkError::Hdf5 { path: master.to_owned(), error: source });
        }
        Ok(NxmxWriter {
            master: master.to_owned(),
            meta: meta.clone(),
            mask,
            current: None,
            overwrite,
            parts: Vec::new(),
            incomplete: Vec::new(),
            numbers: Vec::new(),
            words: Compressor::new(meta.pixel.bytes(), 0, meta.codec),
            chunk: Vec::new(),
            bytes_written: 0,
            chunks_handed_on: 0,
            io_waits: 0,
            reserve: Reserve::hold(master, RESERVE_BYTES).ok(),
            failed: false,
            untrimmed: None,
            first_chunk: Vec::new(),
            unreadable: None,
            last_flush: Instant::now(),
        })
    }

    /// Whether disk space is held back for closing the files after a failed write (false
    /// when the filesystem could not give [`RESERVE_BYTES`]: then a full disk may spoil them).
    pub fn has_reserve(&self) -> bool {
        self.reserve.is_some()
    }

    pub fn master(&self) -> &Path {
        &self.master
    }

    pub fn meta(&self) -> &NxmxMeta {
        &self.meta
    }

    /// The data file being written (or to be written next).
    fn data_path(&self) -> PathBuf {
        self.master.with_file_name(data_file_name(&self.master, self.parts.len() + 1))
    }

    /// Stops writing after a failed write of `frame`, saying why in terms of the operating
    /// system where HDF5 knows it, and gives the reserve back so that closing has room.
    fn fail(&mut self, frame: u64, e: hdf5::Error) -> SinkError {
        let cause = crate::nexus::brief(&e);
        self.stop_writing(frame, cause)
    }

    fn stop_writing(&mut self, frame: u64, cause: String) -> SinkError {
        self.failed = true;
        if let Some(r) = self.reserve.as_mut() {
            r.release();
        }
        SinkError::Write { path: self.data_path(), frame, cause }
    }

    /// The filesystem's free space and the bytes of chunks still being copied to disk by the
    /// I/O threads (they take their room only then), when the free space is short of them,
    /// `bytes` and [`HEADROOM_BYTES`].
    fn short_of_space(&self, bytes: usize) -> Option<(u64, u64)> {
        let dir = self.master.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let copying = crate::deferred::bytes_in_flight();
        let free = crate::space::free_bytes(dir).ok()?;
        (free < bytes as u64 + HEADROOM_BYTES + copying).then_some((free, copying))
    }

    /// Appends an assembled frame of little-endian pixels of the series' pixel type,
    /// compressing it here. `missing` lists the runs of pixels (first, count; row-major) that
    /// carry no data (incomplete frame); they are flagged in a per-frame mask.
    pub fn write_frame(&mut self, frame_number: u64, pixels: &[u8], missing: &[(usize, usize)]) -> Result<(), SinkError> {
        let want = self.meta.image_bytes();
        if pixels.len() != want {
            return Err(SinkError::FrameSize { got: pixels.len(), want });
        }
        let mut chunk = std::mem::take(&mut self.chunk);
        self.words.compress(pixels, &mut chunk);
        let r = self.write_chunk(frame_number, &chunk, missing);
        self.chunk = chunk;
        r
    }

    /// As [`NxmxWriter::write_chunk`], but the chunk's bytes are copied into the data file by
    /// an I/O thread while the writer goes on ([`crate::deferred`]); the chunk cannot be
    /// changed until then. A failed copy fails a later write, the flush or the close.
    pub fn write_shared(&mut self, frame_number: u64, chunk: &SharedChunk, missing: &[(usize, usize)]) -> Result<(), SinkError> {
        let (r, handed) = crate::deferred::lend(chunk, |bytes| self.write_chunk(frame_number, bytes, missing));
        self.chunks_handed_on += handed.chunks;
        self.io_waits += handed.waits;
        r
    }

    /// Appends a frame already compressed as a chunk of the series' codec and pixel type.
    /// `missing` as in [`NxmxWriter::write_frame`]; a run outside the image is refused
    /// (nothing of the frame is written, and writing goes on).
    pub fn write_chunk(&mut self, frame_number: u64, chunk: &[u8], missing: &[(usize, usize)]) -> Result<(), SinkError> {
        if self.failed {
            return Err(SinkError::Stopped { path: self.data_path() });
        }
        let pixels = self.meta.geometry.height() * self.meta.geometry.width();
        if let Some(&(start, len)) = missing.iter().find(|&&(s, n)| s.checked_add(n).is_none_or(|end| end > pixels)) {
            return Err(SinkError::MissingPixels { frame: frame_number, start, len, pixels });
        }
        if let Some((free, copying)) = self.short_of_space(chunk.len()) {
            let cause = format!("{} ({free} bytes free, {copying} of them for chunks still being copied, for a {}-byte frame)", std::io::Error::from_raw_os_error(libc::ENOSPC), chunk.len());
            return Err(self.stop_writing(frame_number, cause));
        }
        if let Err(e) = self.flush_if_due().and_then(|()| self.roll()) {
            return Err(self.fail(frame_number, e));
        }
        let file = self.current.as_mut().expect("opened by roll");
        match file.append(frame_number, chunk, missing) {
            Ok(bytes) => self.bytes_written += bytes,
            Err(e) => return Err(self.fail(frame_number, e)),
        }
        if file.frames() == 1 {
            self.first_chunk.clear();
            self.first_chunk.extend_from_slice(chunk);
        }
        self.numbers.push(frame_number);
        Ok(())
    }

    /// Flushes the data file and writes the master for it when [`FLUSH_EVERY`] has passed.
    /// Called before a frame is appended: every frame before it has its spot list by then.
    fn flush_if_due(&mut self) -> hdf5::Result<()> {
        let Some(f) = self.current.as_mut().filter(|_| self.last_flush.elapsed() >= FLUSH_EVERY) else { return Ok(()) };
        self.last_flush = Instant::now();
        f.flush()?;
        self.write_master_flushed()
    }

    /// Writes the master for the frames the data files hold as of their last flush: the
    /// closed files', and the current file's flushed rows.
    fn write_master_flushed(&self) -> hdf5::Result<()> {
        let mut parts = self.parts.clone();
        let mut incomplete = self.incomplete.clone();
        if let Some(f) = &self.current {
            let (frames, flushed_incomplete) = f.flushed();
            parts.push(Part { file: data_file_name(&self.master, self.parts.len() + 1), frames, incomplete: flushed_incomplete.len() as u64 });
            incomplete.extend_from_slice(flushed_incomplete);
        }
        let n: u64 = parts.iter().map(|p| p.frames).sum();
        write_master(&self.master, &self.meta, &self.mask, &Contents { parts: &parts, incomplete: &incomplete, frames: &self.numbers[..n as usize], end_time: None })
    }

    /// Opens the first data file, or closes a full one and opens the next (not after a
    /// closed one failed to read back: the next would fail the same way).
    fn roll(&mut self) -> hdf5::Result<()> {
        if self.current.as_ref().is_some_and(|f| f.frames() >= self.meta.images_per_file) {
            self.close_current()?;
            if let Some(why) = &self.unreadable {
                return Err(hdf5::Error::from(why.clone()));
            }
            self.write_master_flushed()?;
        }
        if self.current.is_none() {
            let path = self.data_path();
            crate::claim::claim(&path, self.overwrite).map_err(|e| hdf5::Error::from(e.to_string()))?;
            self.current = Some(DataFile::create(&path, &self.meta, self.numbers.len() as u64)?);
        }
        Ok(())
    }

    fn close_current(&mut self) -> hdf5::Result<()> {
        let Some(f) = self.current.take() else { return Ok(()) };
        let file = data_file_name(&self.master, self.parts.len() + 1);
        let failed = self.failed;
        let (frames, incomplete, untrimmed) = f.finish(failed)?;
        self.incomplete.extend_from_slice(&incomplete);
        self.untrimmed = self.untrimmed.take().or(untrimmed);
        if frames > 0 && self.unreadable.is_none() {
            let path = self.master.with_file_name(&file);
            self.unreadable = crate::readback::first_frame(&path, &self.meta, &self.first_chunk).err();
        }
        self.parts.push(Part { file, frames, incomplete: incomplete.len() as u64 });
        Ok(())
    }

    /// Records the spots and the hit decision of the frame written last (call once per
    /// frame written, from the first frame on, or never).
    pub fn write_spots(&mut self, spots: &[Spot], total: usize, hit: bool) -> Result<(), SinkError> {
        if self.current.as_mut().is_some_and(|f| f.spots(spots, total, hit)) {
            return Ok(());
        }
        Err(SinkError::NoSpotList { path: self.data_path() })
    }

    /// Frames written so far.
    pub fn frames(&self) -> usize {
        self.numbers.len()
    }

    /// Closes the data file and writes the master for the frames the files hold: exactly
    /// the frames whose writes succeeded, also after a failed write. A series that holds no
    /// frame keeps its master only (the caller decides whether to keep it).
    pub fn finish(mut self) -> Result<Closed, SinkError> {
        if let Some(r) = self.reserve.as_mut() {
            r.release();
        }
        let path = self.data_path();
        self.close_current().map_err(|error| SinkError::Hdf5 { path, error })?;
        let end = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        // after a failed write, the files hold the first frames only
        self.numbers.truncate(self.parts.iter().map(|p| p.frames as usize).sum());
        let c = Contents { parts: &self.parts, incomplete: &self.incomplete, frames: &self.numbers, end_time: Some(&end) };
        write_master(&self.master, &self.meta, &self.mask, &c).map_err(|error| SinkError::Hdf5 { path: self.master.clone(), error })?;
        let dir = self.master.parent().unwrap_or(Path::new(""));
        Ok(Closed {
            path: self.master.clone(),
            frames: self.parts.iter().map(|p| p.frames).sum(),
            data_files: self.parts.iter().map(|p| dir.join(&p.file)).collect(),
            untrimmed: self.untrimmed,
            unreadable: self.unreadable,
        })
    }
}

/// A series the writer closed.
#[derive(Debug)]
pub struct Closed {
    /// The master file.
    pub path: PathBuf,
    /// Frames in the files (after a failed write, those HDF5 really holds).
    pub frames: u64,
    pub data_files: Vec<PathBuf>,
    /// After a failed write whose row HDF5 could not drop: why. The data file's
    /// `/entry/data/data` then has one row more than its `frame_number` (the failed
    /// frame's, not data); the master's virtual dataset leaves it out.
    pub untrimmed: Option<String>,
    /// A data file whose first frame, read back through HDF5 after it was closed, was not
    /// the frame written: why (its frames are in the file, but readers would not see them).
    pub unreadable: Option<String>,
}
