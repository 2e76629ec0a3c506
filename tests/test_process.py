"""The processing stages against independent implementations: aare (PSI) for the JUNGFRAU
conversion and pedestal tracking, cfelpyutils for peakfinder8, hdf5plugin for every
compressed chunk. Inputs are made here with numpy; rdaq runs through `rdaq process`."""
import json
import os
import re
import subprocess

import aare
import h5py
import hdf5plugin  # noqa: F401  (registers the bitshuffle filter with h5py)
import numpy as np
import pytest
from cfelpyutils.peakfinding.peakfinder8 import Peakfinder8PeakDetection

ROWS, COLS = 512, 1024


def write_frames(path, frames):
    with h5py.File(path, "w") as f:
        f.create_dataset("entry/data/data", data=frames)


def write_calibration(path, pedestal, gain, mask):
    with h5py.File(path, "w") as f:
        f["pedestal"] = pedestal
        f["gain"] = gain
        f["pixel_mask"] = mask


def random_calibration(rng):
    pedestal = np.stack([rng.normal(m, 0.03 * m, (ROWS, COLS)) for m in (2450, 13600, 14100)]).astype(np.float32)
    gain = np.stack([rng.normal(m, abs(0.02 * m), (ROWS, COLS)) for m in (41.0, -1.439, -0.1145)]).astype(np.float32)
    return pedestal, gain


def random_raw(rng, n):
    """Every gain code (the invalid 10 too), every ADC value, and the special words."""
    codes = rng.choice(np.array([0, 1, 2, 3], dtype=np.uint16), size=(n, ROWS, COLS), p=[0.7, 0.12, 0.03, 0.15])
    raw = (codes << 14) | rng.integers(0, 1 << 14, size=(n, ROWS, COLS), dtype=np.uint16)
    flat = raw.reshape(-1)
    for word in (0xC000, 0x4000, 0xFFFF):
        flat[rng.integers(0, flat.size, 500)] = word
    return raw


def special(raw):
    return (raw == 0xC000) | (raw == 0x4000) | (raw == 0xFFFF)


def read(path, name="entry/data/data"):
    with h5py.File(path, "r") as f:
        return f[name][()]


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_kev_is_bit_exact_with_aare(rdaq, tmp_path, codec):
    rng = np.random.default_rng(5)
    pedestal, gain = random_calibration(rng)
    mask = np.zeros((ROWS, COLS), np.uint32)
    mask[100, 200:210] = 1 << 4
    raw = random_raw(rng, 4)
    write_frames(tmp_path / "raw.h5", raw)
    write_calibration(tmp_path / "cal.h5", pedestal, gain, mask)
    # aare converts the invalid gain code 10 with G0: ask rdaq for the same
    subprocess.run([rdaq, "process", "convert", "--input", tmp_path / "raw.h5", "--calibration", tmp_path / "cal.h5",
                    "--output", tmp_path / "kev.h5", "--invalid-gain", "g0", "--codec", codec], check=True)
    ours = read(tmp_path / "kev.h5")  # decoded by hdf5plugin
    assert ours.dtype == np.float32 and ours.shape == raw.shape
    ref = aare.apply_calibration(raw, pd=pedestal, cal=gain)
    normal = ~special(raw) & (mask == 0)[None]
    assert normal.sum() > 2_000_000
    assert np.array_equal(ours[normal].view(np.uint32), ref[normal].view(np.uint32)), "float32 keV differs from aare"
    # the special words and masked pixels aare does not know: +inf saturated, NaN error/masked
    assert np.all(np.isposinf(ours[raw == 0xC000]))
    assert np.all(np.isnan(ours[(raw == 0xFFFF) | (raw == 0x4000)]))
    assert np.all(np.isnan(ours[:, 100, 200:210]))


def test_invalid_gain_is_an_error_by_default(rdaq, tmp_path):
    rng = np.random.default_rng(6)
    pedestal, gain = random_calibration(rng)
    raw = random_raw(rng, 1)
    write_frames(tmp_path / "raw.h5", raw)
    write_calibration(tmp_path / "cal.h5", pedestal, gain, np.zeros((ROWS, COLS), np.uint32))
    subprocess.run([rdaq, "process", "convert", "--input", tmp_path / "raw.h5", "--calibration", tmp_path / "cal.h5",
                    "--output", tmp_path / "kev.h5"], check=True)
    ours = read(tmp_path / "kev.h5")
    invalid = (raw >> 14 == 2) & ~special(raw)
    assert invalid.sum() > 10_000 and np.all(np.isnan(ours[invalid]))


@pytest.mark.parametrize("counts,dtype,lo,hi", [("i16", np.int16, -32767, 32766), ("i32", np.int32, -2147483520, 2147483520)])
def test_photon_counts_round_aare_energies_half_away_from_zero(rdaq, tmp_path, counts, dtype, lo, hi):
    """aare has no integer output: the reference is aare's keV over the photon energy (in
    float32, as rdaq divides), rounded half away from zero, saturating inside the markers."""
    rng = np.random.default_rng(7)
    pedestal, gain = random_calibration(rng)
    raw = random_raw(rng, 2)
    write_frames(tmp_path / "raw.h5", raw)
    write_calibration(tmp_path / "cal.h5", pedestal, gain, np.zeros((ROWS, COLS), np.uint32))
    e = 12.4
    subprocess.run([rdaq, "process", "convert", "--input", tmp_path / "raw.h5", "--calibration", tmp_path / "cal.h5",
                    "--output", tmp_path / "n.h5", "--invalid-gain", "g0", "--photon-kev", str(e), "--counts", counts,
                    "--codec", "zstd"], check=True)
    ours = read(tmp_path / "n.h5")
    assert ours.dtype == dtype
    q = (aare.apply_calibration(raw, pd=pedestal, cal=gain) / np.float32(e)).astype(np.float64)
    ref = np.clip(np.sign(q) * np.floor(np.abs(q) + 0.5), lo, hi).astype(dtype)
    normal = ~special(raw)
    assert np.array_equal(ours[normal], ref[normal])
    info = np.iinfo(dtype)
    assert np.all(ours[raw == 0xC000] == info.max) and np.all(ours[raw == 0xFFFF] == info.min)


# a window of a power of two divides by multiplying with its reciprocal; another divides
@pytest.mark.parametrize("window", [128, 100])
@pytest.mark.parametrize("sums,ref_cls", [("f32", aare.Pedestal_f), ("f64", aare.Pedestal_d)])
def test_pedestal_is_bit_exact_with_aare(rdaq, tmp_path, sums, ref_cls, window):
    rng = np.random.default_rng(8)
    n, rows, cols = 300, 128, 256
    level = rng.normal(2450, 70, (rows, cols))
    noise = rng.normal(0, 12, (rows, cols))
    noise[5, 7] = 300  # a noisy pixel
    dark = np.clip(level[None] + rng.normal(0, 1, (n, rows, cols)) * np.abs(noise)[None], 0, 16383).astype(np.uint16)
    write_frames(tmp_path / "dark.h5", dark)
    subprocess.run([rdaq, "process", "pedestal", "--input", tmp_path / "dark.h5", "--output", tmp_path / "cal.h5",
                    "--window", str(window), "--sums", sums], check=True)
    ref = ref_cls(rows, cols, window)
    for frame in dark:
        ref.push(frame)
    with h5py.File(tmp_path / "cal.h5", "r") as f:
        ours_p, ours_rms, mask = f["pedestal"][0], f["pedestal_rms"][0], f["pixel_mask"][()]
        assert list(f["pedestal_frames"][()]) == [n, 0, 0]
    assert np.array_equal(ours_p.view(np.uint32), ref.mean().astype(np.float32).view(np.uint32))
    var = ref.variance()
    rms = np.where(var > 0, np.sqrt(np.maximum(var, 0)), 0).astype(np.float32)
    assert np.array_equal(ours_rms.view(np.uint32), rms.view(np.uint32))
    assert mask[5, 7] & (1 << 4), "the noisy pixel is masked"
    assert (mask != 0).sum() == 1


def synthetic_peaks(rng):
    img = rng.normal(20, 5, (ROWS, COLS)).astype(np.float32)
    yy, xx = np.mgrid[0:ROWS, 0:COLS]
    for _ in range(60):
        x, y = rng.uniform(5, COLS - 5), rng.uniform(5, ROWS - 5)
        total = rng.uniform(2000, 40000)
        sel = (np.abs(xx - x) < 6) & (np.abs(yy - y) < 6)
        img[sel] += (total / (2 * np.pi) * np.exp(-((xx[sel] + 0.5 - x) ** 2 + (yy[sel] + 0.5 - y) ** 2) / 2)).astype(np.float32)
    return img


# the centre of the module, and a fractional one: cfelpyutils' users build the radius map in
# float64 (numpy) and hand it over as float32; a map built in float32 puts some pixels into
# another radial bin when the centre is fractional
@pytest.mark.parametrize("cx,cy", [(COLS / 2, ROWS / 2), (511.37, 255.81)], ids=["centred", "fractional"])
def test_peakfinder8_mode_finds_the_same_peaks_as_cfelpyutils(rdaq, tmp_path, cx, cy):
    rng = np.random.default_rng(9)
    frames = np.stack([synthetic_peaks(rng) for _ in range(3)])
    write_frames(tmp_path / "img.h5", frames)
    yy, xx = np.mgrid[0:ROWS, 0:COLS]
    radius = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2).astype(np.float32)
    pf = Peakfinder8PeakDetection(max_num_peaks=2048, asic_nx=256, asic_ny=256, nasics_x=4, nasics_y=2,
                                  adc_threshold=100.0, minimum_snr=5.0, min_pixel_count=2, max_pixel_count=200,
                                  local_bg_radius=3, min_res=0, max_res=10000, bad_pixel_map_filename=None,
                                  bad_pixel_map_hdf5_path=None, radius_pixel_map=radius)
    subprocess.run([rdaq, "process", "spots", "--input", tmp_path / "img.h5", "--output", tmp_path / "spots.h5",
                    "--finder", "peakfinder8", "--adc-threshold", "100", "--min-snr", "5", "--min-res", "0",
                    "--max-res", "10000", "--center-x", str(cx), "--center-y", str(cy)], check=True)
    with h5py.File(tmp_path / "spots.h5", "r") as f:
        n, xs, ys, its = (f["entry/result_1/" + k][()] for k in ("nPeaks", "peakXPosRaw", "peakYPosRaw", "peakTotalIntensity"))
    total = 0
    for i, frame in enumerate(frames):
        ref = pf.find_peaks(frame)
        assert n[i] == ref.num_peaks, f"frame {i}: {n[i]} peaks, cfelpyutils {ref.num_peaks}"
        total += n[i]
        assert np.array_equal(xs[i, :n[i]], np.array(ref.fs, np.float32))
        assert np.array_equal(ys[i, :n[i]], np.array(ref.ss, np.float32))
        assert np.array_equal(its[i, :n[i]], np.array(ref.intensity, np.float32))
    assert total > 100


def test_the_radius_map_is_the_one_numpy_users_build():
    import rdaq as lib  # the Python package: rdaq's own map, as the CLI builds it
    for cx, cy in [(COLS / 2, ROWS / 2), (511.37, 255.81), (1151.37, 1150.81)]:
        yy, xx = np.mgrid[0:ROWS, 0:COLS]
        ref = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2).astype(np.float32)
        assert np.array_equal(lib.radius_map(COLS, ROWS, cx, cy).view(np.uint32), ref.view(np.uint32)), (cx, cy)


def test_a_radius_map_from_a_file_and_a_threshold_in_photons(rdaq, tmp_path):
    rng = np.random.default_rng(10)
    frames = synthetic_peaks(rng)[None]
    write_frames(tmp_path / "img.h5", frames)
    yy, xx = np.mgrid[0:ROWS, 0:COLS]
    radius = np.sqrt((xx - 300.25) ** 2 + (yy - 100.75) ** 2).astype(np.float32)
    with h5py.File(tmp_path / "radius.h5", "w") as f:
        f["radius"] = radius
    def spots(*args):
        out = tmp_path / f"spots{len(list(tmp_path.iterdir()))}.h5"
        subprocess.run([rdaq, "process", "spots", "--input", tmp_path / "img.h5", "--output", out, *args], check=True, capture_output=True)
        with h5py.File(out, "r") as f:
            n = f["entry/result_1/nPeaks"][0]
            return f["entry/result_1/peakXPosRaw"][0, :n], f["entry/result_1/peakYPosRaw"][0, :n]
    pf8 = ["--finder", "peakfinder8", "--adc-threshold", "100", "--min-snr", "5", "--min-res", "0", "--max-res", "10000"]
    from_file = spots(*pf8, "--radius-map", tmp_path / "radius.h5")
    computed = spots(*pf8, "--center-x", "300.25", "--center-y", "100.75")
    assert len(from_file[0]) > 0 and all(np.array_equal(a, b) for a, b in zip(from_file, computed))
    # 0.5 photons of 12.4 keV is the 6.2 keV threshold
    assert all(np.array_equal(a, b) for a, b in zip(spots("--threshold-photons", "0.5", "--photon-energy-kev", "12.4"), spots("--threshold", "6.2")))
    bad = subprocess.run([rdaq, "process", "spots", "--input", tmp_path / "img.h5", "--output", tmp_path / "x.h5", *pf8,
                          "--radius-map", tmp_path / "img.h5"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--radius-map" in bad.stderr


def test_bench_pipeline_runs_the_graph_and_prints_its_table(rdaq, tmp_path):
    """The pipeline bench is a command: one worker count, one module, half a second. What it
    measures is recorded in bench/RESULTS.md; here only that it runs the whole graph (dark frames
    to the pedestal, signal frames through every step) and reports what it saw."""
    out = tmp_path / "p.json"
    r = subprocess.run([rdaq, "bench", "pipeline", "--modules", "1", "--seconds", "0.5", "--max-workers", "1",
                        "--json", out], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "mod.fr/s" in r.stdout and "copy GB/s" in r.stdout
    [p] = json.loads(out.read_text())
    assert p["workers"] == 1 and p["pedestal_bands"] == 1 and p["frames"] > 10
    assert p["module_frames_per_s"] > 0 and p["copy_gb_per_s"] > 0
    assert p["convert_ms"] > 0 and p["spots_ms"] > 0 and p["compress_ms"] > 0 and p["pedestal_ms_per_dark"] > 0
    assert 0 < p["workers_busy"] <= 1.05, p["workers_busy"]


def test_bench_pipeline_raw_says_what_limits_the_raw_chain(rdaq, tmp_path):
    """`--raw`: beside the table, a plain sequential write of the same chunks and the serial
    parts alone, measured in the same run, and which limits the chain (the write, the serial
    parts, the copy bandwidth, or the workers)."""
    r = subprocess.run([rdaq, "bench", "pipeline", "--raw", "--modules", "1", "--seconds", "0.5", "--workers", "1"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"plain sequential write of the same chunks .*: \d+ module frames/s; the serial parts alone \(1 workers handing on "
                     r"a chunk made once\): \d+; the best point \(1 workers\) is [\d.]+ of the write and [\d.]+ of the serial parts", r.stdout), r.stdout
    [limit] = [line for line in r.stdout.splitlines() if line.startswith("limit: ")]
    assert limit.split(": ", 1)[1].startswith(("the write", "the serial parts", "the copy bandwidth", "the workers")), limit


@pytest.mark.parametrize("mode", [[], ["--no-dark"], ["--raw"]])
def test_bench_pipeline_ceiling_hands_on_results_and_prints_the_serial_fraction(rdaq, tmp_path, mode):
    """`--ceiling`: the workers (and the bands) hand on a frame's results made once; the
    bench measures one real worker too and prints the serial fraction, Amdahl's table and,
    for the raw chain, a plain write of the same chunks. Every frame is written: a point
    whose writer failed is an error, not a row."""
    out = tmp_path / "c.json"
    r = subprocess.run([rdaq, "bench", "pipeline", "--ceiling", "--modules", "1", "--seconds", "0.5", "--workers", "1", *mode,
                        "--json", out], capture_output=True, text=True, timeout=180, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "serial fraction:" in r.stdout and "Amdahl's law" in r.stdout, r.stdout
    assert ("plain sequential write" in r.stdout) == (mode == ["--raw"]), r.stdout
    d = json.loads(out.read_text())
    [c] = d["ceiling"]
    assert d["real"]["workers"] == 1 and c["frames"] > 10 and c["module_frames_per_s"] > 0
    # handing on results made once, the workers time no step of their own
    assert c["convert_ms"] == 0 and c["spots_ms"] == 0 and c["compress_ms"] == 0


def test_a_crafted_chunk_is_refused_with_exit_2_never_a_crash(rdaq, tmp_path):
    """Bitshuffle chunks that claim more (or less) than the dataset's chunk: a 32 GiB claim,
    a 2 GiB claim backed by enough block headers, and a valid chunk of 10 rows where the
    dataset's chunks hold 512 (HDF5 would read past it). Each is refused naming the frame."""
    import rdaq as py
    raw = np.random.default_rng(1).integers(0, 1 << 14, (2, ROWS, COLS), dtype=np.uint16)
    crafted = {
        "huge": (32 << 30).to_bytes(8, "big") + (8192).to_bytes(4, "big") + bytes(16),
        "big": (1 << 31).to_bytes(8, "big") + (8192).to_bytes(4, "big") + b"".join((4).to_bytes(4, "big") + bytes(4) for _ in range(300_000)),
        "short": bytes(py.compress(raw[1, :10], "lz4")),
    }
    for name, chunk in crafted.items():
        path = tmp_path / f"{name}.h5"
        with h5py.File(path, "w") as f:
            d = f.create_dataset("entry/data/data", data=raw, chunks=(1, ROWS, COLS), **hdf5plugin.Bitshuffle(cname="lz4"))
            d.id.write_direct_chunk((1, 0, 0), chunk)
        r = subprocess.run([rdaq, "process", "pedestal", "--input", path, "--output", tmp_path / f"{name}_cal.h5", "--window", "2"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, (name, r.returncode, r.stderr)
        assert f"{name}.h5: frame 1" in r.stderr and "the dataset's chunks hold 1048576" in r.stderr and len(r.stderr.strip().splitlines()) == 1, (name, r.stderr)
    # convert meets the crafted chunk after it began writing: it leaves no output behind
    good = tmp_path / "good.h5"
    with h5py.File(good, "w") as f:
        f.create_dataset("entry/data/data", data=raw, chunks=(1, ROWS, COLS), **hdf5plugin.Bitshuffle(cname="lz4"))
    r = subprocess.run([rdaq, "process", "pedestal", "--input", good, "--output", tmp_path / "cal.h5", "--window", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for name in crafted:
        out = tmp_path / f"{name}_kev.h5"
        r = subprocess.run([rdaq, "process", "convert", "--input", tmp_path / f"{name}.h5", "--calibration", tmp_path / "cal.h5", "--output", out],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and f"{name}.h5: frame 1" in r.stderr, (name, r.stderr)
        assert not out.exists() and not list(tmp_path.glob(f".{name}_kev.h5*")), f"{name}: a failed conversion leaves no file"
