"""Baselines of `rdaq bench process`: the reference libraries on the same data, one thread.

Usage: process_baselines.py DIR SECONDS  (DIR holds bench_inputs.h5 written by the bench,
with the spot finders' parameters as attributes, so that both sides use the same ones)
Prints one JSON object: seconds per frame for each baseline (null where unavailable), and the
spots each finder found over the frames. The libraries allocate their outputs (their APIs
take no output buffer); the local-SNR baseline allocates its temporaries (numpy).
"""
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # bitshuffle's OpenMP: one thread

import h5py  # noqa: E402
import numpy as np  # noqa: E402


def per_frame(fn, frames, seconds):
    """Calls fn(frame) over the frames until `seconds` passed; seconds per frame."""
    n, t0 = 0, time.perf_counter()
    while True:
        for f in frames:
            fn(f)
            n += 1
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return dt / n


def box_sums(a, n):
    """Sum of a over the (2n+1)^2 box around each pixel, the box clipped at the borders."""
    rows, cols = a.shape
    sat = np.zeros((rows + 1, cols + 1))
    sat[1:, 1:] = a.cumsum(0).cumsum(1)
    r0, r1 = np.clip(np.arange(rows) - n, 0, rows), np.clip(np.arange(rows) + n + 1, 0, rows)
    c0, c1 = np.clip(np.arange(cols) - n, 0, cols), np.clip(np.arange(cols) + n + 1, 0, cols)
    return sat[r1][:, c1] - sat[r0][:, c1] - sat[r1][:, c0] + sat[r0][:, c0]


def local_snr(img, threshold, snr, n, min_px, max_px):
    """rdaq's local-SNR rule (docs/processing.md), vectorized over the whole image: strong if
    >= threshold and (I - mean)^2 > snr^2 var over the box without the pixel and without
    pixels that are not finite (+inf: strong), 8-connected groups of min_px..max_px pixels
    with a positive sum. Returns the number of spots."""
    from scipy import ndimage
    ok = np.isfinite(img)
    x = np.where(ok, img, 0.0).astype(np.float64)
    cnt = box_sums(ok.astype(np.float64), n) - ok
    s = box_sums(x, n) - x
    s2 = box_sums(x * x, n) - x * x
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = s / cnt
        var = np.maximum(s2 / cnt - mean * mean, 0.0)
    d = x - mean
    strong = (img >= threshold) & (np.isposinf(img) | ((cnt > 0) & (d > 0) & (d * d > snr * snr * var)))
    labels, _ = ndimage.label(strong, structure=np.ones((3, 3)))
    sizes = np.bincount(labels.ravel())[1:]
    sums = np.bincount(labels.ravel(), weights=x.ravel())[1:]
    return int(np.count_nonzero((sizes >= min_px) & (sizes <= max_px) & (sums > 0)))


def main():
    d, seconds = sys.argv[1], float(sys.argv[2])
    with h5py.File(os.path.join(d, "bench_inputs.h5"), "r") as f:
        raw, kev, photons = f["raw"][()], f["kev"][()], f["photons"][()]
        pd, gain = f["pedestal"][()], f["gain"][()]
        lsnr = [float(v) for v in f.attrs["local_snr"]]
        p8 = [float(v) for v in f.attrs["peakfinder8"]]
    out = {}
    try:
        import aare
        out["aare_convert"] = per_frame(lambda r: aare.apply_calibration(r[None], pd=pd, cal=gain, n_threads=1), raw, seconds)
        ped = aare.Pedestal_d(raw.shape[1], raw.shape[2], 128)
        out["aare_pedestal"] = per_frame(ped.push, raw, seconds)
    except ImportError:
        out["aare_convert"] = out["aare_pedestal"] = None
    try:
        threshold, snr, n, min_px, max_px = lsnr
        args = (threshold, snr, int(n), int(min_px), int(max_px))
        out["local_snr"] = per_frame(lambda img: local_snr(img, *args), kev, seconds)
        out["local_snr_spots"] = sum(local_snr(img, *args) for img in kev)
    except ImportError:
        out["local_snr"] = out["local_snr_spots"] = None
    try:
        from cfelpyutils.peakfinding.peakfinder8 import Peakfinder8PeakDetection
        rows, cols = kev.shape[1:]
        yy, xx = np.mgrid[0:rows, 0:cols]
        radius = np.sqrt((xx - cols / 2) ** 2 + (yy - rows / 2) ** 2).astype(np.float32)
        ints = [int(v) for v in p8[:5]] + [p8[5], p8[6], int(p8[7]), int(p8[8]), int(p8[9]), p8[10], p8[11]]
        pf = Peakfinder8PeakDetection(*ints, None, None, radius)
        out["peakfinder8"] = per_frame(pf.find_peaks, kev, seconds)
        out["peakfinder8_spots"] = sum(pf.find_peaks(img).num_peaks for img in kev)
    except ImportError:
        out["peakfinder8"] = out["peakfinder8_spots"] = None
    try:
        import bitshuffle
        out["bitshuffle_lz4_photons"] = per_frame(bitshuffle.compress_lz4, photons, seconds)
        # the same counts as int16 (they fit): what rdaq run writes by default
        out["bitshuffle_lz4_photons16"] = per_frame(bitshuffle.compress_lz4, photons.astype(np.int16), seconds)
        out["bitshuffle_lz4_kev"] = per_frame(bitshuffle.compress_lz4, kev, seconds)
        out["bitshuffle_zstd_photons"] = per_frame(lambda a: bitshuffle.compress_zstd(a, 0, 3), photons, seconds)
        # the raw words, as a raw run writes them
        out["bitshuffle_lz4_raw"] = per_frame(bitshuffle.compress_lz4, raw, seconds)
    except ImportError:
        for k in ("bitshuffle_lz4_photons", "bitshuffle_lz4_photons16", "bitshuffle_lz4_kev", "bitshuffle_zstd_photons", "bitshuffle_lz4_raw"):
            out[k] = None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
