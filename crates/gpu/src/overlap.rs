//! The overlapped transfer pipeline, first form: three streams (copy in, compute, copy out)
//! and two buffers of each kind, so that frame k+1 is copied to the device while frame k is
//! converted and frame k-1 comes back. `cudarc` records an event on every buffer a stream
//! writes and makes the next stream that uses it wait, which orders the three streams
//! without a host wait; the host waits only for the frame two steps back.
//!
//! What it is not yet (issue 13): frames are copied from the receiver's slot into pinned
//! staging buffers (write-combined, as `cudarc` allocates them) instead of registering the
//! ring itself with cuMemHostRegister; results come back into ordinary host memory (a
//! synchronous copy for the host); kernels are launched per frame, not pre-launched behind
//! a stream flag. Not yet run on a GPU.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, PinnedHostSlice};

use crate::convert::GpuConverter;
use crate::probe::{Device, GpuError};

/// Conversion of a stream of frames with the transfers overlapped.
pub struct Overlapped {
    conv: GpuConverter,
    copy_in: Arc<CudaStream>,
    compute: Arc<CudaStream>,
    copy_out: Arc<CudaStream>,
    staging: [PinnedHostSlice<u16>; 2],
    raw: [CudaSlice<u16>; 2],
    kev: [CudaSlice<f32>; 2],
    /// Frames queued and not yet handed back, oldest first: (buffer, tag).
    queued: std::collections::VecDeque<(usize, u64)>,
    next: usize,
}

impl Overlapped {
    pub fn new(dev: &Device, conv: GpuConverter, pixels: usize) -> Result<Overlapped, GpuError> {
        let ctx = &dev.ctx;
        let stage = || -> Result<PinnedHostSlice<u16>, GpuError> {
            // SAFETY: the staging buffer is written whole (a frame's words) before each copy
            // that reads it, so its unset initial contents are never read.
            Ok(unsafe { ctx.alloc_pinned::<u16>(pixels) }?)
        };
        let s = ctx.default_stream();
        Ok(Overlapped {
            conv,
            copy_in: ctx.new_stream()?,
            compute: ctx.new_stream()?,
            copy_out: ctx.new_stream()?,
            staging: [stage()?, stage()?],
            raw: [s.alloc_zeros(pixels)?, s.alloc_zeros(pixels)?],
            kev: [s.alloc_zeros(pixels)?, s.alloc_zeros(pixels)?],
            queued: Default::default(),
            next: 0,
        })
    }

    /// Queues frame `raw` (tagged `tag`); when both buffers are busy, first hands back the
    /// oldest frame's keV into `out` and returns its tag.
    pub fn submit(&mut self, raw: &[u16], tag: u64, out: &mut [f32]) -> Result<Option<u64>, GpuError> {
        let done = if self.queued.len() == 2 { self.finish_oldest(out)? } else { None };
        let b = self.next;
        self.next ^= 1;
        let staging = self.staging[b].as_mut_slice()?;
        if raw.len() != staging.len() {
            return Err(GpuError::Input(format!("a frame of {} pixels for buffers of {}", raw.len(), staging.len())));
        }
        staging.copy_from_slice(raw);
        self.copy_in.memcpy_htod(&self.staging[b], &mut self.raw[b])?;
        self.conv.launch_kev(&self.compute, &self.raw[b], &mut self.kev[b])?;
        self.queued.push_back((b, tag));
        Ok(done)
    }

    /// Hands back the oldest queued frame's keV into `out`; `None` when nothing is queued.
    pub fn finish_oldest(&mut self, out: &mut [f32]) -> Result<Option<u64>, GpuError> {
        let Some((b, tag)) = self.queued.pop_front() else { return Ok(None) };
        self.copy_out.memcpy_dtoh(&self.kev[b], out)?;
        self.copy_out.synchronize()?;
        Ok(Some(tag))
    }
}
