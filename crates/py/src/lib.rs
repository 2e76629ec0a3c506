//! rdaq for Python (`import rdaq`): the extension module `rdaq._rdaq`, wrapped by the pure
//! Python package in `python/rdaq/` (docs/api.md).
//!
//! - [`receiver`]: `Receiver`, an iterator of `Frame`s whose pixels numpy reads in place,
//!   inside the receiver's ring, through the buffer protocol.
//! - [`acquisition`]: `Acquisition`, an acquisition of this process as `rdaq run` runs it,
//!   an iterator of `ProcessedFrame`s whose photon counts numpy reads in place.
//! - [`emulator`]: `Emulator`, the emulated JUNGFRAU modules, to drive acquisitions.
//! - [`stages`]: the processing stages on numpy arrays (`Converter`, `Pedestal`,
//!   `find_spots`, `compress`).
//! - [`view`]: the read-only buffer protocol numpy reads frames through.

use pyo3::prelude::*;

mod acquisition;
mod emulator;
mod receiver;
mod stages;
mod view;

/// Python's view of a JSON value (dicts, lists, numbers, strings).
fn from_json(py: Python<'_>, v: &serde_json::Value) -> PyResult<Py<PyAny>> {
    Ok(py.import("json")?.call_method1("loads", (v.to_string(),))?.unbind())
}

#[pymodule]
fn _rdaq(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<receiver::Receiver>()?;
    m.add_class::<receiver::Frame>()?;
    m.add_class::<acquisition::Acquisition>()?;
    m.add_class::<acquisition::ProcessedFrame>()?;
    m.add_class::<emulator::Emulator>()?;
    m.add_class::<stages::Converter>()?;
    m.add_class::<stages::Pedestal>()?;
    m.add_function(wrap_pyfunction!(stages::find_spots, m)?)?;
    m.add_function(wrap_pyfunction!(stages::run_finder, m)?)?;
    m.add_function(wrap_pyfunction!(stages::run_converter, m)?)?;
    m.add_function(wrap_pyfunction!(stages::compress, m)?)?;
    m.add_function(wrap_pyfunction!(stages::decompress, m)?)?;
    m.add_function(wrap_pyfunction!(stages::radius_map, m)?)?;
    m.add("FrameReleased", m.py().get_type::<receiver::FrameReleased>())?;
    Ok(())
}
