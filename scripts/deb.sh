#!/usr/bin/env bash
# Builds the Debian package (make deb): target/debian/rdaq_<version>-1_amd64.deb, with the rdaq
# binary and its manual pages, librdaq (shared, static, header, pkg-config file, CMake
# package), the systemd units and /etc/rdaq. The files cargo-deb packs (crates/rdaq/Cargo.toml,
# [package.metadata.deb]) are staged first in target/release/deb: stripped, librdaq given its
# soname, the pkg-config and CMake files given the version. Built in CARGO_TARGET_DIR (default
# target), which cargo-deb maps the assets' target/release/ paths to.
#   scripts/deb.sh --no-build   packs what is already built there (the test suite's, built by
#                               scripts/setup.sh and cargo test), so that no build replaces
#                               the binaries under running tests
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

case "${1:-}" in
  "") build=1 ;;
  --no-build) build=0 ;;
  *) echo "deb: unknown argument '$1' (--no-build, or none)" >&2; exit 2 ;;
esac
command -v cargo-deb >/dev/null 2>&1 || { echo "deb: cargo-deb is missing: run scripts/setup.sh" >&2; exit 1; }
[ "$build" = 1 ] && cargo build --release --quiet -p rdaq -p rdaq-capi
release="${CARGO_TARGET_DIR:-target}/release"
for f in rdaq librdaq.so librdaq.a; do
  [ -f "$release/$f" ] || { echo "deb: $release/$f is missing: build it first (scripts/deb.sh without --no-build)" >&2; exit 1; }
done

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
# before 1.0 a minor version may change the ABI: the soname carries major.minor
abi=${version%.*}
stage="$release/deb"
rm -rf "$stage" target/debian/rdaq_*.deb
mkdir -p "$stage"
strip --strip-unneeded -o "$stage/rdaq" "$release/rdaq"
strip --strip-unneeded -o "$stage/librdaq.so.$version" "$release/librdaq.so"
patchelf --set-soname "librdaq.so.$abi" "$stage/librdaq.so.$version"
ln -s "librdaq.so.$version" "$stage/librdaq.so.$abi"
ln -s "librdaq.so.$abi" "$stage/librdaq.so"
strip --strip-debug -o "$stage/librdaq.a" "$release/librdaq.a"
# what a static link of librdaq also needs (the Rust runtime's and HDF5's libraries), for the
# pkg-config file and the CMake package alike
static_libs="hdf5_serial stdc++ gcc_s util rt pthread dl m"
pc_libs=$(printf -- "-l%s " $static_libs)
cmake_libs=$(echo $static_libs | tr ' ' ';')
for f in rdaq.pc rdaqConfig.cmake rdaqConfigVersion.cmake; do
  sed -e "s/@VERSION@/$version/g" -e "s/@ABI@/$abi/g" -e "s/@STATIC_LIBS_PC@/${pc_libs% }/g" \
    -e "s/@STATIC_LIBS_CMAKE@/$cmake_libs/g" "packaging/lib/$f.in" > "$stage/$f"
done
gzip -9n -c CHANGELOG.md > "$stage/changelog.gz"
mkdir "$stage/man"
"$release/rdaq" manpages "$stage/man"
gzip -9n "$stage"/man/*.1

deb=$(cargo deb --no-build --no-strip --fast --quiet -p rdaq -o target/debian/)
# cargo-deb writes no shlibs file; lintian (and dpkg-shlibdeps of programs linking librdaq)
# need one: the package is repacked with it
pkg="$stage/pkg"
dpkg-deb -R "$deb" "$pkg"
echo "librdaq $abi rdaq (>= $version)" > "$pkg/DEBIAN/shlibs"
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" >/dev/null
rm -rf "$pkg"
echo "$deb"
