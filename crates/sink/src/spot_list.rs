//! Spot lists in the CXI peak-list layout (`/entry/result_1`, as CrystFEL's `peak_list`
//! reads it): per frame the number of spots found (`nPeaks`) and, in rows of a fixed width,
//! their positions, intensities and pixel counts, with a hit flag where a veto decided. A
//! data file of a series keeps its frames' lists here, and `rdaq process spots` writes a
//! file of them in the same layout.

use std::path::Path;

use hdf5::{Dataset, File, Group};
use rdaq_process::spots::Spot;

use crate::nexus::{nx_group, str_attr};

/// Rows by which the per-frame tables and spot lists are chunked.
pub(crate) const GROW: usize = 256;

/// The spot lists of a file, the rows of frames not yet flushed buffered.
pub struct SpotLists {
    n_peaks: Dataset,
    x: Dataset,
    y: Dataset,
    intensity: Dataset,
    pixels: Dataset,
    hit: Option<Dataset>,
    /// Spots kept per frame (the rows' width); `nPeaks` counts all found.
    max: usize,
    written: usize,
    buf_n: Vec<u32>,
    buf_x: Vec<f32>,
    buf_y: Vec<f32>,
    buf_i: Vec<f32>,
    buf_p: Vec<u32>,
    buf_hit: Vec<u8>,
}

impl SpotLists {
    /// Creates `entry/result_1` with rows of `max` spots (at least 1: a chunk has a width);
    /// the intensities in `units` when known, and a `hit` flag per frame when `hits`.
    pub fn create(entry: &Group, max: usize, units: Option<&str>, hits: bool) -> hdf5::Result<SpotLists> {
        let max = max.max(1);
        let g = nx_group(entry, "result_1", "NXcollection")?;
        str_attr(&g, "description", "Bragg spots per frame (CXI peak-list layout); positions in pixels, fast (x) and slow (y)")?;
        let per_frame = |name: &str| g.new_dataset::<f32>().chunk((GROW, max)).shape((0.., max)).create(name);
        let intensity = per_frame("peakTotalIntensity")?;
        if let Some(u) = units {
            str_attr(&intensity, "units", u)?;
        }
        let hit = if hits { Some(g.new_dataset::<u8>().chunk(GROW).shape(0..).create("hit")?) } else { None };
        Ok(SpotLists {
            n_peaks: g.new_dataset::<u32>().chunk(GROW).shape(0..).create("nPeaks")?,
            x: per_frame("peakXPosRaw")?,
            y: per_frame("peakYPosRaw")?,
            intensity,
            pixels: g.new_dataset::<u32>().chunk((GROW, max)).shape((0.., max)).create("peakNPixels")?,
            hit,
            max,
            written: 0,
            buf_n: Vec::with_capacity(GROW),
            buf_x: Vec::with_capacity(GROW * max),
            buf_y: Vec::with_capacity(GROW * max),
            buf_i: Vec::with_capacity(GROW * max),
            buf_p: Vec::with_capacity(GROW * max),
            buf_hit: Vec::with_capacity(GROW),
        })
    }

    /// Buffers the next frame's row: its first `max` spots of `total` found, and whether it
    /// was a hit (ignored without a `hit` dataset).
    pub fn push(&mut self, spots: &[Spot], total: usize, hit: bool) {
        self.buf_n.push(total as u32);
        for k in 0..self.max {
            let s = spots.get(k);
            self.buf_x.push(s.map_or(0.0, |s| s.x));
            self.buf_y.push(s.map_or(0.0, |s| s.y));
            self.buf_i.push(s.map_or(0.0, |s| s.intensity));
            self.buf_p.push(s.map_or(0, |s| s.pixels));
        }
        self.buf_hit.push(hit as u8);
    }

    /// Writes the buffered rows.
    pub fn write(&mut self) -> hdf5::Result<()> {
        let (a, n, m) = (self.written, self.buf_n.len(), self.max);
        if n == 0 {
            return Ok(());
        }
        let to_err = |e: ndarray::ShapeError| hdf5::Error::from(e.to_string());
        self.n_peaks.resize(a + n)?;
        self.n_peaks.write_slice(&self.buf_n, a..a + n)?;
        if let Some(hit) = &self.hit {
            hit.resize(a + n)?;
            hit.write_slice(&self.buf_hit, a..a + n)?;
        }
        for (ds, buf) in [(&self.x, &self.buf_x), (&self.y, &self.buf_y), (&self.intensity, &self.buf_i)] {
            ds.resize((a + n, m))?;
            ds.write_slice(ndarray::ArrayView2::from_shape((n, m), buf).map_err(to_err)?, ndarray::s![a..a + n, ..])?;
        }
        self.pixels.resize((a + n, m))?;
        self.pixels.write_slice(ndarray::ArrayView2::from_shape((n, m), &self.buf_p).map_err(to_err)?, ndarray::s![a..a + n, ..])?;
        self.written += n;
        self.buf_n.clear();
        self.buf_x.clear();
        self.buf_y.clear();
        self.buf_i.clear();
        self.buf_p.clear();
        self.buf_hit.clear();
        Ok(())
    }

    /// Keeps the rows of the first `n` frames only (after a failed write took frames back).
    pub fn truncate(&mut self, n: usize) {
        let keep = n.saturating_sub(self.written);
        self.buf_n.truncate(keep);
        self.buf_hit.truncate(keep);
        for b in [&mut self.buf_x, &mut self.buf_y, &mut self.buf_i] {
            b.truncate(keep * self.max);
        }
        self.buf_p.truncate(keep * self.max);
        if self.written > n {
            // best effort: the file is being rescued after a failure
            let _ = self.n_peaks.resize(n);
            if let Some(hit) = &self.hit {
                let _ = hit.resize(n);
            }
            for ds in [&self.x, &self.y, &self.intensity, &self.pixels] {
                let _ = ds.resize((n, self.max));
            }
            self.written = n;
        }
    }
}

/// Writes the new file `path` holding only the spot lists `all` (one per frame, every spot
/// kept), their intensities in `units` when known.
pub fn write_file(path: &Path, all: &[Vec<Spot>], units: Option<&str>) -> hdf5::Result<()> {
    let f = File::create(path)?;
    let entry = nx_group(&f, "entry", "NXentry")?;
    let max = all.iter().map(Vec::len).max().unwrap_or(0);
    let mut lists = SpotLists::create(&entry, max, units, false)?;
    for spots in all {
        lists.push(spots, spots.len(), false);
    }
    lists.write()?;
    f.flush()
}
