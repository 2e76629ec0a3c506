"""`rdaq write` on another host (network namespace) writes, from the stream, files equal to
the ones `rdaq run` writes on the receiver host: the same images, tables, spot lists and
metadata, the chunks put in as they came."""
import json
import subprocess

import h5py
import hdf5plugin  # noqa: F401
import numpy as np
import pytest

import netns

pytestmark = pytest.mark.skipif(not netns.available(), reason="needs root and network namespaces")

SAME = ["entry/data/data", "entry/data/frame_number", "entry/data/frame_complete", "entry/data/incomplete_frame_number",
        "entry/result_1/nPeaks", "entry/result_1/peakXPosRaw", "entry/result_1/peakYPosRaw",
        "entry/result_1/peakTotalIntensity", "entry/result_1/peakNPixels", "entry/result_1/hit",
        "entry/instrument/beam/incident_wavelength", "entry/instrument/detector/pixel_mask",
        "entry/instrument/detector/distance", "entry/instrument/detector/beam_center_x",
        "entry/instrument/detector/x_pixel_size", "entry/instrument/detector/saturation_value",
        "entry/instrument/detector/module_1/data_origin", "entry/instrument/detector/module_1/module_offset",
        "entry/start_time"]


def test_a_writer_on_another_host_writes_the_same_files(rdaq, tmp_path):
    h = netns.Hosts(["rx", "wr"])
    try:
        endpoint = f"tcp://{h.addr['rx']}:31001"
        wr_dir, rx_dir = tmp_path / "wr", tmp_path / "rx"
        writer = h.exec("wr", [rdaq, "write", "--from", endpoint, "--out", wr_dir, "--name", "copy", "--idle-timeout-s", "60",
                               "--summary-json", tmp_path / "w.json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        run = h.exec("rx", [rdaq, "run", "--frames", "60", "--images-per-file", "8", "--out", rx_dir, "--stream", f"tcp://{h.addr['rx']}:31001",
                            "--stream-policy", "block", "--summary-json", tmp_path / "r.json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = run.communicate(timeout=180)
        assert run.returncode == 0, out + err
        wout, werr = writer.communicate(timeout=60)
        assert writer.returncode == 0, wout + werr
    finally:
        h.close()
    r, w = json.loads((tmp_path / "r.json").read_text()), json.loads((tmp_path / "w.json").read_text())
    assert w["images_written"] == r["frames_written"] == r["stream"]["images_sent"] > 8
    assert w["ended"] and w["images_missing"] == 0
    assert sorted(p.name for p in wr_dir.glob("copy_data_*.h5")) == [p.name.replace("rdaq_run", "copy") for p in sorted(rx_dir.glob("rdaq_run_data_*.h5"))]
    with h5py.File(rx_dir / "rdaq_run_master.h5", "r") as a, h5py.File(wr_dir / "copy_master.h5", "r") as b:
        for name in SAME:
            assert np.array_equal(a[name][()], b[name][()]), name
        assert dict(a["entry/result_1/peakTotalIntensity"].attrs) == dict(b["entry/result_1/peakTotalIntensity"].attrs)
        # the chunks went in as they came: the same bytes on disk
        da, db = a["entry/data/data_000001"], b["entry/data/data_000001"]
        for i in range(da.shape[0]):
            assert da.id.read_direct_chunk((i, 0, 0)) == db.id.read_direct_chunk((i, 0, 0)), f"chunk {i}"
