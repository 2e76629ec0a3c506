"""Online processing of a real JUNGFRAU stream: PSI's virtual JUNGFRAU packets (one and two
interfaces, a 256-row partial readout) replayed into `rdaq receive --format sls` with a
calibration go through the same processing graph as `rdaq run`. The photon counts in its
file must equal, bit for bit, `rdaq process convert` on the raw file of the same frames,
and aare's conversion (keV over the photon energy, rounded half away from zero)."""
import json
import subprocess
import threading

import aare
import h5py
import hdf5plugin  # noqa: F401
import numpy as np
import pytest

from conftest import free_port
from test_process import write_calibration
from test_sls_replay import finish, replay, start_receiver

KEV = 12.4

CASES = {
    "one interface": (1, [("jungfrau_virtual.bin", 0)], 3, 512, []),
    "two interfaces": (2, [("jungfrau_virtual_2if_port50001.bin", 0), ("jungfrau_virtual_2if_port50002.bin", 1)], 2, 512, []),
    "256 rows": (1, [("jungfrau_virtual_readnrows256.bin", 0)], 1, 256, ["--read-rows", "256"]),
}


def calibration(rows, seed=7):
    """Per-pixel pedestals near the virtual detector's ADC values (1..128) and PSI-like
    gains, so every gain stage converts to counts of both signs."""
    rng = np.random.default_rng(seed)
    pedestal = np.stack([rng.uniform(0, 130, (rows, 1024)) for _ in range(3)]).astype(np.float32)
    gain = np.stack([rng.normal(m, abs(0.02 * m), (rows, 1024)) for m in (41.0, -1.439, -0.1145)]).astype(np.float32)
    return pedestal, gain


def receive(rdaq, tmp_path, case, extra):
    interfaces, captures, frames, _, case_extra = CASES[case]
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, interfaces, frames, extra=[*case_extra, *extra])
    replay([(capture, ports[i]) for capture, i in captures])
    return finish(proc, summary), out


@pytest.mark.parametrize("case", list(CASES))
def test_processed_stream_equals_offline_conversion_and_aare(rdaq, tmp_path, case):
    rows = CASES[case][3]
    pedestal, gain = calibration(rows)
    write_calibration(tmp_path / "cal.h5", pedestal, gain, np.zeros((rows, 1024), np.uint32))
    # the captures hold a few frames with too few spots for a hit: keep every frame
    (tmp_path / "proc.toml").write_text('[process]\nveto = false\noutput = "photons32"\n')
    raw_dir, proc_dir = tmp_path / "raw", tmp_path / "processed"
    raw_dir.mkdir(), proc_dir.mkdir()
    s_raw, raw_h5 = receive(rdaq, raw_dir, case, [])
    s, out = receive(rdaq, proc_dir, case, ["--calibration", tmp_path / "cal.h5", "--config", tmp_path / "proc.toml",
                                            "--photon-energy-kev", str(KEV)])
    assert s_raw["processing"] is None and s["processing"] is not None, s["stderr"]
    assert s["processing"]["signal_frames"] == s["frames_complete"] == s_raw["frames_complete"]
    assert s["processing"]["frames_written"] == s["frames_written"] == s_raw["frames_written"]
    subprocess.run([rdaq, "process", "convert", "--input", raw_h5, "--calibration", tmp_path / "cal.h5",
                    "--photon-kev", str(KEV), "--counts", "i32", "--output", tmp_path / "offline.h5"], check=True)
    with h5py.File(out, "r") as f, h5py.File(raw_h5, "r") as r, h5py.File(tmp_path / "offline.h5", "r") as o:
        online, raw, offline = f["entry/data/data"][()], r["entry/data/data"][()], o["entry/data/data"][()]
        assert online.dtype == np.int32 and online.shape == raw.shape == (CASES[case][2], rows, 1024)
        assert f["entry/data/frame_number"][:].tolist() == r["entry/data/frame_number"][:].tolist()
    # counts of both signs in every gain stage: nothing trivially equal
    assert online.min() < -50 and online.max() > 50 and np.unique(online).size > 100, (online.min(), online.max())
    assert np.array_equal(online, offline), "online and offline photon counts differ"
    assert np.array_equal(online, aare_counts(raw, pedestal, gain)), "photon counts differ from aare's conversion"


def aare_counts(raw, pedestal, gain):
    """aare's conversion of raw frames into photons at KEV (keV over the photon energy,
    rounded half away from zero), as int32."""
    kev = aare.apply_calibration(raw, pd=pedestal, cal=gain)
    q = (kev / np.float32(KEV)).astype(np.float64)
    return (np.sign(q) * np.floor(np.abs(q) + 0.5)).astype(np.int32)


def raw_and_with_gain_maps(rdaq, tmp_path, case, gain_map, hg0, calibration):
    """The case's frames received raw, then processed with `calibration` and the gain map
    (photons32, the veto off): the raw file, and the processed run's summary and file."""
    (tmp_path / "proc.toml").write_text(f'[process]\nveto = false\noutput = "photons32"\n'
                                        f'gain_maps = ["{gain_map}"]\nhg0 = {str(hg0).lower()}\n')
    raw_dir, proc_dir = tmp_path / "raw", tmp_path / "processed"
    raw_dir.mkdir(), proc_dir.mkdir()
    _, raw_h5 = receive(rdaq, raw_dir, case, [])
    s, out = receive(rdaq, proc_dir, case, ["--calibration", calibration, "--config", tmp_path / "proc.toml",
                                            "--photon-energy-kev", str(KEV)])
    assert s["processing"] is not None, s["stderr"]
    return raw_h5, s, out


@pytest.mark.parametrize("case,hg0", [("one interface", False), ("256 rows", True)])
def test_psi_gain_maps_give_the_gains_as_aare_reads_them(rdaq, tmp_path, case, hg0):
    """PSI's gain map file (6 float64 maps of 512 x 1024: G0, G1, G2, HG0, HG1, HG2) gives
    the gains, read as aare's load_calibration reads it (HG0 for G0 in fixed high gain); the
    pedestals come from rdaq's calibration file. A partial readout takes the map's central
    rows."""
    rows = CASES[case][3]
    rng = np.random.default_rng(11)
    maps = np.stack([rng.normal(m, abs(0.02 * m), (512, 1024)) for m in (41.0, -1.439, -0.1145, 120.0, -4.2, -0.3)])
    maps.astype("<f8").tofile(tmp_path / "gainMaps_M001.bin")
    pedestal, _ = calibration(rows)
    write_calibration(tmp_path / "cal.h5", pedestal, np.ones((3, rows, 1024), np.float32), np.zeros((rows, 1024), np.uint32))
    raw_h5, s, out = raw_and_with_gain_maps(rdaq, tmp_path, case, tmp_path / "gainMaps_M001.bin", hg0, tmp_path / "cal.h5")
    gains = aare.load_calibration(str(tmp_path / "gainMaps_M001.bin"), hg0=hg0).astype(np.float32)
    top = (512 - rows) // 2
    gains = np.ascontiguousarray(gains[:, top:top + rows])
    with h5py.File(out, "r") as f, h5py.File(raw_h5, "r") as r:
        online, raw = f["entry/data/data"][()], r["entry/data/data"][()]
    q = (aare.apply_calibration(raw, pd=pedestal, cal=gains) / np.float32(KEV)).astype(np.float64)
    ref = (np.sign(q) * np.floor(np.abs(q) + 0.5)).astype(np.int32)
    assert np.unique(online).size > 20
    assert np.array_equal(online, ref), "photon counts differ from aare's with the gain map"


@pytest.mark.parametrize("case,hg0", [("one interface", False), ("256 rows", True)])
def test_a_psi_pedestal_file_gives_the_pedestals_and_bad_pixels(rdaq, tmp_path, case, hg0):
    """A pedestal file of PSI's tools (jungfrau_utils' layout: /gains holds the pedestals of
    G0, G1, G2 and HG0 over the stacked modules, /pixel_mask the bad pixels) is taken as the
    calibration: the counts equal aare's conversion with those pedestals (HG0's for G0 in
    fixed high gain; a partial readout takes the central rows) and the gain map's gains, and
    its bad pixels are masked."""
    rows = CASES[case][3]
    rng = np.random.default_rng(5)
    maps = np.stack([rng.normal(m, abs(0.02 * m), (512, 1024)) for m in (41.0, -1.439, -0.1145, 120.0, -4.2, -0.3)])
    maps.astype("<f8").tofile(tmp_path / "gainMaps_M000.bin")
    # G0's and HG0's pedestals far from the ADC values, so that G0's words convert to counts
    # that tell the two apart
    pedestals = rng.uniform(0, 130, (4, 512, 1024))
    pedestals[[0, 3]] = rng.uniform(-6000, 6000, (2, 512, 1024))
    bad = np.zeros((512, 1024), np.int32)
    bad[rng.integers(0, 512, 40), rng.integers(0, 1024, 40)] = 1 << rng.integers(0, 3, 40)
    with h5py.File(tmp_path / "pedestal.h5", "w") as f:
        f["gains"] = pedestals
        f["gainsRMS"] = rng.uniform(1, 3, (4, 512, 1024))
        f["pixel_mask"] = bad
    raw_h5, s, out = raw_and_with_gain_maps(rdaq, tmp_path, case, tmp_path / "gainMaps_M000.bin", hg0, tmp_path / "pedestal.h5")
    assert "is a PSI pedestal file (jungfrau_utils' layout): its pedestals and bad pixels, with the gains of process.gain_maps" in s["stderr"]
    top = (512 - rows) // 2
    central = slice(top, top + rows)
    pd = np.ascontiguousarray(pedestals[[3 if hg0 else 0, 1, 2]][:, central]).astype(np.float32)
    gains = np.ascontiguousarray(aare.load_calibration(str(tmp_path / "gainMaps_M000.bin"), hg0=hg0).astype(np.float32)[:, central])
    with h5py.File(out, "r") as f, h5py.File(raw_h5, "r") as r:
        online, raw = f["entry/data/data"][()], r["entry/data/data"][()]
    q = (aare.apply_calibration(raw, pd=pd, cal=gains) / np.float32(KEV)).astype(np.float64)
    ref = (np.sign(q) * np.floor(np.abs(q) + 0.5)).astype(np.int32)
    masked = np.broadcast_to(bad[central] != 0, online.shape)
    assert masked.any() and np.unique(online[~masked]).size > 20
    assert (online[masked] == np.iinfo(np.int32).min).all(), "PSI's bad pixels are not masked"
    assert np.array_equal(online[~masked], ref[~masked]), "photon counts differ from aare's with PSI's pedestals"


def test_processing_of_a_stream_needs_its_calibration(rdaq, tmp_path):
    """Processing asked for without a calibration: one line naming the setting, exit 2."""
    (tmp_path / "proc.toml").write_text('[process]\nmode = "jungfrau"\n')
    r = subprocess.run([rdaq, "receive", "--format", "sls", "--config", tmp_path / "proc.toml", "--frames", "1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "process.calibration" in r.stderr, r.stderr


def test_a_pedestal_run_makes_the_calibration_the_next_acquisition_uses(rdaq, tmp_path):
    """`rdaq receive --pedestal-run`: PSI's virtual JUNGFRAU sends columns 0-299 in G0,
    300-599 in G1 and 600-1023 in G2, each pixel's ADC its packet number + 1: each pixel's
    pedestal of its stage is that ADC, the gains are the gain map's, and the stages a pixel
    never showed are masked. Converted with that calibration, the same frames are 0 photons
    wherever the pixel is not masked."""
    rng = np.random.default_rng(5)
    maps = np.stack([rng.normal(m, abs(0.02 * m), (512, 1024)) for m in (41.0, -1.439, -0.1145)])
    maps.astype("<f8").tofile(tmp_path / "gainMaps_M001.bin")
    (tmp_path / "maps.toml").write_text(f'[process]\ngain_maps = ["{tmp_path / "gainMaps_M001.bin"}"]\n')
    (tmp_path / "dark").mkdir()
    s, _ = receive(rdaq, tmp_path / "dark", "one interface", ["--pedestal-run", tmp_path / "cal.h5", "--config", tmp_path / "maps.toml"])
    assert s["frames_complete"] == 3 and "pedestal run of 3 frames" in s["stderr"], s["stderr"]
    # each pixel showed one stage: the run says which stages most pixels never showed
    assert "warning: G1 was measured in 29.3% of the pixels: take dark frames with the detector in forceswitchg1" in s["stderr"], s["stderr"]
    adc = (np.arange(512) // 4 + 1).astype(np.float32)[:, None] * np.ones((1, 1024), np.float32)
    stage_of = np.zeros(1024, int)
    stage_of[300:600], stage_of[600:] = 1, 2
    with h5py.File(tmp_path / "cal.h5", "r") as c:
        pedestal, gain, mask = c["pedestal"][()], c["gain"][()], c["pixel_mask"][()]
        assert c["pedestal_frames"][:].tolist() == [3, 3, 3]
    for s_ in range(3):
        cols = stage_of == s_
        assert np.array_equal(pedestal[s_][:, cols], adc[:, cols]), f"G{s_} pedestal"
    assert np.array_equal(gain, aare.load_calibration(str(tmp_path / "gainMaps_M001.bin")).astype(np.float32))
    # every pixel showed one stage: the other two are masked (too few frames)
    assert (mask != 0).all() and set(np.unique(mask).tolist()) == {2}
    # a calibration that masks every pixel is refused at start, naming the limit...
    r = subprocess.run([rdaq, "receive", "--format", "sls", "--calibration", tmp_path / "cal.h5", "--frames", "1",
                        "--timeout-s", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "module 0 has 100.0% of its pixels masked, more than process.max_masked = 0.1" in r.stderr, r.stderr
    # ...unless told to take it anyway, and the start says how much it masks
    (tmp_path / "any.toml").write_text("[process]\nmax_masked = 1.0\nveto = false\n")
    (tmp_path / "masked").mkdir()
    s, _ = receive(rdaq, tmp_path / "masked", "one interface", ["--calibration", tmp_path / "cal.h5", "--config", tmp_path / "any.toml"])
    assert "calibration: pixels masked per module: 100.0%" in s["stderr"], s["stderr"]
    # the next acquisition: with the masks cleared, each pixel converts to 0 photons
    with h5py.File(tmp_path / "cal.h5", "r+") as c:
        c["pixel_mask"][...] = 0
    (tmp_path / "next").mkdir()
    (tmp_path / "proc.toml").write_text('[process]\nveto = false\noutput = "photons32"\n')
    s, out = receive(rdaq, tmp_path / "next", "one interface", ["--calibration", tmp_path / "cal.h5", "--config", tmp_path / "proc.toml"])
    with h5py.File(out, "r") as f:
        assert s["processing"] is not None and (f["entry/data/data"][()] == 0).all()


def test_a_receiver_on_its_own_shows_its_dashboard(rdaq, tmp_path):
    """`rdaq receive --dashboard PORT` serves the page (and /status) of `rdaq run --serve`:
    the processing counts while it runs, the summary after it, until Ctrl-C."""
    import json
    import signal
    import time
    import urllib.request
    from conftest import free_port
    pedestal, gain = calibration(512)
    write_calibration(tmp_path / "cal.h5", pedestal, gain, np.zeros((512, 1024), np.uint32))
    (tmp_path / "proc.toml").write_text('[process]\nveto = false\n')
    port = free_port()
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 1, 3, extra=["--dashboard", str(port), "--calibration", tmp_path / "cal.h5",
                                                                            "--config", tmp_path / "proc.toml"])

    def status():
        return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5).read())
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                s = status()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        assert s["state"] == "acquiring" and s["frames_expected"] == 3
        replay([("jungfrau_virtual.bin", ports[0])])
        while status()["state"] != "finished":
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        s = status()
        assert s["result"]["summary"]["frames_complete"] == 3 and s["process"]["signal_frames"] == 3
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).status == 200
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)
        assert proc.returncode == 0
    finally:
        proc.kill()


def test_a_pedestal_run_leaves_incomplete_frames_out_and_says_so(rdaq, tmp_path):
    """A 256-row readout into a receiver expecting 512 rows: the frame is incomplete, its
    missing rows no dark signal, so the run takes no frame, says it left one out, and writes
    no calibration."""
    proc, ports, _, summary = start_receiver(rdaq, tmp_path, 1, 1, extra=["--pedestal-run", tmp_path / "cal.h5"])
    replay([("jungfrau_virtual_readnrows256.bin", ports[0])])
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "no complete frame came (1 incomplete left out)" in err, out + err
    assert json.loads(summary.read_text())["frames_incomplete"] == 1
    assert not (tmp_path / "cal.h5").exists()


def test_python_acquisition_of_a_detector_outside_equals_rdaq_receive(rdaq, tmp_path):
    """`rdaq.Acquisition(source=...)` runs `rdaq receive`'s acquisition: the PSI captures sent
    to its ports come out as processed frames, numpy arrays over the graph's buffers, equal to
    what `rdaq receive --calibration` writes from the same packets; its errors name the
    source's fields."""
    import rdaq as rdaq_py  # the Python package (the fixture `rdaq` is the binary)
    case = "two interfaces"
    interfaces, captures, frames, rows, _ = CASES[case]
    pedestal, gain = calibration(rows)
    cal = tmp_path / "cal.h5"
    write_calibration(cal, pedestal, gain, np.zeros((rows, 1024), np.uint32))
    (tmp_path / "proc.toml").write_text('[process]\nveto = false\noutput = "photons32"\n')
    (tmp_path / "cli").mkdir()
    s_cli, cli_h5 = receive(rdaq, tmp_path / "cli", case, ["--calibration", cal, "--config", tmp_path / "proc.toml", "--photon-energy-kev", str(KEV)])
    conf = tmp_path / "py.toml"
    port = free_port()
    conf.write_text(f'[detector]\nphoton_energy_kev = {KEV}\n[network]\ndata_port = 0\n[stream]\nendpoint = "tcp://127.0.0.1:{port}"\n'
                    f'policy = "block"\npreview = "none"\n[output]\nname = "py"\n[process]\ncalibration = "{cal}"\nveto = false\noutput = "photons32"\n')
    got, streamed = {}, []
    reader = threading.Thread(target=lambda: streamed.extend(rdaq_py.stream.messages(f"tcp://127.0.0.1:{port}", timeout_ms=20000)))
    reader.start()
    with rdaq_py.Acquisition(config=conf, frames=frames, out=tmp_path / "py", source={"format": "sls", "interfaces": interfaces}) as acq:
        assert len(acq.ports) == interfaces and acq.shape == (rows, 1024)
        replay([(c, acq.ports[i]) for c, i in captures])
        for frame in acq:
            a = np.asarray(frame)
            assert np.shares_memory(a, frame.array) and a.dtype == np.int32
            got[frame.number] = a.copy()
            del a
            frame.release()
    reader.join()
    # the series announces the frames the source stops after, as rdaq receive's does
    assert streamed[0]["type"] == "start" and streamed[0]["number_of_images"] == frames, [m["type"] for m in streamed]
    assert acq.summary["frames_written"] == frames == s_cli["frames_written"], acq.summary
    assert acq.summary["processing"]["signal_frames"] == frames
    with h5py.File(cli_h5, "r") as f, h5py.File(tmp_path / "py" / "py_master.h5", "r") as p:
        numbers = f["entry/data/frame_number"][:].tolist()
        assert sorted(got) == numbers == p["entry/data/frame_number"][:].tolist()
        for i, n in enumerate(numbers):
            assert np.array_equal(got[n], f["entry/data/data"][i]), f"frame {n}"
        assert np.array_equal(p["entry/data/data"][()], f["entry/data/data"][()])
    with pytest.raises(ValueError, match="source: unknown field `lnk`"):
        rdaq_py.Acquisition(config=conf, source={"lnk": "10g"})
    with pytest.raises(ValueError, match="source.bit_depth"):
        rdaq_py.Acquisition(config=conf, source={"bit_depth": 12})
    (tmp_path / "raw.toml").write_text('[stream]\nendpoint = "none"\n')
    with pytest.raises(ValueError, match="process"):
        rdaq_py.Acquisition(config=tmp_path / "raw.toml", source={"format": "sls"})
