"""The portable bundle (make dist, scripts/dist.sh): unpacked outside the tree, its `rdaq`
needs no HDF5 or ZeroMQ of the system and no glibc newer than 2.28, says what the host can
run (`rdaq check`), and acquires into files that h5py reads."""
import re
import subprocess
import tarfile

import h5py
import hdf5plugin  # noqa: F401
import pytest

from conftest import ROOT, built

VERSION = re.search(r'^version = "(.*)"$', (ROOT / "Cargo.toml").read_text(), re.M).group(1)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    path = built("dist", timeout=1500)
    assert path.name == f"rdaq-{VERSION}-x86_64-linux.tar.gz", path
    out = tmp_path_factory.mktemp("bundle")
    with tarfile.open(path) as t:
        t.extractall(out, filter="data")
    return out / f"rdaq-{VERSION}-x86_64-linux"


def test_the_bundle_holds_the_binary_its_manual_and_the_gpu_check(bundle):
    for f in ["rdaq", "man/rdaq.1", "man/rdaq-check.1", "bench/gpu_device.sh", "bench/gpu_files_equal.py", "README.md"]:
        assert (bundle / f).is_file(), f
    out = subprocess.run([bundle / "rdaq", "--version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith(f"rdaq {VERSION} ("), out


def test_the_binary_needs_only_glibc_2_28(bundle):
    libs = subprocess.run(["ldd", bundle / "rdaq"], capture_output=True, text=True, check=True).stdout
    assert "not found" not in libs, libs
    for lib in ("hdf5", "zmq", "curl", "stdc++", "sz"):
        assert lib not in libs, f"{lib} is linked dynamically:\n{libs}"
    symbols = subprocess.run(["objdump", "-T", bundle / "rdaq"], capture_output=True, text=True, check=True).stdout
    versions = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_([0-9.]+)\b", symbols)}
    assert versions and max(versions) <= (2, 28), sorted(versions)[-3:]


def test_the_bundle_checks_this_host_and_acquires(bundle, tmp_path):
    r = subprocess.run([bundle / "rdaq", "check"], capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 3), r.stdout + r.stderr
    xdp = next(line for line in r.stdout.splitlines() if line.startswith("AF_XDP engine"))
    assert "not built" not in xdp, "the bundle has the AF_XDP engine's program: " + xdp
    r = subprocess.run([bundle / "rdaq", "run", "--frames", "20", "--out", tmp_path, "--stream", "none", "--preview", "none"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    with h5py.File(tmp_path / "rdaq_run_master.h5", "r") as f:
        data = f["entry/data/data"]
        assert data.shape[0] > 0 and data[0].any()
