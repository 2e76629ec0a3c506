//! The kernel sources (CUDA C in `kernels/`, compiled into the binary as text) and their
//! compilation at run time by NVRTC, with the options that keep results equal to the CPU's.

use std::sync::Arc;

use cudarc::driver::CudaModule;
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

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
    pub const ALL: [Kernels; 5] = [Kernels::Convert, Kernels::Pedestal, Kernels::Bitshuffle, Kernels::Spots, Kernels::Csr];

    pub fn file(self) -> &'static str {
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

    /// The kernels the file defines (its `extern "C" __global__` functions).
    pub fn entries(self) -> &'static [&'static str] {
        match self {
            Kernels::Convert => &["jf_convert_kev", "kev_to_photons_i32", "kev_to_photons_i16"],
            Kernels::Pedestal => &["pedestal_push", "pedestal_mean"],
            Kernels::Bitshuffle => &["bitshuffle_blocks"],
            Kernels::Spots => &["colsum_running", "strong_pixels"],
            Kernels::Csr => &["csr_count_f32", "csr_fill_f32", "csr_count_i32", "csr_fill_i32"],
        }
    }
}

/// NVRTC's options for results equal to the CPU's: no contraction into fused multiply-adds,
/// IEEE division and square root, no flush of subnormals to zero, no fast math (the kernels
/// also spell the rounding out with intrinsics).
pub fn exact_options() -> CompileOptions {
    CompileOptions { fmad: Some(false), prec_div: Some(true), prec_sqrt: Some(true), ftz: Some(false), use_fast_math: Some(false), ..Default::default() }
}

/// `k` compiled to PTX with [`exact_options`], for `arch` (e.g. "compute_90"; `None`:
/// NVRTC's default, which the stages use and the driver compiles further for its device).
/// Needs NVRTC only, no GPU.
pub fn ptx(k: Kernels, arch: Option<&'static str>) -> Result<Ptx, GpuError> {
    let opts = CompileOptions { arch, ..exact_options() };
    compile_ptx_with_opts(k.source(), opts).map_err(|e| GpuError::Compile { file: k.file(), message: e.to_string() })
}

/// Compiles `k` for the device and loads it.
pub fn compile(dev: &Device, k: Kernels) -> Result<Arc<CudaModule>, GpuError> {
    Ok(dev.ctx.load_module(ptx(k, None)?)?)
}
