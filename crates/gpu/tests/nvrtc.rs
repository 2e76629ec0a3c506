//! Every kernel compiled by NVRTC with the backend's own options, for NVRTC's default target
//! (what the stages load) and for the H100's (compute_90), with an entry for each of its
//! kernels: a compile error shows without a GPU. Needs an NVRTC only, a compiler library;
//! without one the test says why and returns (`tests/test_gpu.py` runs it with CUDA 12's
//! and CUDA 13's, from the `nvidia-cuda-nvrtc-cu12` and `nvidia-cuda-nvrtc` wheels, so
//! `make test` always compiles them with both).

use rdaq_gpu::kernels::{ptx, Kernels};

#[test]
fn every_kernel_compiles_with_the_backends_options() {
    match rdaq_gpu::probe::nvrtc() {
        Ok(n) => println!("nvrtc: {n:?}"),
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    }
    for k in Kernels::ALL {
        for arch in [None, Some("compute_90")] {
            let src = ptx(k, arch).unwrap_or_else(|e| panic!("{e}"));
            for entry in k.entries() {
                assert!(src.contains(&format!(".entry {entry}(")), "{}: no kernel {entry} in its PTX", k.file());
            }
            if arch.is_some() {
                assert!(src.contains(".target sm_90"), "{}: PTX not for sm_90", k.file());
            }
        }
        println!("compiled {}", k.file());
    }
}
