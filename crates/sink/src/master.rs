//! The master file of a series (`<name>_master.h5`, as Dectris detectors and Jungfraujoch
//! write it): all metadata, and the data files joined without copying a byte. `/entry/data`
//! holds an external link per data file (`data_000001` -> `<name>_data_000001.h5:/entry/data/data`,
//! what XDS/Durin follow) and virtual datasets that read as one array across the files:
//! `data` (the images; what DIALS and h5py read), the per-frame tables and, with spot
//! finding, `/entry/result_1`.
//!
//! It is written at the start (no images yet), again after each flush of the data files
//! (covering exactly the images flushed, so that a reader of the master, during the run or
//! after a crash, sees only frames that are in the data files: never a planned frame that
//! reads as zeros or fails), and at the end with the images the files hold. Each time it is
//! written beside and renamed over the old one, so that a master file is always whole. It
//! keeps the series' metadata as JSON in its `rdaq_series` attribute, so that `rdaq
//! recover` can write it again from the data files after a crash ([`read_meta`]).

use std::path::Path;

use hdf5::{Dataset, Extents, File, Group, H5Type, Hyperslab, Selection, SliceOrIndex};

use crate::instrument::{write_metadata, MaskChunk};
use crate::meta::{NxmxMeta, PixelType};
use crate::nexus::{nx_group, str_attr, str_ds};

/// One data file of the series as the master sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// The data file's name, relative to the master's directory.
    pub file: String,
    pub frames: u64,
    /// Incomplete frames in the file (rows of its `incomplete_pixel_mask`).
    pub incomplete: u64,
}

/// The name of data file `k` (from 1) of the series whose master is `master`:
/// `<name>_data_00000k.h5` for `<name>_master.h5` (or for `<name>.h5`).
pub fn data_file_name(master: &Path, k: usize) -> String {
    let stem = master.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let name = stem.strip_suffix("_master").unwrap_or(&stem);
    format!("{name}_data_{k:06}.h5")
}

/// What the master says beyond the metadata.
pub struct Contents<'a> {
    pub parts: &'a [Part],
    /// Frame numbers of the incomplete frames (known at the end).
    pub incomplete: &'a [u64],
    /// Frame numbers of all images, in order.
    pub frames: &'a [u64],
    pub end_time: Option<&'a str>,
}

/// Rows of one data file placed in the master's virtual datasets: `count` rows from
/// `src_start` on, at rows `dst_start`, `dst_start + dst_step`, ... of the master's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub file: String,
    pub src_start: usize,
    pub dst_start: usize,
    pub dst_step: usize,
    pub count: usize,
}

/// Where a master's rows come from: the data files it links, the pieces of its images (and
/// per-frame tables) and of its incomplete frames' masks, and the frame numbers of both.
pub struct Layout<'a> {
    pub files: Vec<String>,
    pub frames: Vec<Piece>,
    pub masks: Vec<Piece>,
    pub frame_numbers: &'a [u64],
    pub incomplete: &'a [u64],
    pub end_time: Option<&'a str>,
}

impl Layout<'_> {
    /// The layout of a series' own data files, one after the other.
    fn of<'a>(c: &Contents<'a>) -> Layout<'a> {
        let pieces = |rows: &dyn Fn(&Part) -> u64| {
            let mut at = 0;
            let mut out = Vec::new();
            for p in c.parts {
                let count = rows(p) as usize;
                if count > 0 {
                    out.push(Piece { file: p.file.clone(), src_start: 0, dst_start: at, dst_step: 1, count });
                }
                at += count;
            }
            out
        };
        Layout {
            files: c.parts.iter().map(|p| p.file.clone()).collect(),
            frames: pieces(&|p| p.frames),
            masks: pieces(&|p| p.incomplete),
            frame_numbers: c.frames,
            incomplete: c.incomplete,
            end_time: c.end_time,
        }
    }
}

/// Writes the master file `path` (beside it first, then renamed over it).
pub fn write_master(path: &Path, meta: &NxmxMeta, mask: &MaskChunk, c: &Contents) -> hdf5::Result<()> {
    write_layout(path, meta, mask, &Layout::of(c))
}

/// Writes a master file `path` whose rows are laid out as `l` says (beside it first, then
/// renamed over it).
pub fn write_layout(path: &Path, meta: &NxmxMeta, mask: &MaskChunk, l: &Layout) -> hdf5::Result<()> {
    let tmp = crate::claim::claim_staging(path).map_err(|e| hdf5::Error::from(e.to_string()))?;
    let written = write_staged(&tmp, meta, mask, l);
    if written.is_err() {
        // a master that could not be written (a full disk) leaves nothing beside the series
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    std::fs::rename(&tmp, path).map_err(|e| hdf5::Error::from(format!("cannot rename {} to {}: {e}", tmp.display(), path.display())))
}

/// The master's content, written to its staging name `tmp`.
fn write_staged(tmp: &Path, meta: &NxmxMeta, mask: &MaskChunk, l: &Layout) -> hdf5::Result<()> {
    {
        let file = File::create(tmp)?;
        write_series(&file, meta)?;
        let entry = write_metadata(&file, meta, mask, l.frame_numbers)?;
        if let Some(t) = l.end_time {
            str_ds(&entry, "end_time", t)?;
        }
        data_group(&entry, meta, l)?;
        if meta.max_spots > 0 {
            results_group(&entry, meta, l)?;
        }
        file.flush()?;
    }
    Ok(())
}

/// The master's attribute that holds the series' metadata (JSON).
const SERIES_ATTR: &str = "rdaq_series";

/// The series' metadata as the master `path` keeps it: the JSON of its `rdaq_series`
/// attribute, with the module mask taken from module 0's place in the pixel mask.
pub fn read_meta(path: &Path) -> hdf5::Result<NxmxMeta> {
    let file = File::open(path)?;
    let mut meta = series_of(&file)?;
    let mask_ds = file.dataset("entry/instrument/detector/pixel_mask")?;
    let mask: Vec<u32> = rdaq_process::chunk_size::reading(&mask_ds, || mask_ds.read_raw())?;
    let g = meta.geometry;
    if mask.len() != g.height() * g.width() {
        return Err(format!("pixel_mask has {} pixels, the image {}", mask.len(), g.height() * g.width()).into());
    }
    let module: Vec<u32> = (0..g.module_height).flat_map(|y| mask[y * g.width()..y * g.width() + g.module_width].iter().copied()).collect();
    meta.module_mask = module.iter().any(|&m| m != 0).then_some(module);
    Ok(meta)
}

/// The series' metadata a file rdaq wrote keeps in its `rdaq_series` attribute (a master,
/// or a file `rdaq process convert` made from one), without the module mask.
pub fn read_series(path: &Path) -> hdf5::Result<NxmxMeta> {
    series_of(&File::open(path)?)
}

/// Keeps `meta` in `file`'s `rdaq_series` attribute.
pub fn write_series(file: &File, meta: &NxmxMeta) -> hdf5::Result<()> {
    let series = serde_json::to_string(meta).map_err(|e| hdf5::Error::from(e.to_string()))?;
    str_attr(file, SERIES_ATTR, &series)
}

fn series_of(file: &File) -> hdf5::Result<NxmxMeta> {
    let json: hdf5::types::VarLenUnicode = file.attr(SERIES_ATTR)?.read_scalar()?;
    serde_json::from_str(json.as_str()).map_err(|e| hdf5::Error::from(format!("{SERIES_ATTR}: {e}")))
}

/// `/entry/data`: the links to the data files and the virtual datasets across them.
fn data_group(entry: &Group, meta: &NxmxMeta, l: &Layout) -> hdf5::Result<()> {
    let g = nx_group(entry, "data", "NXdata")?;
    str_attr(&g, "signal", "data")?;
    for (k, f) in l.files.iter().enumerate() {
        g.link_external(f, "/entry/data/data", &format!("data_{:06}", k + 1))?;
    }
    let (h, w) = (meta.geometry.height(), meta.geometry.width());
    let (src, n, f) = ("/entry/data/data", l.frame_numbers.len(), &l.frames);
    let data = match meta.pixel {
        PixelType::Raw => join::<u16>(&g, "data", f, n, src, &[h, w])?,
        PixelType::Kev => join::<f32>(&g, "data", f, n, src, &[h, w])?,
        PixelType::Photons16 | PixelType::Fields => join::<i16>(&g, "data", f, n, src, &[h, w])?,
        PixelType::Photons32 => join::<i32>(&g, "data", f, n, src, &[h, w])?,
        PixelType::Counts(_) => match meta.pixel.bytes() {
            1 => join::<u8>(&g, "data", f, n, src, &[h, w])?,
            2 => join::<u16>(&g, "data", f, n, src, &[h, w])?,
            _ => join::<u32>(&g, "data", f, n, src, &[h, w])?,
        },
    };
    str_attr(&data, "units", meta.pixel.units())?;
    join::<u64>(&g, "frame_number", f, n, "/entry/data/frame_number", &[])?;
    join::<u8>(&g, "frame_complete", f, n, "/entry/data/frame_complete", &[])?;
    g.new_dataset::<u64>().shape(l.incomplete.len()).create("incomplete_frame_number")?.write(l.incomplete)?;
    // the missing pixels of the incomplete frames, one mask per incomplete frame
    join::<u32>(&g, "incomplete_pixel_mask", &l.masks, l.incomplete.len(), "/entry/data/incomplete_pixel_mask", &[h, w])?;
    Ok(())
}

/// `/entry/result_1`: the spot lists across the data files.
fn results_group(entry: &Group, meta: &NxmxMeta, l: &Layout) -> hdf5::Result<()> {
    let g = nx_group(entry, "result_1", "NXcollection")?;
    str_attr(&g, "description", "Bragg spots per frame (CXI peak-list layout); positions in pixels, fast (x) and slow (y)")?;
    let m = [meta.max_spots];
    let src = |name: &str| format!("/entry/result_1/{name}");
    let (f, n) = (&l.frames, l.frame_numbers.len());
    join::<u32>(&g, "nPeaks", f, n, &src("nPeaks"), &[])?;
    join::<u8>(&g, "hit", f, n, &src("hit"), &[])?;
    join::<f32>(&g, "peakXPosRaw", f, n, &src("peakXPosRaw"), &m)?;
    join::<f32>(&g, "peakYPosRaw", f, n, &src("peakYPosRaw"), &m)?;
    let intensity = join::<f32>(&g, "peakTotalIntensity", f, n, &src("peakTotalIntensity"), &m)?;
    str_attr(&intensity, "units", meta.pixel.units())?;
    join::<u32>(&g, "peakNPixels", f, n, &src("peakNPixels"), &m)?;
    Ok(())
}

/// A virtual dataset `name` of `total` rows of shape `row`: each piece's rows of dataset
/// `src` of its file, at the piece's rows.
fn join<T: H5Type>(g: &Group, name: &str, pieces: &[Piece], total: usize, src: &str, row: &[usize]) -> hdf5::Result<Dataset> {
    let dims = |n: usize| Extents::from([&[n][..], row].concat());
    let rows = |start: usize, step: usize, count: usize| {
        let mut s = vec![SliceOrIndex::SliceCount { start, step, count, block: 1 }];
        s.extend(row.iter().map(|_| SliceOrIndex::from(..)));
        Selection::from(Hyperslab::from(s))
    };
    let mut b = g.new_dataset::<T>().shape(dims(total));
    for p in pieces {
        b = b.virtual_map(&p.file, src, dims(p.src_start + p.count), rows(p.src_start, 1, p.count), dims(total), rows(p.dst_start, p.dst_step, p.count));
    }
    b.create(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{PixelType, Rotation};
    use rdaq_process::bitshuffle::Codec;

    #[test]
    fn the_master_keeps_the_series_metadata() {
        let dir = std::env::temp_dir().join(format!("rdaq-master-meta-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let geometry = rdaq_detector::Geometry::new(2, 2, 8, 36).unwrap().with_module_size(6, 4);
        let module_mask: Vec<u32> = (0..24).map(|i| (i % 5 == 0) as u32).collect();
        let mut meta = NxmxMeta::described(geometry, &rdaq_detector::Description::load("eiger").unwrap(), PixelType::Counts(12), Some(module_mask));
        meta.codec = Codec::Zstd(7);
        meta.rotation = Some(Rotation { start_deg: 1.5, increment_deg: 0.25 });
        meta.max_spots = 3;
        let path = dir.join("m_master.h5");
        let c = Contents { parts: &[], incomplete: &[], frames: &[], end_time: None };
        write_master(&path, &meta, &MaskChunk::new(&meta), &c).unwrap();
        assert_eq!(format!("{:?}", read_meta(&path).unwrap()), format!("{meta:?}"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
