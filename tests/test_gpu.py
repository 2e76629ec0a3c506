"""The GPU backend (issue 13, in progress): without a GPU, `--backend gpu` answers with one
line that names what this machine lacks and exits 2 without starting anything; with one, the
GPU graph's files equal the CPU graph's. On every machine, every kernel compiles with CUDA
12's NVRTC (the `nvidia-cuda-nvrtc-cu12` wheel), with the backend's options."""
import importlib.util
import os
import pathlib
import subprocess

import h5py
import hdf5plugin  # noqa: F401
import numpy as np
import pytest

from conftest import ROOT


def gpu_missing(rdaq, tmp_path):
    """Why this machine cannot run the GPU backend (None: it can)."""
    r = subprocess.run([rdaq, "run", "--backend", "gpu", "--frames", "1", "--out", tmp_path / "probe", "--stream", "none", "--preview", "none"],
                       capture_output=True, text=True, timeout=120)
    return r.stderr.strip() if r.returncode == 2 and "process.backend" in r.stderr else None


def test_every_kernel_compiles_through_nvrtc_with_the_backends_options():
    """crates/gpu/tests/nvrtc.rs with the wheel's NVRTC first on the library path: it compiles
    each kernel file to PTX, for NVRTC's default target and for the H100's, and finds each
    kernel in it."""
    spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    assert spec, "the nvidia-cuda-nvrtc-cu12 wheel is not installed (tests/requirements.txt)"
    lib = pathlib.Path(list(spec.submodule_search_locations)[0]) / "lib"
    env = {**os.environ, "LD_LIBRARY_PATH": f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    r = subprocess.run(["cargo", "test", "--release", "-q", "-p", "rdaq-gpu", "--test", "nvrtc", "--", "--nocapture"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "skipped" not in r.stdout, r.stdout
    for kernel in ["convert", "pedestal", "bitshuffle", "spots", "csr"]:
        assert f"compiled kernels/{kernel}.cu" in r.stdout, r.stdout


def test_without_a_gpu_the_backend_says_what_is_missing(rdaq, tmp_path):
    if gpu_missing(rdaq, tmp_path) is None:
        pytest.skip("this machine has a GPU")
    r = subprocess.run([rdaq, "run", "--backend", "gpu", "--frames", "5", "--out", tmp_path], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('rdaq: error: process.backend = "gpu": '), r.stderr
    assert any(k in lines[0] for k in ("no CUDA driver", "no NVRTC", "no CUDA device", "CUDA 12 libnvrtc.so")), lines[0]
    assert "panicked" not in r.stderr
    assert not list(tmp_path.iterdir()), "nothing was started or written"


def test_the_gpu_graph_writes_what_the_cpu_graph_writes(rdaq, tmp_path):
    why = gpu_missing(rdaq, tmp_path)
    if why is not None:
        pytest.skip(why)
    # dark and signal frames (the chopper), four modules, and incomplete frames (datagrams
    # lost for good: no retransmission)
    cfg = tmp_path / "lossy.toml"
    cfg.write_text("[reliability]\nretransmit = false\n[faults]\nloss = 0.001\n")
    files = {}
    for backend in ("cpu", "gpu"):
        out = tmp_path / backend
        r = subprocess.run([rdaq, "run", "--config", cfg, "--backend", backend, "--frames", "200", "--modules", "4", "--out", out,
                            "--stream", "none", "--preview", "none", "--tolerate-loss"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        files[backend] = out / "rdaq_run_master.h5"
    with h5py.File(files["cpu"], "r") as a, h5py.File(files["gpu"], "r") as b:
        assert len(a["entry/data/incomplete_frame_number"]) > 0, "the run had incomplete frames"
        for name in ("entry/data/data", "entry/data/frame_number", "entry/result_1/nPeaks", "entry/result_1/peakXPosRaw",
                     "entry/result_1/peakYPosRaw", "entry/result_1/peakTotalIntensity", "entry/result_1/peakNPixels"):
            assert np.array_equal(a[name][()], b[name][()]), name
