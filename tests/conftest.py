"""Shared helpers for the end-to-end tests: they run the real rdaq binary."""
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
RDAQ = ROOT / "target" / "release" / "rdaq"
# real packets of PSI's virtual JUNGFRAU (slsDetectorPackage 9.2.0); the format is in the README there
INTEROP = ROOT / "tests" / "data" / "sls-jungfrau-virtual"


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
    assert path.exists(), f"{path} is missing"
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


# Ports handed out in this session: the kernel may hand a closed port out again at once, and a
# test that asks for several (a detector's, each receiver's, the manager's) needs them distinct:
# two daemons on one port fail, or worse, one answers the other's requests.
_HANDED_OUT = set()


def _free(kind):
    for _ in range(1000):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise AssertionError("no port free that this session has not handed out already")


def free_port():
    """A TCP port free now and not handed out before in this session."""
    return _free(socket.SOCK_STREAM)


def free_udp_port():
    """A UDP port free now and not handed out before in this session."""
    return _free(socket.SOCK_DGRAM)


def frames_in(path, swmr=False, origins=None):
    """{frame number: [xxh3 of each module]} of an NXmx file, modules found by data_origin
    (or given, for a data file, which has no geometry); `swmr` reads a file being written
    or left by a killed writer."""
    import h5py
    import hdf5plugin  # noqa: F401
    import numpy as np
    import xxhash
    out = {}
    with h5py.File(path, "r", swmr=swmr) as f:
        data = f["entry/data/data"]
        numbers = f["entry/data/frame_number"][:]
        if origins is None:
            det = f["entry/instrument/detector"]
            names = sorted((k for k in det if k.startswith("module_")), key=lambda k: int(k.split("_")[1]))
            origins = [tuple(det[k]["data_origin"][:]) for k in names]
        for i in range(data.shape[0]):
            img = data[i]
            out[int(numbers[i])] = [xxhash.xxh3_64_hexdigest(np.ascontiguousarray(img[r:r + 512, c:c + 1024]).tobytes())
                                    for r, c in origins]
    return out


def manifest(path):
    """{(frame, module): xxh3} of a manifest CSV."""
    import csv
    return {(int(r["frame"]), int(r["module"])): r["xxh3"] for r in csv.DictReader(open(path))}


@pytest.fixture(autouse=True)
def drop_outputs(tmp_path):
    """Deletes each test's HDF5 files after it: gigabytes of dirty pages left behind would
    make the disk's writeback stall the next test's writer (a real overrun, but of the test
    machine, not of what the next test checks)."""
    yield
    for f in tmp_path.rglob("*.h5"):
        f.unlink(missing_ok=True)


ENGINES = ["recvmmsg", "io_uring", "af_xdp"]


def send_udp(datagrams, host="127.0.0.1"):
    """Sends [(payload, port), ...] to `host`, in order, from this process."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for payload, port in datagrams:
        s.sendto(payload, (host, port))
    s.close()


class EngineNet:
    """Where a receiver test runs for one receive engine: the socket engines on loopback,
    AF_XDP in a network namespace behind a veth pair (it needs an interface with a driver),
    with the sender in another namespace."""

    def __init__(self, engine, tmp_path):
        self.engine, self.tmp_path, self.hosts = engine, tmp_path, None
        self.bind = "127.0.0.1"
        if engine == "af_xdp":
            import netns
            if not netns.available():
                pytest.skip("AF_XDP needs network namespaces (root and iproute2)")
            self.hosts = netns.Hosts(["snd", "rcv"])
            self.bind = self.hosts.addr["rcv"]

    def args(self):
        return ["--engine", self.engine, "--bind", self.bind]

    def popen(self, args, **kw):
        if self.hosts is None:
            return subprocess.Popen([str(a) for a in args], **kw)
        return self.hosts.exec("rcv", args, **kw)

    def send(self, datagrams):
        """Sends [(payload, port), ...] to the receiver's address, in order."""
        if self.hosts is None:
            send_udp(datagrams, self.bind)
            return
        import pickle
        f = self.tmp_path / "datagrams.pickle"
        f.write_bytes(pickle.dumps(list(datagrams)))
        p = self.hosts.exec("snd", [sys.executable, ROOT / "tests" / "udp_send.py", f, self.bind])
        assert p.wait(timeout=60) == 0

    def close(self):
        if self.hosts is not None:
            self.hosts.close()


@pytest.fixture(params=ENGINES)
def net(request, tmp_path):
    n = EngineNet(request.param, tmp_path)
    yield n
    n.close()


# The packaging builds (the wheel, the portable bundle, the .deb) take minutes each on the
# 2-core CI machine. When a session collects their tests, they start at once in the background
# at low priority, one after the other, while the other tests run; their tests go last and
# wait for what they need. The .deb packs the binaries the other tests run (built before the
# session): a build of its own would cost minutes and could replace them under those tests.
BUILDS = ("wheel", "dist", "deb")
BUILT_FOR = {"test_package.py": ("wheel", "deb"), "test_dist.py": ("dist",)}
BUILD_ARGS = {"deb": "--no-build"}


class Builds:
    """Scripts/<name>.sh for each name, run one after the other in the background."""

    def __init__(self, names):
        import tempfile
        self.names, self.dir = names, pathlib.Path(tempfile.mkdtemp(prefix="rdaq-builds-"))
        steps = []
        for n in names:
            steps.append(f"nice -n 10 scripts/{n}.sh {BUILD_ARGS.get(n, '')} >{self.dir}/{n}.out 2>{self.dir}/{n}.err; echo $? >{self.dir}/{n}.rc")
        self.proc = subprocess.Popen(["bash", "-c", "; ".join(steps)], cwd=ROOT, start_new_session=True)

    def result(self, name, timeout):
        """The last word of the script's output (the file it made); fails with its output
        when it failed."""
        rc = self.dir / f"{name}.rc"
        deadline = time.monotonic() + timeout
        while not (rc.exists() and rc.read_text().strip()):
            assert self.proc.poll() is None or rc.exists(), f"the builds stopped before scripts/{name}.sh"
            assert time.monotonic() < deadline, f"scripts/{name}.sh did not finish in {timeout} s"
            time.sleep(1)
        out, err = (self.dir / f"{name}.out").read_text(), (self.dir / f"{name}.err").read_text()
        assert rc.read_text().strip() == "0", out + err
        return out.split()[-1]

    def stop(self):
        if self.proc.poll() is None:
            import signal
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)


_builds = None


def pytest_collection_modifyitems(session, config, items):
    global _builds
    names = {n for i in items for n in BUILT_FOR.get(i.path.name, ())}
    if names:
        items.sort(key=lambda i: i.path.name in BUILT_FOR)
        _builds = Builds([n for n in BUILDS if n in names])


def pytest_sessionfinish(session, exitstatus):
    if _builds is not None:
        _builds.stop()


def built(name, timeout):
    """What scripts/<name>.sh made (the path it printed last), relative to the repository:
    from the background build when the session started one, else built now."""
    if _builds is not None and name in _builds.names:
        return ROOT / _builds.result(name, timeout)
    args = BUILD_ARGS.get(name, "").split()
    r = subprocess.run([str(ROOT / "scripts" / f"{name}.sh"), *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return ROOT / r.stdout.split()[-1]
