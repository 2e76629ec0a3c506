"""The GPU backend (issue 13, in progress): `--backend gpu` answers with one line that names
what this machine lacks, or what it found, and exits 2 without starting anything."""
import subprocess


def test_the_gpu_backend_says_what_it_found(rdaq, tmp_path):
    r = subprocess.run([rdaq, "run", "--backend", "gpu", "--frames", "5", "--out", tmp_path], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('rdaq: error: process.backend = "gpu": '), r.stderr
    assert any(k in lines[0] for k in ("no CUDA driver", "no NVRTC", "no CUDA device", "not part of the processing graph yet")), lines[0]
    assert "panicked" not in r.stderr
    assert not list(tmp_path.iterdir()), "nothing was started or written"
