//! Bragg spots found frame by frame in converted frames, with local SNR or peakfinder8,
//! written as spot lists in the layout a run's data files keep them
//! ([`rdaq_sink::spot_list`]).

use std::path::Path;

use anyhow::{bail, Context};
use rdaq_process::spots::{LocalSnr, LocalSnrParams, Peakfinder8, Peakfinder8Params, Spot, SpotFinder};
use rdaq_sink::{FrameReader, PixelType};

use crate::Output;

/// Which finder, with its parameters.
pub enum Finder {
    Local(LocalSnrParams),
    Peakfinder8(Peakfinder8Params, Radius),
}

/// peakfinder8's radius of each pixel.
pub enum Radius {
    /// From the beam centre (pixel indices; none: the image's centre).
    Centre { x: Option<f64>, y: Option<f64> },
    /// Given, one per pixel (see [`read_radius_map`]).
    Map(Vec<f32>),
}

/// The local finder of the processed run that wrote an rdaq master, in the unit of the
/// file's image: [`run_finder`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunFinder {
    pub params: LocalSnrParams,
    /// The run's threshold in photons (`params.threshold` is in the image's unit).
    pub threshold_photons: f32,
    /// The image's unit: "keV" or "photons".
    pub unit: &'static str,
}

/// The local finder's settings of the run that wrote the master `path` (kept in its
/// `rdaq_series`; or a file `rdaq process convert` made from a raw run's master), the
/// threshold in the unit of its image (keV for keV images, photons for photon counts, counts
/// for a counting detector's); `None` for raw images, a file rdaq did not write, or one
/// written before rdaq kept them.
pub fn run_finder(path: &Path) -> Option<RunFinder> {
    let meta = rdaq_sink::master::read_series(path).ok()?;
    let p = meta.processing?;
    let (unit, per_photon) = match meta.pixel {
        PixelType::Kev => ("keV", meta.photon_energy_kev as f32),
        PixelType::Photons16 | PixelType::Photons32 => ("photons", 1.0),
        PixelType::Counts(_) => ("counts", 1.0),
        _ => return None,
    };
    let params = LocalSnrParams { threshold: p.threshold_photons * per_photon, snr: p.snr, box_half: p.box_half, min_pixels: p.min_pixels, max_pixels: p.max_pixels };
    (p.finder == "local").then_some(RunFinder { params, threshold_photons: p.threshold_photons, unit })
}

/// The peakfinder8 of the run (a counting detector's, `process.finder = "peakfinder8"`)
/// that wrote the master `path`, as it ran online: the whole image one panel, its settings
/// in counts, radii from the series' beam centre (x, y); `None` for another file.
pub fn run_peakfinder8(path: &Path) -> Option<(Peakfinder8Params, [f64; 2])> {
    let meta = rdaq_sink::master::read_series(path).ok()?;
    let g = meta.geometry;
    Some((meta.processing?.peakfinder8(g.width(), g.height())?, meta.beam_center))
}

/// What a counting detector's frames leave out of the finder: every pixel's NXmx mask bits
/// and the count at which a pixel saturates.
pub struct Counted {
    pub mask: Vec<u32>,
    pub saturation: f32,
}

/// The mask and saturation of the counting detector's series whose rdaq master is `path`
/// (`None` for another file), as its online spot finding left them out.
pub fn counted(path: &Path) -> Option<Counted> {
    let meta = rdaq_sink::master::read_series(path).ok()?;
    let PixelType::Counts(bits) = meta.pixel else { return None };
    Some(Counted { mask: meta.pixel_mask(), saturation: rdaq_process::spots::count_saturation(bits) })
}

/// Finds the spots of every frame of `frames` and writes them to `out`; returns the spots
/// found per frame. A counting detector's `counted` pixels are left out, as online.
pub fn spots(frames: &FrameReader, finder: Finder, counted: Option<&Counted>, out: &Output) -> anyhow::Result<Vec<Vec<Spot>>> {
    let (r, c) = (frames.rows, frames.cols);
    if counted.is_some_and(|k| k.mask.len() != r * c) {
        bail!("the series' pixel mask does not cover the {r}x{c} images");
    }
    let mut find = ready(finder, r, c)?;
    let (mut img, mut found) = (Vec::<f32>::new(), Vec::<Spot>::new());
    let mut all: Vec<Vec<Spot>> = Vec::with_capacity(frames.frames);
    for i in 0..frames.frames {
        frames.read(i, &mut img)?;
        if let Some(k) = counted {
            rdaq_process::spots::mask_counts(&mut img, &k.mask, k.saturation);
        }
        find.find(&img, c, r, &mut found);
        all.push(found.clone());
    }
    out.make(|path| Ok(rdaq_sink::spot_list::write_file(path, &all, None)?))?;
    Ok(all)
}

/// The finder for images of `r` x `c`, its parameters checked.
fn ready(finder: Finder, r: usize, c: usize) -> anyhow::Result<SpotFinder> {
    match finder {
        Finder::Local(p) => {
            p.check(r, c).map_err(anyhow::Error::msg)?;
            Ok(SpotFinder::Local(LocalSnr::new(p)))
        }
        Finder::Peakfinder8(p, radius) => {
            if (p.asic_ny * p.nasics_y, p.asic_nx * p.nasics_x) != (r, c) {
                bail!("peakfinder8: {}x{} ASICs of {}x{} do not tile the {r}x{c} image", p.nasics_y, p.nasics_x, p.asic_ny, p.asic_nx);
            }
            let radius = match radius {
                Radius::Centre { x, y } => Peakfinder8::radius_map(c, r, x.unwrap_or(c as f64 / 2.0), y.unwrap_or(r as f64 / 2.0)),
                Radius::Map(m) if m.len() == r * c => m,
                Radius::Map(m) => bail!("a radius map of {} pixels for a {r}x{c} image", m.len()),
            };
            Ok(SpotFinder::Peakfinder8(Peakfinder8::new(p, radius, &vec![true; r * c])))
        }
    }
}

/// peakfinder8's radius map from `dataset` of the HDF5 file `path` (float, `shape`: the
/// images' rows and columns).
pub fn read_radius_map(path: &Path, dataset: &str, shape: (usize, usize)) -> anyhow::Result<Vec<f32>> {
    let (rows, cols) = shape;
    let what = || format!("{}:{dataset}", path.display());
    let f = hdf5::File::open(path).with_context(what)?;
    let ds = f.dataset(dataset).with_context(what)?;
    if ds.shape() != [rows, cols] {
        bail!("{}: shape {:?}, the image is {rows}x{cols}", what(), ds.shape());
    }
    let radius: Vec<f32> = rdaq_process::chunk_size::reading(&ds, || ds.read_raw()).with_context(what)?;
    if radius.iter().any(|r| !r.is_finite() || *r < 0.0) {
        bail!("{}: radii must be finite and not negative", what());
    }
    Ok(radius)
}
