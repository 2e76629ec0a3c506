"""A detector's own packets through the daemons: a receiver daemon defines buffers for native
JUNGFRAU packets (PSI's virtual JUNGFRAU captures, processed online) or EIGER packets, and
`rdaq manage` drives an emulated EIGER (`rdaq emulate --serve --detector eiger`) into two
receiver daemons, each holding one module. All daemons on one host."""
import json
import subprocess
import time

import h5py
import hdf5plugin  # noqa: F401
import numpy as np
import pytest

from conftest import ROOT, free_port, read_capture, send_udp
from test_control_api import call
from test_eiger import capture
from test_eiger import receive as eiger_receive
from test_eiger import pattern
from test_process import write_calibration
from test_readme_daemons import wait_up
from test_receive_process import CASES, KEV, calibration
from test_receive_process import receive as receive_raw
from test_sls_replay import replay


def receiver_daemon(rdaq, tmp_path, *args):
    port = free_port()
    out = tmp_path / "dr0"
    out.mkdir()
    proc = subprocess.Popen([rdaq, "receive", "--serve", f"127.0.0.1:{port}", "--name", "dr0", "--memory-mib", "64",
                             "--out-dir", out, "--stream", "none", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    wait_up(url + "/status", proc)
    return proc, url, out


def buffers(url, module_bytes, native, modules=(0,)):
    req = {"version": 1, "modules": list(modules), "module_bytes": module_bytes, "payload_bytes": 8192, "slots": 8,
           "data_port": 0, "native": native}
    return call("PUT", url + "/buffers", req)


def acquire(url, output, frames, send):
    """One acquisition of `frames` frames that `send(map)` sends; returns the stop answer."""
    code, started = call("POST", url + "/start", {"output": output})
    assert code == 200, started
    send()
    deadline = time.monotonic() + 20
    while call("GET", url + "/status")[1]["counters"]["frames_complete"] < frames:
        assert time.monotonic() < deadline, call("GET", url + "/status")
        time.sleep(0.05)
    code, stopped = call("POST", url + "/stop", {})
    assert code == 200, stopped
    return stopped


@pytest.mark.parametrize("case", ["two interfaces", "256 rows"])
def test_psi_jungfrau_captures_processed_by_a_receiver_daemon(rdaq, tmp_path, case):
    """The daemon's acquisition is `rdaq receive`'s: its photon counts equal `rdaq process
    convert` on the raw file of the same frames, bit for bit."""
    interfaces, captures, frames, rows, _ = CASES[case]
    pedestal, gain = calibration(rows)
    write_calibration(tmp_path / "cal.h5", pedestal, gain, np.zeros((rows, 1024), np.uint32))
    (tmp_path / "proc.toml").write_text('[process]\nveto = false\noutput = "photons32"\n')
    (tmp_path / "raw").mkdir()
    s_raw, raw_h5 = receive_raw(rdaq, tmp_path / "raw", case, [])
    assert s_raw["frames_complete"] == frames
    proc, url, out = receiver_daemon(rdaq, tmp_path, "--calibration", tmp_path / "cal.h5", "--config", tmp_path / "proc.toml",
                                     "--photon-energy-kev", str(KEV))
    try:
        code, bad = buffers(url, 1 << 20, {"detector": "jungfrau", "interfaces": interfaces, "read_rows": rows})
        if rows != 512:
            assert code == 400 and "module_bytes" in bad["error"] and str(rows // 4 * 8192) in bad["error"], bad
        code, m = buffers(url, rows // 4 * 8192, {"detector": "jungfrau", "interfaces": interfaces, "read_rows": rows})
        assert code == 200 and len(m["data_ports"]) == interfaces, m
        stopped = acquire(url, "proc.h5", frames, lambda: replay([(c, m["data_ports"][i]) for c, i in captures]))
        threads = call("GET", url + "/status")[1]["threads"]
        assert threads["busy"] == {"receivers": 1, "writers": 1, "senders": 0} and threads["workers"] >= 1, threads
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert stopped["frames_written"] == frames and stopped["frames_incomplete"] == 0, stopped
    assert stopped["processing"]["signal_frames"] == frames, stopped["processing"]
    subprocess.run([rdaq, "process", "convert", "--input", raw_h5, "--calibration", tmp_path / "cal.h5",
                    "--photon-kev", str(KEV), "--counts", "i32", "--output", tmp_path / "offline.h5"], check=True)
    with h5py.File(stopped["output"], "r") as f, h5py.File(tmp_path / "offline.h5", "r") as o:
        online, offline = f["entry/data/data"][()], o["entry/data/data"][()]
        assert online.dtype == np.int32 and online.shape == (frames, rows, 1024)
        assert np.unique(online).size > 100
        assert np.array_equal(online, offline), "the daemon's photon counts differ from the offline conversion"


def test_psi_eiger_captures_through_a_receiver_daemon(rdaq, tmp_path):
    """Native EIGER packets (10GbE, 16 bits) into a daemon equal `rdaq receive --detector
    eiger` of the same capture; a request naming a path is refused."""
    streams = capture("eiger_10g_dr16")
    send = lambda ports: send_udp([(p, ports[i]) for i, st in enumerate(streams) for p in st])  # noqa: E731
    (tmp_path / "cli").mkdir()
    s, cli_h5 = eiger_receive(rdaq, tmp_path / "cli", 2, ["--detector", "eiger", "--bit-depth", "16", "--link", "10g"], send=send)
    assert s["frames_complete"] == 2
    proc, url, out = receiver_daemon(rdaq, tmp_path)
    try:
        code, bad = buffers(url, 1 << 20, {"detector": str(ROOT / "detectors" / "eiger.toml")})
        assert code == 400 and "native.detector" in bad["error"], bad
        native = {"detector": "eiger", "bit_depth": 16, "link": "10g"}
        code, bad = buffers(url, 1 << 20, {**native, "bit_depth": 24})
        assert code == 400 and "native.bit_depth 24" in bad["error"], bad
        code, m = buffers(url, 1 << 20, native)
        assert code == 200 and len(m["data_ports"]) == 4, m
        code, bad = call("POST", url + "/start", {"output": "x.h5", "config": {"detector": {"name": "jungfrau.toml"}}})
        assert code == 400 and "detector.name" in bad["error"], bad
        stopped = acquire(url, "eiger.h5", 2, lambda: send(m["data_ports"]))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert stopped["frames_written"] == 2 and stopped["frames_incomplete"] == 0, stopped
    with h5py.File(stopped["output"], "r") as f, h5py.File(cli_h5, "r") as c:
        assert f["entry/data/frame_number"][:].tolist() == c["entry/data/frame_number"][:].tolist()
        assert np.array_equal(f["entry/data/data"][()], c["entry/data/data"][()])
        assert f["entry/instrument/detector/description"][()] == c["entry/instrument/detector/description"][()]


def eiger_topology(tmp_path, ports, mode="spatial", bits=16, streams=("none", "none")):
    text = (f'[detector]\nname = "eiger"\nbit_depth = {bits}\nmodules = 2\nmodule_cols = 1\n'
            f'control = "127.0.0.1:{ports["det"]}"\n\n[transfer]\nmode = "{mode}"\n')
    for k, name in enumerate(("dr0", "dr1")):
        text += (f'\n[[receivers]]\nname = "{name}"\ncontrol = "127.0.0.1:{ports[name]}"\ndata = "127.0.0.1"\n'
                 f'data_port = 0\nmemory_mib = 64\nstream = "{streams[k]}"\n')
    path = tmp_path / f"topology-{mode}.toml"
    path.write_text(text)
    return path


def test_an_eiger_acquisition_through_the_manager(rdaq, tmp_path):
    """`rdaq manage` with `detector.name = "eiger"`: the emulated EIGER sends each module's
    four ports to the receiver holding it (spatial), and every pixel of every frame in each
    receiver's file is the emulator's pattern for that module; `rdaq write` joins the two
    receivers' streams into whole images of the detector. A temporal plan (modules that
    would change receiver frame by frame) and a detector of other settings are refused
    before anything is sent."""
    frames, bits = 20, 12
    ports = {k: free_port() for k in ("det", "dr0", "dr1")}
    procs = [subprocess.Popen([rdaq, "emulate", "--serve", f"127.0.0.1:{ports['det']}", "--modules", "2", "--detector", "eiger",
                               "--bit-depth", str(bits)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)]
    try:
        wait_up(f"http://127.0.0.1:{ports['det']}/status", procs[0])
        for name in ("dr0", "dr1"):
            (tmp_path / name).mkdir()
            procs.append(subprocess.Popen([rdaq, "receive", "--serve", f"127.0.0.1:{ports[name]}", "--name", name, "--memory-mib", "64",
                                           "--out-dir", tmp_path / name, "--stream", "none"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            wait_up(f"http://127.0.0.1:{ports[name]}/status", procs[-1])
        manage = [rdaq, "manage", "--frames", str(frames), "--rate", "50"]
        r = subprocess.run([*manage, "--topology", eiger_topology(tmp_path, ports, "temporal", bits), "--out", tmp_path / "t"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "transfer.mode" in r.stderr and "spatial" in r.stderr, r.stderr
        r = subprocess.run([*manage, "--topology", eiger_topology(tmp_path, ports, "spatial", 16), "--out", tmp_path / "b"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "detector.name" in r.stderr and "12 bits" in r.stderr, r.stderr
        streams = (f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
        procs.append(subprocess.Popen([rdaq, "write", "--from", streams[0], "--from", streams[1], "--out", tmp_path / "joined", "--name", "eiger",
                                       "--idle-timeout-s", "60", "--summary-json", tmp_path / "w.json"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        r = subprocess.run([*manage, "--topology", eiger_topology(tmp_path, ports, "spatial", bits, streams), "--out", tmp_path / "report"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        out, err = procs[-1].communicate(timeout=60)
        assert procs[-1].returncode == 0, out + err
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    for m, name in enumerate(("dr0", "dr1")):
        rep = report["receivers"][name]
        assert rep["frames_complete"] == frames and rep["frames_incomplete"] == 0, rep
        with h5py.File(rep["output"], "r") as f:
            data = f["entry/data/data"]
            assert data.shape == (frames, 512, 1024) and data.dtype == np.uint16
            assert f["entry/data/frame_number"][:].tolist() == list(range(frames))
            for i in (0, frames // 2, frames - 1):
                assert np.array_equal(data[i], pattern(i, m, bits)), f"{name}, frame {i}"
    with h5py.File(tmp_path / "joined" / "eiger_master.h5", "r") as j:
        data = j["entry/data/data"]
        assert data.shape == (frames, 2 * 512 + 36, 1024) and data.dtype == np.uint16, data.shape
        assert j["entry/data/frame_number"][:].tolist() == list(range(frames))
        assert "incomplete_frame_number" not in j["entry/data"] or len(j["entry/data/incomplete_frame_number"]) == 0
        for i in (0, frames // 2, frames - 1):
            assert np.array_equal(data[i, :512], pattern(i, 0, bits)) and np.array_equal(data[i, 548:], pattern(i, 1, bits)), f"frame {i}"
            assert (data[i, 512:548] == 0xffff).all(), "the gap between the modules"
        assert j["entry/instrument/detector/description"][()].decode().startswith("EIGER 2-module")
