"""librdaq (crates/capi) from C and C++: the test programs in tests/c are compiled here with
the system compiler against the generated header, linked with the shared and with the
static library. The C program checks that misuse returns errors (null pointers, wrong
handles, double release, small buffers, bad configurations), then receives the emulator's
frames; their hashes must equal the emulator's manifest. tests/c/acquire.c runs an
acquisition (rdaq_acquisition_*) and reads its processed frames, which must equal the NXmx
file's. The C++ example of docs/api.md receives frames through RAII wrappers."""
import csv
import json
import pathlib
import subprocess

import h5py
import hdf5plugin  # noqa: F401
import numpy as np
import pytest
import xxhash

from conftest import ROOT

LIB = ROOT / "target" / "release"
HEADER = ROOT / "crates" / "capi" / "include"
MODULE_BYTES = 512 * 1024 * 2


@pytest.fixture(scope="module")
def librdaq():
    if not (LIB / "librdaq.so").exists() or not (LIB / "librdaq.a").exists():
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "rdaq-capi"], cwd=ROOT, check=True)
    return LIB


def compile_c(tmp_path, source, out, static=False, cxx=False):
    cmd = ["c++", "-std=c++17"] if cxx else ["cc", "-Wextra"]
    cmd += ["-O2", "-Wall", "-Werror", "-I", str(HEADER), str(ROOT / "tests" / "c" / source), "-o", str(tmp_path / out)]
    if static:
        # what the static library's Rust and its HDF5 need (`--print native-static-libs`)
        hdf5 = subprocess.run(["pkg-config", "--libs", "hdf5"], capture_output=True, text=True, check=True).stdout.split()
        cmd += [str(LIB / "librdaq.a"), *hdf5, "-lstdc++", "-lgcc_s", "-lutil", "-lrt", "-lpthread", "-ldl", "-lm"]
    else:
        cmd += ["-L", str(LIB), "-lrdaq", f"-Wl,-rpath,{LIB}"]
    subprocess.run(cmd, check=True)
    return tmp_path / out


def receive_with_emulator(rdaq, program_args, map_path, frames, modules, tmp_path, env=None):
    """Runs the program (in `env`) until it is ready, sends `frames` to it; returns its output
    and the manifest."""
    p = subprocess.Popen(program_args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "READY", p.stderr.read()
        subprocess.run([str(rdaq), "emulate", "--buffers", str(map_path), "--frames", str(frames), "--modules", str(modules),
                        "--rate", "200", "--manifest", str(tmp_path / "manifest.csv"), "--overwrite"], check=True, capture_output=True)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, out + err
    with open(tmp_path / "manifest.csv") as f:
        manifest = {(int(r["frame"]), int(r["module"])): int(r["xxh3"], 16) for r in csv.DictReader(f)}
    return out, manifest


@pytest.mark.parametrize("static", [False, True], ids=["shared", "static"])
def test_c_program_receives_frames_bit_exact_and_misuse_is_refused(rdaq, librdaq, tmp_path, static):
    frames, modules = 8, 2
    prog = compile_c(tmp_path, "receive.c", "receive", static=static)
    out, manifest = receive_with_emulator(rdaq, [str(prog), str(frames), str(modules), str(tmp_path / "map.json"), str(tmp_path / "frames.bin")],
                                          tmp_path / "map.json", frames, modules, tmp_path)
    assert f"OK {frames} frames, 0 failures" in out
    data = pathlib.Path(tmp_path / "frames.bin").read_bytes()
    record = 8 + modules * MODULE_BYTES
    assert len(data) == frames * record
    seen = set()
    for k in range(frames):
        rec = data[k * record:(k + 1) * record]
        number = int(np.frombuffer(rec[:8], "<u8")[0])
        for m in range(modules):
            module = rec[8 + m * MODULE_BYTES:8 + (m + 1) * MODULE_BYTES]
            assert xxhash.xxh3_64_intdigest(module) == manifest[(number, m)], f"frame {number} module {m}"
        seen.add(number)
    assert seen == set(range(frames))


DTYPES = {0: np.int16, 1: np.int32, 2: np.float32, 3: np.uint8, 4: np.uint16, 5: np.uint32}
EIGER_SPOTS = '[detector]\nname = "eiger"\nbit_depth = 16\n[process]\nmode = "spots"\nveto = false\n'


def read_frames(path):
    """{frame number: (pixels, spots)} of the frames acquire.c wrote."""
    data, got, at = path.read_bytes(), {}, 0
    while at < len(data):
        number = int(np.frombuffer(data, "<u8", 1, at)[0])
        pixel, width, height, spots = (int(v) for v in np.frombuffer(data, "<i4", 4, at + 8))
        dtype = DTYPES[pixel]
        n = width * height * np.dtype(dtype).itemsize
        got[number] = (np.frombuffer(data[at + 24:at + 24 + n], dtype).reshape(height, width), spots)
        at += 24 + n
    return got


@pytest.mark.parametrize("static", [False, True], ids=["shared", "static"])
@pytest.mark.parametrize("detector", ["jungfrau", "eiger"])
def test_c_program_runs_an_acquisition_and_reads_its_processed_frames(librdaq, tmp_path, static, detector):
    """rdaq_acquisition_*: the acquisition of `rdaq run` from a configuration text, its
    processed frames read in place; they equal the frames of the NXmx file it wrote, and
    the summary is rdaq run's. An emulated EIGER with spot finding on its counts hands out
    its counts (pixel type 4, uint16) with their spot counts."""
    prog = compile_c(tmp_path, "acquire.c", "acquire", static=static)
    conf = tmp_path / "acq.toml"
    conf.write_text((EIGER_SPOTS if detector == "eiger" else '[detector]\nmodules = 1\n') +
                    f'[emulator]\nframes = 8\nrate_hz = 50\n[stream]\nendpoint = "none"\npreview = "none"\n[output]\ndir = "{tmp_path}"\nname = "c"\n')
    r = subprocess.run([str(prog), str(conf), str(tmp_path / "frames.bin")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("SUMMARY "))[8:])
    got = read_frames(tmp_path / "frames.bin")
    assert f"OK {len(got)} frames, 0 failures" in r.stdout
    assert summary["frames_written"] == len(got) > 0 and summary["processing"]["hits"] == len(got if detector == "jungfrau" else []), summary
    if detector == "eiger":
        assert {a.dtype for a, _ in got.values()} == {np.dtype(np.uint16)} and len(got) == 8
    with h5py.File(tmp_path / "c_master.h5", "r") as f:
        numbers = f["entry/data/frame_number"][:].tolist()
        assert sorted(numbers) == sorted(got)
        n_peaks = f["entry/result_1/nPeaks"][:].tolist()
        for i, n in enumerate(numbers):
            assert f["entry/data/data"].dtype == got[n][0].dtype and np.array_equal(f["entry/data/data"][i], got[n][0]), f"frame {n}"
            assert got[n][1] == n_peaks[i], f"frame {n}: spots"


def test_the_cpp_example_of_the_docs_receives_frames(rdaq, librdaq, tmp_path):
    prog = compile_c(tmp_path, "example.cpp", "example", cxx=True)
    out, _ = receive_with_emulator(rdaq, [str(prog), "5", str(tmp_path / "map.json")], tmp_path / "map.json", 5, 1, tmp_path)
    lines = out.splitlines()
    assert len(lines) == 5 and all(" complete mean " in ln for ln in lines), out
    docs = (ROOT / "docs" / "api.md").read_text()
    assert (ROOT / "tests" / "c" / "example.cpp").read_text() in docs, "docs/api.md shows the example as tested"
