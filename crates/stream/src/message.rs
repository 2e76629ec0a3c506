//! The Stream V2 messages. Each is one CBOR map behind the self-described CBOR tag 55799,
//! with unsigned integers only, dates as tag 0 text, rationals as [num, den], images as
//! tag 40 multi-dimensional arrays of RFC 8746 typed arrays whose bytes are the bitshuffle
//! LZ4 chunk of the HDF5 files (tag 56500 "bslz4", the same bytes the data files hold).
//! Every field of DECTRIS' field tables is sent (docs/stream.md says what rdaq's values
//! mean where it has no such setting); rdaq's own fields go under `user_data` -> `rdaq`.

use ciborium_ll::Header;
use rdaq_process::bitshuffle::{Codec, Compressor};
use rdaq_process::spots::Spot;
use rdaq_sink::{NxmxMeta, PixelType};

/// The one channel rdaq's images have.
pub const CHANNEL: &str = "data";
/// Dectris' tag for compressed byte strings.
pub const TAG_COMPRESSED: u64 = 56500;
/// RFC 8949's self-described CBOR tag, which starts every message.
pub const TAG_SELF_DESCRIBED: u64 = 55799;
/// RFC 8746's tag for a row-major multi-dimensional array.
pub const TAG_MULTI_DIM: u64 = 40;

/// RFC 8746's typed-array tag of the pixel type (little-endian).
pub fn typed_array_tag(p: PixelType) -> u64 {
    match p {
        PixelType::Raw => 69,       // uint16
        PixelType::Photons16 | PixelType::Fields => 77, // sint16
        PixelType::Photons32 => 78, // sint32
        PixelType::Kev => 85,       // float32
        PixelType::Counts(_) => [64, 69, 70][p.bytes().trailing_zeros() as usize], // uint8, uint16, uint32
    }
}

/// What an image message says beyond its pixels.
pub struct ImageInfo<'a> {
    /// The image's index in the series (from 0).
    pub image_id: u64,
    /// The detector's frame number.
    pub frame_number: u64,
    /// Runs of pixels (first, count) that carry no data (empty: complete).
    pub missing: &'a [(usize, usize)],
    /// Spot finding's result, when the series finds spots.
    pub spots: Option<(&'a [Spot], bool)>,
    /// The image's exposure, start and stop, in nanoseconds since the series' date.
    pub time_ns: (u64, u64),
}

/// Encodes the messages of one series into a buffer it keeps.
pub struct Encoder {
    meta: NxmxMeta,
    series_id: u64,
    unique_id: String,
    /// When the series started (made with the encoder), to the nanosecond: what the images'
    /// times count from.
    series_date: String,
    buf: Vec<u8>,
}

/// The time base of the images' rationals: nanoseconds.
const TIME_BASE: u64 = 1_000_000_000;

/// The buffer under construction, with the headers the messages need.
struct Cbor<'a>(ciborium_ll::Encoder<&'a mut Vec<u8>>);

impl Cbor<'_> {
    fn h(&mut self, h: Header) {
        self.0.push(h).expect("writing to a Vec does not fail");
    }
    fn text(&mut self, s: &str) {
        self.0.text(s, None).expect("writing to a Vec does not fail");
    }
    fn bytes(&mut self, b: &[u8]) {
        self.0.bytes(b, None).expect("writing to a Vec does not fail");
    }
    fn uint(&mut self, key: &str, v: u64) {
        self.text(key);
        self.h(Header::Positive(v));
    }
    fn float(&mut self, key: &str, v: f64) {
        self.text(key);
        self.h(Header::Float(v));
    }
    fn string(&mut self, key: &str, v: &str) {
        self.text(key);
        self.text(v);
    }
    fn map(&mut self, key: &str, n: usize) {
        self.text(key);
        self.h(Header::Map(Some(n)));
    }
    fn boolean(&mut self, key: &str, v: bool) {
        self.text(key);
        self.h(Header::Simple(if v { ciborium_ll::simple::TRUE } else { ciborium_ll::simple::FALSE }));
    }
    fn date(&mut self, key: &str, v: &str) {
        self.text(key);
        self.h(Header::Tag(0));
        self.text(v);
    }
    fn rational_ns(&mut self, key: &str, ns: u64) {
        self.text(key);
        self.h(Header::Array(Some(2)));
        self.h(Header::Positive(ns));
        self.h(Header::Positive(TIME_BASE));
    }
    fn floats(&mut self, key: &str, v: impl ExactSizeIterator<Item = f64>) {
        self.text(key);
        self.h(Header::Array(Some(v.len())));
        v.for_each(|x| self.h(Header::Float(x)));
    }
    /// `40([[h, w], tag(56500(["bslz4", element size, chunk]))])`.
    fn image(&mut self, h: usize, w: usize, tag: u64, elem: usize, chunk: &[u8]) {
        self.h(Header::Tag(TAG_MULTI_DIM));
        self.h(Header::Array(Some(2)));
        self.h(Header::Array(Some(2)));
        self.h(Header::Positive(h as u64));
        self.h(Header::Positive(w as u64));
        self.h(Header::Tag(tag));
        self.h(Header::Tag(TAG_COMPRESSED));
        self.h(Header::Array(Some(3)));
        self.text("bslz4");
        self.h(Header::Positive(elem as u64));
        self.bytes(chunk);
    }
}

impl Encoder {
    /// The encoder of series `series_id` described by `meta` (its codec must be LZ4: Stream
    /// V2 defines bslz4 only); the series starts now (the images' times count from here).
    pub fn new(meta: &NxmxMeta, series_id: u64) -> Encoder {
        let unique_id = format!("rdaq-{}-{series_id}", meta.start_time);
        let series_date = humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string();
        Encoder { meta: meta.clone(), series_id, unique_id, series_date, buf: Vec::new() }
    }

    fn begin(&mut self, kind: &str, fields: usize) -> Cbor<'_> {
        self.buf.clear();
        let mut c = Cbor(ciborium_ll::Encoder::from(&mut self.buf));
        c.h(Header::Tag(TAG_SELF_DESCRIBED));
        c.h(Header::Map(Some(fields + 3)));
        c.string("type", kind);
        c.uint("series_id", self.series_id);
        c.string("series_unique_id", &self.unique_id);
        c
    }

    /// The `start` message: the series' metadata, as the NXmx master says it.
    pub fn start(&mut self) -> &[u8] {
        let m = self.meta.clone();
        let g = m.geometry;
        let (h, w) = (g.height(), g.width());
        let mut c = self.begin("start", 30);
        c.date("arm_date", &m.start_time);
        c.uint("number_of_images", m.number_of_images.unwrap_or(0));
        c.uint("image_size_x", w as u64);
        c.uint("image_size_y", h as u64);
        c.string("image_dtype", m.pixel.dtype());
        c.float("pixel_size_x", m.pixel_size_m);
        c.float("pixel_size_y", m.pixel_size_m);
        c.float("beam_center_x", m.beam_center[0]);
        c.float("beam_center_y", m.beam_center[1]);
        c.floats("detector_translation", [0.0, 0.0, m.detector_distance_m].into_iter());
        c.float("incident_energy", m.photon_energy_kev * 1e3);
        c.float("incident_wavelength", m.wavelength_angstrom());
        c.float("count_time", m.count_time_s);
        c.float("frame_time", m.frame_time_s);
        Self::corrections(&mut c, &m);
        c.text("saturation_value");
        let (sat, _) = m.pixel.markers();
        if sat.is_finite() { c.h(Header::Positive(sat as u64)) } else { c.h(Header::Float(sat)) }
        c.string("sensor_material", &m.sensor_material);
        c.float("sensor_thickness", m.sensor_thickness_m);
        c.text("channels");
        c.h(Header::Array(Some(1)));
        c.text(CHANNEL);
        c.map("pixel_mask", 1);
        c.text(CHANNEL);
        let mask: Vec<u8> = m.pixel_mask().iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut packed = Vec::new();
        Compressor::new(4, 0, Codec::Lz4).compress(&mask, &mut packed);
        c.image(h, w, 70, 4, &packed);
        c.map("goniometer", usize::from(m.rotation.is_some()));
        if let Some(r) = m.rotation {
            c.map("omega", 2);
            c.float("start", r.start_deg);
            c.float("increment", r.increment_deg);
        }
        c.map("user_data", 1);
        c.map("rdaq", 10 + if m.part.is_some() { 3 } else { 0 });
        c.string("detector", &m.detector_name);
        // the module grid, for a writer that rebuilds the NXmx geometry from the stream
        c.uint("modules", g.modules as u64);
        c.uint("module_cols", g.module_cols as u64);
        c.uint("gap_x", g.gap_x as u64);
        c.uint("gap_y", g.gap_y as u64);
        c.uint("module_height", g.module_height as u64);
        c.uint("module_width", g.module_width as u64);
        c.string("units", m.pixel.units());
        c.uint("images_per_file", m.images_per_file as u64);
        c.uint("max_spots", m.max_spots as u64);
        // a receiver holding some of the modules: where they go, for a joiner of the parts
        if let Some(p) = &m.part {
            c.text("module_ids");
            c.h(Header::Array(Some(p.module_ids.len())));
            p.module_ids.iter().for_each(|&id| c.h(Header::Positive(id as u64)));
            c.uint("detector_modules", p.detector.modules as u64);
            c.uint("detector_module_cols", p.detector.module_cols as u64);
        }
        &self.buf
    }

    /// The start message's fields of what the detector does to the pixels, and who it is:
    /// rdaq applies no count rate correction and no flatfield (empty tables), knows no
    /// threshold and no serial number; masked pixels carry the no-data value in the images,
    /// except chip gap pixels, which share the counts of their neighbours (virtual pixels).
    fn corrections(c: &mut Cbor, m: &NxmxMeta) {
        let virtual_pixels = m.module_mask.is_some();
        c.boolean("countrate_correction_enabled", false);
        c.text("countrate_correction_lookup_table");
        c.h(Header::Tag(70));
        c.bytes(&[]);
        c.string("detector_description", &m.detector_name);
        c.string("detector_serial_number", "unknown");
        c.map("flatfield", 0);
        c.boolean("flatfield_enabled", false);
        c.boolean("pixel_mask_enabled", !virtual_pixels);
        c.map("threshold_energy", 0);
        c.boolean("virtual_pixel_interpolation_enabled", virtual_pixels);
    }

    /// An `image` message carrying `chunk`, the image compressed as the data files hold it.
    pub fn image(&mut self, info: &ImageInfo, chunk: &[u8]) -> &[u8] {
        let (pixel, g) = (self.meta.pixel, self.meta.geometry);
        // taken out for the message (the buffer borrows the encoder) and put back: no copy
        let date = std::mem::take(&mut self.series_date);
        let mut c = self.begin("image", 7);
        c.uint("image_id", info.image_id);
        c.date("series_date", &date);
        let (start, stop) = info.time_ns;
        c.rational_ns("start_time", start);
        c.rational_ns("stop_time", stop);
        c.rational_ns("real_time", stop.saturating_sub(start));
        c.map("data", 1);
        c.text(CHANNEL);
        c.image(g.height(), g.width(), typed_array_tag(pixel), pixel.bytes(), chunk);
        c.map("user_data", 1);
        c.map("rdaq", 3 + usize::from(info.spots.is_some()));
        c.uint("frame_number", info.frame_number);
        c.text("complete");
        c.h(Header::Simple(if info.missing.is_empty() { ciborium_ll::simple::TRUE } else { ciborium_ll::simple::FALSE }));
        // the incomplete-pixel mask as runs of pixels [first, count] (row-major)
        c.text("missing_pixels");
        c.h(Header::Array(Some(info.missing.len())));
        for &(start, len) in info.missing {
            c.h(Header::Array(Some(2)));
            c.h(Header::Positive(start as u64));
            c.h(Header::Positive(len as u64));
        }
        if let Some((spots, hit)) = info.spots {
            c.map("spots", 5);
            c.floats("x", spots.iter().map(|s| s.x as f64));
            c.floats("y", spots.iter().map(|s| s.y as f64));
            c.floats("intensity", spots.iter().map(|s| s.intensity as f64));
            c.text("pixels");
            c.h(Header::Array(Some(spots.len())));
            spots.iter().for_each(|s| c.h(Header::Positive(s.pixels as u64)));
            c.text("hit");
            c.h(Header::Simple(if hit { ciborium_ll::simple::TRUE } else { ciborium_ll::simple::FALSE }));
        }
        self.series_date = date;
        &self.buf
    }

    /// The `end` message, with what the publisher counted, and for a series joined from
    /// several sources the images their own numbering skipped (lost before the joiner).
    pub fn end(&mut self, images_sent: u64, images_dropped: u64, images_missing: Option<u64>) -> &[u8] {
        let mut c = self.begin("end", 1);
        c.map("user_data", 1);
        c.map("rdaq", 2 + usize::from(images_missing.is_some()));
        c.uint("images_sent", images_sent);
        c.uint("images_dropped", images_dropped);
        if let Some(n) = images_missing {
            c.uint("images_missing", n);
        }
        &self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ciborium::Value;

    fn meta() -> NxmxMeta {
        let mut m = NxmxMeta::jungfrau(rdaq_detector::Geometry::new(1, 1, 8, 36).unwrap(), 12.4, 0.01);
        m.number_of_images = Some(5);
        m
    }

    fn decode(b: &[u8]) -> Vec<(String, Value)> {
        assert_eq!(&b[..3], [0xd9, 0xd9, 0xf7], "self-described CBOR first");
        let v: Value = ciborium::from_reader(b).unwrap();
        let Value::Tag(TAG_SELF_DESCRIBED, inner) = v else { panic!("{v:?}") };
        inner.into_map().unwrap().into_iter().map(|(k, v)| (k.into_text().unwrap(), v)).collect()
    }

    fn get<'a>(m: &'a [(String, Value)], k: &str) -> &'a Value {
        &m.iter().find(|(key, _)| key == k).unwrap_or_else(|| panic!("no {k}")).1
    }

    #[test]
    fn start_image_and_end_decode_with_an_independent_parser() {
        let mut e = Encoder::new(&meta(), 7);
        let s = decode(e.start());
        assert_eq!(s[0], ("type".into(), Value::Text("start".into())), "type first");
        assert_eq!(get(&s, "number_of_images"), &Value::Integer(5.into()));
        assert_eq!(get(&s, "image_size_x"), &Value::Integer(1024.into()));
        assert_eq!(get(&s, "image_dtype"), &Value::Text("uint16".into()));
        assert!(matches!(get(&s, "arm_date"), Value::Tag(0, _)));
        for (k, v) in [("countrate_correction_enabled", false), ("flatfield_enabled", false), ("pixel_mask_enabled", true), ("virtual_pixel_interpolation_enabled", false)] {
            assert_eq!(get(&s, k), &Value::Bool(v), "{k}");
        }
        assert_eq!(get(&s, "countrate_correction_lookup_table"), &Value::Tag(70, Box::new(Value::Bytes(vec![]))));
        assert_eq!((get(&s, "flatfield"), get(&s, "threshold_energy")), (&Value::Map(vec![]), &Value::Map(vec![])));
        assert_eq!(get(&s, "count_time"), &Value::Float(0.01));
        let chunk = [1u8, 2, 3, 4, 5];
        let spots = [Spot { x: 1.5, y: 2.5, intensity: 30.0, pixels: 4 }];
        let info = ImageInfo { image_id: 3, frame_number: 42, missing: &[(2, 4)], spots: Some((&spots, true)), time_ns: (10, 20) };
        let i = decode(e.image(&info, &chunk));
        assert_eq!(get(&i, "image_id"), &Value::Integer(3.into()));
        assert!(matches!(get(&i, "series_date"), Value::Tag(0, _)));
        let ns = |n: u64| Value::Array(vec![Value::Integer(n.into()), Value::Integer(1_000_000_000u64.into())]);
        assert_eq!((get(&i, "start_time"), get(&i, "stop_time"), get(&i, "real_time")), (&ns(10), &ns(20), &ns(10)));
        let data = get(&i, "data").as_map().unwrap();
        let Value::Tag(40, arr) = &data[0].1 else { panic!() };
        let arr = arr.as_array().unwrap();
        let Value::Tag(69, comp) = &arr[1] else { panic!("{:?}", arr[1]) };
        let Value::Tag(TAG_COMPRESSED, c) = &**comp else { panic!() };
        let c = c.as_array().unwrap();
        assert_eq!(c[0], Value::Text("bslz4".into()));
        assert_eq!(c[2], Value::Bytes(chunk.to_vec()));
        let rdaq = get(&i, "user_data").as_map().unwrap()[0].1.as_map().unwrap().clone();
        assert_eq!(rdaq[0], (Value::Text("frame_number".into()), Value::Integer(42.into())));
        assert_eq!(rdaq[1].1, Value::Bool(false));
        assert_eq!(rdaq[2].1, Value::Array(vec![Value::Array(vec![Value::Integer(2.into()), Value::Integer(4.into())])]));
        let end = decode(e.end(4, 1, Some(2)));
        assert_eq!(get(&end, "type"), &Value::Text("end".into()));
    }
}
