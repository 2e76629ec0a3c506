//! The buffer protocol of the objects whose memory numpy reads in place (a receiver's
//! `Frame`, an acquisition's `ProcessedFrame`): a read-only, row-major 2-D view.

use std::ffi::{c_int, c_void, CStr};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// What a view shows: `len` bytes from `buf`, pixels of `item` bytes in struct format
/// `format`, of the object's `shape` and `strides` (which live in the object).
pub struct Pixels {
    pub buf: *const u8,
    pub len: usize,
    pub item: usize,
    pub format: &'static CStr,
}

/// Refuses what these views cannot give: no view to fill, or a writable one (`what` says
/// who owns the data).
pub fn check(view: *mut ffi::Py_buffer, flags: c_int, what: &str) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("no buffer view to fill"));
    }
    if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
        return Err(PyBufferError::new_err(format!("read-only: {what}")));
    }
    Ok(())
}

/// Fills `view` (checked by [`check`]) as asked by `flags`, holding a reference to `obj`.
///
/// # Safety
/// `p.buf..p.buf + p.len` must stay valid and unchanged, and `shape` and `strides` (two
/// each) must stay where they are, for as long as `obj` is referenced by the view: the
/// caller keeps its memory while it counts the view as exported.
pub unsafe fn fill(view: *mut ffi::Py_buffer, obj: Bound<'_, PyAny>, p: &Pixels, shape: *mut ffi::Py_ssize_t, strides: *mut ffi::Py_ssize_t, flags: c_int) {
    let nd = flags & ffi::PyBUF_ND == ffi::PyBUF_ND;
    // SAFETY: `view` is non-null (checked) and CPython's to fill; the memory it points to
    // stays valid while `obj` is referenced (the caller's contract); the formats are static.
    unsafe {
        (*view).obj = obj.into_ptr();
        (*view).buf = p.buf as *mut c_void;
        (*view).len = p.len as ffi::Py_ssize_t;
        (*view).readonly = 1;
        (*view).itemsize = if nd { p.item as ffi::Py_ssize_t } else { 1 };
        (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT { if nd { p.format.as_ptr() as *mut _ } else { c"B".as_ptr() as *mut _ } } else { std::ptr::null_mut() };
        (*view).ndim = if nd { 2 } else { 1 };
        (*view).shape = if nd { shape } else { std::ptr::null_mut() };
        (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES { strides } else { std::ptr::null_mut() };
        (*view).suboffsets = std::ptr::null_mut();
        (*view).internal = std::ptr::null_mut();
    }
}

/// numpy's array of `obj` through a memoryview: what `__array__` answers once the object
/// checked that its memory is still there (numpy would otherwise wrap the object itself).
pub fn array(obj: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let view = pyo3::types::PyMemoryView::from(obj)?;
    Ok(obj.py().import("numpy")?.call_method1("asarray", (view,))?.unbind())
}

/// Refuses to give frame `number`'s memory back while `exports` arrays read it (`what`:
/// the memory, as its owner calls it).
pub fn refuse_while_exported(number: u64, exports: usize, what: &str) -> PyResult<()> {
    if exports > 0 {
        return Err(PyBufferError::new_err(format!("frame {number}: {exports} array(s) still read {what}; delete them before releasing it")));
    }
    Ok(())
}
