"""Baselines of `rdaq bench process`: the reference libraries on the same data, one thread.

Usage: process_baselines.py DIR SECONDS  (DIR holds bench_inputs.h5 written by the bench)
Prints one JSON object: seconds per frame for each baseline (null where unavailable).
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


def main():
    d, seconds = sys.argv[1], float(sys.argv[2])
    with h5py.File(os.path.join(d, "bench_inputs.h5"), "r") as f:
        raw, kev, photons = f["raw"][()], f["kev"][()], f["photons"][()]
        pd, gain = f["pedestal"][()], f["gain"][()]
    out = {}
    try:
        import aare
        out["aare_convert"] = per_frame(lambda r: aare.apply_calibration(r[None], pd=pd, cal=gain, n_threads=1), raw, seconds)
        ped = aare.Pedestal_d(raw.shape[1], raw.shape[2], 128)
        out["aare_pedestal"] = per_frame(ped.push, raw, seconds)
    except ImportError:
        out["aare_convert"] = out["aare_pedestal"] = None
    try:
        from cfelpyutils.peakfinding.peakfinder8 import Peakfinder8PeakDetection
        rows, cols = kev.shape[1:]
        yy, xx = np.mgrid[0:rows, 0:cols]
        radius = np.sqrt((xx - cols / 2) ** 2 + (yy - rows / 2) ** 2).astype(np.float32)
        pf = Peakfinder8PeakDetection(2048, 256, 256, cols // 256, rows // 256, 6.2, 5.0, 2, 200, 3, 0, 10000,
                                      None, None, radius)
        out["peakfinder8"] = per_frame(pf.find_peaks, kev, seconds)
    except ImportError:
        out["peakfinder8"] = None
    try:
        import bitshuffle
        out["bitshuffle_lz4_photons"] = per_frame(bitshuffle.compress_lz4, photons, seconds)
        out["bitshuffle_lz4_kev"] = per_frame(bitshuffle.compress_lz4, kev, seconds)
        out["bitshuffle_zstd_photons"] = per_frame(lambda a: bitshuffle.compress_zstd(a, 0, 3), photons, seconds)
    except ImportError:
        out["bitshuffle_lz4_photons"] = out["bitshuffle_lz4_kev"] = out["bitshuffle_zstd_photons"] = None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
