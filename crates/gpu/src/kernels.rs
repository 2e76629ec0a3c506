//! The kernel sources (CUDA C in `kernels/`, compiled into the binary as text) and their
//! compilation at run time by NVRTC, with the options that keep results equal to the CPU's.

use std::sync::Arc;

use cudarc::driver::{CudaModule, LaunchConfig};
use cudarc::nvrtc::Ptx;

use crate::nvrtc::Nvrtc;
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
            Kernels::Convert => &["jf_convert_kev", "kev_to_photons_i32", "kev_to_photons_i16", "assemble_words", "jf_assemble_kev"],
            Kernels::Pedestal => &["pedestal_push", "pedestal_mean"],
            Kernels::Bitshuffle => &["bitshuffle_blocks"],
            Kernels::Spots => &["colsum_running", "strong_pixels", "strong_flags", "row_offsets", "strong_compact"],
            Kernels::Csr => &["csr_count_f32", "csr_fill_f32", "csr_count_i32", "csr_fill_i32"],
        }
    }
}

/// NVRTC's options for results equal to the CPU's: no contraction into fused multiply-adds,
/// IEEE division and square root, no flush of subnormals to zero, no fast math (the kernels
/// also spell the rounding out with intrinsics).
pub const EXACT_OPTIONS: [&str; 4] = ["--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false"];

/// `k` compiled to PTX text with [`EXACT_OPTIONS`] by `nvrtc`, for `arch` (e.g. "compute_90";
/// `None`: NVRTC's default, which the driver compiles further for its device). Needs NVRTC
/// only, no GPU.
pub fn ptx_with(nvrtc: &Nvrtc, k: Kernels, arch: Option<&str>) -> Result<String, GpuError> {
    let mut opts: Vec<String> = EXACT_OPTIONS.iter().map(|o| o.to_string()).collect();
    opts.extend(arch.map(|a| format!("--gpu-architecture={a}")));
    nvrtc.compile(k.source(), k.file(), &opts).map_err(|message| GpuError::Compile { file: k.file(), message })
}

/// [`ptx_with`] the NVRTC this process loads.
pub fn ptx(k: Kernels, arch: Option<&str>) -> Result<String, GpuError> {
    ptx_with(crate::nvrtc::load(None)?, k, arch)
}

/// Compiles `k` with the NVRTC the probe chose, for NVRTC's default target (the driver
/// compiles the PTX further for its device when it loads it), and loads it.
pub fn compile(dev: &Device, k: Kernels) -> Result<Arc<CudaModule>, GpuError> {
    Ok(dev.ctx.load_module(Ptx::from_src(ptx_with(dev.nvrtc, k, None)?))?)
}

/// Checks a pixel map for an image of `pixels` pixels from frames of `words` module words:
/// one entry a pixel, each -1 (a gap) or a word of the frame, as the assembling kernels need.
pub(crate) fn check_pixel_map(src_of: &[i32], pixels: usize, words: usize) -> Result<(), GpuError> {
    if src_of.len() != pixels || src_of.iter().any(|&i| i >= 0 && i as usize >= words) {
        return Err(GpuError::Input(format!("a pixel map of {} entries for {pixels} pixels, each below {words} words", src_of.len())));
    }
    Ok(())
}

/// One thread per element (pixel, row, byte group), in blocks of 256: few enough threads
/// per block for any kernel's registers.
pub(crate) fn threads_for(n: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: ((n as u32).div_ceil(256), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// One thread per column, one warp per block: the column sums are a chain of dependent
/// additions per thread, so their few warps are spread over as many multiprocessors as
/// there are (1024-thread blocks would put a 4M image's 2,068 columns on 3 of 132).
pub(crate) fn per_column(width: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (width.div_ceil(32), 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 }
}
