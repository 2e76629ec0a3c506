//! Whether this machine can run the GPU stages. `cudarc` panics when it cannot load the
//! CUDA driver; this looks for the driver first (under the names `cudarc` loads) and for
//! NVRTC ([`crate::nvrtc`]), so that a machine without them gets an error that says what is
//! missing.

use std::ffi::CString;
use std::sync::Arc;

use cudarc::driver::CudaContext;

use crate::nvrtc::{self, CudaVersion};

pub use crate::error::GpuError;

/// The GPU the stages run on.
#[derive(Clone)]
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub name: String,
    /// The driver's CUDA version.
    pub driver: CudaVersion,
    /// The NVRTC the kernels are compiled with.
    pub nvrtc: &'static nvrtc::Nvrtc,
    /// How host threads wait for it.
    pub sync: Sync,
}

/// Whether the shared library `name` can be loaded (it is unloaded again).
fn loadable(name: &str) -> bool {
    let c = CString::new(name).expect("no NUL in a library name");
    // SAFETY: dlopen with a valid NUL-terminated name; the handle is closed right away.
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if h.is_null() {
            return false;
        }
        libc::dlclose(h);
        true
    }
}

/// NVRTC, the compiler of the kernels, without a driver (compiling needs no GPU).
pub fn nvrtc() -> Result<&'static nvrtc::Nvrtc, GpuError> {
    nvrtc::load(None)
}

/// The CUDA version of the loaded driver.
fn driver_version() -> Result<CudaVersion, GpuError> {
    let mut v = 0;
    // SAFETY: the driver library loads (checked by the caller); cuDriverGetVersion writes
    // one int and needs no initialisation.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }.result()?;
    Ok((v / 1000, (v % 1000) / 10))
}

/// The first GPU, or why there is none.
pub fn probe() -> Result<Device, GpuError> {
    const CUDA: &str = "libcuda.so.1";
    if !loadable(CUDA) && !loadable("libcuda.so") {
        return Err(GpuError::NoDriver(CUDA));
    }
    let driver = driver_version()?;
    let nvrtc = nvrtc::load(Some(driver))?;
    if CudaContext::device_count()? < 1 {
        return Err(GpuError::NoDevice);
    }
    let ctx = CudaContext::new(0)?;
    let name = ctx.name()?;
    let sync = Sync::from_env()?;
    ctx.set_flags(sync.flags())?;
    Ok(Device { ctx, name, driver, nvrtc, sync })
}

/// How a host thread waits for the device (the context's scheduling flag), from
/// `RDAQ_CUDA_SYNC`: each GPU worker waits for its frame, and many threads spinning on the
/// driver at once slow each other down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sync {
    /// The driver's choice (spin while there are fewer waiting threads than cores).
    Auto,
    Spin,
    Yield,
    /// Sleep until the device is done (the default).
    Blocking,
}

impl Sync {
    fn from_env() -> Result<Sync, GpuError> {
        match std::env::var("RDAQ_CUDA_SYNC").as_deref() {
            Err(_) | Ok("") | Ok("blocking") => Ok(Sync::Blocking),
            Ok("auto") => Ok(Sync::Auto),
            Ok("spin") => Ok(Sync::Spin),
            Ok("yield") => Ok(Sync::Yield),
            Ok(other) => Err(GpuError::Input(format!("RDAQ_CUDA_SYNC must be auto, spin, yield or blocking, not {other:?}"))),
        }
    }

    fn flags(self) -> cudarc::driver::sys::CUctx_flags {
        use cudarc::driver::sys::CUctx_flags::*;
        match self {
            Sync::Auto => CU_CTX_SCHED_AUTO,
            Sync::Spin => CU_CTX_SCHED_SPIN,
            Sync::Yield => CU_CTX_SCHED_YIELD,
            Sync::Blocking => CU_CTX_SCHED_BLOCKING_SYNC,
        }
    }
}
