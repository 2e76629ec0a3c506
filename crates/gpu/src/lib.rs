//! The GPU backend of the processing stages: CUDA through `cudarc` with the driver loaded at
//! run time and NVRTC loaded by [`nvrtc`], so that rdaq builds and every test passes on
//! machines without CUDA, and CUDA 12 and 13 serve alike; kernels are CUDA C sources in
//! `kernels/`, compiled at run time.
//!
//! - [`probe`]: whether this machine can run them, as a one-line answer, never a crash
//!   ([`error`]: why not, or why a stage failed).
//! - [`nvrtc`]: the compiler library, chosen by version against the driver.
//! - [`kernels`]: the sources and their compilation with the options that keep results
//!   equal to the CPU's.
//! - [`chain`]: the graph's GPU path, built for throughput: frames copied from the
//!   (registered) receiver slots, assembled, converted and searched for strong pixels in
//!   several lanes at once; only the strong pixels come back, and the image where it is kept.
//! - [`standin`]: the lanes done on the CPU, for testing the graph's GPU path anywhere.
//! - [`selfcheck`]: every kernel against its CPU stage, as `rdaq check` runs them.
//! - [`register`]: host memory page-locked for the driver (the receiver's ring).
//! - [`convert`]: JUNGFRAU conversion to keV and photon counts, the CPU stage being the
//!   reference (bit-exact by construction: same operations, correctly rounded).
//! - [`pedestal`]: pedestal tracking on dark frames, equal to the CPU tracker (f64 sums).
//! - [`shuffle`]: the bitshuffle transposition, block by block as the chunk writer cuts.
//! - [`csr`]: CSR compaction of sparse frames, so that only their entries leave the device.
//! - [`spots`]: the local-SNR strong-pixel test on the device, grouped into spots on the host
//!   by the CPU finder's own code.
//!
//! The tests that compare the kernels with the CPU stages skip on a machine without a GPU
//! and say so; `rdaq check` runs the same comparisons on any host.

pub mod chain;
pub mod convert;
pub mod csr;
pub mod error;
pub mod kernels;
pub mod nvrtc;
pub mod pedestal;
pub mod probe;
pub mod register;
pub mod selfcheck;
pub mod shuffle;
pub mod spots;
pub mod standin;

pub use chain::{ChainSetup, Counts, FrameLane, Found, Lane};
pub use convert::GpuConverter;
pub use csr::GpuCsr;
pub use pedestal::{DevicePedestal, GpuPedestal};
pub use error::GpuError;
pub use probe::{probe, Device};
pub use register::HostRegistration;
pub use shuffle::GpuShuffle;
pub use spots::GpuLocalSnr;
