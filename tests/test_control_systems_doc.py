"""docs/control-systems.md's first hour, run as written on one host: its shell and Python
blocks, in order, as one script (`/tmp/beamline` moved under the test's directory). The
datasets it makes by hand, through Bluesky and through the PVs and the Tango device must be
where the page says, with the frames it says."""
import os
import re
import signal
import subprocess
import time

import h5py
import hdf5plugin  # noqa: F401

from conftest import ROOT


def first_hour():
    """The page's code blocks up to "Where the files go", as one bash script."""
    text = (ROOT / "docs" / "control-systems.md").read_text()
    text = text[text.index("## The first hour"):text.index("## Where the files go")]
    script = []
    for lang, body in re.findall(r"```(sh|python)\n(.*?)```", text, re.S):
        script.append(body if lang == "sh" else f".venv/bin/python - <<'PY'\n{body}PY\n")
    assert len(script) == 5, "the page's blocks changed: update this test"
    return "set -euo pipefail\n" + "".join(script)


def test_the_first_hour_runs_as_written(rdaq, tmp_path):
    script = first_hour().replace("/tmp/beamline", str(tmp_path / "beamline"))
    # a file, not a pipe: the daemons started in the background hold it after the script ends
    log = tmp_path / "first_hour.log"
    proc = subprocess.Popen(["bash", "-c", script], cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        proc.wait(timeout=300)
    finally:
        # the daemons, the service and the IOC it started in the background
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(3)
    out = log.read_text()
    assert proc.returncode == 0, out
    data = tmp_path / "beamline" / "data"
    lines = out.splitlines()
    assert str(data / "first" / "hello_master.h5") in lines, out
    with h5py.File(data / "first" / "hello_master.h5", "r") as f:
        assert f["entry/data/frame_number"][:].tolist() == list(range(20))
    (bluesky,) = [p for p in (data / "bluesky").glob("*_master.h5") if re.fullmatch(r"[0-9a-f-]{36}_master\.h5", p.name)]
    with h5py.File(bluesky, "r") as f:
        assert f["entry/data/data"].shape[0] == 12, "3 points of 4 frames"
    assert any(line.startswith("stream_resource file://localhost" + str(data / "bluesky")) for line in lines), out
    assert str(data / "epics" / "pva_master.h5") in lines, out
    assert re.search(r"BL01:RDAQ:NumCaptured_RBV\s+\[?\d+", out), out
    assert re.search(r"BL01:RDAQ:FullFileName_RBV\s+" + re.escape(str(data / "epics" / "pva_master.h5")), out), out
    assert re.search(r"Idle \d+ " + re.escape(str(data / "epics" / "pva_master.h5")), out), out
