#!/usr/bin/env bash
# Builds the portable bundle (make dist): target/dist/rdaq-<version>-x86_64-linux.tar.gz, the
# `rdaq` binary for any x86-64 Linux with glibc 2.28 or later, with HDF5 and ZeroMQ linked in
# (no system HDF5 or ZeroMQ needed), its manual pages, and the GPU check (bench/gpu_device.sh,
# bench/gpu_files_equal.py): copy it to a host, unpack, and run `./rdaq check` there.
# The binary is built as the wheel is (scripts/wheel.sh), by maturin with zig against glibc
# 2.28's symbols and HDF5 built from its source (feature static-hdf5), in the wheel's target
# directory, which the two builds share (HDF5 is built once); maturin packs a binary crate
# as a wheel, from which it is taken.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
export PATH="$PWD/.venv/bin:$PATH"

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
name="rdaq-$version-x86_64-linux"
rm -rf target/dist && mkdir -p target/dist
CARGO_TARGET_DIR=target/wheel CARGO_PROFILE_RELEASE_DEBUG=0 \
  maturin build --release --strip --quiet --zig --compatibility manylinux_2_28 \
  --bindings bin --features static-hdf5 -m crates/rdaq/Cargo.toml -o target/dist/wheel
stage="target/dist/$name"
mkdir -p "$stage/man" "$stage/bench"
unzip -q -j -d "$stage" target/dist/wheel/rdaq-"$version"-*.whl "rdaq-$version.data/scripts/rdaq"
chmod +x "$stage/rdaq"
"$stage/rdaq" manpages "$stage/man"
cp bench/gpu_device.sh bench/gpu_files_equal.py "$stage/bench/"
cp README.md CHANGELOG.md "$stage/"
rm -rf target/dist/wheel
tar czf "target/dist/$name.tar.gz" -C target/dist "$name"
echo "target/dist/$name.tar.gz"
