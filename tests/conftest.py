"""Shared helpers for the end-to-end tests: they run the real rdaq binary."""
import json
import os
import pathlib
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
RDAQ = ROOT / "target" / "release" / "rdaq"
SHARED = ROOT.parent / "shared"
INTEROP = SHARED / "interop" / "sls-jungfrau-virtual"


@pytest.fixture(scope="session")
def rdaq():
    if not RDAQ.exists():
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "rdaq"], cwd=ROOT, check=True)
    return RDAQ


def wait_for_file(path, proc, timeout=20.0):
    """Waits until `path` exists and parses as JSON, failing early if `proc` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"rdaq exited early with {proc.returncode}: {proc.stderr.read()}")
        try:
            return json.loads(pathlib.Path(path).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(0.05)
    raise AssertionError(f"{path} did not appear in {timeout} s")


def read_capture(path):
    """Records of an SLSCAP01 file: list of UDP payloads."""
    path = pathlib.Path(path)
    assert path.exists(), f"{path} is missing: the tests expect shared/ beside the repository"
    data = path.read_bytes()
    assert data[:8] == b"SLSCAP01"
    count = int.from_bytes(data[8:12], "little")
    off, out = 16, []
    for _ in range(count):
        ln = int.from_bytes(data[off:off + 4], "little")
        off += 12
        out.append(data[off:off + ln])
        off += ln
    return out


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
