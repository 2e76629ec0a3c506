#!/usr/bin/env bash
# Builds the Python package as one wheel (make wheel): CPython 3.11 and later (abi3), any
# Linux with glibc 2.28 or later (manylinux_2_28: RHEL 8, Debian 10, Ubuntu 20.04 and newer):
# target/wheels/rdaq-<version>-cp311-abi3-manylinux_2_28_x86_64.whl.
# zig (the ziglang package) links it against glibc 2.28's symbols; HDF5 is built from its
# source and linked in (feature static-hdf5, which needs CMake 3.26: the venv's), as ZeroMQ
# already is. Its own target directory keeps these builds apart from the workspace's.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
export PATH="$PWD/.venv/bin:$PATH"

rm -f target/wheels/rdaq-*.whl
CARGO_TARGET_DIR=target/wheel CARGO_PROFILE_RELEASE_DEBUG=0 \
  maturin build --release --strip --quiet --zig --compatibility manylinux_2_28 \
  --features static-hdf5 -m crates/py/Cargo.toml -o target/wheels
ls target/wheels/rdaq-*.whl
