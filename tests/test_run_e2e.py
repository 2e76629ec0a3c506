"""`rdaq run` end to end: every frame in the NXmx file, read with h5py + hdf5plugin, matches
the emulator's manifest hash."""
import csv
import json
import subprocess

import h5py
import hdf5plugin  # noqa: F401  (registers the bitshuffle filter with h5py)
import numpy as np
import xxhash


def test_run_writes_every_frame_bit_exact(rdaq, tmp_path):
    out = tmp_path / "out"
    summary = tmp_path / "summary.json"
    r = subprocess.run([str(rdaq), "run", "--out", str(out), "--summary-json", str(summary)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "loss        : none" in r.stdout
    s = json.loads(summary.read_text())
    assert s["frames_complete"] == s["frames_expected"] == 1000
    assert s["datagrams_dropped"] == 0 and s["kernel_drops"] == 0

    manifest = {(int(row["frame"]), int(row["module"])): row["xxh3"]
                for row in csv.DictReader(open(out / "rdaq_run_manifest.csv"))}
    assert len(manifest) == 2000
    with h5py.File(out / "rdaq_run.h5", "r") as f:
        assert f["entry"].attrs["NX_class"] == "NXentry"
        assert f["entry/definition"][()] == b"NXmx"
        data = f["entry/data/data"]
        assert data.shape == (1000, 1024, 1024) and data.dtype == np.uint16
        assert data.chunks == (1, 1024, 1024)
        assert 32008 in [int(k) for k in data._filters]
        frame_numbers = f["entry/data/frame_number"][:]
        assert sorted(frame_numbers.tolist()) == list(range(1000))
        assert f["entry/data/frame_complete"][:].all()
        for i in range(data.shape[0]):
            img = data[i]
            for m in range(2):
                h = xxhash.xxh3_64_hexdigest(np.ascontiguousarray(img[m * 512:(m + 1) * 512]).tobytes())
                assert h == manifest[(int(frame_numbers[i]), m)], f"frame {frame_numbers[i]} module {m}"
        det = f["entry/instrument/detector"]
        assert det["module_1/data_origin"][:].tolist() == [512, 0]
        assert det["pixel_mask"].shape == (1024, 1024)
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
    assert not (tmp_path / "rdaq_run.h5").exists(), "nothing starts half-configured"
