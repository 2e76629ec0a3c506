//! Why the GPU backend cannot run, or a stage on it failed: each says what to do about it.

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no CUDA driver on this machine (neither {0} nor libcuda.so could be loaded): it has no usable GPU; use the cpu backend")]
    NoDriver(&'static str),
    #[error("no NVRTC on this machine ({0}): the GPU kernels are compiled at run time and need CUDA 12's or 13's libnvrtc (set RDAQ_NVRTC to its path if it is elsewhere)")]
    NoNvrtc(String),
    /// PTX from an NVRTC newer than the driver does not load.
    #[error("the NVRTC found, {nvrtc}, is newer than the driver's CUDA {driver}: its kernels would not load; put an NVRTC of CUDA {driver} or older first (LD_LIBRARY_PATH or RDAQ_NVRTC), or update the driver")]
    NvrtcTooNew { nvrtc: String, driver: String },
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("no CUDA device on this machine")]
    NoDevice,
    #[error("compiling the kernels of {file}: {message}")]
    Compile { file: &'static str, message: String },
    #[error("{0}")]
    Input(String),
}
