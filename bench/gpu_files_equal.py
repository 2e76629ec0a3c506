"""Whether two runs' masters hold the same frames: every data file's chunks byte for byte (read
raw, so that no compression filter is needed: h5py alone, as on a GPU host), frame numbers,
incomplete frames and the spot lists. Prints what differs; exit 0 equal, 1 different.

    python3 bench/gpu_files_equal.py A_master.h5 B_master.h5
"""
import sys

import h5py
import numpy as np

TABLES = ["entry/data/frame_number", "entry/data/incomplete_frame_number", "entry/result_1/nPeaks",
          "entry/result_1/peakXPosRaw", "entry/result_1/peakYPosRaw", "entry/result_1/peakTotalIntensity",
          "entry/result_1/peakNPixels"]


def chunks(master):
    """Every frame's raw chunk, in file order, from the data files the master links."""
    out = []
    data = master["entry/data"]
    for name in sorted(k for k in data if k.startswith("data_")):
        d = data[name]
        for i in range(d.shape[0]):
            out.append(d.id.read_direct_chunk((i, 0, 0))[1])
    return out


def main(a_path, b_path):
    diffs = []
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        for t in TABLES:
            if t in a or t in b:
                x, y = (a[t][()] if t in a else None), (b[t][()] if t in b else None)
                if x is None or y is None or x.shape != y.shape or not np.array_equal(x, y):
                    diffs.append(f"{t}: {None if x is None else x.shape} vs {None if y is None else y.shape}")
        ca, cb = chunks(a), chunks(b)
        if len(ca) != len(cb):
            diffs.append(f"data: {len(ca)} vs {len(cb)} chunks")
        else:
            bad = [i for i, (x, y) in enumerate(zip(ca, cb)) if x != y]
            if bad:
                diffs.append(f"data: {len(bad)} of {len(ca)} chunks differ, first at {bad[0]}")
        frames = len(ca)
    for d in diffs:
        print("differs:", d)
    print(f"{'equal' if not diffs else 'DIFFERENT'}: {a_path} vs {b_path} ({frames} frames)")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
