//! Compiles the data files' HDF5 driver (csrc/deferred_vfd.c) against the headers of the HDF5
//! that hdf5-sys links: the driver table's layout differs between HDF5 versions.
fn main() {
    let include = std::env::var("DEP_HDF5_INCLUDE")
        .expect("hdf5-sys names the HDF5 headers it was built against");
    println!("cargo::rerun-if-changed=csrc/deferred_vfd.c");
    cc::Build::new()
        .file("csrc/deferred_vfd.c")
        .include(include)
        .warnings(true)
        .extra_warnings(true)
        .flag_if_supported("-Werror=implicit-function-declaration")
        .compile("rdaq_deferred_vfd");
}
