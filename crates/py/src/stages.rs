//! The processing stages on numpy arrays, as `rdaq run` runs them: JUNGFRAU conversion to
//! keV, pedestal tracking, local-SNR spot finding, bitshuffle compression. Each releases
//! the GIL while it runs, and checks dtype and shape before it starts (a wrong one raises
//! `TypeError` or `ValueError` naming the argument).

use numpy::{PyArray1, PyArray2, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray2, PyReadonlyArray3, PyUntypedArrayMethods};
use pyo3::exceptions::{PyMemoryError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use rdaq_process::bitshuffle::{Codec, Compressor};
use rdaq_process::spots::{LocalSnr, LocalSnrParams, Spot};
use rdaq_process::{Calibration, InvalidGain};

fn bad(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

/// `rows` x `cols` pixels, when `bytes_per_pixel` of each fit in half of this machine's
/// memory: an array the caller asks for is bounded before it is allocated.
fn pixels(rows: usize, cols: usize, bytes_per_pixel: usize, what: &str) -> PyResult<usize> {
    let limit = rdaq_run::config::physical_mib() / 2;
    match rows.checked_mul(cols).filter(|p| (p.saturating_mul(bytes_per_pixel) as u64 >> 20) <= limit) {
        Some(0) => Err(bad(format!("{what}: {rows}x{cols} has no pixel"))),
        Some(p) => Ok(p),
        None => Err(PyMemoryError::new_err(format!("{what}: {rows}x{cols} pixels of {bytes_per_pixel} bytes are more than half of this machine's {} MiB", 2 * limit))),
    }
}

/// `values` as a float32 array of `shape` (moved, not copied).
fn f32_array(py: Python<'_>, values: Vec<f32>, shape: (usize, usize)) -> PyResult<Bound<'_, PyArray2<f32>>> {
    PyArray1::from_vec(py, values).reshape([shape.0, shape.1])
}

/// The JUNGFRAU conversion of raw words to keV with one calibration (aare-exact; the
/// special words and masked pixels as `rdaq process convert` writes them).
#[pyclass(module = "rdaq._rdaq")]
pub struct Converter {
    conv: rdaq_process::Converter,
    shape: (usize, usize),
}

#[pymethods]
impl Converter {
    /// `pedestal` and `gain`: float32 (3, rows, cols), per gain stage; `mask`: uint32
    /// (rows, cols), non-zero pixels are not converted; `invalid_gain`: "error", "g0"
    /// (as aare) or "g2".
    #[new]
    #[pyo3(signature = (pedestal, gain, mask=None, invalid_gain="error"))]
    fn new(pedestal: PyReadonlyArray3<'_, f32>, gain: PyReadonlyArray3<'_, f32>, mask: Option<PyReadonlyArray2<'_, u32>>, invalid_gain: &str) -> PyResult<Converter> {
        let (s, g) = (pedestal.shape(), gain.shape());
        if s[0] != 3 || s != g {
            return Err(bad(format!("pedestal and gain: shapes {s:?} and {g:?}, both must be (3, rows, cols)")));
        }
        let (rows, cols) = (s[1], s[2]);
        let stage = |a: &PyReadonlyArray3<'_, f32>, k: usize| a.as_array().index_axis(numpy::ndarray::Axis(0), k).iter().copied().collect::<Vec<f32>>();
        let mask = match mask {
            Some(m) if m.shape() != [rows, cols] => return Err(bad(format!("mask: shape {:?}, the calibration's is ({rows}, {cols})", m.shape()))),
            Some(m) => m.as_array().iter().copied().collect(),
            None => vec![0; rows * cols],
        };
        let cal = Calibration { pedestal: [0, 1, 2].map(|k| stage(&pedestal, k)), gain: [0, 1, 2].map(|k| stage(&gain, k)), mask };
        let invalid = InvalidGain::parse(invalid_gain).map_err(|e| bad(format!("invalid_gain: {e}")))?;
        let conv = rdaq_process::Converter::new(cal, invalid).map_err(|e| bad(format!("calibration: {e}")))?;
        Ok(Converter { conv, shape: (rows, cols) })
    }

    /// keV (float32, the shape of `raw`) from raw words (uint16, (rows, cols)).
    fn to_kev<'py>(&self, py: Python<'py>, raw: PyReadonlyArray2<'py, u16>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        if raw.shape() != [self.shape.0, self.shape.1] {
            return Err(bad(format!("raw: shape {:?}, the calibration's is {:?}", raw.shape(), self.shape)));
        }
        let raw = raw.as_slice().map_err(|_| bad("raw: must be C-contiguous".into()))?;
        let mut out = vec![0f32; raw.len()];
        py.detach(|| self.conv.to_kev(raw, &mut out));
        f32_array(py, out, self.shape)
    }
}

/// Pedestal tracking of dark frames over a running window (aare's method).
#[pyclass(module = "rdaq._rdaq")]
pub struct Pedestal {
    ped: rdaq_process::pedestal::Pedestal<f64>,
    shape: (usize, usize),
}

#[pymethods]
impl Pedestal {
    /// A tracker of gain stage `stage` (0, 1, 2) over the last `window` dark frames.
    #[new]
    #[pyo3(signature = (rows, cols, window=128, stage=0))]
    fn new(rows: usize, cols: usize, window: u32, stage: u8) -> PyResult<Pedestal> {
        if stage > 2 || window == 0 {
            return Err(bad(format!("stage {stage}, window {window}: stage 0..2, a window of at least 1 frame")));
        }
        // the sums (two f64), the sample and the wrong-gain counts (u32) of each pixel
        let n = pixels(rows, cols, 24, "Pedestal")?;
        Ok(Pedestal { ped: rdaq_process::pedestal::Pedestal::new(n, stage, window), shape: (rows, cols) })
    }

    /// Adds one dark frame (uint16, (rows, cols)).
    fn push(&mut self, py: Python<'_>, raw: PyReadonlyArray2<'_, u16>) -> PyResult<()> {
        if raw.shape() != [self.shape.0, self.shape.1] {
            return Err(bad(format!("raw: shape {:?}, the tracker's is {:?}", raw.shape(), self.shape)));
        }
        let raw = raw.as_slice().map_err(|_| bad("raw: must be C-contiguous".into()))?;
        let ped = &mut self.ped;
        py.detach(|| ped.push(raw));
        Ok(())
    }

    /// Dark frames added so far.
    #[getter]
    fn frames(&self) -> u64 {
        self.ped.frames()
    }

    /// The pedestal (float32, (rows, cols)).
    fn mean<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let mut out = vec![0f32; self.ped.pixels()];
        self.ped.mean_into(&mut out);
        f32_array(py, out, self.shape)
    }

    /// The RMS of the samples (float32, (rows, cols)).
    fn rms<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let mut out = vec![0f32; self.ped.pixels()];
        self.ped.rms_into(&mut out);
        f32_array(py, out, self.shape)
    }
}

/// The local-SNR spot finder on an image (float32, (rows, cols), in the unit of
/// `threshold`): spots as a float32 array of rows (x, y, intensity, pixels).
#[pyfunction]
#[pyo3(signature = (image, threshold, snr=3.0, box_half=15, min_pixels=4, max_pixels=200))]
pub fn find_spots<'py>(py: Python<'py>, image: PyReadonlyArray2<'py, f32>, threshold: f32, snr: f32, box_half: usize, min_pixels: u32, max_pixels: u32) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let (h, w) = (image.shape()[0], image.shape()[1]);
    let params = LocalSnrParams { threshold, snr, box_half, min_pixels, max_pixels };
    params.check(h, w).map_err(bad)?;
    let img = image.as_slice().map_err(|_| bad("image: must be C-contiguous".into()))?;
    let mut finder = LocalSnr::new(params);
    let mut spots: Vec<Spot> = Vec::new();
    py.detach(|| finder.find(img, w, h, &mut spots));
    let flat: Vec<f32> = spots.iter().flat_map(|s| [s.x, s.y, s.intensity, s.pixels as f32]).collect();
    f32_array(py, flat, (spots.len(), 4))
}

/// The local spot finder's settings of the processed run that wrote the rdaq master `path`
/// (kept in the file), as `find_spots`' keyword arguments with the threshold in the unit of
/// the file's image (keV, or photons for counts); None for a file rdaq did not process.
#[pyfunction]
pub fn run_finder(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Option<Bound<'_, PyDict>>> {
    let Some(r) = py.detach(|| rdaq_offline::run_finder(&path)) else {
        return Ok(None);
    };
    let (p, d) = (r.params, PyDict::new(py));
    d.set_item("threshold", p.threshold)?;
    d.set_item("snr", p.snr)?;
    d.set_item("box_half", p.box_half)?;
    d.set_item("min_pixels", p.min_pixels)?;
    d.set_item("max_pixels", p.max_pixels)?;
    Ok(Some(d))
}

/// The conversion settings of the run that wrote the rdaq master `path` (a processed run's,
/// or a raw JUNGFRAU run's that it would have converted with), as `Converter`'s keyword
/// arguments beside the calibration's arrays; None for a file without them.
#[pyfunction]
pub fn run_converter(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Option<Bound<'_, PyDict>>> {
    let Some(gain) = py.detach(|| rdaq_offline::run_invalid_gain(&path)) else {
        return Ok(None);
    };
    let d = PyDict::new(py);
    d.set_item("invalid_gain", gain)?;
    Ok(Some(d))
}

/// The array's bytes as one bitshuffle chunk (HDF5 filter 32008's format: a 12-byte
/// header, then blocks), with "lz4" or "zstd".
#[pyfunction]
#[pyo3(signature = (array, codec="lz4", zstd_level=3))]
pub fn compress<'py>(py: Python<'py>, array: &Bound<'py, PyAny>, codec: &str, zstd_level: i32) -> PyResult<Bound<'py, PyBytes>> {
    let codec = Codec::parse(codec, zstd_level).map_err(|e| bad(format!("codec: {e}")))?;
    let arr = array.downcast::<numpy::PyUntypedArray>().map_err(|_| pyo3::exceptions::PyTypeError::new_err("array: a numpy array is needed"))?;
    if !arr.is_c_contiguous() {
        return Err(bad("array: must be C-contiguous".into()));
    }
    let es = arr.dtype().itemsize();
    // the same memory as bytes, without a copy
    let flat = arr.call_method1("reshape", (-1,))?.call_method1("view", ("u1",))?;
    let flat = flat.downcast::<PyArray1<u8>>().map_err(|_| bad("array: not viewable as bytes".into()))?.readonly();
    let bytes = flat.as_slice().map_err(|_| bad("array: must be C-contiguous".into()))?;
    let mut out = Vec::new();
    py.detach(|| Compressor::new(es, 0, codec).compress(bytes, &mut out));
    Ok(PyBytes::new(py, &out))
}

/// The bytes of a bitshuffle chunk (HDF5 filter 32008's format) of `elem_size`-byte
/// elements, as `compress` or the stream and the data files hold them.
#[pyfunction]
#[pyo3(signature = (chunk, elem_size, codec="lz4"))]
pub fn decompress<'py>(py: Python<'py>, chunk: &[u8], elem_size: usize, codec: &str) -> PyResult<Bound<'py, PyBytes>> {
    let codec = Codec::parse(codec, 0).map_err(|e| bad(format!("codec: {e}")))?;
    if elem_size == 0 {
        return Err(bad("elem_size: at least 1".into()));
    }
    let out = py.detach(|| rdaq_process::bitshuffle::decompress(chunk, elem_size, codec)).map_err(|e| bad(format!("chunk: {e}")))?;
    Ok(PyBytes::new(py, &out))
}

/// peakfinder8's radius map of a `height` x `width` image with the beam at (`cx`, `cy`)
/// (pixel indices, fast, slow): float32, computed in float64 as numpy users do.
#[pyfunction]
pub fn radius_map(py: Python<'_>, width: usize, height: usize, cx: f64, cy: f64) -> PyResult<Bound<'_, PyArray2<f32>>> {
    pixels(height, width, 4, "radius_map")?;
    f32_array(py, rdaq_process::spots::Peakfinder8::radius_map(width, height, cx, cy), (height, width))
}
