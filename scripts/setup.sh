#!/usr/bin/env bash
# Installs what rdaq needs on a Debian 12 machine (root). Idempotent: every step checks
# before it installs.
#   scripts/setup.sh run    what `make run` needs: the build's apt packages, the Rust
#                           toolchain, the release build of the rdaq binary
#   scripts/setup.sh        everything (`make test`): also the tools the tests use, the
#                           project Python venv (.venv) with the rdaq package, cargo-deb,
#                           and the whole workspace built
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE="${1:-all}"
case "$PROFILE" in
  run|all) ;;
  *) echo "setup: unknown profile '$PROFILE' (run, or none for everything)" >&2; exit 2 ;;
esac

# what the build needs: HDF5 and ZeroMQ to link, clang and libbpf for the AF_XDP engine's
# XDP program (crates/net/bpf/steer.c, built by cargo)
RUN_PACKAGES=(libhdf5-dev pkg-config libzmq3-dev clang libbpf-dev)

# dials: the tests check that DIALS imports rdaq's files and finds its spots;
# hdf5-tools: h5dump and h5clear to look at files by hand (rdaq recover clears a killed
# writer's flags itself); iproute2: network namespaces; stress-ng: tests on a busy machine;
# tshark: the RoCEv2 test decodes the emulator's packets with Wireshark's dissector
# chromium, chromium-driver: the dashboard tests open the page in a real (headless) browser
# patchelf: the Debian package gives librdaq its soname with it;
# dpkg-dev, lintian, systemd, cmake: the Debian package is built (dpkg-shlibdeps), checked
# (lintian, systemd-analyze verify) and built against (CMake's find_package) in the tests
TEST_PACKAGES=(iproute2 python3-venv stress-ng dials hdf5-tools tshark chromium chromium-driver patchelf dpkg-dev lintian systemd cmake)
APT_PACKAGES=("${RUN_PACKAGES[@]}")
[ "$PROFILE" = all ] && APT_PACKAGES+=("${TEST_PACKAGES[@]}")
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing apt packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  # Debian 12's packaged rustc (1.63) is too old for the dependencies; rustup is the supported way.
  echo "setup: cargo not found, installing the Rust toolchain with rustup"
  curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
  export PATH="$HOME/.cargo/bin:$PATH"
fi

if [ "$PROFILE" = run ]; then
  echo "setup: building the rdaq binary (release)"
  cargo build --release -p rdaq --quiet
  exit 0
fi

# cargo-deb builds the Debian package (scripts/deb.sh, make deb)
if ! command -v cargo-deb >/dev/null 2>&1; then
  echo "setup: installing cargo-deb"
  cargo install --quiet --locked cargo-deb --version 3.8.0
fi

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import sys" 2>/dev/null; then
  echo "setup: creating the Python venv in .venv"
  python3 -m venv .venv
fi
if ! cmp -s tests/requirements.txt .venv/.requirements.installed 2>/dev/null; then
  echo "setup: installing Python test packages into .venv"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -r tests/requirements.txt
  cp tests/requirements.txt .venv/.requirements.installed
fi

echo "setup: building rdaq (release)"
cargo build --release --workspace --quiet
# the Python package `rdaq` (crates/py, PyO3) into the venv, as `maturin develop` installs
# it (a .pth naming crates/py/python, the extension module beside its Python files) but with
# the extension module the workspace build just made: maturin would compile every rdaq crate
# again with the extension's own feature set, minutes on 2 cores. `make wheel` makes a wheel
# for other environments (docs/api.md). The module is replaced, not overwritten in place:
# a running Python keeps the one it loaded.
echo "setup: installing the rdaq Python package into .venv"
cp --remove-destination target/release/lib_rdaq.so crates/py/python/rdaq/_rdaq.abi3.so
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD/crates/py/python" > "$site/rdaq.pth"
.venv/bin/python -c "import rdaq" || { echo "setup: the rdaq Python package does not import" >&2; exit 1; }
