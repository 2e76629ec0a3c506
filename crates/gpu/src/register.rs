//! Host memory registered with the driver (cuMemHostRegister): page-locked, so that copies
//! between it and the device run as DMA without a staging copy. The receiver's ring is
//! registered this way, so a frame goes from its slot to the device in one copy.

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use crate::error::GpuError;

/// A registered range of host memory; unregistered when dropped.
pub struct HostRegistration {
    ctx: Arc<CudaContext>,
    ptr: *mut std::ffi::c_void,
}

// SAFETY: the registration is a pointer the driver knows; unregistering it from another
// thread is allowed (the context is bound first), and nothing is read or written through it.
unsafe impl Send for HostRegistration {}
// SAFETY: as for Send: shared access only reads the address.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Registers `len` bytes from `ptr` (page-aligned ranges register whole; others cover
    /// the pages they touch).
    ///
    /// # Safety
    /// The memory stays mapped until this registration is dropped; no other registration
    /// overlaps it.
    pub unsafe fn new(ctx: &Arc<CudaContext>, ptr: *const u8, len: usize) -> Result<HostRegistration, GpuError> {
        if len == 0 {
            return Err(GpuError::Input("registering no memory".into()));
        }
        ctx.bind_to_thread()?;
        let p = ptr as *mut std::ffi::c_void;
        // SAFETY: the caller vouches that [ptr, ptr + len) is mapped and stays so while the
        // registration lives; flag 0 asks for page-locking only.
        unsafe { sys::cuMemHostRegister_v2(p, len, 0) }.result()?;
        Ok(HostRegistration { ctx: ctx.clone(), ptr: p })
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` was registered by `new` and is unregistered once, here.
            let _ = unsafe { sys::cuMemHostUnregister(self.ptr) };
        }
    }
}
