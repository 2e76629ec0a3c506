"""The NXmx series on disk: a master file and data files that are readable while they are
written (HDF5 SWMR) and after the writer is killed, up to its last flush."""
import os
import signal
import subprocess
import time

import h5py
import hdf5plugin  # noqa: F401

from conftest import frames_in, manifest

ORIGINS = [(0, 0), (548, 0)]  # the default 2 modules, 36-pixel gap


def data_files(out):
    return sorted(out.glob("rdaq_run_data_*.h5"))


def frames_readable(out):
    """Frames a SWMR reader sees in the data files now."""
    n = 0
    for p in data_files(out):
        with h5py.File(p, "r", swmr=True) as f:
            n += f["entry/data/frame_number"].shape[0]
    return n


def test_a_reader_follows_a_run_and_a_killed_run_keeps_what_was_flushed(rdaq, tmp_path):
    # the reference: the emulated detector sends the same frames in every run, and the
    # manifest lists what it sent whatever the receiver kept (the file is not needed)
    ref = tmp_path / "ref"
    r = subprocess.run([rdaq, "run", "--raw", "--frames", "700", "--rate", "200", "--out", ref, "--stream", "none", "--preview", "none"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1), r.stderr
    truth = manifest(ref / "rdaq_run_manifest.csv")
    assert len(truth) == 1400

    out = tmp_path / "out"
    p = subprocess.Popen([rdaq, "run", "--raw", "--frames", "3000", "--rate", "100", "--images-per-file", "200", "--out", out],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen, deadline = [], time.monotonic() + 90
    try:
        while (not seen or seen[-1] < 450) and time.monotonic() < deadline:
            assert p.poll() is None, p.stderr.read()
            time.sleep(0.3)
            seen.append(frames_readable(out))
        before_kill = frames_readable(out)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert before_kill >= 450, f"frames seen while running: {seen}"
    assert len(set(x for x in seen if x > 0)) >= 3, f"frames appear while the run goes on: {seen}"

    # the master was written at the start: it opens and covers the planned run
    with h5py.File(out / "rdaq_run_master.h5", "r") as f:
        assert f["entry/data/data"].shape[0] == 3000
        assert f["entry/instrument/detector/distance"][()] > 0
    # every frame a reader saw before the kill is still there, bit-exact
    frames = {}
    for d in data_files(out):
        frames.update(frames_in(d, swmr=True, origins=ORIGINS))
    assert len(frames) >= before_kill and sorted(frames) == list(range(len(frames)))
    for frame, hashes in frames.items():
        if frame < 700:
            assert hashes == [truth[(frame, m)] for m in range(2)], f"frame {frame}"
    # or, once h5clear has cleared the killed writer's flag, opened as any file
    last_file = data_files(out)[-1]
    with h5py.File(last_file, "r", swmr=True) as f:
        held = f["entry/data/frame_number"][:]
    subprocess.run(["h5clear", "-s", last_file], check=True, capture_output=True)
    with h5py.File(last_file, "r") as f:
        assert list(f["entry/data/frame_number"][:]) == list(held) and f["entry/data/data"].shape[0] >= len(held)
    # the master reads the killed writer's last file too (in SWMR mode)
    with h5py.File(out / "rdaq_run_master.h5", "r", swmr=True) as f:
        last = max(frames)
        assert f["entry/data/frame_number"][last] == last
    assert not os.path.exists(out / "rdaq_run_manifest.csv"), "the run did not finish"


def test_a_run_splits_its_images_over_data_files(rdaq, tmp_path):
    r = subprocess.run([rdaq, "run", "--raw", "--frames", "25", "--images-per-file", "10", "--out", tmp_path], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in data_files(tmp_path)] == [f"rdaq_run_data_00000{k}.h5" for k in (1, 2, 3)]
    with h5py.File(tmp_path / "rdaq_run_master.h5", "r") as f:
        assert [f[f"entry/data/data_00000{k}"].shape[0] for k in (1, 2, 3)] == [10, 10, 5]
        assert f["entry/data/data"].shape[0] == 25
        assert list(f["entry/data/frame_number"][:]) == list(range(25))
        assert "end_time" in f["entry"]
    frames = frames_in(tmp_path / "rdaq_run_master.h5")
    truth = manifest(tmp_path / "rdaq_run_manifest.csv")
    assert all(frames[fr] == [truth[(fr, m)] for m in range(2)] for fr in range(25))
