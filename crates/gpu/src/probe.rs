//! Whether this machine can run the GPU stages. `cudarc` panics when it cannot load the
//! CUDA driver or NVRTC; this looks for both libraries first (under the names `cudarc`
//! loads), so that a machine without them gets an error that says what is missing.

use std::ffi::CString;
use std::sync::Arc;

use cudarc::driver::CudaContext;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no CUDA driver on this machine ({0} not found): it has no usable GPU; use the cpu backend")]
    NoDriver(&'static str),
    #[error("no NVRTC on this machine ({0} not found): the GPU kernels are compiled at run time and need it")]
    NoNvrtc(&'static str),
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("no CUDA device on this machine")]
    NoDevice,
    #[error("compiling the kernels of {file}: {message}")]
    Compile { file: &'static str, message: String },
    #[error("{0}")]
    Input(String),
}

/// The GPU the stages run on.
#[derive(Clone)]
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub name: String,
}

/// Whether the shared library `name` can be loaded (it is unloaded again).
fn loadable(name: &str) -> bool {
    let c = CString::new(name).expect("no NUL in a library name");
    // SAFETY: dlopen with a valid NUL-terminated name; the handle is closed right away and
    // no symbol of it is used.
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if h.is_null() {
            return false;
        }
        libc::dlclose(h);
    }
    true
}

/// The first GPU, or why there is none.
pub fn probe() -> Result<Device, GpuError> {
    const CUDA: &str = "libcuda.so";
    const NVRTC: &str = "libnvrtc.so";
    if !loadable(CUDA) {
        return Err(GpuError::NoDriver(CUDA));
    }
    if !loadable(NVRTC) {
        return Err(GpuError::NoNvrtc(NVRTC));
    }
    if CudaContext::device_count()? < 1 {
        return Err(GpuError::NoDevice);
    }
    let ctx = CudaContext::new(0)?;
    let name = ctx.name()?;
    Ok(Device { ctx, name })
}
