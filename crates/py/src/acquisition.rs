//! `rdaq.Acquisition` and `rdaq.ProcessedFrame`: the acquisition `rdaq run` runs (the
//! emulated detector, the receiver, the processing graph, the files, the stream), or with a
//! `source` the one `rdaq receive` runs on a detector outside this process, configured by
//! the same file, whose processed frames Python iterates over.
//! A frame's photon counts are the graph's own buffer, read by numpy in place (the buffer
//! protocol); the buffer goes back to the graph when the frame is released or freed, which
//! cannot happen while an array over it exists.

use std::ffi::c_int;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use rdaq_emulator::Control;
use rdaq_run::config::Config;
use rdaq_run::embedded;
use rdaq_run::graph::deliver::{Pixels, Processed};
use rdaq_run::remote::{self, Source};
use rdaq_run::summary::Summary;

use crate::receiver::FrameReleased;

/// How long `__next__` waits between looks at Ctrl-C.
const POLL: Duration = Duration::from_millis(100);

/// An acquisition, configured as `rdaq run` and `rdaq receive` are (`config`: a TOML file
/// of rdaq.example.toml's sections; the keywords override it): of the emulated detector in
/// this process, or with `source` (a dict of what a detector outside the process sends:
/// `format`, `detector`, `interfaces`, `read_rows`, `bit_depth`, `link`, ...) of the packets
/// that come to its data ports (`ports`), as `rdaq receive` takes them. Iterate over it for
/// the processed frames as they are written; `summary` is the acquisition's summary (the
/// one `--summary-json` writes) once iteration ended.
#[pyclass(module = "rdaq._rdaq")]
pub struct Acquisition {
    frames: crossbeam_channel::Receiver<Processed>,
    /// Behind locks, not `&mut self`: one thread iterates while another stops the run or
    /// reads its properties.
    run: Mutex<Option<JoinHandle<anyhow::Result<Summary>>>>,
    control: Arc<Control>,
    summary: Mutex<Option<serde_json::Value>>,
    shape: [ffi::Py_ssize_t; 2],
    /// The data ports of a source outside this process (none for the emulated detector).
    ports: Vec<u16>,
}

impl Acquisition {
    /// Waits for the run's end and keeps its summary; an error of the run raises.
    fn finish(&self, py: Python<'_>) -> PyResult<()> {
        let Some(run) = lock(&self.run).take() else { return Ok(()) };
        let r = py.detach(|| run.join()).map_err(|_| PyRuntimeError::new_err("the acquisition's thread panicked"))?;
        let sum = r.map_err(|e| PyRuntimeError::new_err(format!("{e:#}")))?;
        *lock(&self.summary) = Some(serde_json::to_value(&sum).map_err(|e| PyRuntimeError::new_err(e.to_string()))?);
        Ok(())
    }
}

/// A panicked holder leaves the value as it was: a poisoned lock is taken as it is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `source` dict as a [`Source`] (through JSON; errors name `source.<field>`); the
/// `frames` keyword goes over its `frames`.
fn source_of(py: Python<'_>, source: &Bound<'_, PyAny>, frames: Option<u64>) -> PyResult<Source> {
    let text: String = py.import("json")?.call_method1("dumps", (source,))?.extract()?;
    let s: Source = serde_json::from_str(&text).map_err(|e| PyValueError::new_err(format!("source: {e}")))?;
    Ok(Source { frames: frames.or(s.frames), naming: remote::Naming::Fields("source"), ..s })
}

#[pymethods]
impl Acquisition {
    #[new]
    #[pyo3(signature = (config=None, frames=None, modules=None, rate_hz=None, out=None, overwrite=false, source=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        config: Option<PathBuf>,
        frames: Option<u64>,
        modules: Option<u16>,
        rate_hz: Option<f64>,
        out: Option<PathBuf>,
        overwrite: bool,
        source: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Acquisition> {
        let bad = |e: anyhow::Error| PyValueError::new_err(format!("{e:#}"));
        let base = if source.is_some() { Config::remote() } else { Config::default() };
        let mut cfg = match &config {
            Some(p) => Config::load_over(base, p).map_err(bad)?,
            None => base,
        };
        (cfg.emulator.frames, cfg.detector.modules) = (frames.unwrap_or(cfg.emulator.frames), modules.unwrap_or(cfg.detector.modules));
        cfg.emulator.rate_hz = rate_hz.unwrap_or(cfg.emulator.rate_hz);
        cfg.output.dir = out.unwrap_or(cfg.output.dir);
        cfg.output.overwrite |= overwrite;
        cfg.check().map_err(bad)?;
        let source = source.map(|s| source_of(py, &s, frames)).transpose()?;
        // the start waits a little for stream consumers, perhaps threads of this program
        let e = py.detach(|| embedded::start(cfg, source)).map_err(bad)?;
        let shape = [e.geometry.height() as ffi::Py_ssize_t, e.geometry.width() as ffi::Py_ssize_t];
        Ok(Acquisition { frames: e.frames, run: Mutex::new(Some(e.run)), control: e.control, summary: Mutex::new(None), shape, ports: e.ports })
    }

    /// The data ports the detector sends to (a `source` outside this process; empty for
    /// the emulated detector).
    #[getter]
    fn ports(&self) -> Vec<u16> {
        self.ports.clone()
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<ProcessedFrame>> {
        loop {
            let frames = self.frames.clone();
            match py.detach(|| frames.recv_timeout(POLL)) {
                Ok(p) => return Ok(Some(ProcessedFrame::new(p, self.shape))),
                Err(RecvTimeoutError::Disconnected) => {
                    self.finish(py)?;
                    return Ok(None);
                }
                Err(RecvTimeoutError::Timeout) => py.check_signals()?,
            }
        }
    }

    /// Stops the detector early (as Ctrl-C does `rdaq run`); the frames on their way still
    /// come.
    fn stop(&self) {
        self.control.stop.store(true, Ordering::Relaxed);
    }

    /// The run's summary (a dict, as `--summary-json` writes it), once iteration ended.
    #[getter]
    fn summary(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        lock(&self.summary).as_ref().map(|s| crate::from_json(py, s)).transpose()
    }

    /// The shape of the images: (rows, cols).
    #[getter]
    fn shape(&self) -> (isize, isize) {
        (self.shape[0], self.shape[1])
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Stops the detector, lets the frames still coming go, and waits for the run's end.
    fn __exit__(&self, py: Python<'_>, _t: Py<PyAny>, _v: Py<PyAny>, _tb: Py<PyAny>) -> PyResult<bool> {
        self.stop();
        while let Ok(p) = py.detach(|| self.frames.recv()) {
            drop(p);
        }
        self.finish(py)?;
        Ok(false)
    }
}

/// One processed, written frame: its pixels as the files hold them (photon counts as int16
/// or int32, or keV as float32; the image's shape) in the processing graph's buffer;
/// `numpy.asarray(frame)` reads them in place.
#[pyclass(module = "rdaq._rdaq")]
pub struct ProcessedFrame {
    frame: Option<Processed>,
    number: u64,
    exports: usize,
    shape: [ffi::Py_ssize_t; 2],
    strides: [ffi::Py_ssize_t; 2],
}

impl ProcessedFrame {
    fn new(p: Processed, shape: [ffi::Py_ssize_t; 2]) -> ProcessedFrame {
        let item = layout(&p.pixels()).item as ffi::Py_ssize_t;
        ProcessedFrame { number: p.frame(), frame: Some(p), exports: 0, shape, strides: [shape[1] * item, item] }
    }

    fn held(&self) -> PyResult<&Processed> {
        self.frame.as_ref().ok_or_else(|| FrameReleased::new_err(format!("frame {} was released", self.number)))
    }
}

#[pymethods]
impl ProcessedFrame {
    #[getter]
    fn number(&self) -> u64 {
        self.number
    }

    /// Whether the frame has enough Bragg spots to be a hit.
    #[getter]
    fn hit(&self) -> PyResult<bool> {
        Ok(self.held()?.spots().1)
    }

    /// The Bragg spots: (x, y, intensity in photons, pixels) each, x along the columns.
    #[getter]
    fn spots(&self) -> PyResult<Vec<(f32, f32, f32, u32)>> {
        Ok(self.held()?.spots().0.iter().map(|s| (s.x, s.y, s.intensity, s.pixels)).collect())
    }

    /// The pixels as a read-only numpy array over the graph's buffer (no copy).
    #[getter]
    fn array(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        slf.borrow().held()?;
        crate::view::array(slf.as_any())
    }

    /// numpy's fallback when the buffer protocol fails (a released frame): raise, rather
    /// than let numpy wrap the frame object in an object array.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__(slf: &Bound<'_, Self>, dtype: Option<Py<PyAny>>, copy: Option<bool>) -> PyResult<Py<PyAny>> {
        let _ = (dtype, copy);
        slf.borrow().held()?;
        crate::view::array(slf.as_any())
    }

    /// Gives the buffer back to the graph. Refused while arrays over it exist.
    fn release(&mut self) -> PyResult<()> {
        crate::view::refuse_while_exported(self.number, self.exports, "it")?;
        self.frame = None;
        Ok(())
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(&mut self, _t: Py<PyAny>, _v: Py<PyAny>, _tb: Py<PyAny>) -> PyResult<bool> {
        self.release()?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("<rdaq.ProcessedFrame {} {}x{}{}>", self.number, self.shape[0], self.shape[1], if self.frame.is_none() { " released" } else { "" })
    }

    /// The buffer protocol: the pixels, read-only, of the image's shape.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        crate::view::check(view, flags, "the processing graph owns the data")?;
        let mut f = slf.borrow_mut();
        let p = layout(&f.held()?.pixels());
        f.exports += 1;
        let (shape, strides) = (f.shape.as_mut_ptr(), f.strides.as_mut_ptr());
        // SAFETY: the buffer stays held (not given back to the graph, not moved: it is
        // boxed) while `exports` > 0: `release` refuses then, and the frame cannot be dropped
        // while the view holds a reference to it. Shape and strides live in the object,
        // which does not move.
        unsafe { crate::view::fill(view, slf.clone().into_any(), &p, shape, strides, flags) };
        Ok(())
    }

    unsafe fn __releasebuffer__(&mut self, _view: *mut ffi::Py_buffer) {
        self.exports -= 1;
    }
}

/// What a view of a frame's pixels shows.
fn layout(px: &Pixels) -> crate::view::Pixels {
    let (buf, item, format, len): (*const u8, usize, &'static std::ffi::CStr, usize) = match px {
        Pixels::I16(v) => (v.as_ptr().cast(), 2, c"h", std::mem::size_of_val(*v)),
        Pixels::I32(v) => (v.as_ptr().cast(), 4, c"i", std::mem::size_of_val(*v)),
        Pixels::F32(v) => (v.as_ptr().cast(), 4, c"f", std::mem::size_of_val(*v)),
        // a counting detector's counts, little-endian as the struct module says ("<": no
        // alignment asked of the buffer)
        Pixels::Counts { bytes, size } => {
            let format = match size {
                1 => c"B",
                2 => c"<H",
                _ => c"<I",
            };
            (bytes.as_ptr(), *size, format, bytes.len())
        }
    };
    crate::view::Pixels { buf, len, item, format }
}
