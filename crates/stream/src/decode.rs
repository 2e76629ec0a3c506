//! Stream V2 messages read back (sans I/O): what a file writer needs of `start`, `image` and
//! `end`, from rdaq or another Stream V2 source, with typed errors that name the field.

use ciborium::Value;
use rdaq_detector::Geometry;
use rdaq_process::bitshuffle::Codec;
use rdaq_process::spots::Spot;
use rdaq_sink::{DetectorPart, NxmxMeta, PixelType, Rotation};

use crate::message::{TAG_COMPRESSED, TAG_MULTI_DIM, TAG_SELF_DESCRIBED};

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("not CBOR: {0}")]
    Cbor(String),
    #[error("field {0}: missing or of the wrong type")]
    Field(&'static str),
    #[error("field {field}: {why}")]
    Value { field: &'static str, why: String },
}

/// One decoded message.
#[derive(Debug)]
pub enum Message {
    Start(Box<NxmxMeta>),
    Image(Image),
    End,
}

/// An image as the stream carried it: the compressed chunk, untouched.
#[derive(Debug, Default)]
pub struct Image {
    pub image_id: u64,
    pub frame_number: u64,
    /// Element size of the chunk's pixels.
    pub elem: usize,
    pub chunk: Vec<u8>,
    /// Byte ranges of the raw 16-bit image with no data (as the NXmx writer takes them).
    pub missing: Vec<(usize, usize)>,
    pub spots: Option<(Vec<Spot>, bool)>,
    /// The exposure's start and stop in nanoseconds since the series' date (0, 0 when the
    /// message's rationals are absent or not countable in nanoseconds).
    pub time_ns: (u64, u64),
}

type Map = Vec<(Value, Value)>;

fn get<'a>(m: &'a Map, key: &str) -> Option<&'a Value> {
    m.iter().find(|(k, _)| k.as_text() == Some(key)).map(|(_, v)| v)
}

fn uint(m: &Map, key: &'static str) -> Result<u64, DecodeError> {
    get(m, key).and_then(|v| v.as_integer()).and_then(|i| u64::try_from(i).ok()).ok_or(DecodeError::Field(key))
}

fn float(m: &Map, key: &'static str) -> Result<f64, DecodeError> {
    match get(m, key) {
        Some(Value::Float(f)) => Ok(*f),
        Some(Value::Integer(i)) => Ok(i128::from(*i) as f64),
        _ => Err(DecodeError::Field(key)),
    }
}

fn text<'a>(m: &'a Map, key: &'static str) -> Result<&'a str, DecodeError> {
    get(m, key).and_then(|v| v.as_text()).ok_or(DecodeError::Field(key))
}

fn map<'a>(m: &'a Map, key: &'static str) -> Result<&'a Map, DecodeError> {
    get(m, key).and_then(|v| v.as_map()).ok_or(DecodeError::Field(key))
}

/// rdaq's own fields of a message (`user_data.rdaq`), when the producer sent them.
fn rdaq_fields(m: &Map) -> Option<&Map> {
    get(m, "user_data")?.as_map().and_then(|u| get(u, "rdaq"))?.as_map()
}

/// Decodes one message (the self-described tag is optional, as in Dectris' spec).
pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
    let v: Value = ciborium::from_reader(bytes).map_err(|e| DecodeError::Cbor(e.to_string()))?;
    let v = match v {
        Value::Tag(TAG_SELF_DESCRIBED, inner) => *inner,
        v => v,
    };
    let m = v.into_map().map_err(|_| DecodeError::Field("(message map)"))?;
    match text(&m, "type")? {
        "start" => Ok(Message::Start(Box::new(start(&m)?))),
        "image" => Ok(Message::Image(image(&m)?)),
        "end" => Ok(Message::End),
        t => Err(DecodeError::Value { field: "type", why: format!("unknown message type {t:?}") }),
    }
}

/// The series' metadata. The module grid comes from `user_data.rdaq`; a source that does
/// not send it must have JUNGFRAU modules' image size (one column of modules, no gaps).
fn start(m: &Map) -> Result<NxmxMeta, DecodeError> {
    let rdaq = rdaq_fields(m);
    let geometry = match rdaq {
        Some(r) => grid(r)?,
        None => guess_grid(uint(m, "image_size_x")?, uint(m, "image_size_y")?)?,
    };
    if (uint(m, "image_size_x")? as usize, uint(m, "image_size_y")? as usize) != (geometry.width(), geometry.height()) {
        return Err(DecodeError::Value { field: "image_size_x", why: "does not match the module grid in user_data.rdaq".into() });
    }
    let units = rdaq.and_then(|r| text(r, "units").ok());
    let pixel = match text(m, "image_dtype")? {
        // a counting detector's counts (rdaq says "counts"): the bit depth from the saturation
        "uint8" | "uint16" | "uint32" if units == Some("counts") => PixelType::Counts(counts_bits(m)?),
        "int16" if units == Some("ADU") => PixelType::Fields,
        "uint16" => PixelType::Raw,
        "int16" => PixelType::Photons16,
        "int32" => PixelType::Photons32,
        "float32" => PixelType::Kev,
        "uint8" => PixelType::Counts(8),
        "uint32" => PixelType::Counts(32),
        t => return Err(DecodeError::Value { field: "image_dtype", why: format!("{t:?} is not written by this writer") }),
    };
    let mut meta = NxmxMeta::jungfrau(geometry, float(m, "incident_energy")? / 1e3, float(m, "frame_time")?);
    meta.count_time_s = float(m, "count_time")?;
    meta.pixel = pixel;
    meta.codec = Codec::Lz4;
    meta.pixel_size_m = float(m, "pixel_size_x")?;
    meta.beam_center = [float(m, "beam_center_x")?, float(m, "beam_center_y")?];
    meta.detector_distance_m = translation_z(m)?;
    meta.sensor_material = text(m, "sensor_material")?.to_string();
    meta.sensor_thickness_m = float(m, "sensor_thickness")?;
    meta.number_of_images = Some(uint(m, "number_of_images")?).filter(|&n| n > 0);
    meta.start_time = match get(m, "arm_date") {
        Some(Value::Tag(0, t)) => t.as_text().ok_or(DecodeError::Field("arm_date"))?.to_string(),
        _ => return Err(DecodeError::Field("arm_date")),
    };
    meta.rotation = rotation(m);
    if let Some(r) = rdaq {
        meta.detector_name = text(r, "detector")?.to_string();
        meta.max_spots = uint(r, "max_spots")? as usize;
        meta.images_per_file = uint(r, "images_per_file")? as usize;
        meta.part = part(r, geometry)?;
    }
    Ok(meta)
}

/// The modules a receiver holds and the whole detector's grid, when it sent them: its
/// images are `geometry`, those modules in one column.
fn part(r: &Map, geometry: Geometry) -> Result<Option<DetectorPart>, DecodeError> {
    let Some(ids) = get(r, "module_ids") else { return Ok(None) };
    let bad = |why: &str| DecodeError::Value { field: "user_data.rdaq.module_ids", why: why.into() };
    let ids = ids.as_array().ok_or_else(|| bad("not an array"))?;
    let module_ids = ids.iter().map(|v| v.as_integer().and_then(|i| u16::try_from(i).ok()).ok_or_else(|| bad("not a module id"))).collect::<Result<Vec<_>, _>>()?;
    let count = |key: &'static str| uint(r, key).and_then(|n| u16::try_from(n).map_err(|_| DecodeError::Value { field: key, why: format!("{n} modules") }));
    let detector = Geometry::new(count("detector_modules")?, count("detector_module_cols")?, geometry.gap_x, geometry.gap_y)
        .ok_or(DecodeError::Value { field: "user_data.rdaq.detector_module_cols", why: "does not divide the detector's modules into rows".into() })?
        .with_module_size(geometry.module_width, geometry.module_height);
    let part = DetectorPart { module_ids, detector };
    if !part.valid() || part.geometry() != geometry {
        return Err(bad("not distinct modules of the detector, one column of the image"));
    }
    Ok(Some(part))
}

/// The bit depth of counts whose saturation value is 2^bits - 1.
fn counts_bits(m: &Map) -> Result<u8, DecodeError> {
    let sat = uint(m, "saturation_value")?;
    match sat.checked_add(1).filter(|s| s.is_power_of_two() && *s <= 1 << 32) {
        Some(s) => Ok(s.trailing_zeros() as u8),
        None => Err(DecodeError::Value { field: "saturation_value", why: format!("{sat} is not 2^bits - 1 of counts") }),
    }
}

fn grid(r: &Map) -> Result<Geometry, DecodeError> {
    let g = Geometry::new(uint(r, "modules")? as u16, uint(r, "module_cols")? as u16, uint(r, "gap_x")? as usize, uint(r, "gap_y")? as usize)
        .ok_or(DecodeError::Value { field: "user_data.rdaq.module_cols", why: "does not divide the modules into rows".into() })?;
    // module_width came later: a sender without it has JUNGFRAU's 1024
    let width = uint(r, "module_width").map_or(rdaq_detector::MODULE_COLS, |w| w as usize);
    Ok(g.with_module_size(width, uint(r, "module_height")? as usize))
}

fn guess_grid(w: u64, h: u64) -> Result<Geometry, DecodeError> {
    let rows = rdaq_detector::MODULE_ROWS as u64;
    if w != rdaq_detector::MODULE_COLS as u64 || h == 0 || h % rows != 0 {
        return Err(DecodeError::Value { field: "image_size_x", why: format!("{w}x{h} is not a column of JUNGFRAU modules, and the source sends no module grid") });
    }
    Geometry::new((h / rows) as u16, 1, 0, 0).ok_or(DecodeError::Field("image_size_y"))
}

fn translation_z(m: &Map) -> Result<f64, DecodeError> {
    let t = get(m, "detector_translation").and_then(|v| v.as_array()).ok_or(DecodeError::Field("detector_translation"))?;
    match t.get(2) {
        Some(Value::Float(z)) => Ok(*z),
        _ => Err(DecodeError::Field("detector_translation")),
    }
}

fn rotation(m: &Map) -> Option<Rotation> {
    let omega = get(m, "goniometer")?.as_map().and_then(|g| get(g, "omega"))?.as_map()?;
    Some(Rotation { start_deg: float(omega, "start").ok()?, increment_deg: float(omega, "increment").ok()? })
}

fn image(m: &Map) -> Result<Image, DecodeError> {
    let data = map(m, "data")?;
    let (_, array) = data.first().ok_or(DecodeError::Field("data"))?;
    let (elem, chunk) = bslz4(array)?;
    let time_ns = (nanoseconds(m, "start_time"), nanoseconds(m, "stop_time"));
    let mut img = Image { image_id: uint(m, "image_id")?, frame_number: uint(m, "image_id")?, elem, chunk, time_ns, ..Image::default() };
    if let Some(r) = rdaq_fields(m) {
        img.frame_number = uint(r, "frame_number")?;
        let runs = get(r, "missing_pixels").and_then(|v| v.as_array()).ok_or(DecodeError::Field("missing_pixels"))?;
        for run in runs {
            let pair = run.as_array().filter(|p| p.len() == 2).ok_or(DecodeError::Field("missing_pixels"))?;
            let n = |v: &Value| v.as_integer().and_then(|i| usize::try_from(i).ok()).ok_or(DecodeError::Field("missing_pixels"));
            img.missing.push((n(&pair[0])?, n(&pair[1])?));
        }
        if let Some(s) = get(r, "spots").and_then(|v| v.as_map()) {
            img.spots = Some(spots(s)?);
        }
    }
    Ok(img)
}

/// A time rational `[count, per second]` in nanoseconds; 0 when absent or malformed.
fn nanoseconds(m: &Map, key: &'static str) -> u64 {
    let pair = get(m, key).and_then(|v| v.as_array()).filter(|p| p.len() == 2);
    let n = |v: &Value| v.as_integer().and_then(|i| u128::try_from(i).ok());
    match pair.map(|p| (n(&p[0]), n(&p[1]))) {
        Some((Some(count), Some(base))) if base > 0 => u64::try_from(count * 1_000_000_000 / base).unwrap_or(u64::MAX),
        _ => 0,
    }
}

/// `40([dims, T(56500(["bslz4", elem, chunk]))])` -> (elem, chunk).
fn bslz4(v: &Value) -> Result<(usize, Vec<u8>), DecodeError> {
    let bad = |why: &str| DecodeError::Value { field: "data", why: why.into() };
    let Value::Tag(TAG_MULTI_DIM, arr) = v else { return Err(bad("not a tag 40 array")) };
    let typed = arr.as_array().and_then(|a| a.get(1)).ok_or_else(|| bad("no typed array"))?;
    let Value::Tag(_, comp) = typed else { return Err(bad("not a typed array")) };
    let Value::Tag(TAG_COMPRESSED, c) = &**comp else { return Err(bad("not compressed (tag 56500): this writer does not re-compress")) };
    match c.as_array().map(Vec::as_slice) {
        Some([Value::Text(algo), Value::Integer(elem), Value::Bytes(b)]) if algo == "bslz4" => {
            Ok((usize::try_from(*elem).map_err(|_| bad("element size"))?, b.clone()))
        }
        _ => Err(bad("compression other than bslz4")),
    }
}

fn spots(s: &Map) -> Result<(Vec<Spot>, bool), DecodeError> {
    let floats = |key: &'static str| -> Result<Vec<f32>, DecodeError> {
        let a = get(s, key).and_then(|v| v.as_array()).ok_or(DecodeError::Field(key))?;
        a.iter().map(|v| v.as_float().map(|f| f as f32).ok_or(DecodeError::Field(key))).collect()
    };
    let (x, y, i) = (floats("x")?, floats("y")?, floats("intensity")?);
    let px = get(s, "pixels").and_then(|v| v.as_array()).ok_or(DecodeError::Field("pixels"))?;
    let hit = get(s, "hit").and_then(|v| v.as_bool()).ok_or(DecodeError::Field("hit"))?;
    let spots = (0..x.len())
        .map(|k| {
            let pixels = px.get(k).and_then(|v| v.as_integer()).and_then(|n| u32::try_from(n).ok()).ok_or(DecodeError::Field("pixels"))?;
            Ok(Spot { x: x[k], y: *y.get(k).ok_or(DecodeError::Field("y"))?, intensity: *i.get(k).ok_or(DecodeError::Field("intensity"))?, pixels })
        })
        .collect::<Result<_, DecodeError>>()?;
    Ok((spots, hit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Encoder, ImageInfo};

    #[test]
    fn what_the_encoder_writes_decodes_to_the_same_series() {
        let g = Geometry::new(2, 1, 8, 36).unwrap();
        let mut meta = NxmxMeta::jungfrau(g, 12.4, 0.01);
        meta.pixel = PixelType::Photons32;
        meta.max_spots = 10;
        meta.images_per_file = 7;
        meta.number_of_images = Some(3);
        meta.rotation = Some(Rotation { start_deg: 1.0, increment_deg: 0.1 });
        let mut e = Encoder::new(&meta, 1);
        let Message::Start(got) = decode(e.start()).unwrap() else { panic!("start") };
        assert_eq!(format!("{:?}", *got), format!("{meta:?}"));
        let spots = vec![Spot { x: 1.5, y: 2.5, intensity: 3.0, pixels: 4 }];
        let info = ImageInfo { image_id: 2, frame_number: 9, missing: &[(20, 40)], spots: Some((&spots, true)), time_ns: (0, 1) };
        let Message::Image(img) = decode(e.image(&info, &[7, 8, 9])).unwrap() else { panic!("image") };
        assert_eq!((img.image_id, img.frame_number, img.elem, img.chunk.as_slice()), (2, 9, 4, &[7u8, 8, 9][..]));
        assert_eq!(img.missing, vec![(20, 40)]);
        assert_eq!(img.time_ns, (0, 1));
        assert_eq!(img.spots, Some((spots, true)));
        assert!(matches!(decode(e.end(1, 0, None)).unwrap(), Message::End));
        let e = decode(&[0xa1, 0x64, b't', b'y', b'p', b'e', 0x63, b'f', b'o', b'o']).unwrap_err();
        assert!(e.to_string().contains("unknown message type \"foo\""), "{e}");
    }

    #[test]
    fn eiger_counts_and_descrambled_planes_come_back_as_sent() {
        let d = rdaq_detector::Description::load("eiger").unwrap();
        let g = Geometry::new(2, 2, 8, 36).unwrap().with_module_size(1030, 514);
        for pixel in [PixelType::Counts(12), PixelType::Counts(8), PixelType::Counts(32), PixelType::Fields] {
            let meta = NxmxMeta::described(g, &d, pixel, None);
            let mut e = Encoder::new(&meta, 1);
            let Message::Start(got) = decode(e.start()).unwrap() else { panic!("start") };
            assert_eq!((got.pixel, got.geometry), (pixel, g));
        }
    }

    #[test]
    fn a_part_of_the_detector_says_which_modules_it_holds() {
        let detector = Geometry::new(6, 2, 8, 36).unwrap();
        let part = DetectorPart { module_ids: vec![2, 3], detector };
        let meta = NxmxMeta { part: Some(part.clone()), ..NxmxMeta::jungfrau(part.geometry(), 12.4, 0.01) };
        let mut e = Encoder::new(&meta, 1);
        let Message::Start(got) = decode(e.start()).unwrap() else { panic!("start") };
        assert_eq!(got.part, Some(part.clone()));
        // modules that are not the detector's, or images that are not their column, are refused
        for bad in [DetectorPart { module_ids: vec![5, 6], detector }, DetectorPart { module_ids: vec![2, 2], detector }] {
            let meta = NxmxMeta { part: Some(bad), ..meta.clone() };
            let err = decode(Encoder::new(&meta, 1).start()).unwrap_err();
            assert!(err.to_string().contains("module_ids"), "{err}");
        }
        let wide = NxmxMeta { part: Some(DetectorPart { module_ids: vec![0, 1], detector }), ..NxmxMeta::jungfrau(Geometry::new(2, 2, 8, 36).unwrap(), 12.4, 0.01) };
        assert!(decode(Encoder::new(&wide, 1).start()).is_err());
    }
}
