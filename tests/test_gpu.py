"""The GPU backend: without a GPU, `--backend gpu` answers with one line that names what this
machine lacks and exits 2 without starting anything, and `rdaq check` says so and exits 3;
with one, the GPU graph's files equal the CPU graph's as far as the two runs received the
same frames (bench/gpu_files_equal.py tells a difference of reception from one of
processing). On every machine, every kernel compiles with CUDA 12's NVRTC (the
`nvidia-cuda-nvrtc-cu12` wheel), with the backend's options."""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import gpu_files_equal  # noqa: E402


def gpu_missing(rdaq, tmp_path):
    """Why this machine cannot run the GPU backend (None: it can)."""
    r = subprocess.run([rdaq, "run", "--backend", "gpu", "--frames", "1", "--out", tmp_path / "probe", "--stream", "none", "--preview", "none"],
                       capture_output=True, text=True, timeout=120)
    return r.stderr.strip() if r.returncode == 2 and "process.backend" in r.stderr else None


def wheel_lib(module):
    """The library folder of an NVIDIA wheel's package (`nvidia.cuda_nvrtc`, `nvidia.cu13`)."""
    spec = importlib.util.find_spec(module)
    assert spec, f"the wheel of {module} is not installed (tests/requirements.txt)"
    return pathlib.Path(list(spec.submodule_search_locations)[0]) / "lib"


@pytest.mark.parametrize("cuda", [12, 13])
def test_every_kernel_compiles_through_nvrtc_with_the_backends_options(cuda):
    """crates/gpu/tests/nvrtc.rs with CUDA 12's NVRTC first on the library path, or CUDA 13's
    named by RDAQ_NVRTC: it compiles each kernel file to PTX, for NVRTC's default target and
    for the H100's, and finds each kernel in it."""
    env = {k: v for k, v in os.environ.items() if k != "RDAQ_NVRTC"}
    if cuda == 12:
        env["LD_LIBRARY_PATH"] = f"{wheel_lib('nvidia.cuda_nvrtc')}:{os.environ.get('LD_LIBRARY_PATH', '')}"
    else:
        env["RDAQ_NVRTC"] = str(wheel_lib("nvidia.cu13") / "libnvrtc.so.13")
    r = subprocess.run(["cargo", "test", "--release", "-q", "--workspace", "--test", "nvrtc", "--", "--nocapture"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "skipped" not in r.stdout, r.stdout
    assert f"(CUDA {cuda}." in r.stdout, r.stdout
    for kernel in ["convert", "pedestal", "bitshuffle", "spots", "csr"]:
        assert f"compiled kernels/{kernel}.cu" in r.stdout, r.stdout


def test_without_a_gpu_the_backend_says_what_is_missing(rdaq, tmp_path):
    if gpu_missing(rdaq, tmp_path) is None:
        pytest.skip("this machine has a GPU")
    r = subprocess.run([rdaq, "run", "--backend", "gpu", "--frames", "5", "--out", tmp_path], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('rdaq: error: process.backend = "gpu": '), r.stderr
    assert any(k in lines[0] for k in ("no CUDA driver", "no NVRTC", "no CUDA device", "newer than the driver")), lines[0]
    assert "panicked" not in r.stderr
    assert not list(tmp_path.iterdir()), "nothing was started or written"


LOSSY = "[reliability]\nretransmit = false\n[faults]\nloss = 0.001\n"


def lossy_run(rdaq, tmp_path, name, backend, config=""):
    """`rdaq run` of four modules, dark and signal frames, incomplete frames (datagrams lost
    for good: no retransmission), with `config` added to its configuration: its master and
    its summary."""
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(LOSSY + config)
    out, summary = tmp_path / name, tmp_path / f"{name}.json"
    r = subprocess.run([rdaq, "run", "--config", cfg, "--backend", backend, "--frames", "200", "--modules", "4", "--out", out,
                        "--stream", "none", "--preview", "none", "--tolerate-loss", "--summary-json", summary],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return out / "rdaq_run_master.h5", json.loads(summary.read_text())


def test_the_comparison_of_two_runs_finds_a_difference_of_processing(rdaq, tmp_path):
    """The comparison the GPU test makes, on two CPU runs: equal for the same frames, and a
    difference found when the frames' content differs (another seed of the emulated
    detector: the same frames sent and lost, other pixels)."""
    a = lossy_run(rdaq, tmp_path, "a", "cpu")
    b = lossy_run(rdaq, tmp_path, "b", "cpu")
    alike, compared, _, diffs = gpu_files_equal.compare(a[0], b[0], a[1], b[1])
    assert not diffs, diffs
    assert len(compared) >= a[1]["frames_written"] // 2, "most frames were compared"
    c = lossy_run(rdaq, tmp_path, "c", "cpu", "[detector]\nseed = 7\n")
    _, compared, _, diffs = gpu_files_equal.compare(a[0], c[0], a[1], c[1])
    assert diffs and compared, "another seed's frames differ"


def test_the_gpu_graph_writes_what_the_cpu_graph_writes(rdaq, tmp_path):
    why = gpu_missing(rdaq, tmp_path)
    if why is not None:
        pytest.skip(why)
    cpu, gpu = lossy_run(rdaq, tmp_path, "cpu", "cpu"), lossy_run(rdaq, tmp_path, "gpu", "gpu")
    alike, compared, skipped, diffs = gpu_files_equal.compare(cpu[0], gpu[0], cpu[1], gpu[1])
    assert not diffs, f"processing differs (received alike: {alike}): {diffs[:5]}"
    assert len(compared) >= cpu[1]["frames_written"] // 2, f"too few frames received alike to compare ({len(compared)}, {len(skipped)} not)"
    assert gpu[1]["processing"]["gpu"]["device_errors"] == 0


def test_check_says_what_this_host_runs(rdaq):
    """`rdaq check`: the host's CPUs, memory, AF_XDP; without a GPU it says why and exits 3
    (with one: 0 when every kernel equals the CPU, 1 when one differs)."""
    r = subprocess.run([rdaq, "check"], capture_output=True, text=True, timeout=300)
    lines = r.stdout.splitlines()
    for what in ("CPUs", "memory", "locked memory", "AF_XDP engine", "GPU"):
        assert any(line.startswith(what) for line in lines), r.stdout
    assert lines[-1].startswith("result: "), r.stdout
    if r.returncode == 3:
        assert "no usable GPU" in lines[-1] and "exit 3" in lines[-1], r.stdout
        assert any(k in r.stdout for k in ("no CUDA driver", "no NVRTC", "no CUDA device", "newer than the driver")), r.stdout
    else:
        assert r.returncode == 0, r.stdout + r.stderr
        assert "DIFFERS" not in r.stdout and "all 6 kernel checks equal the CPU" in lines[-1], r.stdout
    assert "panicked" not in r.stderr
