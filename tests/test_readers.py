"""What readers see of rdaq's files, whatever the environment:
the filter settings stored with the chunks are bitshuffle's own (a bitshuffle plugin on
HDF5_PLUGIN_PATH, as docs/files.md tells DIALS users to export, changes nothing), every
frame decodes with h5py + hdf5plugin, and rdaq reads back what it wrote with no environment
set."""
import os
import subprocess

import h5py
import hdf5plugin
import numpy as np

from conftest import frames_in, manifest


def with_plugin_path():
    return {**os.environ, "HDF5_PLUGIN_PATH": hdf5plugin.PLUGIN_PATH}


def without_plugin_path():
    return {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}


def bitshuffle_values(path):
    with h5py.File(path, "r") as f:
        plist = f["entry/data/data"].id.get_create_plist()
        for i in range(plist.get_nfilters()):
            fid, _, values, _ = plist.get_filter(i)
            if fid == 32008:
                return tuple(values)
    raise AssertionError(f"{path}: no bitshuffle filter")


def test_a_plugin_path_in_the_environment_changes_nothing_written(rdaq, tmp_path):
    out = tmp_path / "raw"
    r = subprocess.run([str(rdaq), "run", "--raw", "--frames", "12", "--images-per-file", "5", "--stream", "none", "--out", str(out)],
                       capture_output=True, text=True, timeout=120, env=with_plugin_path())
    assert r.returncode == 0, r.stdout + r.stderr
    data_files = sorted(out.glob("rdaq_run_data_*.h5"))
    assert len(data_files) == 3
    for p in data_files:
        # version fields, element size 2, default block, LZ4 (2), level 0: what bitshuffle readers decode
        assert bitshuffle_values(p) == (0, 4, 2, 0, 2, 0), p
    got = frames_in(out / "rdaq_run_master.h5")
    want = manifest(out / "rdaq_run_manifest.csv")
    assert sorted(got) == list(range(12))
    for f, mods in got.items():
        assert mods == [want[(f, m)] for m in range(len(mods))], f"frame {f}"


def processed_run(rdaq, out, env):
    """The master of a processed run of 40 frames made in the environment `env`."""
    r = subprocess.run([str(rdaq), "run", "--frames", "40", "--stream", "none", "--out", str(out)],
                       capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return out / "rdaq_run_master.h5"


def test_processed_frames_read_in_full_with_a_plugin_path_set(rdaq, tmp_path):
    out = tmp_path / "proc"
    master = processed_run(rdaq, out, with_plugin_path())
    assert bitshuffle_values(out / "rdaq_run_data_000001.h5") == (0, 4, 2, 0, 2, 0)
    # every frame at once, through the master's virtual dataset (this crashed h5py before)
    with h5py.File(master, "r") as f:
        data = f["entry/data/data"][:]
        assert data.dtype == np.int16 and data.shape[0] == len(f["entry/data/frame_number"]) > 0
        assert (data != 0).any()


def test_rdaq_reads_its_own_files_with_no_environment(rdaq, tmp_path):
    master = processed_run(rdaq, tmp_path / "proc", without_plugin_path())
    spots = tmp_path / "spots.h5"
    r = subprocess.run([str(rdaq), "process", "spots", "--input", str(master), "--output", str(spots), "--threshold", "1"],
                       capture_output=True, text=True, timeout=120, env=without_plugin_path())
    assert r.returncode == 0, r.stdout + r.stderr
    with h5py.File(master, "r") as f:
        frames = len(f["entry/data/frame_number"])
    assert f"{frames} frames" in r.stderr
    png = tmp_path / "p.png"
    r = subprocess.run([str(rdaq), "preview", "--file", str(master), "--frame", "0", "--png", str(png)],
                       capture_output=True, text=True, timeout=60, env=without_plugin_path())
    assert r.returncode == 0, r.stdout + r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
