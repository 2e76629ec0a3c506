//! Compiles the XDP steering program (bpf/steer.c) with clang when clang and the libbpf
//! headers are present (scripts/setup.sh installs both). Without them rdaq still builds; the
//! AF_XDP engine then says at start that the program was not built.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=bpf/steer.c");
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rustc-check-cfg=cfg(rdaq_xdp_program)");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("steer.o");
    let arch_include = format!("/usr/include/{}-linux-gnu", std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default());
    let candidates = std::env::var("CLANG").map(|c| vec![c]).unwrap_or_else(|_| vec!["clang".into(), "clang-15".into(), "clang-16".into(), "clang-14".into()]);
    for clang in candidates {
        let status = Command::new(&clang)
            .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
            .arg(format!("-I{arch_include}"))
            .args(["-c", "bpf/steer.c", "-o"])
            .arg(&out)
            .status();
        match status {
            Ok(s) if s.success() => {
                println!("cargo:rustc-cfg=rdaq_xdp_program");
                return;
            }
            Ok(_) => {
                println!("cargo:warning={clang} could not compile bpf/steer.c (libbpf-dev missing?): the AF_XDP engine is unavailable");
                return;
            }
            Err(_) => continue,
        }
    }
    println!("cargo:warning=no clang found: the AF_XDP engine's XDP program is not built (install clang and libbpf-dev)");
}
