"""rdaq.sls, the detector-control layer over PSI's slsdet, against a stand-in of
slsdet.Detector that records every call and answers as the real one does (its property
names, its per-module dicts, its enums: checked against the real slsdet's below)."""
import enum
import time
import types

import pytest

from rdaq.sls import DetectorError, SlsControl

GainMode = enum.Enum("gainMode", "DYNAMIC FORCE_SWITCH_G1 FORCE_SWITCH_G2 FIX_G1 FIX_G2 FIX_G0")
TimingMode = enum.Enum("timingMode", "AUTO_TIMING TRIGGER_EXPOSURE GATED BURST_TRIGGER TRIGGER_GATED")
RunStatus = enum.Enum("runStatus", "IDLE ERROR WAITING RUN_FINISHED TRANSMITTING RUNNING STOPPED")
ENUMS = types.SimpleNamespace(gainMode=GainMode, timingMode=TimingMode, runStatus=RunStatus)
SETTINGS = ["numinterfaces", "udp_dstip", "udp_dstmac", "udp_dstport", "udp_dstip2", "udp_dstmac2", "udp_dstport2",
            "timing", "frames", "triggers", "period", "exptime", "gainmode", "dr"]


class StandIn:
    """slsdet.Detector as rdaq.sls uses it: settings recorded in order (a dict of module
    index to value sets each module, as slsdet's set_using_dict does), start and stop,
    and a status that runs for `busy` polls after each start, then says `ends`."""

    def __init__(self, modules=2, busy=2, ends=None, interrupt_at=None):
        self.__dict__.update(calls=[], modules=modules, busy=busy, ends=list(ends or []), polls=0, interrupt_at=interrupt_at,
                             values={"gainmode": GainMode.DYNAMIC, "frames": 1})

    def __len__(self):
        return self.modules

    def __setattr__(self, name, value):
        assert name in SETTINGS, f"slsdet.Detector has no setting {name} here"
        if isinstance(value, dict):
            assert set(value) <= set(range(self.modules)), value
        self.calls.append((name, value))
        self.values[name] = value

    def __getattr__(self, name):
        if name in ("gainmode", "frames"):
            return self.values[name]
        raise AttributeError(name)

    def start(self):
        self.calls.append(("start", self.values["gainmode"], self.values["frames"]))
        self.__dict__["polls"] = 0

    def stop(self):
        self.calls.append(("stop",))

    @property
    def status(self):
        self.__dict__["polls"] += 1
        if self.polls == self.interrupt_at:
            raise KeyboardInterrupt
        if self.polls <= self.busy:
            return RunStatus.RUNNING
        return self.ends.pop(0) if self.ends else RunStatus.IDLE


def test_the_stand_in_speaks_slsdets_api():
    """Every setting, call and enum member the stand-in offers exists in slsdet 10.0.1."""
    slsdet = pytest.importorskip("slsdet")
    for name in SETTINGS + ["start", "stop", "status", "hostname", "__len__"]:
        assert hasattr(slsdet.Detector, name), name
    for ours, theirs in ((GainMode, slsdet.gainMode), (TimingMode, slsdet.timingMode), (RunStatus, slsdet.runStatus)):
        assert all(hasattr(theirs, m.name) for m in ours), ours


def test_two_modules_with_two_interfaces_send_to_the_receivers_ports():
    """Module m, interface i sends to port + m * interfaces + i, where `rdaq receive --port
    --interfaces 2` listens."""
    d = StandIn(modules=2)
    SlsControl(d, ENUMS).point_at("10.1.1.100", "9c:dc:71:47:e5:d4", port=50001, interfaces=2)
    assert d.calls == [("numinterfaces", 2), ("udp_dstip", "10.1.1.100"), ("udp_dstmac", "9c:dc:71:47:e5:d4"),
                       ("udp_dstport", {0: 50001, 1: 50003}), ("udp_dstip2", "10.1.1.100"), ("udp_dstmac2", "9c:dc:71:47:e5:d4"),
                       ("udp_dstport2", {0: 50002, 1: 50004})]
    one = StandIn(modules=3)
    SlsControl(one, ENUMS).point_at("10.1.1.100", "9c:dc:71:47:e5:d4", port=50001)
    assert ("udp_dstport", {0: 50001, 1: 50002, 2: 50003}) in one.calls and not any(c[0].endswith("2") for c in one.calls)
    with pytest.raises(ValueError, match="65536"):
        SlsControl(StandIn(), ENUMS).point_at("10.1.1.100", "9c:dc:71:47:e5:d4", port=65535, interfaces=2)


def test_an_eigers_half_modules_send_to_the_receivers_four_ports_per_module():
    """slsdet's EIGER modules are half-modules of two ports each: half j sends to port + 2j
    and port + 2j + 1, the four ports per module `rdaq receive --detector eiger` listens on;
    no interface count or second destination is set (a JUNGFRAU's), and the bit depth is."""
    d = StandIn(modules=4)
    c = SlsControl(d, ENUMS)
    c.point_at("10.1.1.100", "9c:dc:71:47:e5:d4", port=50011, kind="eiger")
    c.bit_depth(8)
    assert d.calls == [("udp_dstip", "10.1.1.100"), ("udp_dstmac", "9c:dc:71:47:e5:d4"),
                       ("udp_dstport", {0: 50011, 1: 50013, 2: 50015, 3: 50017}),
                       ("udp_dstport2", {0: 50012, 1: 50014, 2: 50016, 3: 50018}), ("dr", 8)]
    with pytest.raises(ValueError, match="bit depth 24"):
        c.bit_depth(24)


def test_frames_timing_and_exposure_by_rdaqs_trigger_names():
    d = StandIn()
    c = SlsControl(d, ENUMS)
    c.configure(frames=100, period_s=0.002, exptime_s=10e-6, trigger="external", triggers=5)
    assert d.calls == [("timing", TimingMode.TRIGGER_EXPOSURE), ("frames", 100), ("triggers", 5), ("period", 0.002), ("exptime", 10e-6)]
    with pytest.raises(ValueError, match="trigger 'edge'"):
        c.configure(frames=1, period_s=0.0, exptime_s=1e-5, trigger="edge")
    with pytest.raises(ValueError, match="exposure"):
        c.configure(frames=1, period_s=0.0, exptime_s=0.0)


def test_the_pedestal_procedure_forces_each_gain_and_restores_the_detector():
    """Dynamic gain (G0), then forced G1, then forced G2, each with the frames asked for and
    acquired to the end; the gain mode and frame count found are restored after."""
    d = StandIn()
    d.values.update(gainmode=GainMode.FIX_G1, frames=7)
    stages = []
    SlsControl(d, ENUMS).pedestal(frames=1000, on_stage=stages.append)
    assert stages == ["g0", "g1", "g2"]
    starts = [c for c in d.calls if c[0] == "start"]
    assert starts == [("start", GainMode.DYNAMIC, 1000), ("start", GainMode.FORCE_SWITCH_G1, 1000), ("start", GainMode.FORCE_SWITCH_G2, 1000)]
    assert d.calls[-2:] == [("gainmode", GainMode.FIX_G1), ("frames", 7)]


def test_a_stage_that_fails_stops_the_detector_and_still_restores_it():
    """The detector says ERROR in the forced-G1 stage: it is stopped, the procedure raises,
    and the gain mode and frames are back as they were; the G2 stage never starts."""
    d = StandIn(ends=[RunStatus.IDLE, RunStatus.ERROR])
    with pytest.raises(DetectorError, match="error"):
        SlsControl(d, ENUMS).pedestal(frames=10)
    assert [c[1] for c in d.calls if c[0] == "start"] == [GainMode.DYNAMIC, GainMode.FORCE_SWITCH_G1]
    assert ("stop",) in d.calls and d.calls[-2:] == [("gainmode", GainMode.DYNAMIC), ("frames", 1)]


def test_an_interrupt_stops_the_detector_and_restores_it():
    """Ctrl-C while the detector runs: stopped, restored, and the interrupt goes on."""
    d = StandIn(busy=10**9, interrupt_at=3)
    with pytest.raises(KeyboardInterrupt):
        SlsControl(d, ENUMS).pedestal(frames=10)
    assert ("stop",) in d.calls and d.calls[-2:] == [("gainmode", GainMode.DYNAMIC), ("frames", 1)]
    assert SlsControl(StandIn(), ENUMS).state() == "running"


def test_a_pedestal_run_with_the_detector_driven(rdaq, tmp_path):
    """pedestal_run: `rdaq receive --pedestal-run` started and listening, then the procedure.
    The stand-in detector replays PSI's virtual JUNGFRAU's three captured frames at each
    start (numbered on from the last) to the port point_at gave it: the receiver takes 9
    frames, writes a calibration with every stage's frames, and exits 0; the detector is
    restored."""
    import socket

    import h5py

    from conftest import INTEROP, read_capture, send_udp
    from rdaq.sls import pedestal_run
    capture = read_capture(INTEROP / "jungfrau_virtual.bin")
    numbers = sorted({int.from_bytes(p[:8], "little") for p in capture})
    assert len(numbers) == 3

    class Replaying(StandIn):
        def start(self):
            super().start()
            stage = sum(1 for c in self.calls if c[0] == "start") - 1
            port = self.values["udp_dstport"][0]
            send_udp([((int.from_bytes(p[:8], "little") + 3 * stage).to_bytes(8, "little") + p[8:], port) for p in capture])

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = Replaying(modules=1)
    c = SlsControl(d, ENUMS)
    c.point_at("127.0.0.1", "00:00:00:00:00:00", port)
    rc = pedestal_run(c, tmp_path / "cal.h5", frames=3, port=port, rdaq=str(rdaq),
                      receive_args=["--modules", "1", "--timeout-s", "60", "--frame-timeout-ms", "200", "--ring-mib", "16", "--stream", "none"])
    assert rc == 0
    with h5py.File(tmp_path / "cal.h5", "r") as f:
        assert f["pedestal_frames"][:].tolist() == [9, 9, 9]
    assert [c[1] for c in d.calls if c[0] == "start"] == [GainMode.DYNAMIC, GainMode.FORCE_SWITCH_G1, GainMode.FORCE_SWITCH_G2]
    assert d.calls[-2:] == [("gainmode", GainMode.DYNAMIC), ("frames", 1)]


class VirtualJungfrau(StandIn):
    """A one-module JUNGFRAU behind the stand-in: at each start it sends `frames` frames to
    where point_at sent it, each a frame of PSI's virtual JUNGFRAU's capture (its ADC values)
    numbered on, every pixel in the gain its gain mode gives a dark pixel (G0, or forced G1
    or G2); in dynamic gain with `spots`, twelve 3 x 3 blocks 1,000 ADU above the dark."""

    GAIN_BITS = {GainMode.DYNAMIC: 0x0000, GainMode.FORCE_SWITCH_G1: 0x4000, GainMode.FORCE_SWITCH_G2: 0xC000}

    def __init__(self, capture, send_at_most=None, **kw):
        super().__init__(modules=1, **kw)
        self.__dict__.update(capture=capture, spots=False, sent=0, send_at_most=send_at_most)

    def start(self):
        import numpy as np

        from conftest import send_udp
        super().start()
        bits, port = self.GAIN_BITS[self.values["gainmode"]], self.values["udp_dstport"][0]
        frames = {}
        for p in self.capture:
            frames.setdefault(int.from_bytes(p[:8], "little"), []).append(p)
        cycle = [frames[k] for k in sorted(frames)]
        for k in range(min(self.values["frames"], self.send_at_most or self.values["frames"])):
            out = []
            self.__dict__["sent"] += 1
            for p in cycle[k % len(cycle)]:
                pixels = (np.frombuffer(p[48:], "<u2") & 0x3FFF) | bits
                packet = int.from_bytes(p[12:16], "little")
                if self.spots and bits == 0 and packet % 10 == 5 and packet < 125:
                    block = pixels.reshape(4, 1024)
                    block[:3, 200 + packet:203 + packet] += 1000
                out.append((self.sent.to_bytes(8, "little") + p[8:48] + pixels.astype("<u2").tobytes(), port))
            # a frame at a time, as a detector paces them: a burst of all of them could
            # overflow the loopback's backlog (1,000 datagrams by default) on a busy host
            send_udp(out)
            time.sleep(0.002)


def test_the_jungfrau_walkthrough_from_a_hostname_to_processed_frames(rdaq, tmp_path, monkeypatch):
    """docs/jungfrau.md's commands, with the stand-in detector for slsdet's: the pedestal
    run writes a calibration that masks nothing (every pixel seen in every gain), and the
    acquisition with it converts the frames, finds the twelve spots of each and keeps every
    frame as a hit."""
    import json
    import socket

    from conftest import INTEROP, read_capture
    import rdaq.sls as sls
    det = VirtualJungfrau(read_capture(INTEROP / "jungfrau_virtual.bin"))
    monkeypatch.setattr(sls.SlsControl, "connect", classmethod(lambda cls, host: cls(det, ENUMS)))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = ["--detector", "jf1", "--receiver-ip", "127.0.0.1", "--receiver-mac", "00:00:00:00:00:00", "--port", str(port),
              "--rdaq", str(rdaq)]
    assert sls.main(["pedestal", *common, "--frames", "20", "--calibration", str(tmp_path / "cal.h5")]) == 0
    det.__dict__["spots"] = True
    receive = [f"--receive={a}" for a in ["--calibration", tmp_path / "cal.h5", "--summary-json", tmp_path / "s.json", "--modules", "1"]]
    assert sls.main(["acquire", *common, "--frames", "6", "--out", str(tmp_path / "run.h5"), *receive]) == 0
    s = json.loads((tmp_path / "s.json").read_text())
    p = s["processing"]
    assert (s["frames_complete"], p["signal_frames"], p["hits"]) == (6, 6, 6), p
    assert p["spots_found"] == 6 * 12, p


def virtual_jungfrau(hostname):
    """`RDAQ_SLS_DETECTOR`'s factory (test_sls_control:virtual_jungfrau) for `rdaq receive
    --sls-detector`, in the client it starts: a VirtualJungfrau with spots when STANDIN_SPOTS
    is set, sending at most STANDIN_SEND frames per start, ending ERROR when STANDIN_ENDS says
    so, never ending with STANDIN_BUSY; its calls are appended to STANDIN_LOG (a JSON line)
    when the client exits."""
    import os

    from conftest import INTEROP, read_capture
    send = os.environ.get("STANDIN_SEND")
    ends = [RunStatus.ERROR] if os.environ.get("STANDIN_ENDS") == "error" else None
    busy = 10**9 if os.environ.get("STANDIN_BUSY") else 2
    det = VirtualJungfrau(read_capture(INTEROP / "jungfrau_virtual.bin"), send_at_most=int(send) if send else None, ends=ends, busy=busy)
    spots = os.environ.get("STANDIN_SPOTS", "")
    # a path: spots while that file exists (a service's datasets after its pedestal)
    det.__dict__["spots"] = os.path.exists(spots) if spots.startswith("/") else bool(spots)
    log_at_exit(det, hostname)
    return SlsControl(det, ENUMS)


def log_at_exit(det, hostname):
    """Appends the stand-in's calls to STANDIN_LOG as one JSON line when the client exits
    (a service starts one client per trigger)."""
    import atexit
    import json
    import os

    def said(v):
        if isinstance(v, enum.Enum):
            return v.name
        return {str(k): said(x) for k, x in v.items()} if isinstance(v, dict) else v

    def log():
        with open(os.environ["STANDIN_LOG"], "a") as f:
            f.write(json.dumps({"hostname": hostname, "calls": [[said(x) for x in c] for c in det.calls]}) + "\n")
    atexit.register(log)


def standin_env(log, **env):
    """The environment of `rdaq receive --sls-detector` whose client drives the stand-in,
    which logs its calls to `log`."""
    import os
    import sys
    from pathlib import Path
    tests = str(Path(__file__).parent)
    return {**os.environ, "RDAQ_SLS_DETECTOR": "test_sls_control:virtual_jungfrau", "RDAQ_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]), "STANDIN_LOG": str(log),
            **{k: str(v) for k, v in env.items()}}


MAC = "00:11:22:33:44:55"


def driven(rdaq, tmp_path, args, bind="127.0.0.1", timeout_s=120, fmt="sls", mac=MAC, **env):
    """`rdaq receive --format sls --sls-detector jf1` on a free port with `args`, its client
    on the stand-in; returns the process result, the stand-in's log and the port."""
    import json
    import subprocess

    from conftest import free_udp_port
    port = free_udp_port()
    log = tmp_path / f"standin-{port}.json"
    source = ["--format", fmt, "--modules", "1"] if fmt else []
    cmd = [rdaq, "receive", *source, "--bind", bind, "--port", str(port), "--sls-detector", "jf1",
           *(["--receiver-mac", mac] if mac else []), "--ring-mib", "16", "--stream", "none", "--timeout-s", str(timeout_s),
           *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=standin_env(log, **env))
    return r, json.loads(log.read_text().splitlines()[-1]) if log.exists() else None, port


def test_rdaq_receive_drives_the_detector_from_its_hostname_to_processed_frames(rdaq, tmp_path):
    """docs/jungfrau.md's two commands: `rdaq receive --sls-detector` points the detector's
    UDP destination at itself, runs PSI's pedestal procedure (dynamic, forced G1, forced G2,
    then the gain mode and frames put back) into a calibration that masks nothing, then
    takes processed frames with it: the twelve spots of each frame found, every frame a hit.
    Each run ends when the detector says it is done (a quiet time of a minute is never
    reached)."""
    import json
    r, log, port = driven(rdaq, tmp_path, ["--frames", 60, "--pedestal-run", tmp_path / "cal.h5", "--quiet-s", 60])
    assert r.returncode == 0, r.stderr
    calls = log["calls"]
    assert log["hostname"] == "jf1"
    assert ["udp_dstport", {"0": port}] in calls and ["udp_dstip", "127.0.0.1"] in calls and ["udp_dstmac", MAC] in calls
    assert [c[1:] for c in calls if c[0] == "start"] == [["DYNAMIC", 20], ["FORCE_SWITCH_G1", 20], ["FORCE_SWITCH_G2", 20]]
    assert calls[-2:] == [["gainmode", "DYNAMIC"], ["frames", 1]], "the detector is put back"
    import h5py
    with h5py.File(tmp_path / "cal.h5", "r") as f:
        assert f["pedestal_frames"][:].tolist() == [20, 20, 20]
        assert not f["pixel_mask"][:].any()
    r, log, _ = driven(rdaq, tmp_path, ["--frames", 6, "--calibration", tmp_path / "cal.h5", "--out", tmp_path / "run.h5",
                                        "--summary-json", tmp_path / "s.json", "--frame-time-s", 0.002, "--count-time-s", 1e-5],
                       STANDIN_SPOTS=1)
    assert r.returncode == 0, r.stderr
    assert [c for c in log["calls"] if c[0] in ("timing", "frames", "period", "exptime")] == [["timing", "AUTO_TIMING"], ["frames", 6], ["period", 0.002], ["exptime", 1e-5]]
    s = json.loads((tmp_path / "s.json").read_text())
    p = s["processing"]
    assert (s["frames_complete"], p["signal_frames"], p["hits"], p["spots_found"]) == (6, 6, 6, 72), p


def test_the_receiver_ends_when_the_driven_detector_is_done(rdaq, tmp_path):
    """A detector that sends 4 of the 6 frames asked and then says it is done: the receiver
    ends then (not after --quiet-s 60), counts the 2 that never came, and exits 1."""
    import json
    r, _, _ = driven(rdaq, tmp_path, ["--frames", 6, "--out", tmp_path / "raw.h5", "--quiet-s", 60, "--summary-json", tmp_path / "s.json"],
                     STANDIN_SEND=4)
    assert r.returncode == 1, r.stderr
    assert "the detector says it has finished, and the datagrams in flight have landed" in r.stderr, r.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["frames_complete"] == 4 and s["frames_never_seen"] == 2, s


def test_a_detector_that_fails_fails_the_receive_and_is_put_back(rdaq, tmp_path):
    """The detector says ERROR in the pedestal's first stage: the client stops it, puts its
    gain mode and frames back and says why; rdaq receive exits 2 naming the client, and
    writes no calibration."""
    r, log, _ = driven(rdaq, tmp_path, ["--frames", 9, "--pedestal-run", tmp_path / "cal.h5"], STANDIN_ENDS="error")
    assert r.returncode == 2, r.stderr
    assert "the detector says error" in r.stderr and "--sls-detector: driving the detector failed" in r.stderr, r.stderr
    assert ["stop"] in log["calls"] and log["calls"][-2:] == [["gainmode", "DYNAMIC"], ["frames", 1]]


def test_a_receiver_stopped_early_stops_the_detector_and_puts_it_back(rdaq, tmp_path):
    """A detector that never says it is done, and the receiver's --timeout-s reached: the
    receiver interrupts its client once, which stops the detector and puts its gain mode
    and frames back; the frames that never came make the exit 1."""
    r, log, _ = driven(rdaq, tmp_path, ["--frames", 9, "--pedestal-run", tmp_path / "cal.h5"], timeout_s=3, STANDIN_BUSY=1)
    assert r.returncode == 1, r.stderr
    assert "interrupted: the detector was stopped" in r.stderr, r.stderr
    assert [c[0] for c in log["calls"] if c[0] in ("start", "stop")] == ["start", "stop"]
    assert log["calls"][-2:] == [["gainmode", "DYNAMIC"], ["frames", 1]]


def test_what_a_driven_detector_cannot_take_is_refused_before_it_starts(rdaq, tmp_path):
    """A pedestal run's frames not in three equal stages, or a receiver listening on every
    address (no destination for the detector): exit 2, one line, the detector untouched."""
    r, log, _ = driven(rdaq, tmp_path, ["--frames", 10, "--pedestal-run", tmp_path / "cal.h5"])
    assert r.returncode == 2 and "a multiple of 3" in r.stderr and log is None, r.stderr
    r, log, _ = driven(rdaq, tmp_path, ["--frames", 3], bind="0.0.0.0")
    assert r.returncode == 2 and "--sls-detector needs --bind" in r.stderr and log is None, r.stderr


def test_the_service_drives_the_detector_through_a_pedestal_dataset_and_processed_ones(rdaq, tmp_path):
    """The acquisition service of one receiver with --sls-detector: a pedestal dataset (one
    service call: POST /arm with pedestal, POST /trigger) runs PSI's procedure on the
    detector and records `<prefix>_calibration.h5`, which the service then processes with:
    the next dataset's trigger sets the detector's frames, period and exposure, starts it,
    and its twelve spots per frame are found in every frame. A pedestal of two triggers, or
    of frames not in three equal stages, is refused at the arm (one asked of `rdaq manage`'s
    service: tests/test_service.py)."""
    import json
    import signal
    import subprocess

    import h5py

    from conftest import free_port, free_udp_port
    from rdaq.control import ApiError, Service
    from test_readme_daemons import wait_up
    log, spots = tmp_path / "standin.jsonl", tmp_path / "spots-on"
    addr, root = f"127.0.0.1:{free_port()}", tmp_path / "data"
    p = subprocess.Popen([rdaq, "receive", "--format", "sls", "--bind", "127.0.0.1", "--port", str(free_udp_port()),
                          "--sls-detector", "jf1", "--receiver-mac", MAC, "--modules", "1", "--ring-mib", "16", "--stream", "none",
                          "--frame-timeout-ms", "200", "--data-root", root, "--serve", addr],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=standin_env(log, STANDIN_SPOTS=spots))
    try:
        wait_up(f"http://{addr}/acquisition", p)
        svc = Service(f"http://{addr}")
        with pytest.raises(ApiError, match="triggers"):
            svc.arm(30, "dark", triggers=2, pedestal=True)
        with pytest.raises(ApiError, match="frames_per_trigger.*multiple of 3"):
            svc.arm(31, "dark", pedestal=True)
        svc.arm(30, "dark", pedestal=True)
        svc.trigger()
        a = svc.wait("idle", timeout=120)
        assert a["dataset"]["summary"]["calibration"] == str(root / "dark_calibration.h5")
        with h5py.File(root / "dark_calibration.h5", "r") as f:
            assert f["pedestal_frames"][:].tolist() == [10, 10, 10] and not f["pixel_mask"][:].any()
        spots.touch()
        svc.arm(6, "run1", period_s=0.002, count_time_s=1e-5)
        svc.trigger()
        a = svc.wait("idle", timeout=120)
        s = a["dataset"]["summary"]
        assert (s["frames_complete"], s["processing"]["hits"], s["processing"]["spots_found"]) == (6, 6, 72), s
    finally:
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    pedestal, run = [json.loads(line)["calls"] for line in log.read_text().splitlines()]
    assert [c[1:] for c in pedestal if c[0] == "start"] == [["DYNAMIC", 10], ["FORCE_SWITCH_G1", 10], ["FORCE_SWITCH_G2", 10]]
    assert pedestal[-2:] == [["gainmode", "DYNAMIC"], ["frames", 1]]
    assert [c for c in run if c[0] in ("timing", "frames", "period", "exptime", "start")] == [
        ["timing", "AUTO_TIMING"], ["frames", 6], ["period", 0.002], ["exptime", 1e-5], ["start", "DYNAMIC", 6]]


class VirtualEiger(StandIn):
    """An EIGER module behind the stand-in (slsdet's two half-modules): at each start it
    sends PSI's virtual EIGER's captured streams, each half-module's two to its two ports."""

    def __init__(self, streams):
        super().__init__(modules=2)
        self.__dict__.update(streams=streams)

    def start(self):
        from conftest import send_udp
        super().start()
        ports = [self.values["udp_dstport"][0], self.values["udp_dstport2"][0], self.values["udp_dstport"][1], self.values["udp_dstport2"][1]]
        send_udp([(p, port) for port, st in zip(ports, self.streams) for p in st])


def virtual_eiger(hostname):
    """`RDAQ_SLS_DETECTOR`'s factory of a VirtualEiger replaying the capture STANDIN_CAPTURE
    (tests/data/sls-eiger-virtual), logging as virtual_jungfrau does."""
    import os

    from conftest import read_capture
    from pathlib import Path
    data = Path(__file__).parent / "data" / "sls-eiger-virtual"
    det = VirtualEiger([read_capture(data / f"{os.environ['STANDIN_CAPTURE']}_port{p}.bin") for p in range(50011, 50015)])
    log_at_exit(det, hostname)
    return SlsControl(det, ENUMS)


def test_rdaq_receive_drives_an_eiger(rdaq, tmp_path):
    """`rdaq receive --detector eiger --sls-detector` (no --receiver-mac): the stand-in
    EIGER's half-modules are pointed at the receiver's four ports and the MAC of the card
    holding --bind, its bit depth set to the receiver's, and the frames it sends (PSI's
    virtual EIGER's) all arrive; the receiver ends when it is done."""
    import json
    r, log, port = driven(rdaq, tmp_path, ["--detector", "eiger", "--bit-depth", 16, "--link", "1g", "--frames", 3,
                                           "--out", tmp_path / "e.h5", "--summary-json", tmp_path / "s.json"],
                          RDAQ_SLS_DETECTOR="test_sls_control:virtual_eiger", STANDIN_CAPTURE="eiger_1g_dr16", fmt=None, mac=None)
    assert r.returncode == 0, r.stderr
    calls = log["calls"]
    # no --receiver-mac: the MAC of the interface holding --bind (loopback's)
    assert ["udp_dstmac", "00:00:00:00:00:00"] in calls
    assert ["udp_dstport", {"0": port, "1": port + 2}] in calls and ["udp_dstport2", {"0": port + 1, "1": port + 3}] in calls
    assert ["dr", 16] in calls and not any(c[0] == "numinterfaces" for c in calls)
    assert json.loads((tmp_path / "s.json").read_text())["frames_complete"] == 3
