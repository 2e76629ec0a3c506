//! The bitshuffle transposition on the GPU (`kernels/bitshuffle.cu`), block by block as the
//! CPU's chunk writer cuts the image, so that only the transposed planes (and after LZ4 or
//! Zstd, the compressed chunk) need to leave the device.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, PushKernelArg};

use crate::kernels::{compile, threads_for, Kernels};
use crate::probe::{Device, GpuError};

pub struct GpuShuffle {
    stream: Arc<CudaStream>,
    kernel: CudaFunction,
}

impl GpuShuffle {
    pub fn new(dev: &Device) -> Result<GpuShuffle, GpuError> {
        let module = compile(dev, Kernels::Bitshuffle)?;
        Ok(GpuShuffle { stream: dev.ctx.default_stream(), kernel: module.load_function("bitshuffle_blocks")? })
    }

    /// `data` (elements of `size` bytes) transposed in blocks of `block` elements (a multiple
    /// of 8): each block's whole groups of 8 transposed, the last `n % 8` elements as they are.
    pub fn shuffle(&self, data: &[u8], size: usize, block: usize) -> Result<Vec<u8>, GpuError> {
        let d_src = self.stream.clone_htod(data)?;
        let mut d_dst = self.stream.alloc_zeros::<u8>(data.len())?;
        self.launch(&d_src, &mut d_dst, size, block)?;
        Ok(self.stream.clone_dtoh(&d_dst)?)
    }

    /// The transposition of device bytes `src` into `dst` (as long), queued on the stream.
    pub fn launch(&self, src: &CudaSlice<u8>, dst: &mut CudaSlice<u8>, size: usize, block: usize) -> Result<(), GpuError> {
        if size == 0 || !src.len().is_multiple_of(size) || block == 0 || !block.is_multiple_of(8) || dst.len() != src.len() {
            return Err(GpuError::Input(format!("{} bytes of {size}-byte elements in blocks of {block} (a multiple of 8) into {}", src.len(), dst.len())));
        }
        let n = src.len() / size;
        let (n32, size32, block32) = (to_i32(n)?, to_i32(size)?, to_i32(block)?);
        let threads = (n / 8) * size + (n % 8) * size;
        let mut b = self.stream.launch_builder(&self.kernel);
        b.arg(src).arg(dst).arg(&n32).arg(&size32).arg(&block32);
        // SAFETY: src and dst hold n * size bytes on the device; each of the `threads`
        // threads writes inside dst (a group's 8 output bytes within its block's rows, or one
        // tail byte), and the parameters are pushed in the kernel's order.
        unsafe { b.launch(threads_for(to_i32(threads.max(1))? as usize)) }?;
        Ok(())
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

fn to_i32(x: usize) -> Result<i32, GpuError> {
    i32::try_from(x).map_err(|_| GpuError::Input(format!("{x} is more than one launch takes")))
}
