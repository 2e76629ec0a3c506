"""The system manager with a detector host, two receiver hosts and a manager host, each in
its own network namespace: temporal and spatial transfer, and a receiver killed mid-run."""
import json
import subprocess
import time
import urllib.request

import pytest

import netns
from conftest import frames_in, manifest

pytestmark = pytest.mark.skipif(not netns.available(), reason="needs root and network namespaces")


@pytest.fixture
def hosts():
    h = netns.Hosts(["det", "dr0", "dr1", "mgr"])
    yield h
    h.close()


def wait_up(url, proc, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"daemon exited with {proc.returncode}"
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not come up")


def start_system(hosts, rdaq, tmp_path, mode, memory_mib=256, receiver_args=(), transfer=""):
    """Starts the detector and receiver daemons (with `receiver_args`); returns the topology
    file (with `transfer` lines added to its [transfer] table)."""
    a = hosts.addr
    det = hosts.exec("det", [rdaq, "emulate", "--serve", f"{a['det']}:7000", "--modules", "4"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = {"det": det}
    for name in ("dr0", "dr1"):
        out = tmp_path / name
        out.mkdir()
        procs[name] = hosts.exec(name, [rdaq, "receive", "--serve", f"{a[name]}:7000", "--name", name,
                                        "--bind", a[name], "--memory-mib", memory_mib, "--out-dir", out, *receiver_args],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    topo = tmp_path / "topology.toml"
    text = (f'[detector]\nmodules = 4\nmodule_cols = 2\ncontrol = "{a["det"]}:7000"\n\n'
            f'[transfer]\nmode = "{mode}"\n{transfer}')
    for name in ("dr0", "dr1"):
        text += (f'\n[[receivers]]\nname = "{name}"\ncontrol = "{a[name]}:7000"\ndata = "{a[name]}"\n'
                 f'data_port = 50000\nmemory_mib = {memory_mib}\n')
    topo.write_text(text)
    # the control APIs answer from the namespaces' own addresses: ask from inside
    for name, p in procs.items():
        probe = ["python3", "-c", f"import urllib.request;urllib.request.urlopen('http://{a[name]}:7000/telegram',timeout=1)"]
        deadline = time.monotonic() + 20
        while subprocess.run(["ip", "netns", "exec", f"{hosts.tag}{name}"] + probe, capture_output=True).returncode != 0:
            assert p.poll() is None and time.monotonic() < deadline, f"{name} did not come up"
            time.sleep(0.1)
    return topo, procs


def manage(hosts, rdaq, topo, out, frames, rate, extra=()):
    p = hosts.exec("mgr", [rdaq, "manage", "--topology", topo, "--frames", frames, "--rate", rate, "--out", out,
                           "--heartbeat-ms", "100", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = p.communicate(timeout=300)
    return p.returncode, stdout + stderr, json.loads((out / "report.json").read_text())


def test_temporal_every_frame_once_on_its_receiver(hosts, rdaq, tmp_path):
    topo, _ = start_system(hosts, rdaq, tmp_path, "temporal")
    out = tmp_path / "out"
    rc, log, report = manage(hosts, rdaq, topo, out, 60, 50)
    assert rc == 0, log
    assert report["frames_complete"] == 60 and report["frames_lost"] == []
    man = manifest(out / "manifest.csv")
    seen = {}
    for r, name in enumerate(("dr0", "dr1")):
        for frame, hashes in frames_in(tmp_path / name / f"{name}_master.h5").items():
            assert frame % 2 == r, f"frame {frame} on {name}, its DTP names dr{frame % 2}"
            assert frame not in seen, f"frame {frame} twice"
            seen[frame] = name
            assert hashes == [man[(frame, m)] for m in range(4)], f"frame {frame}"
    assert sorted(seen) == list(range(60))


def test_spatial_each_receiver_holds_its_modules(hosts, rdaq, tmp_path):
    topo, _ = start_system(hosts, rdaq, tmp_path, "spatial")
    out = tmp_path / "out"
    rc, log, report = manage(hosts, rdaq, topo, out, 40, 50)
    assert rc == 0, log
    man = manifest(out / "manifest.csv")
    for name, modules in (("dr0", [0, 1]), ("dr1", [2, 3])):
        frames = frames_in(tmp_path / name / f"{name}_master.h5")
        assert sorted(frames) == list(range(40))
        for frame, hashes in frames.items():
            assert hashes == [man[(frame, m)] for m in modules], f"{name} frame {frame}"


def test_a_killed_receiver_loses_exactly_its_frames_and_the_rest_arrives(hosts, rdaq, tmp_path):
    # 50 Hz: after the re-plan one receiver takes every frame (8 MiB to compress and write
    # each), which this 2-core machine sustains at that rate; a ring of 128 frames (2.5 s)
    # rides out a disk slowed down by other writers
    topo, procs = start_system(hosts, rdaq, tmp_path, "temporal", memory_mib=1024)
    out = tmp_path / "out"
    frames = 200
    # kill dr0 once the detector has sent 40 module frames (10 frames): by progress, not by
    # time, so that a slow start on a busy machine does not kill it before the run began
    det = f"http://{hosts.addr['det']}:7000/status"
    wait = ("import json,time,urllib.request\n"
            "while json.load(urllib.request.urlopen('%s', timeout=5))['module_frames'] < 40: time.sleep(0.02)\n" % det)
    killer = subprocess.Popen(["bash", "-c", f"ip netns exec {hosts.tag}det python3 -c \"{wait}\" && kill -9 {procs['dr0'].pid}"])
    rc, log, report = manage(hosts, rdaq, topo, out, frames, 50)
    assert killer.wait(timeout=30) == 0, "the killer saw the run start"
    assert rc == 1, log
    epochs = report["epochs"]
    assert len(epochs) == 2 and epochs[1]["receivers"] == ["dr1"], log
    switch = epochs[1]["from_frame"]
    assert 0 < switch < frames
    # lost: exactly the frames the first plan sent to dr0
    assert report["frames_lost"] == [f for f in range(switch) if f % 2 == 0], log
    received = frames_in(tmp_path / "dr1" / "dr1_master.h5")
    expect = [f for f in range(frames) if f >= switch or f % 2 == 1]
    assert sorted(received) == expect
    assert report["frames_complete"] == len(expect)
    man = manifest(out / "manifest.csv")
    for frame, hashes in received.items():
        assert hashes == [man[(frame, m)] for m in range(4)], f"frame {frame}"
    assert report["receivers"]["dr0"]["alive"] is False
