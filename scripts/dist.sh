#!/usr/bin/env bash
# Builds the portable bundle (make dist): target/dist/rdaq-<version>-x86_64-linux.tar.gz, the
# `rdaq` binary for any x86-64 Linux with glibc 2.28 or later, with HDF5 and ZeroMQ linked in
# (no system HDF5 or ZeroMQ needed), its manual pages, and the GPU check (bench/gpu_device.sh,
# bench/gpu_files_equal.py): copy it to a host, unpack, and run `./rdaq check` there.
# zig (the ziglang package in the venv) links against glibc 2.28's symbols through
# cargo-zigbuild; HDF5 is built from its source (feature static-hdf5). Its own target
# directory keeps these builds apart from the workspace's.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
export PATH="$PWD/.venv/bin:$PATH"

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
triple=x86_64-unknown-linux-gnu
name="rdaq-$version-x86_64-linux"
export CARGO_TARGET_DIR=target/dist-build CARGO_PROFILE_RELEASE_DEBUG=0
# the ziglang package's zig, as cargo-zigbuild runs it
export CARGO_ZIGBUILD_ZIG_PATH="$PWD/.venv/bin/python -m ziglang"
cargo zigbuild --release --quiet --target "$triple.2.28" -p rdaq --features static-hdf5
stage="target/dist/$name"
rm -rf "$stage" && mkdir -p "$stage/man" "$stage/bench"
cp "target/dist-build/$triple/release/rdaq" "$stage/rdaq"
strip "$stage/rdaq"
"$stage/rdaq" manpages "$stage/man"
cp bench/gpu_device.sh bench/gpu_files_equal.py "$stage/bench/"
cp README.md CHANGELOG.md "$stage/"
tar czf "target/dist/$name.tar.gz" -C target/dist "$name"
echo "target/dist/$name.tar.gz"
