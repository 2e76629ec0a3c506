//! What the GPU tests share: the device, or a line saying why the test skips.

use rdaq_gpu::{probe, Device};

/// The GPU, or `None` after printing why there is none (the test then returns).
pub fn device() -> Option<Device> {
    probe().map_err(|e| eprintln!("skipped: {e}")).ok()
}
