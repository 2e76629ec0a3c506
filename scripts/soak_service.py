#!/usr/bin/env python3
"""The acquisition service's soak: the one-host system of docs/control-systems.md (detector
daemon, receiver daemon, `rdaq manage --data-root --serve`) takes DATASETS datasets in a row
through `rdaq.control.Service`; every EVERY datasets it prints datasets per minute and each
process's resident memory, open files and threads, so that a growth shows.

    .venv/bin/python scripts/soak_service.py --datasets 1000 --every 100

tests/test_service_soak.py runs a short one and bounds the growth."""
import argparse
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url, proc, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited with {proc.returncode}")
        try:
            return urllib.request.urlopen(url, timeout=1).read()
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def usage(pid):
    """(resident MiB, open files, threads) of process `pid`."""
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    field = {line.split(":")[0]: line.split(":")[1].split() for line in status.splitlines() if ":" in line}
    return int(field["VmRSS"][0]) / 1024, len(os.listdir(f"/proc/{pid}/fd")), int(field["Threads"][0])


class System:
    """The three processes, on free ports, writing under `root`."""

    def __init__(self, rdaq, root, modules=2, data_port=0):
        det, rx, svc = free_port(), free_port(), free_port()
        topo = root / "topology.toml"
        topo.write_text(f'[detector]\nmodules = {modules}\nmodule_cols = 1\ncontrol = "127.0.0.1:{det}"\n\n'
                        f'[[receivers]]\nname = "dr0"\ncontrol = "127.0.0.1:{rx}"\ndata = "127.0.0.1"\ndata_port = {data_port}\n'
                        'memory_mib = 128\nstream = "none"\npreview = "none"\n')
        data = root / "data"
        data.mkdir()
        quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs = {}
        try:
            self.procs["detector"] = subprocess.Popen([rdaq, "emulate", "--serve", f"127.0.0.1:{det}", "--modules", str(modules)], **quiet)
            wait_up(f"http://127.0.0.1:{det}/status", self.procs["detector"])
            self.procs["receiver"] = subprocess.Popen([rdaq, "receive", "--serve", f"127.0.0.1:{rx}", "--name", "dr0", "--memory-mib", "128",
                                                       "--out-dir", data], **quiet)
            wait_up(f"http://127.0.0.1:{rx}/status", self.procs["receiver"])
            self.procs["manager"] = subprocess.Popen([rdaq, "manage", "--topology", topo, "--serve", f"127.0.0.1:{svc}", "--data-root", data], **quiet)
            wait_up(f"http://127.0.0.1:{svc}/acquisition", self.procs["manager"])
        except BaseException:
            self.close()
            raise
        self.url = f"http://127.0.0.1:{svc}"

    def usage(self):
        return {name: usage(p.pid) for name, p in self.procs.items()}

    def close(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def soak(system, datasets, frames, every, period_s=0.001, lossless=True, out=print):
    """Runs the datasets (an error ends the soak; so does a loss, when `lossless`); returns
    one row per EVERY datasets: (datasets done, datasets per minute since the last row,
    {process: (MiB, files, threads)})."""
    from rdaq.control import Service
    svc = Service(system.url)
    rows, t0 = [], time.monotonic()
    out(f"{'datasets':>8} {'per min':>8}  " + "  ".join(f"{n + ' MiB/files/threads':>28}" for n in system.procs))
    for k in range(1, datasets + 1):
        svc.arm(frames_per_trigger=frames, period_s=period_s, directory=f"d{k // 1000}", prefix=f"s{k}", process=False)
        svc.trigger()
        a = svc.wait("idle")
        if a["error"] or (lossless and a["dataset"]["frames_written"] != frames):
            raise RuntimeError(f"dataset {k}: {a}")
        if k % every == 0:
            now = time.monotonic()
            row = (k, every * 60 / (now - t0), system.usage())
            t0 = now
            rows.append(row)
            out(f"{k:>8} {row[1]:>8.0f}  " + "  ".join(f"{m:>18.1f}/{f:>4}/{t:>3}" for m, f, t in row[2].values()))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", type=int, default=1000)
    p.add_argument("--frames", type=int, default=20, help="frames per dataset")
    p.add_argument("--every", type=int, default=100, help="datasets between two rows")
    p.add_argument("--period-s", type=float, default=0.01, help="between two frames (2 MiB each)")
    p.add_argument("--rdaq", default=str(ROOT / "target" / "release" / "rdaq"))
    a = p.parse_args()
    if not (1 <= a.every <= a.datasets and 1 <= a.frames <= 100_000 and 0 <= a.period_s <= 10):
        sys.exit("soak_service: --every must be 1 to --datasets, --frames 1 to 100000, --period-s 0 to 10")
    with tempfile.TemporaryDirectory(prefix="rdaq-soak-") as d:
        system = System(a.rdaq, pathlib.Path(d))
        try:
            soak(system, a.datasets, a.frames, a.every, a.period_s)
        finally:
            system.close()


if __name__ == "__main__":
    main()
