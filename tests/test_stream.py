"""Stream V2 out of `rdaq run`, read by a consumer written with pyzmq + cbor2 + bitshuffle
(tests/stream_consumer.py): every image arrives, equal bit for bit to the same frame of
the HDF5 files; the start message carries the metadata; two consumers share the images,
each exactly once; with the drop policy and no consumer, the images are counted as dropped."""
import json
import pathlib
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import h5py
import hdf5plugin  # noqa: F401
import numpy as np
import pytest

import stream_consumer as sc
from conftest import frames_in, free_port


def run_with_consumers(rdaq, out, n_consumers, *args):
    port = free_port()
    got = [None] * n_consumers
    threads = [threading.Thread(target=lambda k=k: got.__setitem__(k, sc.receive(f"tcp://127.0.0.1:{port}", until_end=False, timeout_ms=8000)))
               for k in range(n_consumers)]
    for t in threads:
        t.start()
    r = subprocess.run([rdaq, "run", "--out", out, "--stream", f"tcp://127.0.0.1:{port}", "--summary-json", out / "s.json", *args],
                       capture_output=True, text=True, timeout=180)
    for t in threads:
        t.join()
    assert r.returncode == 0, r.stdout + r.stderr
    return got, json.loads((out / "s.json").read_text()), r.stdout


@pytest.mark.parametrize("mode", ["processed", "raw"])
def test_every_image_reaches_the_consumer_equal_to_the_file(rdaq, tmp_path, mode):
    extra = ["--raw"] if mode == "raw" else []
    (got,), s, stdout = run_with_consumers(rdaq, tmp_path, 1, "--frames", "40", "--stream-policy", "block", *extra)
    assert [m["type"] for m in got[:1] + got[-1:]] == ["start", "end"]
    images = [m for m in got if m["type"] == "image"]
    assert s["stream"]["images_sent"] == len(images) == s["frames_written"] > 0
    assert s["stream"]["images_dropped"] == 0 and "stream      : tcp://127.0.0.1" in stdout
    assert s["stream"]["consumers"] == 1 and not s["stream"]["split"] and "1 consumer took images" in stdout
    start = got[0]
    with h5py.File(tmp_path / "rdaq_run_master.h5", "r") as f:
        data, det = f["entry/data/data"], f["entry/instrument/detector"]
        assert start["number_of_images"] == 40
        assert (start["image_size_y"], start["image_size_x"]) == data.shape[1:]
        assert start["image_dtype"] == data.dtype.name
        assert start["pixel_size_x"] == det["x_pixel_size"][()] and start["beam_center_y"] == det["beam_center_y"][()]
        assert start["detector_translation"][2] == det["distance"][()]
        assert start["incident_wavelength"] == pytest.approx(f["entry/instrument/beam/incident_wavelength"][()])
        assert np.array_equal(sc.decode_array(start["pixel_mask"]["data"]), det["pixel_mask"][:])
        numbers = f["entry/data/frame_number"][:]
        for i, m in enumerate(images):
            assert m["image_id"] == i and m["user_data"]["rdaq"]["frame_number"] == numbers[i]
            assert np.array_equal(sc.decode_array(m["data"]["data"]), data[i]), f"image {i}"
        if mode == "processed":
            r1 = f["entry/result_1"]
            for i, m in enumerate(images):
                spots = m["user_data"]["rdaq"]["spots"]
                k = r1["nPeaks"][i]
                assert len(spots["x"]) == k and np.allclose(spots["x"], r1["peakXPosRaw"][i, :k])
                assert np.allclose(spots["intensity"], r1["peakTotalIntensity"][i, :k]), "the same units as the file"


def test_two_consumers_share_the_images_exactly_once(rdaq, tmp_path):
    got, s, stdout = run_with_consumers(rdaq, tmp_path, 2, "--frames", "60", "--raw", "--stream-policy", "block")
    ids = [m["image_id"] for g in got for m in g if m["type"] == "image"]
    assert sorted(ids) == list(range(s["frames_written"])) == list(range(60))
    assert all(any(m["type"] == "image" for m in g) for g in got), "round-robin: both got images"
    # a second consumer (a stray one too) is named in the summary: each has part of the series
    assert (s["stream"]["consumers"], s["stream"]["consumers_at_once"], s["stream"]["split"]) == (2, 2, True)
    assert "2 consumers took images (2 at once: the stream shared its images between them" in stdout


def test_the_stream_and_preview_serve_this_host_unless_a_network_address_is_given(rdaq, tmp_path):
    r = subprocess.run([rdaq, "run", "--raw", "--frames", "5", "--out", tmp_path, "--summary-json", tmp_path / "s.json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "s.json").read_text())["stream"]
    # the defaults, or (another acquisition on this host holds them) free ports of the same address
    for key, field, default in (("endpoint", "stream.endpoint", "tcp://127.0.0.1:31001"), ("preview", "stream.preview", "tcp://127.0.0.1:31002")):
        taken = f"warning: {field}: {default} is taken" in r.stderr
        assert s[key] == default or (taken and s[key].startswith("tcp://127.0.0.1:")), (s, r.stderr)
    assert "open to the network" not in r.stderr
    port = free_port()
    r = subprocess.run([rdaq, "run", "--raw", "--frames", "5", "--out", tmp_path, "--overwrite", "--stream", f"tcp://*:{port}", "--preview", "none"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"the stream on tcp://0.0.0.0:{port} is open to the network: any host that reaches this one can read its images" in r.stderr


def test_without_a_consumer_images_are_dropped_and_counted(rdaq, tmp_path):
    r = subprocess.run([rdaq, "run", "--raw", "--frames", "20", "--out", tmp_path, "--stream", f"tcp://127.0.0.1:{free_port()}",
                        "--summary-json", tmp_path / "s.json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "s.json").read_text())["stream"]
    assert s["images_sent"] == 0 and s["images_dropped"] == 20 and not s["start_sent"] and s["consumers"] == 0
    assert s["images_encoded"] == 0, "an image nobody takes is not encoded"
    assert "20 dropped" in r.stdout


def receive_emulated(rdaq, tmp_path, frames, rate, *args):
    """`rdaq receive ARGS --frames FRAMES` fed by `rdaq emulate` at RATE through its buffer
    map: (exit code, stdout, stderr)."""
    rx = subprocess.Popen([rdaq, "receive", "--port", str(free_port()), "--frames", str(frames), "--buffers-out", tmp_path / "map.json",
                           "--timeout-s", "60", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not (tmp_path / "map.json").exists():
        assert rx.poll() is None and time.monotonic() < deadline, rx.stderr.read()
        time.sleep(0.05)
    subprocess.run([rdaq, "emulate", "--buffers", tmp_path / "map.json", "--frames", str(frames), "--rate", str(rate)], check=True,
                   capture_output=True, timeout=60)
    out, err = rx.communicate(timeout=60)
    return rx.returncode, out, err


@pytest.mark.parametrize("reader", [False, True])
def test_processing_without_a_file_compresses_only_for_a_reader(rdaq, tmp_path, reader):
    """`rdaq receive --calibration` without --out: the graph converts and finds spots in
    every signal frame, but with no file and nobody reading the stream it compresses none
    (a counter that stays at zero); a reader gets every kept frame (the stream blocks until it
    has connected: under drop, a reader connecting after the first frames misses them)."""
    port, got = free_port(), {}
    t = threading.Thread(target=lambda: got.setdefault("m", sc.receive(f"tcp://127.0.0.1:{port}", timeout_ms=30000)))
    if reader:
        t.start()
    rc, out, err = receive_emulated(rdaq, tmp_path, 40, 200, "--modules", "1", "--calibration", "emulated", "--stream", f"tcp://127.0.0.1:{port}",
                                    "--stream-policy", "block" if reader else "drop", "--summary-json", tmp_path / "s.json")
    assert rc == 0, out + err
    s = json.loads((tmp_path / "s.json").read_text())
    p, st = s["processing"], s["stream"]
    kept = p["signal_frames"] - p["vetoed"]
    assert kept > 0 and p["frames_written"] == 0
    if reader:
        t.join()
        images = [m for m in got["m"] if m["type"] == "image"]
        assert p["frames_compressed"] == st["images_encoded"] == st["images_sent"] == len(images) == kept, (p, st)
    else:
        assert p["frames_compressed"] == 0, "no file and no reader: nothing compressed"
        assert st["images_encoded"] == 0 and st["images_sent"] == 0 and st["images_dropped"] == kept
        assert " 0 compressed" in out


def test_a_standalone_receiver_streams_what_it_writes(rdaq, tmp_path):
    port = free_port()
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("m", sc.receive(f"tcp://127.0.0.1:{port}", timeout_ms=30000)))
    t.start()
    rc, out, err = receive_emulated(rdaq, tmp_path, 30, 100, "--modules", "2", "--out", tmp_path / "r.h5", "--stream", f"tcp://127.0.0.1:{port}",
                                    "--stream-policy", "block")
    t.join()
    assert rc == 0, out + err
    images = [m for m in got["m"] if m["type"] == "image"]
    assert got["m"][0]["type"] == "start" and got["m"][-1]["type"] == "end" and len(images) == 30
    with h5py.File(tmp_path / "r.h5", "r") as f:
        data = f["entry/data/data"]
        for i, m in enumerate(images):
            assert np.array_equal(sc.decode_array(m["data"]["data"]), data[i]), f"image {i}"


CONSUMER = """
import sys
sys.path.insert(0, {tests!r})
import stream_consumer as sc, zmq, cbor2
s = zmq.Context.instance().socket(zmq.PULL)
s.setsockopt(zmq.RCVHWM, 10)
s.connect({endpoint!r})
while True:
    m = sc.decode(s.recv())
    if m["type"] == "image":
        print(m["image_id"], flush=True)
"""


def test_a_consumer_killed_mid_run_loses_only_what_the_policy_counts(rdaq, tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    tests = str(pathlib.Path(__file__).parent)
    consumer = subprocess.Popen([sys.executable, "-c", CONSUMER.format(tests=tests, endpoint=endpoint)], stdout=subprocess.PIPE, text=True)
    run = subprocess.Popen([rdaq, "run", "--raw", "--frames", "500", "--out", tmp_path, "--stream", endpoint, "--stream-policy", "drop",
                            "--summary-json", tmp_path / "s.json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got = []
    for line in consumer.stdout:
        got.append(int(line))
        if len(got) == 100:
            break
    consumer.kill()
    got += [int(line) for line in consumer.stdout.read().split()]
    consumer.wait()
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, out + err
    s = json.loads((tmp_path / "s.json").read_text())
    st = s["stream"]
    # every image is counted once: sent or dropped; the consumer got the first ones, in order
    assert st["images_sent"] + st["images_dropped"] == s["frames_written"] == 500
    assert st["images_dropped"] > 0, "with nobody left, the drop policy dropped (and counted) the rest"
    assert got == list(range(len(got))) and 100 <= len(got) <= st["images_sent"]
    assert "dropped (no consumer, or its queue full)" in out


def test_a_consumer_connecting_mid_run_gets_the_images_from_then_on(rdaq, tmp_path):
    """Before anyone connects, images are counted as dropped and not encoded; from the
    connection on, every image reaches the consumer, and only those were encoded."""
    endpoint, serve = f"tcp://127.0.0.1:{free_port()}", free_port()
    run = subprocess.Popen([rdaq, "run", "--raw", "--frames", "600", "--rate", "150", "--out", tmp_path, "--stream", endpoint,
                            "--stream-policy", "drop", "--preview", "none", "--serve", str(serve), "--summary-json", tmp_path / "s.json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def frames_done():
        try:
            snap = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{serve}/status", timeout=2).read())
        except OSError:
            return 0
        counters = snap["receivers"][0]["counters"] or {}
        return counters.get("frames_complete", 0)

    deadline = time.monotonic() + 60
    while frames_done() < 60:
        assert run.poll() is None and time.monotonic() < deadline, "the run did not get going"
        time.sleep(0.05)
    tests = str(pathlib.Path(__file__).parent)
    consumer = subprocess.Popen([sys.executable, "-c", CONSUMER.format(tests=tests, endpoint=endpoint)], stdout=subprocess.PIPE, text=True)
    try:
        # the summary is written at the end; the dashboard then stays until Ctrl-C
        while not (tmp_path / "s.json").exists():
            assert run.poll() is None and time.monotonic() < deadline + 60, "the run did not end"
            time.sleep(0.05)
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=60)
        time.sleep(1)
    finally:
        consumer.kill()
    got = [int(line) for line in consumer.stdout.read().split()]
    summary = json.loads((tmp_path / "s.json").read_text())
    # a busy machine may lose datagrams of a frame or two (exit 1, said): the stream is judged
    # against the frames the run wrote
    assert run.returncode == 0 or (run.returncode == 1 and "loss        : YES" in out), out + err
    written = sorted(frames_in(tmp_path / "rdaq_run_master.h5"))
    assert run.returncode == 1 or written == list(range(600)), "without loss every frame is written"
    st = summary["stream"]
    assert got and got[0] > 0, "connected mid-run"
    assert got == [f for f in written if f >= got[0]], "every image from the connection on"
    before = len([f for f in written if f < got[0]])
    assert (st["images_sent"], st["images_dropped"], st["images_encoded"]) == (len(got), before, len(got)), st


def test_an_interrupted_run_still_ends_its_stream(rdaq, tmp_path):
    port = free_port()
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("m", sc.receive(f"tcp://127.0.0.1:{port}", timeout_ms=30000)))
    t.start()
    run = subprocess.Popen([rdaq, "run", "--raw", "--frames", "5000", "--out", tmp_path, "--stream", f"tcp://127.0.0.1:{port}",
                            "--stream-policy", "block"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=60)
    t.join()
    assert "interrupted" in err
    msgs = got["m"]
    assert msgs[0]["type"] == "start" and msgs[-1]["type"] == "end", "end goes out after an interrupted run"
    assert msgs[-1]["user_data"]["rdaq"]["images_sent"] == len(msgs) - 2 < 5000
