"""Spot finding and the veto on a counting detector's counts (`process.mode = "spots"`):
PSI's virtual EIGER's captured frames (one module, four ports, 16 bits), with bright 3 x 3
blocks added to some frames' packets, through `rdaq receive --detector eiger`. The spots the
run wrote equal `rdaq process spots` on its own file (the counts read back, the same pixels
left out), the veto keeps exactly the hits, and a detector that integrates is refused."""
import json
import shutil
import subprocess

import h5py
import hdf5plugin  # noqa: F401
import numpy as np
import pytest

from test_eiger import capture, receive
from test_run_process import spot_lists
from conftest import send_udp

# spots added per frame (frame numbers 2, 3, 4 of the capture): two hits and a miss at the
# default min_spots of 10
SPOTS = {2: 12, 3: 3, 4: 11}


def spotted(streams):
    """The capture's four streams with SPOTS[frame] bright 3 x 3 blocks in the top-left
    port (its packet k carries the port's row k: 512 pixels of 16 bits)."""
    out = [list(st) for st in streams]
    top = out[0]
    for i, p in enumerate(top):
        frame, packet = int.from_bytes(p[:8], "little"), int.from_bytes(p[12:16], "little")
        pixels = np.frombuffer(p[48:], "<u2").copy()
        for s in range(SPOTS[frame]):
            row, col = 10 + 20 * s, 20 + 37 * s
            if row <= packet < row + 3:
                pixels[col:col + 3] += 1000
        top[i] = p[:48] + pixels.tobytes()
    return out


def run(rdaq, tmp_path, veto, stream=None, process=""):
    """`rdaq receive --detector eiger` of the spotted frames with spot finding (the veto on
    or off, more `process` settings), publishing on `stream` when given; its summary and
    master."""
    (tmp_path / "spots.toml").write_text(f'[process]\nmode = "spots"\nveto = {str(veto).lower()}\n{process}'
                                         + (f'[stream]\nendpoint = "{stream}"\npolicy = "block"\n' if stream else ""))
    streams = spotted(capture("eiger_1g_dr16"))
    order = [0, 1, 3, 2]
    return receive(rdaq, tmp_path, 3, ["--detector", "eiger", "--bit-depth", "16", "--link", "1g", "--config", str(tmp_path / "spots.toml")],
                   send=lambda ports: send_udp([(p, ports[i]) for i, st in zip(order, streams) for p in st]), stream=stream)


def test_the_spots_of_a_counting_detector_equal_the_finder_on_its_file(rdaq, tmp_path):
    """Veto off: every frame written with its spot list; the summary counts the spots and
    the hits; `rdaq process spots` on the master (the run's finder settings, the counts
    read back) finds the same spots, and its peakfinder8 as many."""
    s, out = run(rdaq, tmp_path, veto=False)
    assert "spots found in the counts" in s["stderr"] and "veto off" in s["stderr"], s["stderr"]
    p = s["processing"]
    assert (p["signal_frames"], p["hits"], p["vetoed"], s["frames_written"]) == (3, 2, 0, 3), p
    master = out
    n_run, run_spots = spot_lists(master)
    assert n_run.tolist() == [SPOTS[f] for f in (2, 3, 4)] and p["spots_found"] == sum(SPOTS.values())
    with h5py.File(master, "r") as f:
        series = json.loads(f.attrs["rdaq_series"])
        assert series["processing"]["applied"] and series["processing"]["finder"] == "local"
        assert f["entry/result_1/peakTotalIntensity"].attrs["units"] in (b"counts", "counts")
    r = subprocess.run([str(rdaq), "process", "spots", "--input", str(master), "--output", str(tmp_path / "again.h5")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "threshold 0.5 counts" in r.stderr and "masked and saturated pixels are left out" in r.stderr, r.stderr
    n_again, again = spot_lists(tmp_path / "again.h5")
    assert n_again.tolist() == n_run.tolist() and again == run_spots
    # peakfinder8 (offline) on the same counts finds the blocks too
    r = subprocess.run([str(rdaq), "process", "spots", "--input", str(master), "--output", str(tmp_path / "pf8.h5"), "--finder", "peakfinder8",
                        "--asic-nx", "1024", "--asic-ny", "512", "--nasics-x", "1", "--nasics-y", "1", "--adc-threshold", "100"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert spot_lists(tmp_path / "pf8.h5")[0].tolist() == [SPOTS[f] for f in (2, 3, 4)]


def test_peakfinder8_finds_a_counting_detectors_spots_online_as_on_its_file(rdaq, tmp_path):
    """`process.finder = "peakfinder8"` (ADC threshold 100 counts, SNR 5, 2 to 200 pixels,
    background ring 3): the spots found online equal peakfinder8 run by `rdaq process spots`
    on the file with the same settings (the whole image one panel, radii from the beam
    centre, the series' masked and saturated pixels left out), and the file keeps the
    finder's settings."""
    pf8 = 'finder = "peakfinder8"\nthreshold_photons = 100\nsnr = 5\nmin_pixels = 2\nmax_pixels = 200\nlocal_bg_radius = 3\n'
    s, master = run(rdaq, tmp_path, veto=False, process=pf8)
    assert "peakfinder8, ADC threshold 100 counts" in s["stderr"], s["stderr"]
    p = s["processing"]
    assert (p["signal_frames"], p["hits"], p["spots_found"]) == (3, 2, sum(SPOTS.values())), p
    n_run, run_spots = spot_lists(master)
    assert n_run.tolist() == [SPOTS[f] for f in (2, 3, 4)]
    with h5py.File(master, "r") as f:
        series = json.loads(f.attrs["rdaq_series"])
        assert (series["processing"]["finder"], series["processing"]["local_bg_radius"]) == ("peakfinder8", 3)
        cx, cy = series["beam_center"]
    r = subprocess.run([str(rdaq), "process", "spots", "--input", str(master), "--output", str(tmp_path / "pf8.h5"), "--finder", "peakfinder8",
                        "--asic-nx", "1024", "--asic-ny", "512", "--nasics-x", "1", "--nasics-y", "1", "--adc-threshold", "100",
                        "--min-snr", "5", "--min-pixel-count", "2", "--max-pixel-count", "200", "--local-bg-radius", "3",
                        "--center-x", str(cx), "--center-y", str(cy)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    n_off, off = spot_lists(tmp_path / "pf8.h5")
    assert n_off.tolist() == n_run.tolist() and off == run_spots
    # without --finder, `rdaq process spots` takes the run's peakfinder8
    r = subprocess.run([str(rdaq), "process", "spots", "--input", str(master), "--output", str(tmp_path / "again.h5")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "found its spots with peakfinder8" in r.stderr, r.stderr
    assert spot_lists(tmp_path / "again.h5")[1] == run_spots


def test_the_veto_writes_the_hits_of_a_counting_detector(rdaq, tmp_path):
    """Veto on (min_spots 10): the frame with 3 spots is counted as vetoed and not written;
    the hits' images and spot lists are those of the run without the veto."""
    import threading

    import rdaq as rdaq_py
    from conftest import free_port
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    streamed = []
    reader = threading.Thread(target=lambda: streamed.extend(rdaq_py.stream.messages(endpoint, timeout_ms=20000)))
    reader.start()
    s, out = run(rdaq, tmp_path, veto=True, stream=endpoint)
    reader.join()
    p = s["processing"]
    assert (p["signal_frames"], p["hits"], p["vetoed"], s["frames_written"]) == (3, 2, 1, 2), p
    assert s["frames_complete"] == 3, s
    # the stream carries the hits with their spots, the counts' type
    images = [m for m in streamed if m["type"] == "image"]
    assert streamed[0]["image_dtype"] == "uint16" and [m["image_id"] for m in images] == [0, 1]
    assert [len(m["user_data"]["rdaq"]["spots"]["x"]) for m in images] == [SPOTS[2], SPOTS[4]], images[0]["user_data"]
    master = out
    with h5py.File(master, "r") as f:
        assert f["entry/data/frame_number"][:].tolist() == [2, 4]
    assert spot_lists(master)[0].tolist() == [SPOTS[2], SPOTS[4]]


def test_spot_finding_is_for_counting_detectors(rdaq, tmp_path):
    """`process.mode = "spots"` with a JUNGFRAU (whose frames are converted first) or an
    integrating described detector, peakfinder8 online for a JUNGFRAU, or a finder rdaq
    does not have: one line naming the setting, exit 2."""
    (tmp_path / "spots.toml").write_text('[process]\nmode = "spots"\n')
    r = subprocess.run([str(rdaq), "receive", "--format", "sls", "--config", str(tmp_path / "spots.toml"), "--frames", "1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "process.mode = \"spots\"" in r.stderr and "JUNGFRAU" in r.stderr, r.stderr
    r = subprocess.run([str(rdaq), "receive", "--detector", "percival-like", "--config", str(tmp_path / "spots.toml"), "--frames", "1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "integrates" in r.stderr, r.stderr
    # peakfinder8 online is a counting detector's; a finder rdaq does not have is named
    for finder, says in (("peakfinder8", "counting detector"), ("dozor", "must be")):
        (tmp_path / "f.toml").write_text(f'[process]\nfinder = "{finder}"\n')
        r = subprocess.run([str(rdaq), "run", "--config", str(tmp_path / "f.toml"), "--frames", "1", "--out", str(tmp_path / "o")],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "process.finder" in r.stderr and says in r.stderr, r.stderr



@pytest.mark.skipif(shutil.which("dials.import") is None, reason="DIALS is installed by scripts/setup.sh")
def test_dials_finds_the_spots_rdaq_found_in_a_counting_detectors_file(rdaq, tmp_path):
    """DIALS imports the EIGER run's master and `dials.find_spots` finds, within a pixel,
    every spot rdaq found online."""
    from test_dials import HERE, dials
    _, master = run(rdaq, tmp_path, veto=False)
    dials("dials.import", master, cwd=tmp_path)
    dials("dials.find_spots", "imported.expt", "nproc=1", cwd=tmp_path)
    dump = subprocess.run(["/usr/bin/python3", HERE / "dials_dump.py", "imported.expt", "strong.refl"],
                          capture_output=True, text=True, cwd=tmp_path, check=True)
    seen = json.loads(dump.stdout)
    assert seen["images"] == 3
    n, ours = spot_lists(master)
    for img in range(3):
        theirs = np.array([(x, y) for i, _, x, y in seen["spots"] if i == img] or [(-1e9, -1e9)])
        for x, y in zip(ours[img][0], ours[img][1]):
            assert np.hypot(theirs[:, 0] - x, theirs[:, 1] - y).min() <= 1.0, (img, x, y)
    assert sum(len(o[0]) for o in ours) == sum(SPOTS.values())


def test_the_python_acquisition_iterates_a_counting_detectors_frames_with_their_spots(rdaq, tmp_path):
    """`rdaq.Acquisition(source={"detector": "eiger", ...})` with `process.mode = "spots"`:
    the frames sent to its ports come out as uint16 arrays over the chain's buffers, each
    with its spots, equal to the file `rdaq receive` writes from the same packets."""
    import rdaq as rdaq_py  # the Python package (the fixture `rdaq` is the binary)
    _, cli_h5 = run(rdaq, tmp_path, veto=False)
    conf = tmp_path / "py.toml"
    conf.write_text('[network]\ndata_port = 0\n[stream]\nendpoint = "none"\npreview = "none"\n[output]\nname = "py"\n'
                    '[process]\nmode = "spots"\nveto = false\n')
    streams, order, got = spotted(capture("eiger_1g_dr16")), [0, 1, 3, 2], {}
    source = {"detector": "eiger", "bit_depth": 16, "link": "1g"}
    with rdaq_py.Acquisition(config=conf, frames=3, out=tmp_path / "py", source=source) as acq:
        assert len(acq.ports) == 4 and acq.shape == (512, 1024)
        send_udp([(p, acq.ports[i]) for i, st in zip(order, streams) for p in st])
        for frame in acq:
            a = np.asarray(frame)
            assert a.dtype == np.uint16 and np.shares_memory(a, frame.array)
            got[frame.number] = (a.copy(), len(frame.spots), frame.hit)
            del a
            frame.release()
    assert acq.summary["processing"]["hits"] == 2, acq.summary
    with h5py.File(cli_h5, "r") as f:
        numbers = f["entry/data/frame_number"][:].tolist()
        assert sorted(got) == numbers == [2, 3, 4]
        for i, n in enumerate(numbers):
            assert np.array_equal(got[n][0], f["entry/data/data"][i]), f"frame {n}"
            assert got[n][1:] == (SPOTS[n], SPOTS[n] >= 10)


def test_the_python_acquisition_of_an_emulated_counting_detector(tmp_path):
    """`rdaq.Acquisition` without a source runs `rdaq run`'s acquisition: with an emulated
    EIGER (`detector.name`) and `process.mode = "spots"` it hands out the counts (uint16)
    with their spots, equal to the file it writes, as with a source."""
    import rdaq as rdaq_py
    conf = tmp_path / "py.toml"
    conf.write_text('[detector]\nname = "eiger"\nbit_depth = 16\n[stream]\nendpoint = "none"\npreview = "none"\n'
                    '[output]\nname = "py"\n[process]\nmode = "spots"\nveto = false\n')
    got = {}
    with rdaq_py.Acquisition(config=conf, frames=4, out=tmp_path / "py") as acq:
        for frame in acq:
            a = np.asarray(frame)
            assert a.dtype == np.uint16
            got[frame.number] = (a.copy(), len(frame.spots))
            del a
            frame.release()
    assert acq.summary["frames_written"] == 4 and acq.summary["processing"]["signal_frames"] == 4, acq.summary
    with h5py.File(tmp_path / "py" / "py_master.h5", "r") as f:
        numbers = f["entry/data/frame_number"][:].tolist()
        assert sorted(got) == sorted(numbers) and len(numbers) == 4
        n_peaks = f["entry/result_1/nPeaks"][:].tolist()
        for i, n in enumerate(numbers):
            assert np.array_equal(got[n][0], f["entry/data/data"][i]) and got[n][1] == n_peaks[i], f"frame {n}"


def test_the_acquisition_service_finds_a_counting_detectors_spots(rdaq, tmp_path):
    """The acquisition service of one receiver (`rdaq receive --detector eiger --data-root
    --serve`) with `process.mode = "spots"`: a dataset of the spotted frames writes the hits
    (the veto on), and its summary and live view count the spots."""
    import signal

    from conftest import free_port, free_udp_port
    from rdaq.control import Service
    from test_readme_daemons import wait_up
    (tmp_path / "spots.toml").write_text('[process]\nmode = "spots"\n')
    addr, port = f"127.0.0.1:{free_port()}", free_udp_port()
    p = subprocess.Popen([rdaq, "receive", "--detector", "eiger", "--bit-depth", "16", "--link", "1g", "--port", str(port),
                          "--config", tmp_path / "spots.toml", "--stream", "none", "--frame-timeout-ms", "200",
                          "--data-root", tmp_path / "data", "--serve", addr], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_up(f"http://{addr}/acquisition", p)
        svc = Service(f"http://{addr}")
        svc.arm(3, "lyso")
        svc.trigger()
        streams = spotted(capture("eiger_1g_dr16"))
        send_udp([(d, port + i) for i, st in enumerate(streams) for d in st])
        a = svc.wait("idle", timeout=60)
    finally:
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    s = a["dataset"]["summary"]
    assert (s["processing"]["hits"], s["processing"]["vetoed"], s["processing"]["spots_found"], s["frames_written"]) == (2, 1, 26, 2), s
    assert a["live"]["processing"]["hits"] == 2, a["live"]
    with h5py.File(tmp_path / "data" / "lyso_master.h5", "r") as f:
        assert f["entry/data/frame_number"][:].tolist() == [2, 4]


def test_rdaq_run_of_an_emulated_counting_detector_finds_spots_too(rdaq, tmp_path):
    """`rdaq run` with `detector.name = "eiger"` (its own packets emulated in the process)
    and `process.mode = "spots"`: every frame is judged (the emulator's counting pattern is
    not physics: no spots), the files carry the spot lists and the finder's settings."""
    (tmp_path / "c.toml").write_text('[detector]\nname = "eiger"\nbit_depth = 16\n[process]\nmode = "spots"\nveto = false\n'
                                     '[emulator]\nframes = 5\n')
    r = subprocess.run([str(rdaq), "run", "--config", str(tmp_path / "c.toml"), "--out", str(tmp_path / "o"), "--stream", "none",
                        "--preview", "none", "--summary-json", str(tmp_path / "s.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["frames_written"] == 5 and s["processing"]["signal_frames"] == 5, s
    master = tmp_path / "o" / "rdaq_run_master.h5"
    n, _ = spot_lists(master)
    assert len(n) == 5 and int(n.sum()) == s["processing"]["spots_found"]
    with h5py.File(master, "r") as f:
        assert json.loads(f.attrs["rdaq_series"])["processing"]["applied"]


def test_a_receiver_daemon_finds_a_counting_detectors_spots(rdaq, tmp_path):
    """The receiver daemon with native EIGER buffers and an acquisition whose configuration
    says `process.mode = "spots"`: the spotted frames are written with their spot lists, as
    `rdaq receive` writes them."""
    import time

    from test_control_api import call
    from test_native_daemons import buffers, receiver_daemon
    _, cli_h5 = run(rdaq, tmp_path, veto=False)
    streams = spotted(capture("eiger_1g_dr16"))
    proc, url, _ = receiver_daemon(rdaq, tmp_path)
    try:
        code, m = buffers(url, 1 << 20, {"detector": "eiger", "bit_depth": 16, "link": "1g"})
        assert code == 200 and len(m["data_ports"]) == 4, m
        code, started = call("POST", url + "/start", {"output": "eiger.h5", "config": {"process": {"mode": "spots", "veto": False}}})
        assert code == 200, started
        send_udp([(d, m["data_ports"][i]) for i, st in enumerate(streams) for d in st])
        deadline = time.monotonic() + 20
        while call("GET", url + "/status")[1]["counters"]["frames_complete"] < 3:
            assert time.monotonic() < deadline, call("GET", url + "/status")
            time.sleep(0.05)
        code, stopped = call("POST", url + "/stop", {})
        assert code == 200, stopped
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert stopped["frames_written"] == 3, stopped
    (n_daemon, daemon), (n_cli, cli) = spot_lists(stopped["output"]), spot_lists(cli_h5)
    assert n_daemon.tolist() == n_cli.tolist() == [SPOTS[f] for f in (2, 3, 4)] and daemon == cli


def test_the_dashboard_glances_at_a_counting_detectors_frames(rdaq, tmp_path):
    """`rdaq run --serve` of an emulated EIGER with spot finding: the dashboard's snapshot
    shows the counting glance (its unit counts, the image's size), `/dashboard/preview.png`
    renders it at the image's size, and `rdaq preview` renders the live preview's counts."""
    import signal
    import struct
    import time
    import urllib.request

    from conftest import free_port
    conf = tmp_path / "c.toml"
    conf.write_text('[detector]\nname = "eiger"\nbit_depth = 16\nmodules = 1\n[process]\nmode = "spots"\nveto = false\n'
                    f'[emulator]\nframes = 100000\nrate_hz = 20\n[stream]\nendpoint = "none"\npreview = "tcp://127.0.0.1:{free_port()}"\n')
    preview = conf.read_text().split('preview = "')[1].split('"')[0]
    port = free_port()
    p = subprocess.Popen([str(rdaq), "run", "--config", str(conf), "--out", str(tmp_path / "o"), "--serve", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, glance = time.monotonic() + 60, None
        while glance is None:
            assert p.poll() is None and time.monotonic() < deadline, "no glance on the dashboard"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/dashboard/snapshot", timeout=5) as r:
                    glance = json.loads(r.read()).get("preview")
            except OSError:
                pass
            time.sleep(0.2)
        assert (glance["unit"], glance["width"], glance["height"]) == ("counts", 1024, 512), glance
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/dashboard/preview.png", timeout=10) as r:
            png = r.read()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (1024, 512)
        r = subprocess.run([str(rdaq), "preview", "--from", preview, "--png", str(tmp_path / "live.png"), "--timeout-s", "30"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert struct.unpack(">II", (tmp_path / "live.png").read_bytes()[16:24]) == (1024, 512)
    finally:
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    assert p.returncode in (0, 130), err
