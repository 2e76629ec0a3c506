"""The field's tools read rdaq's files: DIALS (Debian's package) imports a run's master file
with the geometry rdaq wrote and finds the Bragg spots rdaq found; the `nxmx` package reads
the master without a warning."""
import json
import os
import pathlib
import shutil
import subprocess
import warnings

import h5py
import hdf5plugin
import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def processed_run(rdaq, tmp_path_factory):
    out = tmp_path_factory.mktemp("dials")
    # 20 frames: every other one dark (pedestal), half the rest hits; 3 images per data file
    r = subprocess.run([rdaq, "run", "--frames", "20", "--images-per-file", "3", "--out", out], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return out / "rdaq_run_master.h5"


def dials(cmd, *args, cwd):
    # DIALS decodes the bitshuffle chunks with hdf5plugin's filters, as a user sets it up
    env = dict(os.environ, HDF5_PLUGIN_PATH=hdf5plugin.PLUGIN_PATH)
    r = subprocess.run([cmd, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.skipif(shutil.which("dials.import") is None, reason="DIALS is installed by scripts/setup.sh")
def test_dials_imports_the_geometry_and_finds_rdaqs_spots(processed_run, tmp_path):
    dials("dials.import", processed_run, cwd=tmp_path)
    dials("dials.find_spots", "imported.expt", "nproc=1", cwd=tmp_path)
    dump = subprocess.run(["/usr/bin/python3", HERE / "dials_dump.py", "imported.expt", "strong.refl"],
                          capture_output=True, text=True, cwd=tmp_path, check=True)
    seen = json.loads(dump.stdout)
    with h5py.File(processed_run, "r") as f:
        images = f["entry/data/data"].shape[0]
        assert len(f["entry/data"]) - 4 > 1, "the run spans several data files"  # data_00000k links
        det = f["entry/instrument/detector"]
        bx, by = det["beam_center_x"][()], det["beam_center_y"][()]
        px_m, dist_m = det["x_pixel_size"][()], det["distance"][()]
        origins = [tuple(det[f"module_{m}/data_origin"][:]) for m in range(2)]
        wavelength = f["entry/instrument/beam/incident_wavelength"][()]
        r1 = f["entry/result_1"]
        n, xs, ys = r1["nPeaks"][:], r1["peakXPosRaw"][:], r1["peakYPosRaw"][:]
    assert seen["images"] == images > 0
    assert abs(seen["wavelength"] - wavelength) < 1e-9
    px, dist = px_m * 1e3, dist_m * 1e3  # DIALS speaks mm
    for p, (r0, c0) in zip(seen["panels"], origins):
        assert p["image_size"] == [1024, 512] and p["pixel_size"] == pytest.approx([px, px])
        assert p["distance"] == pytest.approx(dist)
        # DIALS' frame: x opposite to NeXus' (McStas) x, the detector at -z
        assert p["origin"] == pytest.approx([-(bx - c0) * px, (by - r0) * px, -dist])
    # nearly every spot rdaq found has a DIALS spot within a pixel (DIALS' panel coordinates
    # shifted by the module's place in the image)
    found = {}
    for img, panel, x, y in seen["spots"]:
        r0, c0 = origins[panel]
        found.setdefault(img, []).append((x + c0, y + r0))
    ours = matched = 0
    for img in range(images):
        theirs = np.array(found.get(img, [(-1e9, -1e9)]))
        for k in range(min(n[img], xs.shape[1])):
            ours += 1
            d = np.hypot(theirs[:, 0] - xs[img, k], theirs[:, 1] - ys[img, k]).min()
            matched += d <= 1.0
    assert ours > 100 and matched >= 0.95 * ours, f"{matched} of {ours} spots matched"


def test_nxmx_reads_the_master_without_warnings(processed_run):
    import nxmx
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with h5py.File(processed_run, "r") as f:
            entry = nxmx.NXmx(f).entries[0]
            assert entry.definition == "NXmx"
            assert entry.samples[0].depends_on is None, "stills: no goniometer"
            beam = entry.instruments[0].beams[0]
            assert beam.incident_wavelength.to("angstrom").magnitude == pytest.approx(12.398419843320026 / 12.4)
            det = entry.instruments[0].detectors[0]
            assert det.sensor_material == "Si" and det.pixel_mask.shape == (1060, 1024)
            assert [list(m.data_origin) for m in det.modules] == [[0, 0], [548, 0]]
            for m in det.modules:
                chain = nxmx.get_dependency_chain(m.fast_pixel_direction)
                assert chain[-1].path == "/entry/instrument/detector/transformations/translation"
                origin = nxmx.get_cumulative_transformation(chain)[0][:3, 3]
                assert origin[2] == pytest.approx(100.0), "the modules hang on the detector's distance (mm)"
            assert entry.data[0].signal == "data"


@pytest.mark.skipif(shutil.which("dials.import") is None, reason="DIALS is installed by scripts/setup.sh")
def test_a_rotation_series_imports_as_one_sweep(rdaq, tmp_path):
    cfg = tmp_path / "rot.toml"
    cfg.write_text('[goniometer]\nomega_start_deg = 10.0\nomega_increment_deg = 0.1\n[stream]\nendpoint = "none"\npreview = "none"\n')
    r = subprocess.run([rdaq, "run", "--raw", "--config", cfg, "--frames", "12", "--images-per-file", "5", "--out", tmp_path],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with h5py.File(tmp_path / "rdaq_run_master.h5", "r") as f:
        omega = f["entry/sample/transformations/omega"]
        assert f["entry/sample/depends_on"][()] == b"/entry/sample/transformations/omega"
        assert np.allclose(omega[:], 10.0 + 0.1 * f["entry/data/frame_number"][:])
    out = dials("dials.import", tmp_path / "rdaq_run_master.h5", cwd=tmp_path)
    assert "sweep:    1" in out and "num stills: 0" in out, out
    show = dials("dials.show", "imported.expt", cwd=tmp_path)
    assert "oscillation:   {10,0.1}" in show and "number of images:   12" in show, show


@pytest.mark.skipif(shutil.which("dials.import") is None, reason="DIALS is installed by scripts/setup.sh")
def test_dials_imports_an_eiger_module_with_gap_pixels(rdaq, tmp_path):
    """Each module's data_size is its image with the chip gap pixels (514 x 1030): DIALS
    refused [514, 1024] for 1030-wide modules."""
    import test_eiger as te
    from conftest import send_udp
    streams = te.capture("eiger_10g_dr16")
    s, out = te.receive(rdaq, tmp_path, 2, ["--detector", "eiger", "--gap-pixels"],
                        send=lambda ports: send_udp([(p, ports[i]) for i, st in enumerate(streams) for p in st]))
    assert s["frames_complete"] == 2
    with h5py.File(out, "r") as f:
        assert f["entry/instrument/detector/module_0/data_size"][:].tolist() == [514, 1030]
    dials("dials.import", out, cwd=tmp_path)
    dump = subprocess.run(["/usr/bin/python3", HERE / "dials_dump.py", "imported.expt"], capture_output=True, text=True, cwd=tmp_path, check=True)
    seen = json.loads(dump.stdout)
    assert seen["images"] == 2 and [p["image_size"] for p in seen["panels"]] == [[1030, 514]]
    assert seen["panels"][0]["pixel_size"] == pytest.approx([0.075, 0.075])


@pytest.mark.skipif(shutil.which("dials.import") is None, reason="DIALS is installed by scripts/setup.sh")
def test_dials_imports_eiger_modules_side_by_side(rdaq, tmp_path):
    """Two EIGER modules with gap pixels side by side: one panel each, in place, with the chip
    gaps in each panel's static mask. Debian 12's dxtbx cannot take the pixel mask of
    modules side by side (any detector's: a column slice of the mask is not contiguous, a
    bug dxtbx fixed upstream); the import then fails with exactly that error, and the file
    imports with the upstream fix applied (tests/dials_import_fixed.py)."""
    import test_eiger as te
    from conftest import send_udp
    streams = te.capture("eiger_10g_dr16")
    datagrams = [te.moved(p, 0, c) for c in (0, 2) for st in streams for p in st]
    s, out = te.receive(rdaq, tmp_path, 2, ["--detector", "eiger", "--modules", "2", "--module-cols", "2", "--gap-pixels"], ports=8,
                        send=lambda ports: send_udp([(d, ports[k % 8]) for k, d in enumerate(datagrams)]))
    assert s["frames_complete"] == 2
    with h5py.File(out, "r") as f:
        det = f["entry/instrument/detector"]
        assert f["entry/data/data"].shape[1:] == (514, 2 * 1030 + 8)
        assert [det[f"module_{m}/data_size"][:].tolist() for m in range(2)] == [[514, 1030]] * 2
        assert [det[f"module_{m}/data_origin"][:].tolist() for m in range(2)] == [[0, 0], [0, 1038]]
        px = det["x_pixel_size"][()] * 1e3
    env = dict(os.environ, HDF5_PLUGIN_PATH=hdf5plugin.PLUGIN_PATH)
    r = subprocess.run(["dials.import", str(out)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0 or "non-c-contiguous" in r.stdout + r.stderr, r.stdout + r.stderr
    fixed = subprocess.run(["/usr/bin/python3", HERE / "dials_import_fixed.py", str(out)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    seen = json.loads(fixed.stdout.strip().splitlines()[-1])
    assert seen["images"] == 2
    assert [p["image_size"] for p in seen["panels"]] == [[1030, 514], [1030, 514]]
    # the second panel starts 1038 pixels further along the fast axis
    assert seen["panels"][1]["origin"][0] - seen["panels"][0]["origin"][0] == pytest.approx(1038 * px)
    assert seen["masked"] == [1030 * 514 - 1024 * 512] * 2, "the chip gap pixels"
