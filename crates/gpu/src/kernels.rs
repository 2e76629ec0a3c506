//! The kernel sources (CUDA C in `kernels/`, compiled into the binary as text) and their
//! compilation at run time by NVRTC, with the options that keep results equal to the CPU's.

use std::sync::Arc;

use cudarc::driver::CudaModule;
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use crate::probe::{Device, GpuError};

/// A kernel source file.
#[derive(Clone, Copy, Debug)]
pub enum Kernels {
    Convert,
    Pedestal,
    Bitshuffle,
    Spots,
    Csr,
}

impl Kernels {
    fn file(self) -> &'static str {
        match self {
            Kernels::Convert => "kernels/convert.cu",
            Kernels::Pedestal => "kernels/pedestal.cu",
            Kernels::Bitshuffle => "kernels/bitshuffle.cu",
            Kernels::Spots => "kernels/spots.cu",
            Kernels::Csr => "kernels/csr.cu",
        }
    }

    fn source(self) -> &'static str {
        match self {
            Kernels::Convert => include_str!("../kernels/convert.cu"),
            Kernels::Pedestal => include_str!("../kernels/pedestal.cu"),
            Kernels::Bitshuffle => include_str!("../kernels/bitshuffle.cu"),
            Kernels::Spots => include_str!("../kernels/spots.cu"),
            Kernels::Csr => include_str!("../kernels/csr.cu"),
        }
    }
}

/// NVRTC's options for results equal to the CPU's: no contraction into fused multiply-adds,
/// IEEE division and square root, no flush of subnormals to zero, no fast math (the kernels
/// also spell the rounding out with intrinsics).
pub fn exact_options() -> CompileOptions {
    CompileOptions { fmad: Some(false), prec_div: Some(true), prec_sqrt: Some(true), ftz: Some(false), use_fast_math: Some(false), ..Default::default() }
}

/// Compiles `k` for the device and loads it.
pub fn compile(dev: &Device, k: Kernels) -> Result<Arc<CudaModule>, GpuError> {
    let ptx = compile_ptx_with_opts(k.source(), exact_options()).map_err(|e| GpuError::Compile { file: k.file(), message: e.to_string() })?;
    Ok(dev.ctx.load_module(ptx)?)
}
