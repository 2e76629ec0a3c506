"""The live preview: `rdaq preview` renders the latest image of a run's preview stream, or a
frame of a master file, as a PNG of the image's size with every spot circled."""
import subprocess

import h5py
import numpy as np
from PIL import Image

from conftest import free_port

SPOT = (0, 255, 255)
RADIUS = 8


def spots_of(master, index):
    with h5py.File(master, "r") as f:
        r = f["entry/result_1"]
        n = r["nPeaks"][index]
        return list(zip(r["peakXPosRaw"][index, :n], r["peakYPosRaw"][index, :n])), f["entry/data/data"].shape[1:]


def assert_marks(png, spots, shape):
    img = np.asarray(Image.open(png).convert("RGB"))
    assert img.shape[:2] == shape, "the picture has the image's size"
    h, w = shape
    assert len(spots) > 0
    for x, y in spots:
        cx, cy = int(round(x)), int(round(y))
        ring = [(cx + RADIUS, cy), (cx - RADIUS, cy), (cx, cy + RADIUS), (cx, cy - RADIUS)]
        inside = [(px, py) for px, py in ring if 0 <= px < w and 0 <= py < h - 40]  # above the scale bar
        assert all(tuple(img[py, px]) == SPOT for px, py in inside), f"spot at ({x:.1f}, {y:.1f}) is circled"
    assert (img[h - 20:h - 15, 16:40] == 255).all(), "the scale bar"


def test_a_frame_of_a_file_is_rendered_with_its_spots(rdaq, tmp_path):
    subprocess.run([rdaq, "run", "--frames", "10", "--out", tmp_path, "--stream", "none", "--preview", "none"], check=True, capture_output=True)
    master = tmp_path / "rdaq_run_master.h5"
    r = subprocess.run([rdaq, "preview", "--file", master, "--frame", "2", "--png", tmp_path / "f.png"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    spots, shape = spots_of(master, 2)
    assert f"{len(spots)} spots" in r.stdout
    assert_marks(tmp_path / "f.png", spots, shape)
    bad = subprocess.run([rdaq, "preview", "--file", master, "--frame", "999", "--png", tmp_path / "x.png"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no frame 999" in bad.stderr


def test_the_live_preview_of_a_run(rdaq, tmp_path):
    port = free_port()
    run = subprocess.Popen([rdaq, "run", "--frames", "300", "--out", tmp_path, "--stream", "none", "--preview", f"tcp://127.0.0.1:{port}"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    r = subprocess.run([rdaq, "preview", "--from", f"tcp://127.0.0.1:{port}", "--png", tmp_path / "live.png", "--timeout-s", "30"],
                       capture_output=True, text=True, timeout=60)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    assert r.returncode == 0, r.stderr
    assert "preview on tcp://127.0.0.1" in out
    frame = int(r.stdout.split("frame ")[1].split(",")[0])
    master = tmp_path / "rdaq_run_master.h5"
    with h5py.File(master, "r") as f:
        index = list(f["entry/data/frame_number"][:]).index(frame)
    spots, shape = spots_of(master, index)
    assert_marks(tmp_path / "live.png", spots, shape)
