//! The master file's description of the experiment: `/entry` (NXmx), the instrument with its
//! beam and detector modules, the sample with its goniometer (rotation series) or none
//! (stills), and the source. The geometry is complete NXmx: every module's fast and slow
//! pixel directions hang on its offset, which hangs on the detector's translation along the
//! beam, so that DIALS builds the detector model from the file alone.

use hdf5::{File, Group};

use crate::meta::{NxmxMeta, PixelType};
use crate::nexus::{axis, f64_ds, nx_group, str_attr, str_ds, write_chunk_at, Axis};

const DETECTOR_AXIS: &str = "/entry/instrument/detector/transformations/translation";

/// The pixel mask as the one deflated chunk of `pixel_mask`, made once per series: the
/// master is written again after every flush, and deflating a 4M detector's mask each time
/// took about 60 ms.
pub struct MaskChunk(Vec<u8>);

impl MaskChunk {
    /// The deflate level of HDF5's filter.
    const LEVEL: u8 = 4;

    pub fn new(meta: &NxmxMeta) -> MaskChunk {
        use std::io::Write;
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(Self::LEVEL as u32));
        // little-endian u32, as the dataset's type
        z.write_all(rdaq_process::bytes_of(&meta.pixel_mask())).expect("writing to memory");
        MaskChunk(z.finish().expect("writing to memory"))
    }
}

/// Writes `/entry` and everything in it but `/entry/data`; `frames` are the detector frame
/// numbers of the images, which set the rotation angle of each image of a rotation series.
pub(crate) fn write_metadata(file: &File, meta: &NxmxMeta, mask: &MaskChunk, frames: &[u64]) -> hdf5::Result<Group> {
    str_attr(file, "default", "entry")?;
    let entry = nx_group(file, "entry", "NXentry")?;
    str_attr(&entry, "default", "data")?;
    str_ds(&entry, "definition", "NXmx")?;
    str_ds(&entry, "start_time", &meta.start_time)?;
    let instrument = nx_group(&entry, "instrument", "NXinstrument")?;
    str_ds(&instrument, "name", &meta.detector_name)?;
    let beam = nx_group(&instrument, "beam", "NXbeam")?;
    f64_ds(&beam, "incident_wavelength", meta.wavelength_angstrom(), "angstrom")?;
    detector_group(&instrument, meta, mask)?;
    sample_group(&entry, meta, frames)?;
    let source = nx_group(&entry, "source", "NXsource")?;
    str_ds(&source, "name", "rdaq detector emulator")?;
    Ok(entry)
}

/// `/entry/sample`: no goniometer for stills; for a rotation series the omega angle of
/// every image, from its frame number (frames the processing vetoed leave gaps in the angles).
fn sample_group(entry: &Group, meta: &NxmxMeta, frames: &[u64]) -> hdf5::Result<()> {
    let sample = nx_group(entry, "sample", "NXsample")?;
    if !meta.sample_name.is_empty() {
        str_ds(&sample, "name", &meta.sample_name)?;
    }
    let Some(rot) = meta.rotation else {
        str_ds(&sample, "depends_on", ".")?;
        return Ok(());
    };
    str_ds(&sample, "depends_on", "/entry/sample/transformations/omega")?;
    let tr = nx_group(&sample, "transformations", "NXtransformations")?;
    let angles: Vec<f64> = frames.iter().map(|&f| rot.start_deg + f as f64 * rot.increment_deg).collect();
    let omega = tr.new_dataset::<f64>().shape(angles.len()).create("omega")?;
    omega.write(&angles)?;
    str_attr(&omega, "units", "deg")?;
    str_attr(&omega, "transformation_type", "rotation")?;
    str_attr(&omega, "depends_on", ".")?;
    omega.new_attr::<f64>().shape(3).create("vector")?.write(&[-1.0, 0.0, 0.0])?;
    let inc = tr.new_dataset::<f64>().shape(angles.len()).create("omega_increment_set")?;
    inc.write(&vec![rot.increment_deg; angles.len()])?;
    str_attr(&inc, "units", "deg")?;
    Ok(())
}

/// `/entry/instrument/detector`: the detector's description, the pixel markers and mask,
/// its position, and its modules.
fn detector_group(instrument: &Group, meta: &NxmxMeta, mask: &MaskChunk) -> hdf5::Result<()> {
    let g = meta.geometry;
    let (h, w) = (g.height(), g.width());
    let det = nx_group(instrument, "detector", "NXdetector")?;
    str_ds(&det, "description", &meta.detector_name)?;
    f64_ds(&det, "beam_center_x", meta.beam_center[0], "pixel")?;
    f64_ds(&det, "beam_center_y", meta.beam_center[1], "pixel")?;
    f64_ds(&det, "distance", meta.detector_distance_m, "m")?;
    f64_ds(&det, "count_time", meta.count_time_s, "s")?;
    f64_ds(&det, "frame_time", meta.frame_time_s, "s")?;
    f64_ds(&det, "x_pixel_size", meta.pixel_size_m, "m")?;
    f64_ds(&det, "y_pixel_size", meta.pixel_size_m, "m")?;
    str_ds(&det, "sensor_material", &meta.sensor_material)?;
    f64_ds(&det, "sensor_thickness", meta.sensor_thickness_m, "m")?;
    pixel_markers(&det, meta.pixel)?;
    trigger_mode(&det, &meta.trigger_mode)?;
    // gaps between modules (and chips, when assembled with gap pixels); the emulated detector has no static defects, and transfer
    // losses go to the per-frame mask. Deflated: it is mostly zeros.
    let pixel_mask = det.new_dataset::<u32>().chunk((h, w)).deflate(MaskChunk::LEVEL).shape((h, w)).create("pixel_mask")?;
    write_chunk_at(&pixel_mask, &[0, 0], &mask.0)?;
    str_ds(&det, "depends_on", DETECTOR_AXIS)?;
    let tr = nx_group(&det, "transformations", "NXtransformations")?;
    let along_beam = Axis { kind: "translation", value: meta.detector_distance_m, units: "m", vector: [0.0, 0.0, 1.0], depends_on: ".", offset: None };
    axis(&tr, "translation", &along_beam)?;
    for m in 0..g.modules {
        module_group(&det, meta, m)?;
    }
    Ok(())
}

/// How the frames were triggered, where Dectris's masters say it and in its codes: `ints`
/// (internal), `exts` (each trigger signal starts a series), `exte` (enable: the signal's
/// length is the exposure, a gate).
fn trigger_mode(det: &Group, mode: &str) -> hdf5::Result<()> {
    let code = match mode {
        "external" => "exts",
        "gate" => "exte",
        _ => "ints",
    };
    let specific = nx_group(det, "detectorSpecific", "NXcollection")?;
    str_ds(&specific, "trigger_mode", code).map(drop)
}

/// The saturation and underload values and the bit depth of the pixel type.
fn pixel_markers(det: &Group, pixel: PixelType) -> hdf5::Result<()> {
    let (sat, under) = pixel.markers();
    if pixel == PixelType::Kev {
        det.new_dataset::<f64>().create("saturation_value")?.write_scalar(&sat)?;
        det.new_dataset::<f64>().create("underload_value")?.write_scalar(&under)?;
    } else {
        det.new_dataset::<i64>().create("saturation_value")?.write_scalar(&(sat as i64))?;
        det.new_dataset::<i64>().create("underload_value")?.write_scalar(&(under as i64))?;
    }
    det.new_dataset::<i32>().create("bit_depth_image")?.write_scalar(&(pixel.bytes() as i32 * 8))?;
    if let PixelType::Counts(bits) = pixel {
        det.new_dataset::<i32>().create("bit_depth_readout")?.write_scalar(&(bits as i32))?;
    }
    Ok(())
}

/// `module_<m>`: where module `m` sits in the image and in space.
fn module_group(det: &Group, meta: &NxmxMeta, m: u16) -> hdf5::Result<()> {
    let g = meta.geometry;
    let mg = nx_group(det, &format!("module_{m}"), "NXdetector_module")?;
    let (r0, c0) = g.origin(m);
    mg.new_dataset::<i32>().shape(2).create("data_origin")?.write(&[r0 as i32, c0 as i32])?;
    mg.new_dataset::<i32>().shape(2).create("data_size")?.write(&[g.module_height as i32, g.module_width as i32])?;
    // the module's first pixel relative to the beam centre, with the fast axis along -x
    // and the slow axis along -y
    let px = meta.pixel_size_m;
    let [bx, by] = meta.beam_center;
    let origin = [(bx - c0 as f64) * px, (by - r0 as f64) * px, 0.0];
    let offset = format!("/entry/instrument/detector/module_{m}/module_offset");
    for (name, vector) in [("fast_pixel_direction", [-1.0, 0.0, 0.0]), ("slow_pixel_direction", [0.0, -1.0, 0.0])] {
        axis(&mg, name, &Axis { kind: "translation", value: px, units: "m", vector, depends_on: &offset, offset: None })?;
    }
    let module_offset = Axis { kind: "translation", value: 0.0, units: "m", vector: [1.0, 0.0, 0.0], depends_on: DETECTOR_AXIS, offset: Some(origin) };
    axis(&mg, "module_offset", &module_offset).map(drop)
}
