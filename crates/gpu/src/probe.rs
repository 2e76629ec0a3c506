//! Whether this machine can run the GPU stages. `cudarc` panics when it cannot load the
//! CUDA driver or NVRTC, or NVRTC lacks a symbol it binds; this looks for both libraries
//! first (under the names `cudarc` loads), and for a symbol CUDA 13's NVRTC dropped, so that
//! a machine without them gets an error that says what is missing.

use std::ffi::CString;
use std::sync::Arc;

use cudarc::driver::CudaContext;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no CUDA driver on this machine ({0} not found): it has no usable GPU; use the cpu backend")]
    NoDriver(&'static str),
    #[error("no NVRTC on this machine ({0} not found): the GPU kernels are compiled at run time and need it")]
    NoNvrtc(&'static str),
    /// CUDA 13's NVRTC dropped symbols that the `cudarc` rdaq is built with binds (for CUDA
    /// 12), and `cudarc` panics on the first it misses.
    #[error("the NVRTC found ({0}) lacks {1}, which rdaq's CUDA 12 bindings need (CUDA 13 removed it): put a CUDA 12 libnvrtc.so first on LD_LIBRARY_PATH (e.g. from the nvidia-cuda-nvrtc-cu12 wheel)")]
    NvrtcTooNew(&'static str, &'static str),
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

/// Whether the shared library `name` can be loaded and, when `symbol` is given, has it
/// (the library is unloaded again).
fn loadable(name: &str, symbol: Option<&str>) -> bool {
    let c = CString::new(name).expect("no NUL in a library name");
    let sym = symbol.map(|s| CString::new(s).expect("no NUL in a symbol name"));
    // SAFETY: dlopen and dlsym with valid NUL-terminated names; the handle is closed right
    // away and the symbol's address is only compared with null, never used.
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if h.is_null() {
            return false;
        }
        let found = sym.is_none_or(|s| !libc::dlsym(h, s.as_ptr()).is_null());
        libc::dlclose(h);
        found
    }
}

/// Whether NVRTC, the compiler of the kernels, can be loaded and is CUDA 12's; it needs no
/// GPU. `cudarc` takes the first of these names that loads (and more, for other systems).
pub fn nvrtc() -> Result<(), GpuError> {
    const NAMES: [&str; 2] = ["libnvrtc.so", "libnvrtc.so.12"];
    // one of the symbols cudarc's CUDA 12 NVRTC bindings load eagerly that CUDA 13 lacks
    const CUDA12_ONLY: &str = "nvrtcGetNVVM";
    let Some(name) = NAMES.into_iter().find(|n| loadable(n, None)) else {
        return Err(GpuError::NoNvrtc(NAMES[0]));
    };
    if !loadable(name, Some(CUDA12_ONLY)) {
        return Err(GpuError::NvrtcTooNew(name, CUDA12_ONLY));
    }
    Ok(())
}

/// The first GPU, or why there is none.
pub fn probe() -> Result<Device, GpuError> {
    const CUDA: &str = "libcuda.so";
    if !loadable(CUDA, None) {
        return Err(GpuError::NoDriver(CUDA));
    }
    nvrtc()?;
    if CudaContext::device_count()? < 1 {
        return Err(GpuError::NoDevice);
    }
    let ctx = CudaContext::new(0)?;
    let name = ctx.name()?;
    Ok(Device { ctx, name })
}
