//! Where a preview comes from: the preview stream of a run (a PUB socket that sends the
//! series' `start` and then its latest image, a few times a second), or a frame of a master
//! file (its chunk read raw through the data file's link and decoded here, so no HDF5 filter
//! plugin is needed).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rdaq_process::bitshuffle::{decompress, Codec};
use rdaq_sink::{FrameReader, NxmxMeta, PixelType};
use rdaq_stream::{decode, Buffer, Consumer, Message, SocketKind};

/// What a preview shows.
pub struct Preview {
    pub width: usize,
    pub height: usize,
    /// Pixel values; NaN where the pixel carries none (gaps, masked, lost).
    pub values: Vec<f32>,
    pub spots: Vec<(f32, f32)>,
    pub pixel_size_m: f64,
    /// The detector's frame number.
    pub frame_number: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    #[error("{path}: {source}")]
    Hdf5 { path: PathBuf, source: hdf5::Error },
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error(transparent)]
    Read(#[from] rdaq_sink::ReadError),
    #[error(transparent)]
    Stream(#[from] rdaq_stream::StreamError),
    #[error("{endpoint}: no image came within {secs} s (is a run publishing its preview there?)")]
    Timeout { endpoint: String, secs: f64 },
    #[error("{endpoint}: {message}")]
    Message { endpoint: String, message: String },
}

/// Pixel values of the pixel type as numbers to show: raw words by their ADC part, photon
/// counts and keV as they are; the underload marker and gap pixels carry none.
fn to_values(pixel: PixelType, bytes: &[u8], gaps: &[u32], out: &mut Vec<f32>) {
    let under = pixel.markers().1;
    out.clear();
    match pixel {
        PixelType::Raw => out.extend(bytes.chunks_exact(2).map(|b| (u16::from_le_bytes([b[0], b[1]]) & 0x3fff) as f32)),
        PixelType::Photons16 | PixelType::Fields => out.extend(bytes.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]]) as f32)),
        PixelType::Photons32 => out.extend(bytes.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)),
        PixelType::Kev => out.extend(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        PixelType::Counts(_) => match pixel.bytes() {
            1 => out.extend(bytes.iter().map(|&b| b as f32)),
            2 => out.extend(bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]) as f32)),
            _ => out.extend(bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)),
        },
    }
    for (v, &m) in out.iter_mut().zip(gaps) {
        if m != 0 || (*v as f64 == under && pixel != PixelType::Raw) {
            *v = f32::NAN;
        }
    }
}

/// Frame `frame` (the index in the series, from 0) of the series whose master is `master`.
pub fn from_file(master: &Path, frame: usize) -> Result<Preview, PreviewError> {
    let h5 = |source| PreviewError::Hdf5 { path: master.to_owned(), source };
    let file = hdf5::File::open(master).map_err(h5)?;
    let det = file.group("entry/instrument/detector").map_err(h5)?;
    let pixel_size_m: f64 = det.dataset("x_pixel_size").and_then(|d| d.read_scalar()).map_err(h5)?;
    let gaps: Vec<u32> = det.dataset("pixel_mask").and_then(|d| rdaq_process::chunk_size::reading(&d, || d.read_raw())).map_err(h5)?;
    let (link, index) = locate(&file, master, frame)?;
    let reader = FrameReader::open(master, &link)?;
    let pixel = pixel_type(&file.dataset(&link).map_err(h5)?).ok_or_else(|| PreviewError::File { path: master.into(), message: format!("{link}: pixel type not written by rdaq") })?;
    let mut values = Vec::new();
    to_values(pixel, &reader.read_bytes(index, pixel)?, &gaps, &mut values);
    let frame_number = file.dataset("entry/data/frame_number").and_then(|d| d.read_raw::<u64>()).map_err(h5)?.get(frame).copied().unwrap_or(frame as u64);
    Ok(Preview { width: reader.cols, height: reader.rows, values, spots: file_spots(&file, frame), pixel_size_m, frame_number })
}

/// The spot positions of frame `frame` from the master's spot list (none without one).
fn file_spots(file: &hdf5::File, frame: usize) -> Vec<(f32, f32)> {
    let read = || -> hdf5::Result<Vec<(f32, f32)>> {
        let g = file.group("entry/result_1")?;
        let n = g.dataset("nPeaks")?.read_slice_1d::<u32, _>(frame..frame + 1)?[0] as usize;
        let row = |name: &str| g.dataset(name)?.read_slice_1d::<f32, _>(ndarray::s![frame, ..]);
        let (x, y) = (row("peakXPosRaw")?, row("peakYPosRaw")?);
        Ok(x.iter().zip(y.iter()).take(n).map(|(&x, &y)| (x, y)).collect())
    };
    read().unwrap_or_default()
}

/// The data file link holding frame `frame`, and the frame's index in it.
fn locate(file: &hdf5::File, master: &Path, frame: usize) -> Result<(String, usize), PreviewError> {
    let mut first = 0;
    for k in 1.. {
        let link = format!("entry/data/data_{k:06}");
        let Ok(ds) = file.dataset(&link) else { break };
        let n = ds.shape()[0];
        if frame < first + n {
            return Ok((link, frame - first));
        }
        first += n;
    }
    Err(PreviewError::File { path: master.into(), message: format!("no frame {frame}: the series holds {first}") })
}

fn pixel_type(ds: &hdf5::Dataset) -> Option<PixelType> {
    use hdf5::types::{FloatSize, IntSize, TypeDescriptor as T};
    Some(match ds.dtype().ok()?.to_descriptor().ok()? {
        T::Unsigned(IntSize::U2) => PixelType::Raw,
        T::Integer(IntSize::U2) => PixelType::Photons16,
        T::Integer(IntSize::U4) => PixelType::Photons32,
        T::Float(FloatSize::U4) => PixelType::Kev,
        T::Unsigned(IntSize::U1) => PixelType::Counts(8),
        T::Unsigned(IntSize::U4) => PixelType::Counts(32),
        _ => return None,
    })
}

/// The next image of the preview stream at `endpoint` (a PUB socket), waiting at most
/// `timeout` for the series' `start` and an image after it.
pub fn from_stream(endpoint: &str, timeout: Duration) -> Result<Preview, PreviewError> {
    let fail = |message: String| PreviewError::Message { endpoint: endpoint.into(), message };
    let mut c = Consumer::connect(endpoint, SocketKind::Pub, 4)?;
    let (deadline, mut buf, mut meta) = (Instant::now() + timeout, Buffer::new(), None::<NxmxMeta>);
    while Instant::now() < deadline {
        if !c.recv(&mut buf, Duration::from_millis(100))? {
            continue;
        }
        match decode(&buf).map_err(|e| fail(e.to_string()))? {
            Message::Start(m) => meta = Some(*m),
            Message::Image(img) => {
                let Some(m) = meta.as_ref() else { continue };
                let bytes = decompress(&img.chunk, img.elem, Codec::Lz4).map_err(|e| fail(format!("image {}: {e}", img.image_id)))?;
                let (width, height) = (m.geometry.width(), m.geometry.height());
                if bytes.len() != width * height * m.pixel.bytes() {
                    return Err(fail(format!("image {} decodes to {} bytes, not {width}x{height} pixels", img.image_id, bytes.len())));
                }
                let mut values = Vec::new();
                to_values(m.pixel, &bytes, &m.geometry.gap_mask(), &mut values);
                let spots = img.spots.map(|(s, _)| s.iter().map(|s| (s.x, s.y)).collect()).unwrap_or_default();
                return Ok(Preview { width, height, values, spots, pixel_size_m: m.pixel_size_m, frame_number: img.frame_number });
            }
            Message::End => {}
        }
    }
    Err(PreviewError::Timeout { endpoint: endpoint.into(), secs: timeout.as_secs_f64() })
}
