"""Acquisitions on a machine that is busy, and into a consumer slower than the detector.

- A busy machine (CPU on every core and disk writeback, from stress-ng) must not cost a frame,
  nor one module that the machine runs slower than the others: the emulated modules share a
  trigger, so one cannot fall far behind another, and the receiver waits for a module that is
  late instead of expiring its frames.
- A consumer slower than the detector fills the ring: whole frames are refused at their first
  datagram (counted, with their numbers), the frames already started stay complete, every
  frame expected is in exactly one count, and the summary says the consumer was the limit.
"""
import json
import re
import shutil
import subprocess

import pytest

from conftest import frames_in, manifest


@pytest.fixture
def busy_machine(tmp_path):
    """stress-ng: one CPU worker per core and a disk writer, for at most two minutes."""
    if shutil.which("stress-ng") is None:
        pytest.fail("stress-ng is missing: scripts/setup.sh installs it")
    work = tmp_path / "stress"
    work.mkdir()
    p = subprocess.Popen(["stress-ng", "--cpu", "0", "--hdd", "1", "--hdd-bytes", "256M", "--timeout", "120s",
                          "--temp-path", str(work)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield p
    p.terminate()
    p.wait(timeout=30)


def run_config(rdaq, tmp_path, toml):
    """`rdaq run --raw` with this configuration; the completed process and its summary."""
    cfg = tmp_path / "run.toml"
    cfg.write_text(toml)
    summary = tmp_path / "summary.json"
    r = subprocess.run([str(rdaq), "run", "--raw", "--config", str(cfg), "--out", str(tmp_path / "out"), "--summary-json", str(summary)],
                       capture_output=True, text=True, timeout=300)
    return r, json.loads(summary.read_text()) if summary.exists() else None


def check_bit_exact(out, name="rdaq_run"):
    frames = frames_in(out / f"{name}_master.h5")
    man = manifest(out / f"{name}_manifest.csv")
    for frame, hashes in frames.items():
        assert hashes == [man[(frame, m)] for m in range(len(hashes))], f"frame {frame}"
    return frames


def test_every_frame_arrives_on_a_busy_machine(rdaq, tmp_path, busy_machine):
    out = tmp_path / "out"
    summary = tmp_path / "summary.json"
    r = subprocess.run([str(rdaq), "run", "--raw", "--frames", "300", "--out", str(out), "--summary-json", str(summary)],
                       capture_output=True, text=True, timeout=300)
    assert busy_machine.poll() is None, "the load ran for the whole acquisition"
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(summary.read_text())
    assert s["frames_complete"] == 300 and s["frames_never_seen"] == 0 and s["frames_refused"] == 0
    assert s["dropped_by_reason"] == [] or all(n == "duplicate" for n, _ in s["dropped_by_reason"]), s["dropped_by_reason"]
    assert s["history_misses"] == 0, "nothing was asked for that the modules had not sent"
    assert sorted(check_bit_exact(out)) == list(range(300))


def test_a_slow_module_holds_the_others_back_and_loses_nothing(rdaq, tmp_path):
    """One emulated module takes 15 ms longer for every frame than the others (what a busy
    machine does to one thread): it cannot keep 100 frames/s. Without a common trigger it
    would fall further behind every frame until its frames expired at the receiver and its
    late data was dropped as stale; with the trigger the detector runs late, says so, and
    every frame arrives complete."""
    r, s = run_config(rdaq, tmp_path, "[emulator]\nframes = 200\n[faults]\nslow_module = 1\nslow_ms = 15.0\n")
    assert r.returncode == 0, r.stdout + r.stderr
    assert s["frames_complete"] == 200 and s["dropped_by_reason"] == [], s
    assert s["late_frames"] > 0 and s["held_back"] > 0, "the detector says it ran late"
    assert "module frames started more than a frame period late" in r.stdout
    assert sorted(check_bit_exact(tmp_path / "out")) == list(range(200))


def test_a_slow_consumer_gets_whole_frames_and_is_named_the_limit(rdaq, tmp_path):
    # 200 frames/s into a consumer that takes 50 frames/s, with a ring of 16 frames
    r, s = run_config(rdaq, tmp_path, "[emulator]\nframes = 200\nrate_hz = 200.0\n[receiver]\nring_mib = 32\n"
                                      "[faults]\nconsumer_delay_ms = 20.0\n")
    assert r.returncode == 1, r.stdout + r.stderr
    assert s["frames_refused"] > 0 and s["frames_refused_runs"]
    assert s["frames_incomplete"] == 0, "no partial frame: refused frames are refused whole"
    counted = s["frames_complete"] + s["frames_incomplete"] + s["frames_discarded"] + s["frames_refused"] + s["frames_never_seen"]
    assert counted == 200, s
    assert s["history_misses"] == 0, "no retransmission was asked that could not help"
    assert re.search(r"the consumer \(assembling \(\d+ workers?\) and writing frames\) was the limit", r.stdout), r.stdout
    frames = check_bit_exact(tmp_path / "out")
    assert len(frames) == s["frames_complete"] == s["frames_written"]
    refused = {f for a, b in s["frames_refused_runs"] for f in range(a, b)}
    assert not refused & set(frames), "a refused frame is not in the file"
