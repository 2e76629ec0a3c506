//! What a series of NXmx files (and the Stream V2 start message) says about the experiment:
//! the detector, its pixels, the beam and the sample, and how the images are split over files.

use rdaq_detector::Geometry;
use rdaq_process::bitshuffle::Codec;
use serde::{Deserialize, Serialize};

/// What a pixel of `/entry/data/data` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PixelType {
    /// Raw JUNGFRAU words (gain bits and ADC), uint16.
    Raw,
    /// Energy in keV, float32 (+inf saturated, NaN error or masked).
    Kev,
    /// Photon counts, int16 (max saturated, min error or masked).
    Photons16,
    /// Photon counts, int32.
    Photons32,
    /// Counts of a counting detector (EIGER) read out at this many bits, unsigned: uint8
    /// for 4 and 8 bits, uint16 for 12 and 16, uint32 for 32.
    Counts(u8),
    /// The descramble stage's planes of a described integrating detector: one int16 plane
    /// per bit field of the pixel word (reset-subtracted where the field says so), stacked
    /// along the slow axis of each module.
    Fields,
}

impl PixelType {
    pub fn bytes(self) -> usize {
        match self {
            PixelType::Raw | PixelType::Photons16 | PixelType::Fields => 2,
            PixelType::Kev | PixelType::Photons32 => 4,
            PixelType::Counts(bits) => (bits as usize).div_ceil(8).next_power_of_two(),
        }
    }

    /// The unit of a pixel value (and of sums of them, such as a spot's intensity).
    pub fn units(self) -> &'static str {
        match self {
            PixelType::Raw | PixelType::Fields => "ADU",
            PixelType::Kev => "keV",
            PixelType::Photons16 | PixelType::Photons32 => "photons",
            PixelType::Counts(_) => "counts",
        }
    }

    /// The saturation and underload markers of the pixel type: saturated pixels read the
    /// saturation value, error and masked pixels the underload value (NaN for keV, which no
    /// threshold passes).
    pub fn markers(self) -> (f64, f64) {
        match self {
            PixelType::Raw => (0x3fff as f64, -1.0),
            PixelType::Kev => (f64::INFINITY, f64::NAN),
            PixelType::Photons16 | PixelType::Fields => (i16::MAX as f64, i16::MIN as f64),
            PixelType::Photons32 => (i32::MAX as f64, i32::MIN as f64),
            // the counter's largest value; counts have no underload (-1 is none of them)
            PixelType::Counts(bits) => (((1u64 << bits) - 1) as f64, -1.0),
        }
    }

    /// The bytes of a pixel that holds no data (a gap between modules), little-endian: all
    /// ones in raw words and counts, the minimum in photon counts and planes, NaN in keV.
    pub fn no_data(self) -> Vec<u8> {
        match self {
            PixelType::Raw | PixelType::Counts(_) => vec![0xff; self.bytes()],
            PixelType::Kev => f32::NAN.to_le_bytes().to_vec(),
            PixelType::Photons16 | PixelType::Fields => i16::MIN.to_le_bytes().to_vec(),
            PixelType::Photons32 => i32::MIN.to_le_bytes().to_vec(),
        }
    }

    /// The name of the element type (numpy's and Stream V2's `image_dtype`).
    pub fn dtype(self) -> &'static str {
        match self {
            PixelType::Raw => "uint16",
            PixelType::Kev => "float32",
            PixelType::Photons16 | PixelType::Fields => "int16",
            PixelType::Photons32 => "int32",
            PixelType::Counts(_) => ["uint8", "uint16", "uint32"][self.bytes().trailing_zeros() as usize],
        }
    }
}

/// A rotation series: the sample turns about omega (the x axis) by `increment_deg` per
/// image from `start_deg`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rotation {
    pub start_deg: f64,
    pub increment_deg: f64,
}

/// What the files say about the experiment and the detector. The master file keeps it (as
/// JSON in its `rdaq_series` attribute, the module mask left to the pixel mask) so that
/// `rdaq recover` can write the master again after a crash.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NxmxMeta {
    /// Where the modules sit in the image (the image is `geometry.height() x width()`).
    pub geometry: Geometry,
    pub photon_energy_kev: f64,
    /// Time between the starts of two images (the detector's period); 0: unknown.
    pub frame_time_s: f64,
    /// Exposure of each image; 0: unknown.
    pub count_time_s: f64,
    pub detector_distance_m: f64,
    /// Where the direct beam meets the detector, in pixels: (x fast, y slow).
    pub beam_center: [f64; 2],
    pub pixel_size_m: f64,
    pub sensor_material: String,
    pub sensor_thickness_m: f64,
    pub start_time: String,
    pub detector_name: String,
    pub pixel: PixelType,
    #[serde(with = "codec_values")]
    pub codec: Codec,
    /// Spot lists hold at most this many spots per frame (the rest are counted in nPeaks);
    /// 0: no spot lists.
    pub max_spots: usize,
    /// Images per data file (`<name>_data_000001.h5`, ...).
    pub images_per_file: usize,
    /// The images the series is to hold, when known at its start: the master file then
    /// covers them from the start, so that it reads the data files while they are written
    /// and after a crash.
    pub number_of_images: Option<u64>,
    /// Stills when `None`.
    pub rotation: Option<Rotation>,
    /// The sample's name (`/entry/sample/name`; empty: not written).
    #[serde(default)]
    pub sample_name: String,
    /// How the frames were triggered: internal, external or gate
    /// (`/entry/instrument/detector/detectorSpecific/trigger_mode`, in Dectris's codes).
    #[serde(default = "internal")]
    pub trigger_mode: String,
    /// The online processing that made the images and spot lists (`None`: not processed
    /// by rdaq, or a file written before rdaq kept it).
    #[serde(default)]
    pub processing: Option<ProcessingMeta>,
    /// pixel_mask bits of one module image (module_width x module_height), set in every
    /// module's place: the gap pixels between chips of an EIGER assembled with them.
    #[serde(skip)]
    pub module_mask: Option<Vec<u32>>,
    /// Set when the images hold only some of the detector's modules (a receiver of a
    /// spatial plan): which, and the whole detector they belong in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<DetectorPart>,
}

/// The modules of a detector that a receiver holds, stacked in one column of its images
/// (with the detector's gaps between them), and where they sit in the whole detector.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetectorPart {
    /// The global id of each module of the image, from the top.
    pub module_ids: Vec<u16>,
    /// The whole detector's module grid.
    pub detector: Geometry,
}

impl DetectorPart {
    /// The image geometry of the part: its modules in one column, the detector's gaps and
    /// module size.
    pub fn geometry(&self) -> Geometry {
        let d = self.detector;
        Geometry { modules: self.module_ids.len() as u16, module_cols: 1, ..d }
    }

    /// Whether every module id is one of the detector's, each once.
    pub fn valid(&self) -> bool {
        let mut seen = vec![false; self.detector.modules as usize];
        !self.module_ids.is_empty() && self.module_ids.iter().all(|&m| seen.get_mut(m as usize).is_some_and(|s| !std::mem::replace(s, true)))
    }

    /// Where the part's image position (x fast, y slow) lands in the whole detector's
    /// image: it keeps its place relative to the module at or above it (a position in the
    /// gap below a module lands in the gap below that module's place).
    pub fn to_detector(&self, x: f64, y: f64) -> (f64, f64) {
        let d = self.detector;
        let pitch = (d.module_height + d.gap_y) as f64;
        let i = (y / pitch).floor().clamp(0.0, (self.module_ids.len() - 1) as f64);
        let (r0, c0) = d.origin(self.module_ids[i as usize]);
        (x + c0 as f64, y - i * pitch + r0 as f64)
    }
}

/// The settings of the online processing that made a file, or (`applied` false) that a run
/// of raw JUNGFRAU frames was configured with: what `rdaq process convert` and `spots` take
/// as their defaults for that file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessingMeta {
    /// Whether the processing made the file's images; false: the images are raw, and these
    /// are the run's settings for processing them.
    #[serde(default = "applied")]
    pub applied: bool,
    /// What the conversion made of the invalid gain code 10: error, g0 or g2.
    #[serde(default = "invalid_gain_error")]
    pub invalid_gain: String,
    /// The spot finder: "local" (local SNR) or "peakfinder8" (a counting detector's counts,
    /// `threshold_photons` its ADC threshold in counts, radii from the beam centre).
    pub finder: String,
    /// peakfinder8's background ring in pixels (`None`: the local finder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_bg_radius: Option<i32>,
    /// The finder ran on the keV image: its strong-pixel threshold was this many photons of
    /// the series' photon energy; then SNR, box half-size, pixel counts of a spot.
    pub threshold_photons: f32,
    pub snr: f32,
    pub box_half: usize,
    pub min_pixels: u32,
    pub max_pixels: u32,
    /// Frames with fewer spots were vetoed (neither written nor streamed); `None`: no veto.
    pub veto_min_spots: Option<usize>,
}

impl ProcessingMeta {
    /// peakfinder8's parameters when it was the finder, for `width` x `height` images: the
    /// whole image one panel, its thresholds in counts.
    pub fn peakfinder8(&self, width: usize, height: usize) -> Option<rdaq_process::spots::Peakfinder8Params> {
        let local_bg_radius = self.local_bg_radius.filter(|_| self.finder == "peakfinder8")?;
        Some(rdaq_process::spots::Peakfinder8Params {
            asic_nx: width,
            asic_ny: height,
            nasics_x: 1,
            nasics_y: 1,
            adc_threshold: self.threshold_photons,
            minimum_snr: self.snr,
            min_pixel_count: self.min_pixels as usize,
            max_pixel_count: self.max_pixels as usize,
            local_bg_radius,
            ..rdaq_process::spots::Peakfinder8Params::jungfrau_module()
        })
    }
}

fn applied() -> bool {
    true
}

fn invalid_gain_error() -> String {
    "error".into()
}

fn internal() -> String {
    "internal".into()
}

/// The codec as filter 32008's cd_values 4 and 5.
mod codec_values {
    use rdaq_process::bitshuffle::Codec;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(c: &Codec, s: S) -> Result<S::Ok, S::Error> {
        c.cd_values().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Codec, D::Error> {
        match <[u32; 2]>::deserialize(d)? {
            [2, _] => Ok(Codec::Lz4),
            [3, level] => Ok(Codec::Zstd(level as i32)),
            v => Err(serde::de::Error::custom(format!("codec {v:?}: 2 (LZ4) or 3 (Zstd)"))),
        }
    }
}

/// Images per data file unless told otherwise (as Dectris detectors write them).
pub const IMAGES_PER_FILE: usize = 1000;

impl NxmxMeta {
    /// What rdaq writes for a JUNGFRAU detector of this geometry: 75 µm silicon pixels,
    /// 320 µm thick, 0.1 m from the sample with the beam at the image centre (placeholders
    /// until the beamline says), stills, started now; raw pixels, LZ4.
    pub fn jungfrau(geometry: Geometry, photon_energy_kev: f64, frame_time_s: f64) -> NxmxMeta {
        let modules = geometry.modules;
        NxmxMeta {
            geometry,
            photon_energy_kev,
            frame_time_s,
            count_time_s: frame_time_s,
            detector_distance_m: 0.1,
            beam_center: [geometry.width() as f64 / 2.0, geometry.height() as f64 / 2.0],
            pixel_size_m: rdaq_detector::jungfrau::PIXEL_SIZE_M,
            sensor_material: "Si".into(),
            sensor_thickness_m: 320e-6,
            start_time: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            detector_name: format!("JUNGFRAU {modules}-module (rdaq)"),
            pixel: PixelType::Raw,
            codec: Codec::Lz4,
            max_spots: 0,
            images_per_file: IMAGES_PER_FILE,
            number_of_images: None,
            rotation: None,
            sample_name: String::new(),
            trigger_mode: internal(),
            processing: None,
            module_mask: None,
            part: None,
        }
    }

    /// What a standalone receiver writes for a detector described as data: its pixel size,
    /// sensor and name, its pixels as `pixel` (counts of a counting detector), and the chip
    /// gap pixels of `module_mask`; the experiment's placeholders as [`NxmxMeta::receiver`].
    pub fn described(geometry: Geometry, d: &rdaq_detector::Description, pixel: PixelType, module_mask: Option<Vec<u32>>) -> NxmxMeta {
        NxmxMeta {
            pixel_size_m: d.pixel_size_um * 1e-6,
            sensor_material: d.sensor_material.clone(),
            sensor_thickness_m: d.sensor_thickness_um * 1e-6,
            detector_name: format!("{} {}-module (rdaq)", d.name, geometry.modules),
            pixel,
            processing: None,
            module_mask,
            ..NxmxMeta::receiver(geometry)
        }
    }

    /// The pixel mask of the full image: module gaps, and [`NxmxMeta::module_mask`] in
    /// every module.
    pub fn pixel_mask(&self) -> Vec<u32> {
        let g = self.geometry;
        let mut mask = g.gap_mask();
        if let Some(mm) = &self.module_mask {
            for m in 0..g.modules {
                g.module_runs(m, |at, image, len| mask[image..image + len].iter_mut().zip(&mm[at..at + len]).for_each(|(o, b)| *o |= b));
            }
        }
        mask
    }

    /// What a standalone receiver writes (`rdaq receive`, the receiver daemon): raw frames of
    /// a JUNGFRAU of this geometry, at 12.4 keV, with frame and count time 0 (unknown) unless
    /// it is told them: placeholders, because a receiver is not told the experiment.
    pub fn receiver(geometry: Geometry) -> NxmxMeta {
        NxmxMeta::jungfrau(geometry, 12.4, 0.0)
    }

    /// The wavelength of the beam in Ångström.
    pub fn wavelength_angstrom(&self) -> f64 {
        12.398_419_843_320_026 / self.photon_energy_kev
    }

    /// Bytes of one uncompressed image.
    pub fn image_bytes(&self) -> usize {
        self.geometry.height() * self.geometry.width() * self.pixel.bytes()
    }
}
