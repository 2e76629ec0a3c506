"""`rdaq run --raw` end to end: every frame in the NXmx file, read with h5py + hdf5plugin,
matches the emulator's manifest hash. Modules are found in the assembled image through the file's own
NXmx module description (data_origin), so the test checks the geometry too."""
import csv
import json
import re
import subprocess

import h5py
import hdf5plugin  # noqa: F401  (registers the bitshuffle filter with h5py)
import numpy as np
import xxhash


def test_run_writes_every_frame_bit_exact(rdaq, tmp_path):
    out = tmp_path / "out"
    summary = tmp_path / "summary.json"
    r = subprocess.run([str(rdaq), "run", "--raw", "--out", str(out), "--summary-json", str(summary)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "loss        : none" in r.stdout
    # each time and rate says what it measures
    assert re.search(r"receive buffer 64 MiB asked, \d+ MiB granted", r.stderr), r.stderr
    # the host's transport settings, as found, each on its own line
    for setting in ("socket receive buffer", "net.core.netdev_max_backlog", "busy polling", "interface MTU", "CPU placement", "ring in huge pages"):
        assert f"rdaq run: tuning: {setting}: " in r.stderr, (setting, r.stderr)
    assert re.search(r"GB/s over the [\d.]+ s data window \(first to last frame\)", r.stdout), r.stdout
    assert re.search(r"elapsed     : [\d.]+ s \(start to end, waits included\)", r.stdout), r.stdout
    assert "not asked" not in r.stdout, "nothing to explain when nothing was lost"
    s = json.loads(summary.read_text())
    assert 0 < s["data_window_s"] < s["elapsed_s"]
    assert abs(s["gb_per_s"] - s["bytes_placed"] / 1e9 / s["data_window_s"]) < 1e-6
    assert s["frames_complete"] == s["frames_expected"] == 1000
    assert s["datagrams_dropped"] == 0 and s["kernel_drops"] == 0
    # every frame timed through every step: sent, received, complete, processed, written
    steps = {l["step"]: l for l in s["latency"]}
    assert list(steps) == ["sent -> received", "received -> complete", "complete -> processed", "processed -> written"]
    assert all(l["frames"] == 1000 and 0 < l["p50_us"] <= l["p99_us"] <= l["max_us"] for l in steps.values()), steps
    assert re.search(r"latency     : sent -> received +p50 +[\d.]+ ms", r.stdout), r.stdout

    manifest = {(int(row["frame"]), int(row["module"])): row["xxh3"]
                for row in csv.DictReader(open(out / "rdaq_run_manifest.csv"))}
    assert len(manifest) == 2000
    with h5py.File(out / "rdaq_run_master.h5", "r") as f:
        assert f["entry"].attrs["NX_class"] == "NXentry"
        assert f["entry/definition"][()] == b"NXmx"
        data = f["entry/data/data"]
        # 2 modules stacked along the slow axis with the default 36-pixel gap
        assert data.shape == (1000, 512 + 36 + 512, 1024) and data.dtype == np.uint16
        # the master's virtual dataset reads the data files; in them, one frame per chunk
        assert data.is_virtual and [v.file_name for v in data.virtual_sources()] == ["rdaq_run_data_000001.h5"]
        stored = f["entry/data/data_000001"]  # the external link XDS/Durin follow
        assert stored.shape == data.shape and stored.chunks == (1, 1060, 1024)
        det = f["entry/instrument/detector"]
        origins = [tuple(det[f"module_{m}/data_origin"][:]) for m in range(2)]
        assert origins == [(0, 0), (548, 0)]
        mask = det["pixel_mask"][:]
        assert (mask[512:548] == 1).all() and (mask[:512] == 0).all() and (mask[548:] == 0).all()
        assert 32008 in [int(k) for k in stored._filters]
        frame_numbers = f["entry/data/frame_number"][:]
        assert sorted(frame_numbers.tolist()) == list(range(1000))
        assert f["entry/data/frame_complete"][:].all()
        for i in range(data.shape[0]):
            img = data[i]
            assert (img[512:548] == 0xFFFF).all(), "gap rows carry the marker"
            for m, (r0, c0) in enumerate(origins):
                module = np.ascontiguousarray(img[r0:r0 + 512, c0:c0 + 1024])
                h = xxhash.xxh3_64_hexdigest(module.tobytes())
                assert h == manifest[(int(frame_numbers[i]), m)], f"frame {frame_numbers[i]} module {m}"
        assert abs(f["entry/instrument/beam/incident_wavelength"][()] - 12.398 / 12.4) < 1e-3


def test_run_refuses_a_bad_configuration(rdaq, tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[receiver]\npolicy = \"sometimes\"\n")
    r = subprocess.run([str(rdaq), "run", "--config", str(cfg), "--out", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "receiver.policy" in r.stderr
    cfg.write_text("[emulator]\nframez = 3\n")
    r = subprocess.run([str(rdaq), "run", "--config", str(cfg), "--out", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "framez" in r.stderr
    cfg.write_text("[detector]\nmodules = \"two\"\n")
    r = subprocess.run([str(rdaq), "run", "--config", str(cfg), "--out", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "detector.modules (line 2, column 11)" in r.stderr, r.stderr
    r = subprocess.run([str(rdaq), "run", "--frames", "0", "--out", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "emulator.frames" in r.stderr, r.stderr
    # numbers that would have aborted on an allocation are one-line errors naming the field
    for text, field in [("[detector]\ngap_y = 1000000\n", "detector.gap_y"), ("[reliability]\nhistory_mib = 100000000\n", "reliability.history_mib"),
                        ("[process]\nworkers = 100000\n", "process.workers"), ("[detector]\nspots_per_frame = 1e12\n", "detector.spots_per_frame")]:
        cfg.write_text(text)
        r = subprocess.run([str(rdaq), "run", "--config", str(cfg), "--out", str(tmp_path)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and field in r.stderr and len(r.stderr.strip().splitlines()) == 1, (text, r.returncode, r.stderr)
    assert not (tmp_path / "rdaq_run_master.h5").exists(), "nothing starts half-configured"


def test_run_assembles_a_module_grid(rdaq, tmp_path):
    """4 modules as 2 x 2 with gaps: every module is where data_origin says, bit-exact."""
    cfg = tmp_path / "grid.toml"
    cfg.write_text("[detector]\nmodules = 4\nmodule_cols = 2\n[emulator]\nframes = 40\nrate_hz = 100.0\n"
                   "[receiver]\nring_mib = 512\n")
    out = tmp_path / "out"
    r = subprocess.run([str(rdaq), "run", "--raw", "--config", str(cfg), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    manifest = {(int(row["frame"]), int(row["module"])): row["xxh3"]
                for row in csv.DictReader(open(out / "rdaq_run_manifest.csv"))}
    with h5py.File(out / "rdaq_run_master.h5", "r") as f:
        data = f["entry/data/data"]
        assert data.shape == (40, 2 * 512 + 36, 2 * 1024 + 8)
        det = f["entry/instrument/detector"]
        origins = [tuple(det[f"module_{m}/data_origin"][:]) for m in range(4)]
        assert origins == [(0, 0), (0, 1032), (548, 0), (548, 1032)]
        frame_numbers = f["entry/data/frame_number"][:]
        for i in range(data.shape[0]):
            img = data[i]
            assert (img[:, 1024:1032] == 0xFFFF).all() and (img[512:548] == 0xFFFF).all()
            for m, (r0, c0) in enumerate(origins):
                h = xxhash.xxh3_64_hexdigest(np.ascontiguousarray(img[r0:r0 + 512, c0:c0 + 1024]).tobytes())
                assert h == manifest[(int(frame_numbers[i]), m)], f"frame {frame_numbers[i]} module {m}"


def test_raw_frames_through_several_workers_come_out_in_order(rdaq, tmp_path):
    """Three assemble workers (more than this machine's cores, so they finish out of order):
    the file holds every frame in the source's order, bit-exact, as does the stream."""
    cfg = tmp_path / "w.toml"
    cfg.write_text("[process]\nworkers = 3\nring_frames = 2\n[emulator]\nframes = 300\nrate_hz = 300.0\n")
    out = tmp_path / "out"
    r = subprocess.run([str(rdaq), "run", "--raw", "--config", str(cfg), "--out", str(out), "--stream", "none", "--preview", "none",
                        "--tolerate-loss", "--summary-json", str(tmp_path / "s.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["consumer"] == "assembling (3 workers) and writing frames"
    assert isinstance(s["consumer_waits"], int), "the source's waits for a buffer are counted"
    assert s["frames_written"] == s["frames_complete"] + s["frames_incomplete"] > 0
    # the writer's I/O threads copied every chunk into the data files (read back below)
    assert s["chunks_handed_on"] == s["frames_written"] and isinstance(s["io_waits"], int), s
    assert f"{s['chunks_handed_on']} chunks written out by the writer's 2 I/O threads" in r.stdout
    manifest = {(int(row["frame"]), int(row["module"])): row["xxh3"]
                for row in csv.DictReader(open(out / "rdaq_run_manifest.csv"))}
    with h5py.File(out / "rdaq_run_master.h5", "r") as f:
        data, numbers = f["entry/data/data"], f["entry/data/frame_number"][:].tolist()
        assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers) == s["frames_written"], "the source's order"
        complete = f["entry/data/frame_complete"][:]
        for i, n in enumerate(numbers):
            if not complete[i]:
                continue
            img = data[i]
            for m, (r0, c0) in enumerate([(0, 0), (548, 0)]):
                h = xxhash.xxh3_64_hexdigest(np.ascontiguousarray(img[r0:r0 + 512, c0:c0 + 1024]).tobytes())
                assert h == manifest[(n, m)], f"frame {n} module {m}"


def local_topology(tmp_path, detector, mode):
    """A topology file of two receivers on loopback (ports the kernel picks) for `rdaq run
    --topology`: `detector` lines for its [detector] table, the transfer `mode`."""
    text = f'[detector]\n{detector}\n[transfer]\nmode = "{mode}"\n'
    for i in range(2):
        text += (f'[[receivers]]\nname = "dr{i}"\ncontrol = "127.0.0.1:{7000 + i}"\ndata = "127.0.0.1"\n'
                 f'data_port = 0\nmemory_mib = 64\n')
    topo = tmp_path / "t.toml"
    topo.write_text(text)
    return topo


def test_run_with_a_topology_spreads_modules_over_receivers(rdaq, tmp_path):
    """`rdaq run --topology`, spatial mode on loopback: each receiver's file holds exactly
    its modules of every frame."""
    from conftest import frames_in, manifest
    topo = local_topology(tmp_path, "modules = 4\nmodule_cols = 2", "spatial")
    out = tmp_path / "out"
    r = subprocess.run([str(rdaq), "run", "--topology", str(topo), "--frames", "30", "--rate", "100", "--out", str(out), "--raw"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    man = manifest(out / "rdaq_run_manifest.csv")
    for name, modules in (("dr0", [0, 1]), ("dr1", [2, 3])):
        frames = frames_in(out / f"{name}_master.h5")
        assert sorted(frames) == list(range(30))
        for frame, hashes in frames.items():
            assert hashes == [man[(frame, m)] for m in modules], f"{name} frame {frame}"


def test_run_with_a_topology_processes_each_receivers_share(rdaq, tmp_path):
    """`rdaq run --topology`, temporal mode: each receiver takes its frames through the same
    processing graph as a single-receiver run; the signal frames it writes equal, pixel for
    pixel and spot for spot, those of a single-receiver run of the same detector (the
    pedestal window is not full in 30 frames, so both convert with the emulated calibration)."""
    topo = local_topology(tmp_path, "modules = 2", "temporal")
    for args, out in ((["--topology", str(topo)], tmp_path / "plan"), ([], tmp_path / "one")):
        r = subprocess.run([str(rdaq), "run", *args, "--frames", "30", "--rate", "100", "--out", str(out), "--stream", "none",
                            "--preview", "none"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
    with h5py.File(tmp_path / "one" / "rdaq_run_master.h5", "r") as one:
        ref = {int(n): i for i, n in enumerate(one["entry/data/frame_number"][:])}
        compared = 0
        # the chopper's dark frames are the even ones: all of them go to dr0, which tracks the
        # pedestal and writes nothing (no file is kept)
        assert not (tmp_path / "plan" / "dr0_master.h5").exists()
        for name in ("dr1",):
            with h5py.File(tmp_path / "plan" / f"{name}_master.h5", "r") as f:
                assert f["entry/data/data"].dtype == one["entry/data/data"].dtype != np.uint16
                for i, n in enumerate(f["entry/data/frame_number"][:]):
                    j = ref[int(n)]
                    assert np.array_equal(f["entry/data/data"][i], one["entry/data/data"][j]), f"frame {n}"
                    assert f["entry/result_1/nPeaks"][i] == one["entry/result_1/nPeaks"][j]
                    compared += 1
        assert compared == len(ref) > 0, "every frame the single run wrote, written by one receiver of the plan"


def test_run_says_at_start_which_rate_this_host_can_emulate(rdaq, tmp_path):
    """Each emulated module's sender makes its synthetic frame before sending it: asked for
    more than the host can make, `rdaq run` says so at start with the rate it can emulate,
    and the summary counts the frames that started late."""
    for rate, said in [("1000000", r"warning: this host emulates at most about (\d+) frames/s \(2 senders each make a module frame in [0-9.]+ ms\), not the 1000000 Hz asked"),
                       ("0", r"sends as fast as this host makes its frames: at most about (\d+) frames/s")]:
        r = subprocess.run([rdaq, "run", "--raw", "--frames", "20", "--rate", rate, "--out", tmp_path / rate, "--stream", "none", "--preview", "none"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode in (0, 1), r.stdout + r.stderr
        m = re.search(said, r.stderr)
        assert m and 0 < int(m.group(1)) < 1_000_000, r.stderr
        if rate != "0":
            assert re.search(r"detector    : \d+ module frames started more than a frame period late", r.stdout), r.stdout
