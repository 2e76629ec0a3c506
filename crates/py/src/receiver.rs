//! `rdaq.Receiver` and `rdaq.Frame`. A frame owns its slot of the receiver's ring until it
//! is released; numpy arrays over it read the slot in place (the buffer protocol). The slot
//! goes back only when no array over it is left: `release()` refuses while one exists, and
//! an unreleased frame releases itself when Python frees it, which cannot happen while an
//! array holds it. So no array ever reads a slot the receiver is filling again.

use std::ffi::c_int;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::{ffi, create_exception};
use rdaq_receiver::{FrameReady, FrameStatus, IncompletePolicy, ReceiverConfig};

create_exception!(_rdaq, FrameReleased, pyo3::exceptions::PyRuntimeError, "The frame was released: its slot belongs to the receiver again.");

/// How long `__next__` waits between looks at Ctrl-C.
const POLL: Duration = Duration::from_millis(100);

/// A receiver of rdaq datagrams from emulated (or real) JUNGFRAU modules, with its ring of
/// frame slots. Iterate over it for frames; use it as a context manager to stop it.
#[pyclass(module = "rdaq._rdaq")]
pub struct Receiver {
    /// None once closed. Every method takes `&self`, so that `close` from one thread needs
    /// no exclusive borrow of a receiver another thread is iterating over.
    rx: Mutex<Option<Arc<rdaq_receiver::Receiver>>>,
    modules: u16,
}

impl Receiver {
    fn rx(&self) -> PyResult<Arc<rdaq_receiver::Receiver>> {
        self.rx.lock().unwrap_or_else(|e| e.into_inner()).clone().ok_or_else(|| PyValueError::new_err("the receiver is closed"))
    }

    fn closed(&self) -> bool {
        self.rx.lock().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// The next frame within `timeout` (none: until the receiver finishes); `Ok(None)` when
    /// it has finished or the time ran out.
    fn next(&self, py: Python<'_>, timeout: Option<Duration>) -> PyResult<Option<Frame>> {
        let rx = self.rx()?;
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            let wait = deadline.map_or(POLL, |d| d.saturating_duration_since(std::time::Instant::now()).min(POLL));
            match py.detach(|| rx.frames().recv_timeout(wait)) {
                Ok(f) => return Ok(Some(Frame::new(rx, f, self.modules))),
                Err(RecvTimeoutError::Disconnected) => return Ok(None),
                // closed by another thread: iteration ends (within one poll)
                Err(RecvTimeoutError::Timeout) if self.closed() => return Ok(None),
                Err(RecvTimeoutError::Timeout) if deadline.is_some_and(|d| std::time::Instant::now() >= d) => return Ok(None),
                Err(RecvTimeoutError::Timeout) => py.check_signals()?,
            }
        }
    }
}

#[pymethods]
impl Receiver {
    /// Binds one data port per module on `bind` (from `port` on; 0: ports the kernel
    /// picks) and allocates `slots` frame slots. `frames`: stop by itself after that many.
    #[new]
    #[pyo3(signature = (modules=1, bind="127.0.0.1", port=0, slots=16, frames=None, frame_timeout_ms=500, policy="keep", engine="recvmmsg"))]
    #[allow(clippy::too_many_arguments)]
    fn new(modules: u16, bind: &str, port: u16, slots: usize, frames: Option<u64>, frame_timeout_ms: u64, policy: &str, engine: &str) -> PyResult<Receiver> {
        let bind: IpAddr = bind.parse().map_err(|_| PyValueError::new_err(format!("bind: {bind:?} is not an IP address")))?;
        let policy: IncompletePolicy = policy.parse().map_err(|e| PyValueError::new_err(format!("policy: {e}")))?;
        let engine = engine.parse().map_err(|e| PyValueError::new_err(format!("engine: {e}")))?;
        if modules == 0 || slots < 2 {
            return Err(PyValueError::new_err("modules: at least 1; slots: at least 2"));
        }
        let cfg = ReceiverConfig { bind, data_port: port, modules, slots, frames, frame_timeout: Duration::from_millis(frame_timeout_ms), policy, engine, ..ReceiverConfig::default() };
        let rx = rdaq_receiver::Receiver::start(cfg).map_err(|e| PyValueError::new_err(format!("cannot start the receiver: {e}")))?;
        Ok(Receiver { rx: Mutex::new(Some(Arc::new(rx))), modules })
    }

    /// The buffer map the senders need (JSON), as `rdaq receive --buffers-out` writes it.
    #[getter]
    fn buffer_map(&self) -> PyResult<String> {
        Ok(serde_json::to_string(self.rx()?.buffer_map()).expect("a buffer map serializes"))
    }

    /// The bound data ports, one per module.
    #[getter]
    fn ports(&self) -> PyResult<Vec<u16>> {
        Ok(self.rx()?.ports().to_vec())
    }

    /// `(start, end)` addresses of the ring's slots in this process.
    #[getter]
    fn ring(&self) -> PyResult<(usize, usize)> {
        Ok(self.rx()?.ring_span())
    }

    /// The receiver's counters (at most about 10 ms old), as a dict: the same names as a
    /// receiver daemon's `/status`.
    fn counters(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        crate::from_json(py, &self.rx()?.counters().to_json())
    }

    /// The next frame, waiting at most `timeout` seconds (none: until the receiver has
    /// finished); None when it has finished or the time ran out.
    #[pyo3(signature = (timeout=None))]
    fn next_frame(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Frame>> {
        let timeout = timeout.map(|t| Duration::try_from_secs_f64(t).map_err(|_| PyValueError::new_err(format!("timeout: {t} is not a number of seconds")))).transpose()?;
        self.next(py, timeout)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Frame>> {
        self.next(py, None)
    }

    /// Asks the receiver to finish: it receives until its ports are quiet, finishes the
    /// frames in progress, and iteration ends after the last of them.
    fn stop(&self) -> PyResult<()> {
        self.rx()?.stop();
        Ok(())
    }

    /// Stops the receiver and lets go of it; its ring stays until the last frame is freed.
    /// A thread waiting in `next_frame` or iterating gets None (the iteration ends).
    fn close(&self) {
        let rx = self.rx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(rx) = rx {
            rx.stop();
        }
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(&self, _t: Py<PyAny>, _v: Py<PyAny>, _tb: Py<PyAny>) -> bool {
        self.close();
        false
    }
}

/// One frame: all modules' raw 16-bit words in the receiver's slot, `modules * 512` rows
/// of 1024 pixels. `numpy.asarray(frame)` (or `frame.array`) reads it in place.
#[pyclass(module = "rdaq._rdaq")]
pub struct Frame {
    rx: Arc<rdaq_receiver::Receiver>,
    ready: Option<FrameReady>,
    number: u64,
    status: FrameStatus,
    /// Arrays (buffer views) over the slot now.
    exports: usize,
    /// The buffer protocol's shape and strides point here (the object does not move).
    shape: [ffi::Py_ssize_t; 2],
    strides: [ffi::Py_ssize_t; 2],
}

impl Frame {
    fn new(rx: Arc<rdaq_receiver::Receiver>, f: FrameReady, modules: u16) -> Frame {
        let rows = modules as ffi::Py_ssize_t * rdaq_detector::jungfrau::MODULE_ROWS as ffi::Py_ssize_t;
        let cols = rdaq_detector::jungfrau::MODULE_COLS as ffi::Py_ssize_t;
        Frame { number: f.frame(), status: f.status(), rx, ready: Some(f), exports: 0, shape: [rows, cols], strides: [cols * 2, 2] }
    }

    /// The slot's bytes, while the frame holds it.
    fn bytes(&self) -> PyResult<&[u8]> {
        let f = self.ready.as_ref().ok_or_else(|| FrameReleased::new_err(format!("frame {} was released", self.number)))?;
        self.rx.data(f).map_err(|e| PyValueError::new_err(format!("frame {}: {e}", self.number)))
    }

    fn give_back(&mut self) {
        if let Some(f) = self.ready.take() {
            self.rx.release(f).expect("a frame of this receiver");
        }
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        self.give_back();
    }
}

#[pymethods]
impl Frame {
    /// The frame number the modules sent.
    #[getter]
    fn number(&self) -> u64 {
        self.number
    }

    /// "complete", "incomplete" (kept, missing pixels marked) or "discarded" (no data).
    #[getter]
    fn status(&self) -> &'static str {
        match self.status {
            FrameStatus::Complete => "complete",
            FrameStatus::Incomplete => "incomplete",
            FrameStatus::Discarded => "discarded",
        }
    }

    #[getter]
    fn complete(&self) -> bool {
        self.status == FrameStatus::Complete
    }

    #[getter]
    fn released(&self) -> bool {
        self.ready.is_none()
    }

    /// The shape of the image: (modules * 512, 1024).
    #[getter]
    fn shape(&self) -> (isize, isize) {
        (self.shape[0], self.shape[1])
    }

    /// Missing-pixel mask (numpy bool, the frame's shape): True where the datagram that
    /// carries the pixel never arrived. All False for a complete frame.
    #[getter]
    fn missing_mask(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let f = self.ready.as_ref().ok_or_else(|| FrameReleased::new_err(format!("frame {} was released", self.number)))?;
        let mut mask = vec![0u8; self.rx.grid().frame_pixels()];
        self.rx.missing_mask(f, &mut mask).expect("a frame of this receiver");
        let np = py.import("numpy")?;
        let bytes = pyo3::types::PyBytes::new(py, &mask);
        Ok(np.call_method1("frombuffer", (bytes, "bool"))?.call_method1("reshape", (self.shape(),))?.unbind())
    }

    /// The image as a read-only numpy uint16 array over the slot (no copy).
    #[getter]
    fn array(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        slf.borrow().bytes()?;
        crate::view::array(slf.as_any())
    }

    /// numpy's fallback when the buffer protocol fails (a released frame): raise, rather
    /// than let numpy wrap the frame object in an object array.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__(slf: &Bound<'_, Self>, dtype: Option<Py<PyAny>>, copy: Option<bool>) -> PyResult<Py<PyAny>> {
        let _ = (dtype, copy);
        slf.borrow().bytes()?;
        crate::view::array(slf.as_any())
    }

    /// Gives the slot back to the receiver. Refused while arrays over it exist (delete them
    /// first); afterwards every access to the pixels raises `FrameReleased`.
    fn release(&mut self) -> PyResult<()> {
        crate::view::refuse_while_exported(self.number, self.exports, "its slot")?;
        self.give_back();
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
        format!("<rdaq.Frame {} {} {}x{}{}>", self.number, self.status(), self.shape[0], self.shape[1], if self.ready.is_none() { " released" } else { "" })
    }

    /// The buffer protocol: the slot, read-only, as uint16 of the frame's shape.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        crate::view::check(view, flags, "the receiver owns the data")?;
        let mut f = slf.borrow_mut();
        let p = {
            let b = f.bytes()?;
            crate::view::Pixels { buf: b.as_ptr(), len: b.len(), item: 2, format: c"H" }
        };
        f.exports += 1;
        let (shape, strides) = (f.shape.as_mut_ptr(), f.strides.as_mut_ptr());
        // SAFETY: the slot stays handed (and the ring alive, through `f.rx`) while `exports`
        // > 0: `release` refuses then, and the frame cannot be dropped while the view holds
        // a reference to it. Shape and strides live in the object, which does not move.
        unsafe { crate::view::fill(view, slf.clone().into_any(), &p, shape, strides, flags) };
        Ok(())
    }

    unsafe fn __releasebuffer__(&mut self, _view: *mut ffi::Py_buffer) {
        self.exports -= 1;
    }
}
