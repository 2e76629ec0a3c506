"""Whether two runs' files hold the same results, telling a difference of what the runs
received apart from a difference of their processing: a run on a loaded host may refuse
frames the other took, or lose other datagrams.

Each data file is read directly (chunks raw, so that no compression filter is needed: h5py
alone, as on a GPU host). The runs *received alike* when their summaries (`--summary-json`)
show the same refused and never-seen frames, the same missing cells and no kernel drops;
then every frame must be written by both runs or by neither, with the same chunk, byte for
byte, and the same spot list. Otherwise only the frames both runs wrote, and got whole or
with the same pixels missing, are compared, and the rest are counted as received
differently.

    python3 bench/gpu_files_equal.py A_master.h5 B_master.h5 [A_summary.json B_summary.json]

Exit 0: equal as far as the runs received alike; 1: a difference of processing.
"""
import json
import sys

import h5py

PEAKS = ["peakXPosRaw", "peakYPosRaw", "peakTotalIntensity", "peakNPixels"]
RECEPTION = ["frames_refused_runs", "frames_never_seen_runs", "cells_missing", "kernel_drops"]


def data_files(master):
    """The `/entry` of each data file of the series, through the master's links."""
    data = master["entry/data"]
    for name in sorted(k for k in data if k.startswith("data_")):
        yield data[name].file["entry"]


def raw_chunks(d):
    return [d.id.read_direct_chunk((i,) + (0,) * (d.ndim - 1))[1] for i in range(d.shape[0])]


def frames(master):
    """Per written frame number: (its raw chunk, its spot list, its missing pixels' raw
    chunk or None when it came whole)."""
    out = {}
    for entry in data_files(master):
        d = entry["data"]
        numbers = [int(f) for f in d["frame_number"][()]]
        chunks = raw_chunks(d["data"])
        missing = {}
        if "incomplete_frame_number" in d:
            missing = dict(zip((int(f) for f in d["incomplete_frame_number"][()]), raw_chunks(d["incomplete_pixel_mask"])))
        res = entry.get("result_1")
        for row, f in enumerate(numbers):
            spots = None
            if res is not None:
                n = int(res["nPeaks"][row])
                spots = tuple(res[p][row, :n].tobytes() for p in PEAKS)
            out[f] = (chunks[row], spots, missing.get(f))
    return out


def compare(a_path, b_path, a_summary=None, b_summary=None):
    """(whether the runs received alike, frames compared, frames not compared, differences)."""
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        fa, fb = frames(a), frames(b)
    alike = a_summary is not None and b_summary is not None and all(a_summary.get(k) == b_summary.get(k) for k in RECEPTION) \
        and not a_summary.get("kernel_drops")
    if alike:
        compared = set(fa) | set(fb)
    else:
        compared = {f for f in set(fa) & set(fb) if fa[f][2] == fb[f][2]}
    diffs = []
    for f in sorted(compared):
        x, y = fa.get(f), fb.get(f)
        if x is None or y is None:
            diffs.append(f"frame {f}: written by {'the first' if y is None else 'the second'} run only")
        elif x[2] != y[2]:
            diffs.append(f"frame {f}: different pixels missing")
        elif x[0] != y[0]:
            diffs.append(f"frame {f}: chunks differ")
        elif x[1] != y[1]:
            diffs.append(f"frame {f}: spot lists differ")
    return alike, compared, (set(fa) | set(fb)) - compared, diffs


def main(argv):
    summaries = [json.load(open(p)) for p in argv[2:4]] if len(argv) >= 4 else [None, None]
    alike, compared, skipped, diffs = compare(argv[0], argv[1], *summaries)
    for d in diffs[:20]:
        print("differs:", d)
    if not alike:
        reception = {k: (s.get(k) if s else None for s in summaries) for k in RECEPTION}
        print("the runs received differently (or no summaries):", {k: tuple(v) for k, v in reception.items()})
        print(f"not compared: {len(skipped)} frames written by one run only or with other pixels missing")
    print(f"{'equal' if not diffs else 'DIFFERENT'}: {argv[0]} vs {argv[1]}: {len(compared)} frames compared, {len(diffs)} differ")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
