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


def test_runs_started_together_into_one_directory_get_their_own_names(rdaq, tmp_path):
    """Run names are claimed atomically: three runs started at once write three series."""
    out = tmp_path / "out"
    out.mkdir()
    procs = [subprocess.Popen([str(rdaq), "run", "--raw", "--frames", "5", "--stream", "none", "--preview", "none", "--out", str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (o, e) in zip(procs, results):
        assert p.returncode == 0, o + e
    masters = [line.split(":", 1)[1].strip() for o, _ in results for line in o.splitlines() if line.startswith("output")]
    assert len(set(masters)) == 3, masters
    for m in masters:
        assert sorted(frames_in(m)) == list(range(5)), m


def test_a_link_at_an_output_name_is_never_followed(rdaq, tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    target = elsewhere / "theirs.h5"
    (out / "rdaq_run_data_000001.h5").symlink_to(target)  # dangling
    r = run(rdaq, out, "--frames", "3", "--stream", "none")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "this run is rdaq_run_000002" in r.stderr, "a link takes the name like a file"
    assert not target.exists(), "nothing was created where the link points"
    # --overwrite replaces files, never a link or what it points to
    target.write_bytes(b"theirs")
    r = run(rdaq, out, "--frames", "3", "--stream", "none", "--overwrite")
    assert r.returncode == 2 and "symbolic link" in r.stderr and "rdaq_run_data_000001.h5" in r.stderr, r.stderr
    assert target.read_bytes() == b"theirs"
    r = subprocess.run([str(rdaq), "receive", "--port", "0", "--frames", "1", "--timeout-s", "1", "--stream", "none",
                        "--out", str(out / "rdaq_run.h5"), "--overwrite"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "symbolic link" in r.stderr, r.stderr
    assert target.read_bytes() == b"theirs"
    # names that would make files outside the output directory are refused
    r = subprocess.run([str(rdaq), "write", "--from", "tcp://127.0.0.1:1", "--out", str(out), "--name", "../escaped", "--idle-timeout-s", "0.5"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "plain file name" in r.stderr, r.stderr
    assert not list(tmp_path.glob("escaped*"))


def test_files_named_on_the_command_line_are_not_replaced_without_overwrite(rdaq, tmp_path):
    out = tmp_path / "out"
    r = run(rdaq, out, "--frames", "4", "--stream", "none")
    assert r.returncode == 0, r.stdout + r.stderr
    master = out / "rdaq_run_master.h5"
    existing = tmp_path / "existing"
    existing.write_bytes(b"keep me")
    cal = tmp_path / "cal.h5"
    assert subprocess.run([str(rdaq), "process", "pedestal", "--input", str(master), "--output", str(cal)], capture_output=True, timeout=60).returncode == 0
    commands = [
        ["process", "pedestal", "--input", str(master), "--output", str(existing)],
        ["process", "convert", "--input", str(master), "--calibration", str(cal), "--output", str(existing)],
        ["process", "spots", "--input", str(master), "--output", str(existing)],
        ["preview", "--file", str(master), "--png", str(existing)],
        ["receive", "--port", "0", "--frames", "1", "--timeout-s", "1", "--stream", "none", "--buffers-out", str(existing)],
        ["receive", "--port", "0", "--frames", "1", "--timeout-s", "1", "--stream", "none", "--summary-json", str(existing)],
        ["run", "--raw", "--frames", "2", "--stream", "none", "--out", str(tmp_path / "o2"), "--summary-json", str(existing)],
    ]
    for cmd in commands:
        r = subprocess.run([str(rdaq), *cmd], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (cmd, r.stdout + r.stderr)
        assert f"{existing} exists" in r.stderr and "--overwrite" in r.stderr, (cmd, r.stderr)
        assert existing.read_bytes() == b"keep me", cmd
    for cmd in commands[:4]:
        r = subprocess.run([str(rdaq), *cmd, "--overwrite"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (cmd, r.stdout + r.stderr)
        assert existing.read_bytes() != b"keep me", cmd
        existing.write_bytes(b"keep me")


def test_a_disk_full_at_the_start_is_one_line_and_leaves_nothing(rdaq, small_disk):
    """No room for even the master: exit 2, one line naming the file and the cause, and no
    file of the run (not the master's hidden staging file either)."""
    with open(small_disk / "filler", "wb") as f:
        try:
            while True:
                f.write(bytes(1 << 20))
                f.flush()
        except OSError:
            pass
    r = run(rdaq, small_disk, "--frames", "5")
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()[-1]
    assert str(small_disk) in err and "No space left on device" in err and "H5F" not in r.stderr, r.stderr
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]
