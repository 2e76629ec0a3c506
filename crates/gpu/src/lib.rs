//! The GPU backend of the processing stages (issue 13, in progress): CUDA through `cudarc`
//! with the driver and NVRTC loaded at run time, so that rdaq builds and every test passes on
//! machines without CUDA; kernels are CUDA C sources in `kernels/`, compiled at run time.
//!
//! - [`probe`]: whether this machine can run them, as a one-line answer, never a crash.
//! - [`kernels`]: the sources and their compilation with the options that keep results
//!   equal to the CPU's.
//! - [`convert`]: JUNGFRAU conversion to keV and photon counts, the CPU stage being the
//!   reference (bit-exact by construction: same operations, correctly rounded).
//! - [`pedestal`]: pedestal tracking on dark frames, equal to the CPU tracker (f64 sums).
//! - [`shuffle`]: the bitshuffle transposition, block by block as the chunk writer cuts.
//! - [`overlap`]: the three-stream transfer pipeline (first form: staging buffers, per-frame
//!   launches).
//! - [`csr`]: CSR compaction of sparse frames, so that only their entries leave the device.
//! - [`spots`]: the local-SNR strong-pixel test on the device, grouped into spots on the host
//!   by the CPU finder's own code.
//!
//! Status: written and built without a GPU; the kernels have not run on one yet. The tests
//! that compare them with the CPU stages skip on a machine without a GPU and say so.

pub mod convert;
pub mod csr;
pub mod kernels;
pub mod overlap;
pub mod pedestal;
pub mod probe;
pub mod shuffle;
pub mod spots;

pub use convert::GpuConverter;
pub use csr::GpuCsr;
pub use overlap::Overlapped;
pub use pedestal::GpuPedestal;
pub use shuffle::GpuShuffle;
pub use spots::GpuLocalSnr;
pub use probe::{probe, Device, GpuError};
