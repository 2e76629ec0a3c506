"""The README's system of daemons, run as written on one host (no network namespaces): the
detector daemon, two receiver daemons and the manager, with the README's topology file. Only
the output directories move under the test's own (`/tmp/` becomes the test directory) and
the control and data ports to free ones (in a copy of the topology), so that runs, and
another acquisition on this host, do not meet. Every frame must be written once, by the
receiver the plan sent it to, and each receiver's stream must be on its own port."""
import json
import re
import shlex
import subprocess
import time
import urllib.request

import h5py
import hdf5plugin  # noqa: F401

from conftest import ROOT, free_port


def readme_commands():
    """The shell lines of the README's "system of daemons" block."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"A system of daemons[^\n]*\n\n```sh\n(.*?)```", text, re.S)
    assert block, "the README's daemon example is missing"
    return [line for line in block.group(1).splitlines() if line.strip()]


def wait_up(url, proc, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"daemon exited with {proc.returncode}: {proc.stderr.read()}"
        try:
            return urllib.request.urlopen(url, timeout=1).read()
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not come up")


def test_the_readme_daemon_example_runs_as_written(rdaq, tmp_path):
    lines = readme_commands()
    assert lines[0].startswith("R=")
    daemons, manage = lines[1:-1], lines[-1]
    assert all(d.endswith("&") for d in daemons) and "manage" in manage

    # the README's control ports, and its topology's data ports, moved to free ones
    controls = {p: free_port() for p in sorted(set(re.findall(r"127\.0\.0\.1:(70\d\d)", "\n".join(lines))))}
    topology = (ROOT / "topology.example.toml").read_text()
    for old, new in controls.items():
        topology = topology.replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}")
    topology = re.sub(r"(?m)^data_port = \d+", "data_port = 0", topology)
    (tmp_path / "topology.toml").write_text(topology)

    def argv(line):
        for old, new in controls.items():
            line = line.replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}")
        line = line.replace("/tmp/", f"{tmp_path}/").replace("topology.example.toml", str(tmp_path / "topology.toml"))
        words = shlex.split(line.rstrip("&"))
        assert words[0] == "$R"
        return [str(rdaq), *words[1:]]

    procs = []
    try:
        for d in daemons:
            args = argv(d)
            out = args[args.index("--out-dir") + 1] if "--out-dir" in args else None
            if out:
                (tmp_path / out).mkdir(parents=True, exist_ok=True)
            procs.append(subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            wait_up(f"http://{args[args.index('--serve') + 1]}/status", procs[-1])
        r = subprocess.run(argv(manage), cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    frames = []
    for name in ("dr0", "dr1"):
        with h5py.File(tmp_path / name / f"{name}_master.h5", "r") as f:
            got = f["entry/data/frame_number"][:].tolist()
            assert f["entry/data/data"].shape[0] == len(got) > 0
        frames += got
    assert sorted(frames) == list(range(200)), "every frame once"
    assert "\x1b[" not in r.stderr, "logs to a pipe carry no terminal colour codes"
    # the defaults, or (another acquisition on this host holds one) a free port named so
    streams = dict(re.findall(r"streaming receiver=(dr\d) stream=(\S+)", r.stderr))
    moved = dict(re.findall(r"streaming on a free port.*? receiver=(dr\d) stream=(\S+)", r.stderr))
    assert sorted({**streams, **moved}) == ["dr0", "dr1"], r.stderr
    for name, default in (("dr0", "tcp://127.0.0.1:31001"), ("dr1", "tcp://127.0.0.1:31003")):
        assert streams.get(name) == default or moved[name].startswith("tcp://127.0.0.1:"), r.stderr
    assert report, "the manager wrote its report"
