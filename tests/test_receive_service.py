"""The acquisition service of one receiver (`rdaq receive --format sls --data-root DIR --serve
ADDR`), for a detector that something else triggers: configured once, then datasets armed
and triggered through the same API as `rdaq manage`'s service. The detector here is PSI's
virtual JUNGFRAU: its captured packets, renumbered, sent after each trigger's answer (the
receiver listens then). Every dataset's master holds the frames sent, raw or converted as
aare converts them; a cancel keeps what came; a frame that never came is reported, not
waited for forever; a port another program holds puts the service in error, saying so."""
import json
import re
import signal
import socket
import struct
import subprocess
import time
import urllib.request

import h5py
import hdf5plugin  # noqa: F401
import numpy as np
import pytest
from openapi_spec_validator import validate

from conftest import INTEROP, free_port, free_udp_port, read_capture, send_udp
from rdaq.control import ApiError, Service
from test_process import write_calibration
from test_readme_daemons import wait_up
from test_receive_process import KEV, aare_counts, calibration
from test_sls_replay import expected_frame

# the service binds it at each trigger: a port the kernel found free, so that two test runs
# (or another acquisition) on this host do not meet
DATA_PORT = free_udp_port()
# one frame of PSI's virtual JUNGFRAU: 128 packets, its frame number in the first 8 bytes
FRAME = read_capture(INTEROP / "jungfrau_virtual.bin")[:128]


def send_frames(numbers, port=DATA_PORT):
    """The detector's frames `numbers` (each the captured frame, renumbered)."""
    send_udp([(struct.pack("<Q", n) + p[8:], port) for n in numbers for p in FRAME])


@pytest.fixture
def start(rdaq, tmp_path):
    """Starts `rdaq receive` as the service with `extra` options; stops it (Ctrl-C, exit 0)."""
    procs = []

    def run(*extra, port=DATA_PORT, source=("--format", "sls")):
        addr = f"127.0.0.1:{free_port()}"
        root = tmp_path / "data"
        p = subprocess.Popen([rdaq, "receive", *source, "--port", str(port), "--stream", "none",
                              "--frame-timeout-ms", "200", "--data-root", root, "--serve", addr, *extra],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        wait_up(f"http://{addr}/acquisition", p)
        return Service(f"http://{addr}"), root, p

    yield run
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0, err


def acquire(svc, numbers_per_trigger, port=DATA_PORT):
    """Triggers once per list of frame numbers, sending them after each answer; the
    acquisition after the last trigger."""
    for numbers in numbers_per_trigger:
        svc.trigger()
        send_frames(numbers, port)
        a = svc.wait(("armed", "idle"))
    return a


def frames_of(master):
    with h5py.File(master, "r") as f:
        return f["entry/data/frame_number"][:].tolist(), f["entry/data/data"][()]


def test_datasets_in_a_row_raw_processed_and_open_ended(start, tmp_path):
    pedestal, gain = calibration(512)
    write_calibration(tmp_path / "cal.h5", pedestal, gain, np.zeros((512, 1024), np.uint32))
    (tmp_path / "proc.toml").write_text('[process]\nveto = false\noutput = "photons32"\n')
    svc, root, _ = start("--calibration", tmp_path / "cal.h5", "--config", tmp_path / "proc.toml", "--photon-energy-kev", str(KEV))
    a = svc.acquisition()
    assert a["state"] == "idle" and a["image"] == {"height": 512, "width": 1024}
    # raw: two triggers of three frames
    svc.arm(frames_per_trigger=3, triggers=2, directory="run1", prefix="raw", process=False, sample_name="thaumatin", detector_distance_m=0.2)
    a = acquire(svc, [[1, 2, 3], [4, 5, 6]])
    d = a["dataset"]
    assert a["state"] == "idle" and d["triggers_done"] == 2 and not d["cancelled"]
    assert d["master"] == str(root / "run1" / "raw_master.h5") and (d["frames_written"], d["frames_lost"], d["warning"]) == (6, 0, None)
    assert d["summary"]["frames_expected"] == d["summary"]["frames_complete"] == 6
    with h5py.File(d["master"], "r") as f:  # the arm's metadata, over the service's configuration
        assert (f["entry/sample/name"][()].decode(), f["entry/instrument/detector/distance"][()]) == ("thaumatin", 0.2)
    numbers, data = frames_of(d["master"])
    assert numbers == [1, 2, 3, 4, 5, 6] and all(np.array_equal(f, expected_frame()) for f in data)
    assert json.loads((root / "run1" / "raw_summary.json").read_text()) == d["summary"]
    # processed: the same frames converted, as aare converts them
    svc.arm(frames_per_trigger=3, directory="run1", prefix="photons")
    d = acquire(svc, [[7, 8, 9]])["dataset"]
    assert d["number"] == 2 and d["summary"]["processing"]["signal_frames"] == 3
    numbers, data = frames_of(d["master"])
    assert numbers == [7, 8, 9] and data.dtype == np.int32
    assert np.array_equal(data, aare_counts(np.stack([expected_frame()] * 3), pedestal, gain))
    # open-ended (as a Bluesky run): triggers until disarm
    svc.arm(frames_per_trigger=2, triggers=0, directory="run2", prefix="open", process=False)
    a = acquire(svc, [[10, 11], [12, 13]])
    assert a["state"] == "armed" and a["dataset"]["triggers_done"] == 2
    svc.disarm()
    d = svc.wait("idle")["dataset"]
    assert not d["cancelled"] and (d["frames_written"], d["frames_lost"]) == (4, 0) and d["summary"]["frames_expected"] is None
    assert frames_of(d["master"])[0] == [10, 11, 12, 13]
    # the last dataset's receiver counters, as the receiver daemon's /metrics gives them
    metrics = urllib.request.urlopen(svc.url + "/metrics", timeout=5).read().decode()
    assert re.search(r'^rdaq_frames_complete_total\{receiver="dr0"\} 4$', metrics, re.M), metrics
    assert re.search(r'^rdaq_dropped_total\{receiver="dr0",reason="bad_key"\} 0$', metrics, re.M), metrics


def written(svc, frames):
    """Waits until the dataset under way has written `frames` frames."""
    deadline = time.monotonic() + 20
    while svc.acquisition()["dataset"]["frames_written"] < frames:
        assert time.monotonic() < deadline, f"{frames} frames were not written"
        time.sleep(0.02)


def test_a_cancel_or_ctrl_c_keeps_what_came_and_a_lost_frame_is_reported(start):
    svc, root, proc = start()
    svc.arm(frames_per_trigger=100, directory="c", prefix="long", process=False)
    svc.trigger()
    send_frames(range(1, 6))
    written(svc, 5)
    assert svc.acquisition()["state"] == "acquiring", "95 frames to come"
    svc.cancel()
    d = svc.wait("idle")["dataset"]
    assert d["cancelled"] and d["frames_written"] == 5 and frames_of(d["master"])[0] == [1, 2, 3, 4, 5]
    assert d["frames_lost"] is None, "the detector's frames after a cancel are not waited for"
    # frame 2 never comes: the trigger ends once no frame came for a while, and says so
    svc.arm(frames_per_trigger=3, directory="c", prefix="lossy", process=False)
    svc.trigger()
    send_frames([1, 3])
    d = svc.wait("idle", timeout=30)["dataset"]
    s = d["summary"]
    assert (s["frames_complete"], s["frames_never_seen"], s["frames_expected"], d["frames_lost"]) == (2, 1, 3, 1), s
    assert d["warning"] == "1 frames lost: not in the files (the summary says which and why)", d
    assert frames_of(d["master"])[0] == [1, 3]
    # Ctrl-C while acquiring: the dataset is closed as cancelled, with its summary
    svc.arm(frames_per_trigger=10, directory="c", prefix="interrupted", process=False)
    svc.trigger()
    send_frames([1, 2])
    written(svc, 2)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    assert frames_of(root / "c" / "interrupted_master.h5")[0] == [1, 2]
    assert json.loads((root / "c" / "interrupted_summary.json").read_text())["frames_complete"] == 2


def test_bad_requests_a_held_port_and_the_openapi_document(rdaq, start, tmp_path):
    r = subprocess.run([rdaq, "receive", "--data-root", tmp_path / "x", "--serve", str(free_port())],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "native packets" in r.stderr, r.stderr
    held = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    held.bind(("127.0.0.1", 0))
    other = held.getsockname()[1]
    svc, root, _ = start(port=other)
    with pytest.raises(ApiError) as e:
        svc.arm(frames_per_trigger=1, directory="../out", prefix="x")
    assert e.value.status == 400 and "directory" in str(e.value)
    svc.arm(frames_per_trigger=1, directory="h", prefix="x")
    with pytest.raises(ApiError) as e:
        svc.trigger()
    assert e.value.status == 500 and "Address already in use" in str(e.value)
    a = svc.acquisition()
    assert a["state"] == "error" and "Address already in use" in a["error"]
    assert not list((root / "h").iterdir()), "nothing written"
    held.close()
    # the next arm clears the error; a dataset's files are never written over
    svc.arm(frames_per_trigger=1, directory="h", prefix="x", process=False)
    assert acquire(svc, [[1]], port=other)["dataset"]["frames_written"] == 1
    with pytest.raises(ApiError) as e:
        svc.arm(frames_per_trigger=1, directory="h", prefix="x")
    assert e.value.status == 409 and "x_master.h5" in str(e.value)
    doc = svc.openapi()
    validate(doc)
    assert set(doc["paths"]) == {"/acquisition", "/arm", "/trigger", "/disarm", "/cancel", "/metrics"}


def test_a_described_detector_feeds_the_service_on_one_host(start, rdaq):
    """The docs' recipe for one host: `rdaq receive --detector eiger --data-root` fed by
    `rdaq emulate --detector eiger --port`, which needs no buffer map."""
    port = free_udp_port()  # EIGER: 4 ports per module, from this one on
    svc, root, _ = start("--bit-depth", "16", port=port, source=("--detector", "eiger"))
    svc.arm(frames_per_trigger=5, prefix="eiger", process=False)
    svc.trigger()
    r = subprocess.run([rdaq, "emulate", "--detector", "eiger", "--bit-depth", "16", "--port", str(port), "--frames", "5",
                        "--rate", "100"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "1 modules of EIGER at 16 bits x 5 frames" in r.stdout, r.stdout + r.stderr
    d = svc.wait("idle", timeout=30)["dataset"]
    assert (d["frames_written"], d["frames_lost"]) == (5, 0), d
    with h5py.File(d["master"], "r") as f:
        assert f["entry/data/data"].shape[0] == 5
