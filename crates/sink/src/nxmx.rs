//! The NXmx HDF5 writer: `/entry/data/data` holds one frame per chunk, compressed with
//! bitshuffle+LZ4 or bitshuffle+Zstd (here, or before by a pipeline stage) and written by
//! direct chunk write (H5Dwrite_chunk) with filter 32008 registered OPTIONAL, so writing
//! needs no plugin and readers with hdf5plugin decode it. Pixels are raw 16-bit words,
//! energies in keV (float32) or photon counts (int16/int32).
//! Alongside: per-frame frame numbers and status, for incomplete frames a per-frame pixel
//! mask of the missing pixels, and with spot finding the spot lists and hit flags in
//! `/entry/result_1` (the CXI peak-list layout CrystFEL reads with `peak_list`).

use std::path::{Path, PathBuf};

use hdf5::types::VarLenUnicode;
use hdf5::{Dataset, File, Group};
use rdaq_detector::{Geometry, MODULE_COLS};
use rdaq_process::bitshuffle::{Codec, Compressor};
use rdaq_process::spots::Spot;
use thiserror::Error;

use crate::space::Reserve;

/// HDF5 filter id of bitshuffle.
pub const BSHUF_FILTER: i32 = 32008;
/// NXmx pixel_mask bit 1 ("dead"), used for pixels whose data was lost in transfer.
pub const MASK_MISSING: u32 = 1 << 1;

#[derive(Debug, Error)]
pub enum SinkError {
    #[error("HDF5 error on {path}: {source}")]
    Hdf5 { path: PathBuf, source: hdf5::Error },
    #[error("frame has {got} bytes, the dataset expects {want}")]
    FrameSize { got: usize, want: usize },
    /// Writing a frame failed (a full disk, an I/O error). The writer stops: the file keeps
    /// the frames written before, and [`NxmxWriter::finish`] still closes it cleanly.
    #[error("writing frame {frame} to {path} failed: {cause}")]
    Write { path: PathBuf, frame: u64, cause: String },
    /// A write after a failed one.
    #[error("{path}: writing stopped after an earlier failure")]
    Stopped { path: PathBuf },
}

/// Disk space the writer holds back from the start, given back when a write fails so that
/// the file's metadata can still be written and the file closed (see [`crate::space`]).
pub const RESERVE_BYTES: u64 = 8 << 20;
/// Free space a frame's chunk must leave on the filesystem, besides the reserve, for the
/// metadata that grows with it: below it the writer stops as if the disk were full, before
/// HDF5 meets the full disk in the middle of an update.
pub const HEADROOM_BYTES: u64 = 1 << 20;

/// What a pixel of `/entry/data/data` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PixelType {
    /// Raw JUNGFRAU words (gain bits and ADC), uint16.
    Raw,
    /// Energy in keV, float32 (+inf saturated, NaN error or masked).
    Kev,
    /// Photon counts, int16 (max saturated, min error or masked).
    Photons16,
    /// Photon counts, int32.
    Photons32,
}

impl PixelType {
    pub fn bytes(self) -> usize {
        match self {
            PixelType::Raw | PixelType::Photons16 => 2,
            PixelType::Kev | PixelType::Photons32 => 4,
        }
    }

    /// The unit of a pixel value (and of sums of them, such as a spot's intensity).
    pub fn units(self) -> &'static str {
        match self {
            PixelType::Raw => "ADU",
            PixelType::Kev => "keV",
            PixelType::Photons16 | PixelType::Photons32 => "photons",
        }
    }
}

/// What the file says about the experiment and the detector.
#[derive(Clone, Debug)]
pub struct NxmxMeta {
    /// Where the modules sit in the image (the image is `geometry.height() x width()`).
    pub geometry: Geometry,
    pub photon_energy_kev: f64,
    pub frame_time_s: f64,
    pub detector_distance_m: f64,
    pub pixel_size_m: f64,
    pub sensor_material: String,
    pub sensor_thickness_m: f64,
    pub start_time: String,
    pub detector_name: String,
    pub pixel: PixelType,
    pub codec: Codec,
    /// Spot lists hold at most this many spots per frame (the rest are counted in nPeaks).
    pub max_spots: usize,
}

impl NxmxMeta {
    /// What rdaq writes for a JUNGFRAU detector of this geometry: 75 µm silicon pixels,
    /// 320 µm thick, 0.1 m from the sample (a placeholder until the beamline says), started
    /// now; raw pixels, LZ4.
    pub fn jungfrau(geometry: Geometry, photon_energy_kev: f64, frame_time_s: f64) -> NxmxMeta {
        let modules = geometry.modules;
        NxmxMeta {
            geometry,
            photon_energy_kev,
            frame_time_s,
            detector_distance_m: 0.1,
            pixel_size_m: 75e-6,
            sensor_material: "Si".into(),
            sensor_thickness_m: 320e-6,
            start_time: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            detector_name: format!("JUNGFRAU {modules}-module (rdaq)"),
            pixel: PixelType::Raw,
            codec: Codec::Lz4,
            max_spots: 0,
        }
    }
}

pub struct NxmxWriter {
    path: PathBuf,
    file: File,
    data: Dataset,
    mask: Option<Dataset>,
    meta: NxmxMeta,
    frames: usize,
    frame_numbers: Vec<u64>,
    complete: Vec<u8>,
    incomplete_frames: Vec<u64>,
    words: Compressor,
    mask_words: Compressor,
    chunk: Vec<u8>,
    mask_buf: Vec<u32>,
    results: Option<Results>,
    pub bytes_written: u64,
    reserve: Option<Reserve>,
    /// Set by the first failed write; nothing is written after it.
    failed: bool,
    /// Frames whose rows of the per-frame tables are in the file.
    tables_written: usize,
}

/// Spot lists, buffered and written a block of [`GROW`] frames at a time.
struct Results {
    n_peaks: Dataset,
    x: Dataset,
    y: Dataset,
    intensity: Dataset,
    pixels: Dataset,
    hit: Dataset,
    written: usize,
    buf_n: Vec<u32>,
    buf_x: Vec<f32>,
    buf_y: Vec<f32>,
    buf_i: Vec<f32>,
    buf_p: Vec<u32>,
    buf_hit: Vec<u8>,
}

impl Results {
    /// Keeps the rows of the first `n` frames only (after a failed write took frames back).
    fn truncate(&mut self, n: usize, per_frame: usize) {
        let keep = n.saturating_sub(self.written);
        self.buf_n.truncate(keep);
        self.buf_hit.truncate(keep);
        for b in [&mut self.buf_x, &mut self.buf_y, &mut self.buf_i] {
            b.truncate(keep * per_frame);
        }
        self.buf_p.truncate(keep * per_frame);
        if self.written > n {
            // best effort: the file is being rescued after a failure
            let _ = self.n_peaks.resize(n);
            let _ = self.hit.resize(n);
            for ds in [&self.x, &self.y, &self.intensity, &self.pixels] {
                let _ = ds.resize((n, per_frame));
            }
            self.written = n;
        }
    }
}

/// Frames by which the spot lists and the per-frame tables are written at a time.
const GROW: usize = 256;

fn str_attr(loc: &hdf5::Location, name: &str, value: &str) -> hdf5::Result<()> {
    let v: VarLenUnicode = value.parse().map_err(|e| hdf5::Error::from(format!("{e:?}")))?;
    loc.new_attr::<VarLenUnicode>().create(name)?.write_scalar(&v)
}

fn nx_group(parent: &Group, name: &str, class: &str) -> hdf5::Result<Group> {
    let g = parent.create_group(name)?;
    str_attr(&g, "NX_class", class)?;
    Ok(g)
}

fn str_ds(g: &Group, name: &str, value: &str) -> hdf5::Result<Dataset> {
    let v: VarLenUnicode = value.parse().map_err(|e| hdf5::Error::from(format!("{e:?}")))?;
    let d = g.new_dataset::<VarLenUnicode>().create(name)?;
    d.write_scalar(&v)?;
    Ok(d)
}

fn f64_ds(g: &Group, name: &str, value: f64, units: &str) -> hdf5::Result<Dataset> {
    let d = g.new_dataset::<f64>().create(name)?;
    d.write_scalar(&value)?;
    if !units.is_empty() {
        str_attr(&d, "units", units)?;
    }
    Ok(d)
}

/// A translation axis in an NXtransformations group.
fn axis(g: &Group, name: &str, value: f64, units: &str, vector: [f64; 3], depends_on: &str, offset: Option<[f64; 3]>) -> hdf5::Result<()> {
    let d = f64_ds(g, name, value, units)?;
    str_attr(&d, "transformation_type", "translation")?;
    str_attr(&d, "depends_on", depends_on)?;
    d.new_attr::<f64>().shape(3).create("vector")?.write(&vector)?;
    if let Some(o) = offset {
        d.new_attr::<f64>().shape(3).create("offset")?.write(&o)?;
        str_attr(&d, "offset_units", units)?;
    }
    Ok(())
}

/// A chunked, resizable 3-D dataset with bitshuffle (optional) registered.
pub fn frame_stack<T: hdf5::H5Type>(g: &Group, name: &str, h: usize, w: usize, codec: Codec) -> hdf5::Result<Dataset> {
    let dcpl = hdf5::plist::DatasetCreate::try_new()?;
    // 0, 4: bitshuffle version fields (informational), element size, block size 0 (auto),
    // codec (2 LZ4, 3 Zstd) and level. Set through the C API because the filter need not
    // be registered here.
    let [c, level] = codec.cd_values();
    let cd: [libc_uint; 6] = [0, 4, std::mem::size_of::<T>() as libc_uint, 0, c, level];
    // SAFETY: `dcpl` is a live dataset-creation property list for the call, and `cd` holds
    // the `cd.len()` values the call reads; HDF5's global lock is held (`sync`).
    let rc = hdf5::sync::sync(|| unsafe {
        hdf5_sys::h5p::H5Pset_filter(dcpl.id(), BSHUF_FILTER, hdf5_sys::h5z::H5Z_FLAG_OPTIONAL, cd.len(), cd.as_ptr())
    });
    if rc < 0 {
        return Err("H5Pset_filter(bitshuffle) failed".into());
    }
    g.new_dataset::<T>().set_dcpl(&dcpl).chunk((1, h, w)).shape((0.., h, w)).create(name)
}

#[allow(non_camel_case_types)]
type libc_uint = std::os::raw::c_uint;

impl NxmxWriter {
    /// Creates the file (replacing one of the same name: the caller decides whether that
    /// is allowed) and holds [`RESERVE_BYTES`] of disk space beside it for closing it.
    pub fn create(path: &Path, meta: &NxmxMeta) -> Result<Self, SinkError> {
        let err = |source| SinkError::Hdf5 { path: path.to_owned(), source };
        let mut w = Self::build(path, meta).map_err(err)?;
        w.reserve = Reserve::hold(path, RESERVE_BYTES).ok();
        Ok(w)
    }

    /// Whether disk space is held back for closing the file after a failed write (false when
    /// the filesystem could not give [`RESERVE_BYTES`]: then a full disk may spoil the file).
    pub fn has_reserve(&self) -> bool {
        self.reserve.is_some()
    }

    /// Stops writing after a failed write of `frame`, saying why in terms of the operating
    /// system where HDF5 knows it.
    fn fail(&mut self, frame: u64, e: hdf5::Error) -> SinkError {
        let cause = os_error(&e).map_or_else(|| e.to_string(), |o| o.to_string());
        self.stop_writing(frame, cause)
    }

    /// Stops writing and gives the reserve back, so that closing the file has room.
    fn stop_writing(&mut self, frame: u64, cause: String) -> SinkError {
        self.failed = true;
        if let Some(r) = self.reserve.as_mut() {
            r.release();
        }
        SinkError::Write { path: self.path.clone(), frame, cause }
    }

    /// The filesystem's free space when it is short of `bytes` plus [`HEADROOM_BYTES`].
    fn short_of_space(&self, bytes: usize) -> Option<u64> {
        let dir = self.path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        crate::space::free_bytes(dir).ok().filter(|&free| free < bytes as u64 + HEADROOM_BYTES)
    }

    fn build(path: &Path, meta: &NxmxMeta) -> hdf5::Result<Self> {
        let file = File::create(path)?;
        str_attr(&file, "default", "entry")?;
        let entry = nx_group(&file, "entry", "NXentry")?;
        str_attr(&entry, "default", "data")?;
        str_ds(&entry, "definition", "NXmx")?;
        str_ds(&entry, "start_time", &meta.start_time)?;
        let data = data_group(&entry, meta)?;
        let instrument = nx_group(&entry, "instrument", "NXinstrument")?;
        let beam = nx_group(&instrument, "beam", "NXbeam")?;
        f64_ds(&beam, "incident_wavelength", 12.398_419_843_320_026 / meta.photon_energy_kev, "angstrom")?;
        detector_group(&instrument, meta)?;
        let sample = nx_group(&entry, "sample", "NXsample")?;
        str_ds(&sample, "depends_on", ".")?;
        let source = nx_group(&entry, "source", "NXsource")?;
        str_ds(&source, "name", "rdaq detector emulator")?;
        Ok(NxmxWriter {
            path: path.to_owned(),
            file,
            data,
            mask: None,
            meta: meta.clone(),
            frames: 0,
            frame_numbers: Vec::new(),
            complete: Vec::new(),
            incomplete_frames: Vec::new(),
            words: Compressor::new(meta.pixel.bytes(), 0, meta.codec),
            mask_words: Compressor::new(4, 0, Codec::Lz4),
            chunk: Vec::new(),
            mask_buf: Vec::new(),
            results: None,
            bytes_written: 0,
            reserve: None,
            failed: false,
            tables_written: 0,
        })
    }

    fn err(&self) -> impl Fn(hdf5::Error) -> SinkError + '_ {
        move |source| SinkError::Hdf5 { path: self.path.clone(), source }
    }

    /// Appends an assembled frame of little-endian pixels of the file's pixel type,
    /// compressing it here. `missing` lists byte ranges of the image that carry no data
    /// (incomplete frame); they are flagged in a per-frame mask.
    pub fn write_frame(&mut self, frame_number: u64, pixels: &[u8], missing: &[(usize, usize)]) -> Result<(), SinkError> {
        let want = self.meta.geometry.height() * self.meta.geometry.width() * self.meta.pixel.bytes();
        if pixels.len() != want {
            return Err(SinkError::FrameSize { got: pixels.len(), want });
        }
        let mut chunk = std::mem::take(&mut self.chunk);
        self.words.compress(pixels, &mut chunk);
        let r = self.write_chunk(frame_number, &chunk, missing);
        self.chunk = chunk;
        r
    }

    /// Appends a frame already compressed as a chunk of the file's codec and pixel type
    /// (by a pipeline stage). `missing` as in [`NxmxWriter::write_frame`] (byte ranges of
    /// the raw 16-bit image: the mask is per pixel whatever the type).
    pub fn write_chunk(&mut self, frame_number: u64, chunk: &[u8], missing: &[(usize, usize)]) -> Result<(), SinkError> {
        if self.failed {
            return Err(SinkError::Stopped { path: self.path.clone() });
        }
        if let Some(free) = self.short_of_space(chunk.len()) {
            let cause = format!("{} ({free} bytes free for a {}-byte frame)", std::io::Error::from_raw_os_error(libc::ENOSPC), chunk.len());
            return Err(self.stop_writing(frame_number, cause));
        }
        let (h, w) = (self.meta.geometry.height(), self.meta.geometry.width());
        // one row at a time: a failed write leaves at most its own row behind
        self.data.resize((self.frames + 1, h, w)).map_err(self.err())?;
        if let Err(e) = write_chunk(&self.data, self.frames, chunk) {
            return Err(self.fail(frame_number, e));
        }
        self.bytes_written += chunk.len() as u64;
        if !missing.is_empty() {
            if let Err(e) = self.write_mask(missing) {
                return Err(self.fail(frame_number, e));
            }
            self.incomplete_frames.push(frame_number);
        }
        self.frame_numbers.push(frame_number);
        self.complete.push(missing.is_empty() as u8);
        self.frames += 1;
        // the tables go out a block at a time, so that closing the file after a failed
        // write has little left to write
        if self.frames % GROW == 0 {
            if let Err(e) = self.write_tables() {
                return Err(self.fail(frame_number, e));
            }
        }
        Ok(())
    }

    /// Appends the rows of the per-frame tables not yet in the file.
    fn write_tables(&mut self) -> hdf5::Result<()> {
        let (a, b) = (self.tables_written, self.frames);
        let g = self.file.group("entry/data")?;
        let fnum = g.dataset("frame_number")?;
        fnum.resize(b)?;
        fnum.write_slice(&self.frame_numbers[a..b], a..b)?;
        let comp = g.dataset("frame_complete")?;
        comp.resize(b)?;
        comp.write_slice(&self.complete[a..b], a..b)?;
        self.tables_written = b;
        Ok(())
    }

    /// After a failed write, the frames whose chunks HDF5 really holds: the first `n` with
    /// a chunk allocated (a full disk can cost the index entry of a chunk written just
    /// before). Later frames are dropped from the tables, so that no frame reads as zeros.
    fn trim_to_allocated(&mut self) {
        let mut have = vec![false; self.frames];
        for i in 0..self.data.num_chunks().unwrap_or(0) {
            if let Some(c) = self.data.chunk_info(i) {
                if let Some(h) = have.get_mut(c.offset[0] as usize) {
                    *h = true;
                }
            }
        }
        let n = have.iter().position(|h| !h).unwrap_or(self.frames);
        if n < self.frames {
            self.frames = n;
            self.frame_numbers.truncate(n);
            self.complete.truncate(n);
            let kept: std::collections::HashSet<u64> = self.frame_numbers.iter().copied().collect();
            self.incomplete_frames.retain(|f| kept.contains(f));
            self.tables_written = self.tables_written.min(n);
            let per_frame = self.meta.max_spots;
            if let Some(r) = self.results.as_mut() {
                r.truncate(n, per_frame);
            }
        }
    }

    /// Records the spots and the hit decision of the frame written last (call once per
    /// frame written, from the first frame on, or never).
    pub fn write_spots(&mut self, spots: &[Spot], total: usize, hit: bool) -> Result<(), SinkError> {
        if self.results.is_none() {
            let r = self.create_results().map_err(self.err())?;
            self.results = Some(r);
        }
        let max = self.meta.max_spots;
        let r = self.results.as_mut().expect("created above");
        r.buf_n.push(total as u32);
        for k in 0..max {
            let s = spots.get(k);
            r.buf_x.push(s.map_or(0.0, |s| s.x));
            r.buf_y.push(s.map_or(0.0, |s| s.y));
            r.buf_i.push(s.map_or(0.0, |s| s.intensity));
            r.buf_p.push(s.map_or(0, |s| s.pixels));
        }
        r.buf_hit.push(hit as u8);
        if r.buf_n.len() == GROW {
            if let Err(e) = self.flush_results() {
                let frame = self.frame_numbers.last().copied().unwrap_or(0);
                return Err(self.fail(frame, e));
            }
        }
        Ok(())
    }

    fn create_results(&self) -> hdf5::Result<Results> {
        let entry = self.file.group("entry")?;
        let g = nx_group(&entry, "result_1", "NXcollection")?;
        str_attr(&g, "description", "Bragg spots per frame (CXI peak-list layout); positions in pixels, fast (x) and slow (y)")?;
        let m = self.meta.max_spots;
        let per_frame = |name: &str| g.new_dataset::<f32>().chunk((GROW, m.max(1))).shape((0.., m)).create(name);
        let intensity = per_frame("peakTotalIntensity")?;
        str_attr(&intensity, "units", self.meta.pixel.units())?;
        Ok(Results {
            n_peaks: g.new_dataset::<u32>().chunk(GROW).shape(0..).create("nPeaks")?,
            x: per_frame("peakXPosRaw")?,
            y: per_frame("peakYPosRaw")?,
            intensity,
            pixels: g.new_dataset::<u32>().chunk((GROW, m.max(1))).shape((0.., m)).create("peakNPixels")?,
            hit: g.new_dataset::<u8>().chunk(GROW).shape(0..).create("hit")?,
            written: 0,
            buf_n: Vec::with_capacity(GROW),
            buf_x: Vec::with_capacity(GROW * m),
            buf_y: Vec::with_capacity(GROW * m),
            buf_i: Vec::with_capacity(GROW * m),
            buf_p: Vec::with_capacity(GROW * m),
            buf_hit: Vec::with_capacity(GROW),
        })
    }

    fn flush_results(&mut self) -> hdf5::Result<()> {
        let m = self.meta.max_spots;
        let Some(r) = self.results.as_mut() else { return Ok(()) };
        let (a, n) = (r.written, r.buf_n.len());
        if n == 0 {
            return Ok(());
        }
        let to_err = |e: ndarray::ShapeError| hdf5::Error::from(e.to_string());
        r.n_peaks.resize(a + n)?;
        r.n_peaks.write_slice(&r.buf_n, a..a + n)?;
        r.hit.resize(a + n)?;
        r.hit.write_slice(&r.buf_hit, a..a + n)?;
        for (ds, buf) in [(&r.x, &r.buf_x), (&r.y, &r.buf_y), (&r.intensity, &r.buf_i)] {
            ds.resize((a + n, m))?;
            ds.write_slice(ndarray::ArrayView2::from_shape((n, m), buf).map_err(to_err)?, ndarray::s![a..a + n, ..])?;
        }
        r.pixels.resize((a + n, m))?;
        r.pixels.write_slice(ndarray::ArrayView2::from_shape((n, m), &r.buf_p).map_err(to_err)?, ndarray::s![a..a + n, ..])?;
        r.written += n;
        r.buf_n.clear();
        r.buf_x.clear();
        r.buf_y.clear();
        r.buf_i.clear();
        r.buf_p.clear();
        r.buf_hit.clear();
        Ok(())
    }

    fn write_mask(&mut self, missing: &[(usize, usize)]) -> hdf5::Result<()> {
        let (h, w) = (self.meta.geometry.height(), self.meta.geometry.width());
        if self.mask.is_none() {
            let g = self.file.group("entry/data")?;
            self.mask = Some(frame_stack::<u32>(&g, "incomplete_pixel_mask", h, w, Codec::Lz4)?);
        }
        self.mask_buf.clear();
        self.mask_buf.resize(h * w, 0);
        for &(start, len) in missing {
            self.mask_buf[start / 2..(start + len) / 2].fill(MASK_MISSING);
        }
        let mask = self.mask.as_ref().expect("created above");
        let k = self.incomplete_frames.len();
        mask.resize((k + 1, h, w))?;
        // SAFETY: u32 has no padding; the host is little-endian like the HDF5 type.
        let bytes = unsafe { std::slice::from_raw_parts(self.mask_buf.as_ptr().cast::<u8>(), self.mask_buf.len() * 4) };
        self.mask_words.compress(bytes, &mut self.chunk);
        write_chunk(mask, k, &self.chunk)?;
        self.bytes_written += self.chunk.len() as u64;
        Ok(())
    }

    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Trims the datasets to the frames written and writes the per-frame tables: the file
    /// holds exactly the frames whose writes succeeded, also after a failed write.
    pub fn finish(mut self) -> Result<Closed, SinkError> {
        if let Some(r) = self.reserve.as_mut() {
            r.release();
        }
        if self.failed {
            self.trim_to_allocated();
        }
        self.flush_results().map_err(self.err())?;
        self.write_tables().map_err(self.err())?;
        let (h, w) = (self.meta.geometry.height(), self.meta.geometry.width());
        let untrimmed = match self.data.resize((self.frames, h, w)) {
            Ok(()) => None,
            Err(err) if self.failed => {
                // HDF5 met the full disk mid-update and cannot drop the failed frame's row;
                // the tables say which rows are frames, and the rest of the file closes
                Some(err.to_string())
            }
            Err(err) => return Err(self.err()(err)),
        };
        let e = self.err();
        let g = self.file.group("entry/data").map_err(&e)?;
        if let Some(mask) = &self.mask {
            mask.resize((self.incomplete_frames.len(), h, w)).map_err(&e)?;
        }
        if !self.incomplete_frames.is_empty() {
            g.new_dataset::<u64>().shape(self.incomplete_frames.len()).create("incomplete_frame_number").map_err(&e)?
                .write(&self.incomplete_frames).map_err(&e)?;
        }
        self.file.flush().map_err(&e)?;
        Ok(Closed { path: self.path.clone(), frames: self.frames as u64, untrimmed })
    }
}

/// A file the writer closed.
#[derive(Debug)]
pub struct Closed {
    pub path: PathBuf,
    /// Frames in the file (after a failed write, those HDF5 really holds).
    pub frames: u64,
    /// After a failed write whose row HDF5 could not drop: why. `/entry/data/data` then has
    /// one row more than `/entry/data/frame_number` (the failed frame's, not data).
    pub untrimmed: Option<String>,
}

/// Writes one pre-compressed chunk at frame index `index`. On failure the error carries
/// HDF5's error stack (see [`os_error`]).
pub fn write_chunk(ds: &Dataset, index: usize, chunk: &[u8]) -> hdf5::Result<()> {
    let offset: [hdf5_sys::h5::hsize_t; 3] = [index as _, 0, 0];
    hdf5::sync::sync(|| {
        // SAFETY: `offset` has one entry per dataset dimension and `chunk` is a live buffer
        // of the given size; filter mask 0 says the (only) filter was applied.
        let rc = unsafe {
            hdf5_sys::h5d::H5Dwrite_chunk(ds.id(), hdf5_sys::h5p::H5P_DEFAULT, 0, offset.as_ptr(), chunk.len(), chunk.as_ptr().cast())
        };
        // the stack is read under the same lock, before another call can replace it
        hdf5::h5check(rc).map(drop)
    })
}

/// The operating system's error behind an HDF5 error, where HDF5's file driver recorded
/// one (its messages say `errno = 28, error message = 'No space left on device'`).
pub fn os_error(e: &hdf5::Error) -> Option<std::io::Error> {
    let stack = e.stack()?;
    stack.iter().find_map(|f| {
        let at = f.desc().find("errno = ")? + "errno = ".len();
        let digits: String = f.desc()[at..].chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok().map(std::io::Error::from_raw_os_error)
    })
}

/// `/entry/data`: the frame stack of the file's pixel type (one frame per chunk) and the
/// per-frame tables.
fn data_group(entry: &Group, meta: &NxmxMeta) -> hdf5::Result<Dataset> {
    let (h, w) = (meta.geometry.height(), meta.geometry.width());
    let data_g = nx_group(entry, "data", "NXdata")?;
    str_attr(&data_g, "signal", "data")?;
    let data = match meta.pixel {
        PixelType::Raw => frame_stack::<u16>(&data_g, "data", h, w, meta.codec)?,
        PixelType::Kev => frame_stack::<f32>(&data_g, "data", h, w, meta.codec)?,
        PixelType::Photons16 => frame_stack::<i16>(&data_g, "data", h, w, meta.codec)?,
        PixelType::Photons32 => frame_stack::<i32>(&data_g, "data", h, w, meta.codec)?,
    };
    str_attr(&data, "units", meta.pixel.units())?;
    data_g.new_dataset::<u64>().chunk(1024).shape(0..).create("frame_number")?;
    data_g.new_dataset::<u8>().chunk(1024).shape(0..).create("frame_complete")?;
    Ok(data)
}

/// `/entry/instrument/detector`: the detector's description, the pixel markers and mask,
/// its position, and its modules.
fn detector_group(instrument: &Group, meta: &NxmxMeta) -> hdf5::Result<()> {
    let g = meta.geometry;
    let (h, w) = (g.height(), g.width());
    let det = nx_group(instrument, "detector", "NXdetector")?;
    str_ds(&det, "description", &meta.detector_name)?;
    f64_ds(&det, "beam_center_x", w as f64 / 2.0, "pixel")?;
    f64_ds(&det, "beam_center_y", h as f64 / 2.0, "pixel")?;
    f64_ds(&det, "distance", meta.detector_distance_m, "m")?;
    f64_ds(&det, "count_time", meta.frame_time_s, "s")?;
    f64_ds(&det, "frame_time", meta.frame_time_s, "s")?;
    f64_ds(&det, "x_pixel_size", meta.pixel_size_m, "m")?;
    f64_ds(&det, "y_pixel_size", meta.pixel_size_m, "m")?;
    str_ds(&det, "sensor_material", &meta.sensor_material)?;
    f64_ds(&det, "sensor_thickness", meta.sensor_thickness_m, "m")?;
    pixel_markers(&det, meta.pixel)?;
    // gaps between modules; the emulated detector has no static defects, and transfer
    // losses go to the per-frame mask
    det.new_dataset::<u32>().shape((h, w)).create("pixel_mask")?.write_raw(&g.gap_mask())?;
    str_ds(&det, "depends_on", "/entry/instrument/detector/transformations/translation")?;
    let tr = nx_group(&det, "transformations", "NXtransformations")?;
    axis(&tr, "translation", meta.detector_distance_m, "m", [0.0, 0.0, 1.0], ".", None)?;
    for m in 0..g.modules {
        module_group(&det, meta, m)?;
    }
    Ok(())
}

/// The markers of each pixel type: saturated pixels read the saturation value, error and
/// masked pixels the underload value (NaN for keV, which no threshold passes).
fn pixel_markers(det: &Group, pixel: PixelType) -> hdf5::Result<()> {
    let (sat, under) = match pixel {
        PixelType::Raw => (0x3fff as f64, -1.0),
        PixelType::Kev => (f64::INFINITY, f64::NAN),
        PixelType::Photons16 => (i16::MAX as f64, i16::MIN as f64),
        PixelType::Photons32 => (i32::MAX as f64, i32::MIN as f64),
    };
    if pixel == PixelType::Kev {
        det.new_dataset::<f64>().create("saturation_value")?.write_scalar(&sat)?;
        det.new_dataset::<f64>().create("underload_value")?.write_scalar(&under)?;
    } else {
        det.new_dataset::<i64>().create("saturation_value")?.write_scalar(&(sat as i64))?;
        det.new_dataset::<i64>().create("underload_value")?.write_scalar(&(under as i64))?;
    }
    det.new_dataset::<i32>().create("bit_depth_image")?.write_scalar(&(pixel.bytes() as i32 * 8))?;
    Ok(())
}

/// `module_<m>`: where module `m` sits in the image and in space.
fn module_group(det: &Group, meta: &NxmxMeta, m: u16) -> hdf5::Result<()> {
    let g = meta.geometry;
    let (h, w) = (g.height(), g.width());
    let mg = nx_group(det, &format!("module_{m}"), "NXdetector_module")?;
    let (r0, c0) = g.origin(m);
    mg.new_dataset::<i32>().shape(2).create("data_origin")?.write(&[r0 as i32, c0 as i32])?;
    mg.new_dataset::<i32>().shape(2).create("data_size")?.write(&[g.module_height as i32, MODULE_COLS as i32])?;
    // the module's first pixel relative to the beam centre (image centre), with the fast
    // axis along -x and the slow axis along -y
    let px = meta.pixel_size_m;
    let origin = [(w as f64 / 2.0 - c0 as f64) * px, (h as f64 / 2.0 - r0 as f64) * px, 0.0];
    let offset = format!("/entry/instrument/detector/module_{m}/module_offset");
    for (name, vector) in [("fast_pixel_direction", [-1.0, 0.0, 0.0]), ("slow_pixel_direction", [0.0, -1.0, 0.0])] {
        let d = f64_ds(&mg, name, px, "m")?;
        str_attr(&d, "transformation_type", "translation")?;
        str_attr(&d, "depends_on", &offset)?;
        d.new_attr::<f64>().shape(3).create("vector")?.write(&vector)?;
    }
    axis(&mg, "module_offset", 0.0, "m", [1.0, 0.0, 0.0], "/entry/instrument/detector/transformations/translation", Some(origin))
}
