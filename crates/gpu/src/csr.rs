//! CSR compaction on the GPU (`kernels/csr.cu`): the pixels above a threshold of a frame on
//! the device, in the layout of [`rdaq_process::sparse::Csr`], so that a sparse frame leaves
//! the device as its few entries. Two launches with the row offsets formed on the host in
//! between (a few KB per frame).

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DeviceRepr, PushKernelArg, ValidAsZeroBits};
use rdaq_process::sparse::Csr;

use crate::kernels::{compile, threads_for, Kernels};
use crate::probe::{Device, GpuError};

/// The element types the kernels are built for.
pub trait CsrValue: DeviceRepr + ValidAsZeroBits + Copy + PartialOrd + Default + Unpin {
    const NAME: &'static str;
}
impl CsrValue for f32 {
    const NAME: &'static str = "f32";
}
impl CsrValue for i32 {
    const NAME: &'static str = "i32";
}

pub struct GpuCsr {
    stream: Arc<CudaStream>,
    module: Arc<cudarc::driver::CudaModule>,
}

impl GpuCsr {
    pub fn new(dev: &Device) -> Result<GpuCsr, GpuError> {
        Ok(GpuCsr { stream: dev.ctx.default_stream(), module: compile(dev, Kernels::Csr)? })
    }

    /// The entries of the device image `image` (`rows x cols`) strictly above `threshold`.
    pub fn fill<T: CsrValue>(&self, image: &CudaSlice<T>, rows: usize, cols: usize, threshold: T, out: &mut Csr<T>) -> Result<(), GpuError> {
        if image.len() != rows * cols || image.len() > u32::MAX as usize || rows == 0 {
            return Err(GpuError::Input(format!("an image of {} values for {rows} x {cols}", image.len())));
        }
        let (r32, c32) = (rows as i32, i32::try_from(cols).map_err(|_| GpuError::Input(format!("{cols} columns")))?);
        let count: CudaFunction = self.module.load_function(&format!("csr_count_{}", T::NAME))?;
        let fill: CudaFunction = self.module.load_function(&format!("csr_fill_{}", T::NAME))?;
        let mut counts = self.stream.alloc_zeros::<u32>(rows)?;
        let mut b = self.stream.launch_builder(&count);
        b.arg(image).arg(&r32).arg(&c32).arg(&threshold).arg(&mut counts);
        // SAFETY: image holds rows x cols values and counts holds rows entries on the device;
        // thread r reads row r and writes counts[r] only; parameters in the kernel's order.
        unsafe { b.launch(threads_for(rows)) }?;
        let counts = self.stream.clone_dtoh(&counts)?;
        out.rows = rows;
        out.cols_total = cols;
        out.row_ptr.clear();
        out.row_ptr.push(0);
        let mut total = 0u32;
        for c in counts {
            total += c;
            out.row_ptr.push(total);
        }
        let nnz = total as usize;
        out.values.clear();
        out.values.resize(nnz, T::default());
        out.cols.clear();
        out.cols.resize(nnz, 0);
        if nnz == 0 {
            return Ok(());
        }
        let d_ptr = self.stream.clone_htod(&out.row_ptr)?;
        let mut values = self.stream.alloc_zeros::<T>(nnz)?;
        let mut col_of = self.stream.alloc_zeros::<u32>(nnz)?;
        let mut b = self.stream.launch_builder(&fill);
        b.arg(image).arg(&r32).arg(&c32).arg(&threshold).arg(&d_ptr).arg(&mut values).arg(&mut col_of);
        // SAFETY: row_ptr holds rows + 1 offsets whose last is nnz, the sizes of values and
        // col_of; thread r writes entries row_ptr[r]..row_ptr[r + 1] only, which its count
        // pass found; parameters in the kernel's order.
        unsafe { b.launch(threads_for(rows)) }?;
        self.stream.memcpy_dtoh(&values, &mut out.values)?;
        self.stream.memcpy_dtoh(&col_of, &mut out.cols)?;
        Ok(())
    }

    /// `fill` for an image in host memory (copied to the device first).
    pub fn fill_host<T: CsrValue>(&self, image: &[T], rows: usize, cols: usize, threshold: T, out: &mut Csr<T>) -> Result<(), GpuError> {
        let d = self.stream.clone_htod(image)?;
        self.fill(&d, rows, cols, threshold, out)
    }
}
