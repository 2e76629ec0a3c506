"""The NXmx series on disk: a master file and data files that are readable while they are
written (HDF5 SWMR) and after the writer is killed, up to its last flush."""
import ctypes
import os
import select
import signal
import struct
import subprocess
import time

import h5py
import hdf5plugin  # noqa: F401
import pytest

from conftest import frames_in, manifest

ORIGINS = [(0, 0), (548, 0)]  # the default 2 modules, 36-pixel gap


def data_files(out):
    return sorted(out.glob("rdaq_run_data_*.h5"))


def frames_readable(out):
    """Frames a SWMR reader sees in the data files now (a data file whose name is claimed
    but which HDF5 has not created yet is empty)."""
    n = 0
    for p in (p for p in data_files(out) if p.stat().st_size > 0):
        with h5py.File(p, "r", swmr=True) as f:
            n += f["entry/data/frame_number"].shape[0]
    return n


@pytest.fixture(scope="module")
def truth(rdaq, tmp_path_factory):
    """What the emulated detector sends: the same frames in every run, and the manifest
    lists them whatever the receiver kept."""
    ref = tmp_path_factory.mktemp("ref")
    r = subprocess.run([rdaq, "run", "--raw", "--frames", "700", "--rate", "200", "--out", ref, "--stream", "none", "--preview", "none"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1), r.stderr
    t = manifest(ref / "rdaq_run_manifest.csv")
    assert len(t) == 1400
    for f in ref.glob("*.h5"):
        f.unlink()
    return t


def start_long_run(rdaq, out, per_file):
    return subprocess.Popen([rdaq, "run", "--raw", "--frames", "3000", "--rate", "100", "--images-per-file", str(per_file), "--out", out,
                             "--stream", "none", "--preview", "none"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def master_frames(out):
    """Frames the master lists, read through it as a reader during a run or after a crash
    opens it (SWMR: the last data file still carries the writer's flag)."""
    with h5py.File(out / "rdaq_run_master.h5", "r", swmr=True) as f:
        return f["entry/data/data"].shape[0]


def test_a_reader_follows_a_run_through_its_data_files_and_its_master(rdaq, tmp_path, truth):
    out = tmp_path / "out"
    p = start_long_run(rdaq, out, 200)
    seen, listed, deadline = [], [], time.monotonic() + 90
    try:
        while (not seen or seen[-1] < 450) and time.monotonic() < deadline:
            assert p.poll() is None, p.stderr.read()
            time.sleep(0.3)
            seen.append(frames_readable(out))
            # until the first master is renamed over it, the master's name is claimed by an empty file
            master = out / "rdaq_run_master.h5"
            listed.append(master_frames(out) if master.exists() and master.stat().st_size > 0 else 0)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert seen[-1] >= 450, f"frames seen while running: {seen}"
    assert len(set(x for x in seen if x > 0)) >= 3, f"frames appear in the data files while the run goes on: {seen}"
    assert len(set(x for x in listed if x > 0)) >= 3, f"the master lists more frames as the run goes on: {listed}"
    # every frame a reader saw before the kill is still there, bit-exact
    frames = {}
    for d in (d for d in data_files(out) if d.stat().st_size > 0):
        frames.update(frames_in(d, swmr=True, origins=ORIGINS))
    assert len(frames) >= seen[-1] and sorted(frames) == list(range(len(frames)))
    for frame, hashes in frames.items():
        if frame < 700:
            assert hashes == [truth[(frame, m)] for m in range(2)], f"frame {frame}"
    assert not os.path.exists(out / "rdaq_run_manifest.csv"), "the run did not finish"


@pytest.mark.parametrize("after_s", [1.0, 2.3, 4.1])
def test_a_killed_run_lists_only_frames_that_are_there_and_is_recovered(rdaq, tmp_path, truth, after_s):
    """Killed at several moments (data files roll every half second): the master, opened as
    the docs say, lists only frames the data files hold, every one of them the detector's
    (no planned frame that reads as zeros or fails); `rdaq recover` clears the writer's
    flags, trims the data files, lists every frame they hold and removes the leftovers."""
    out = tmp_path / "out"
    master = out / "rdaq_run_master.h5"
    p = start_long_run(rdaq, out, 50)
    deadline = time.monotonic() + 60
    while not master.exists() and time.monotonic() < deadline:
        assert p.poll() is None, p.stderr.read()
        time.sleep(0.05)
    time.sleep(after_s)
    p.send_signal(signal.SIGKILL)
    p.wait()
    listed = master_frames(out)
    in_files = frames_readable(out)
    assert listed <= in_files, (listed, in_files)
    before = frames_in(master, swmr=True)
    assert sorted(before) == list(range(listed))
    for frame, hashes in before.items():
        assert hashes == [truth[(frame, m)] for m in range(2)], f"frame {frame}"

    r = subprocess.run([rdaq, "recover", master], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not list(out.glob(".*")), "the writer's leftovers are gone"
    for d in data_files(out):
        with h5py.File(d, "r") as f:  # no writer flag left: any reader opens it
            assert f["entry/data/data"].shape[0] == f["entry/data/frame_number"].shape[0] > 0
    after = frames_in(master)  # a plain reader, no SWMR
    assert len(after) >= listed and sorted(after) == list(range(len(after)))
    assert f"lists {len(after)} frames" in r.stdout
    for frame, hashes in after.items():
        assert hashes == [truth[(frame, m)] for m in range(2)], f"frame {frame}"
    r = subprocess.run([rdaq, "recover", master], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"lists {len(after)} frames" in r.stdout, "recovering again changes nothing"


class Writes:
    """The names of the files written in a directory, as the kernel reports each write
    (inotify): a test stops or kills the writer right after a file's first write."""

    IN_MODIFY = 0x2

    def __init__(self, directory):
        directory.mkdir(parents=True)
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0 and self.libc.inotify_add_watch(self.fd, bytes(directory), self.IN_MODIFY) >= 0

    def wait_for(self, name, timeout):
        """Whether `name` is written to within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([self.fd], [], [], left)[0]:
                continue
            buf, i = os.read(self.fd, 1 << 16), 0
            while i < len(buf):
                length = struct.unpack_from("iIII", buf, i)[3]
                if buf[i + 16:i + 16 + length].rstrip(b"\0") == name.encode():
                    return True
                i += 16 + length
        return False

    def close(self):
        os.close(self.fd)


def stop(p):
    """Stops the process `p` and returns once every thread of it has stopped."""
    p.send_signal(signal.SIGSTOP)
    tasks = f"/proc/{p.pid}/task"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            states = [open(f"{tasks}/{t}/stat").read().rsplit(")", 1)[1].split()[0] for t in os.listdir(tasks)]
        except FileNotFoundError:  # a thread ended meanwhile
            continue
        if all(s in "tT" for s in states):
            return
        time.sleep(0.001)
    raise AssertionError(f"process {p.pid} did not stop")


def test_a_data_file_has_its_name_only_once_a_swmr_reader_can_open_it(rdaq, tmp_path):
    """The writer is stopped right after the first write to each new data file's name: what a
    kill at that moment leaves must open for a SWMR reader (HDF5 flags a file as open for
    writing when it creates it, and for SWMR writing only later)."""
    out = tmp_path / "out"
    writes = Writes(out)
    p = start_long_run(rdaq, out, 10)
    try:
        for k in range(2, 10):
            name = f"rdaq_run_data_{k:06}.h5"
            assert writes.wait_for(name, 60), p.stderr.read() if p.poll() is not None else name
            stop(p)
            # the stopped writer still holds its lock; a reader after a kill would not see it
            with h5py.File(out / name, "r", swmr=True, locking=False) as f:
                assert "entry/data/frame_number" in f
            p.send_signal(signal.SIGCONT)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
        writes.close()


def test_a_run_killed_while_it_makes_a_data_file_is_recovered(rdaq, tmp_path, truth):
    """Killed while a data file is made under its staging name (the writer is stopped at the
    file's first write, and until it is caught before the rename): the name is claimed and
    empty, and `rdaq recover` removes both and lists the frames of the files before."""
    out = tmp_path / "out"
    writes = Writes(out)
    p = start_long_run(rdaq, out, 10)
    try:
        for k in range(2, 40):
            staged = out / f".rdaq_run_data_{k:06}.h5.tmp"
            assert writes.wait_for(staged.name, 60), "each data file is made under its staging name"
            stop(p)
            if staged.exists():
                break
            p.send_signal(signal.SIGCONT)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
        writes.close()
    assert staged.exists(), "the writer was never stopped before a rename"
    kept = 10 * (k - 1)
    assert (out / f"rdaq_run_data_{k:06}.h5").stat().st_size == 0, "its name is claimed, empty"
    assert master_frames(out) <= frames_readable(out) == kept
    r = subprocess.run([rdaq, "recover", out / "rdaq_run_master.h5"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"lists {kept} frames" in r.stdout, r.stdout + r.stderr
    assert not list(out.glob(".*")) and [p.name for p in data_files(out)] == [f"rdaq_run_data_{j:06}.h5" for j in range(1, k)]
    frames = frames_in(out / "rdaq_run_master.h5")
    assert sorted(frames) == list(range(kept))
    for frame, hashes in frames.items():
        assert hashes == [truth[(frame, m)] for m in range(2)], f"frame {frame}"


def test_recover_leaves_a_series_whose_writer_runs_alone(rdaq, tmp_path):
    """`rdaq recover` on the master of a run still writing refuses (exit 2, naming the
    process) and touches nothing: the run ends as if nothing had happened."""
    out = tmp_path / "out"
    master = out / "rdaq_run_master.h5"
    p = start_long_run(rdaq, out, 50)
    try:
        deadline = time.monotonic() + 60
        while not data_files(out) and time.monotonic() < deadline:
            assert p.poll() is None, p.stderr.read()
            time.sleep(0.05)
        r = subprocess.run([rdaq, "recover", master], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and f"is open in process {p.pid}" in r.stderr, r.stderr
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
    frames = frames_in(master)  # the writer closed its files itself: a plain reader opens them
    assert sorted(frames) == list(range(len(frames))) and frames


def test_recover_refuses_what_is_not_an_rdaq_master(rdaq, tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = 1
    for path in (other, tmp_path / "missing_master.h5"):
        r = subprocess.run([rdaq, "recover", path], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "not the master of an rdaq series" in r.stderr, r.stderr


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
