"""Nothing is lost or overwritten silently: `rdaq run` numbers a run whose files exist (or
replaces them with --overwrite), and a full disk stops writing cleanly, with the file valid
and readable up to the last frame written, the cause named, the summary printed and exit 1."""
import json
import os
import subprocess

import h5py
import hdf5plugin  # noqa: F401
import pytest

from conftest import frames_in, manifest


def run(rdaq, out, *args, timeout=120):
    return subprocess.run([str(rdaq), "run", "--raw", "--out", str(out), *args], capture_output=True, text=True, timeout=timeout)


def test_a_second_run_is_numbered_and_the_first_is_kept(rdaq, tmp_path):
    out = tmp_path / "out"
    r = run(rdaq, out, "--frames", "5")
    assert r.returncode == 0, r.stdout + r.stderr
    first = (out / "rdaq_run_master.h5").read_bytes()
    r = run(rdaq, out, "--frames", "5")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "this run is rdaq_run_000002" in r.stderr
    assert (out / "rdaq_run_master.h5").read_bytes() == first, "the earlier run's file is untouched"
    assert sorted(frames_in(out / "rdaq_run_000002_master.h5")) == list(range(5))
    assert (out / "rdaq_run_000002_manifest.csv").exists()
    r = run(rdaq, out, "--frames", "3", "--overwrite")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(frames_in(out / "rdaq_run_master.h5")) == list(range(3)), "--overwrite replaces"
    assert not (out / "rdaq_run_000003_master.h5").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 30 MB tmpfs (root only), removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "disk"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=30m", "tmpfs", str(d)], check=True)
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


def test_a_full_disk_keeps_what_was_written(rdaq, small_disk, tmp_path):
    summary = tmp_path / "summary.json"
    r = run(rdaq, small_disk, "--frames", "200", "--summary-json", str(summary))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "warning:" in r.stderr and "may write up to" in r.stderr, "the free space was checked at the start"
    h5 = small_disk / "rdaq_run_master.h5"
    assert "No space left on device" in r.stderr and str(small_disk / "rdaq_run_data_000001.h5") in r.stderr
    assert "---- rdaq summary ----" in r.stdout and "received but not saved" in r.stdout
    s = json.loads(summary.read_text())
    assert s["frames_complete"] == 200, "every frame was received"
    assert 0 < s["frames_written"] < 200
    assert s["frames_written"] + s["frames_not_saved"] == 200
    assert "No space left on device" in s["write_error"]
    # the file opens, and holds exactly the frames written, bit-exact
    frames = frames_in(h5)
    assert sorted(frames) == list(range(s["frames_written"]))
    man = manifest(small_disk / "rdaq_run_manifest.csv")
    for frame, hashes in frames.items():
        assert hashes == [man[(frame, m)] for m in range(2)], f"frame {frame}"
    with h5py.File(h5, "r") as f:
        assert f["entry/data/data"].shape[0] == s["frames_written"]
        assert f["entry/data/frame_complete"][:].all()
    assert not list(small_disk.glob(".*reserve")), "the space held back is given back"
