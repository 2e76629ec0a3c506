"""rdaq drives a PSI JUNGFRAU (or EIGER) through PSI's own client, ``slsdet`` (``pip install
"rdaq[sls]"``; written against slsdet 10.0.1): the detector's UDP destinations pointed at
rdaq's receiver, its frames, timing and exposure, start, stop and state, and the JUNGFRAU
pedestal procedure with forced gain switching.

    from rdaq.sls import SlsControl
    c = SlsControl.connect("jf1")                 # or SlsControl(slsdet.Detector())
    c.point_at("10.1.1.100", "9c:dc:71:47:e5:d4", port=50001, interfaces=1)
    c.configure(frames=1000, period_s=0.002, exptime_s=10e-6)
    c.acquire()                                   # start, and wait until it is done

``port`` and ``interfaces`` are ``rdaq receive``'s ``--port`` and ``--interfaces``: module
``m``'s interface ``i`` sends to ``port + m * interfaces + i``, where the receiver listens.

The pedestal procedure (PSI's): ``frames`` dark frames in dynamic gain (the G0 pedestal),
then as many with forced switching to G1 and to G2; ``rdaq receive --pedestal-run CAL``
taking ``3 * frames`` frames records all three into the calibration. The gain mode and frame
count the detector had are restored afterwards, also when a stage fails or is interrupted
(the detector is stopped first).

``pedestal_run`` (and ``python -m rdaq.sls pedestal --detector HOST ...``) runs the whole
pedestal run: ``rdaq receive --pedestal-run`` started and listening, then the procedure.

``rdaq receive --sls-detector HOST`` drives the detector itself through ``python -m rdaq.sls
drive`` (the detector alone: pointed, set, started and waited for, or the pedestal
procedure), and ends when the detector is done.

The acquisition service of one receiver (``rdaq receive --data-root --serve
--sls-detector``) drives it the same way for each trigger. Reduced form, said here and in
docs/jungfrau.md: this layer has run against a stand-in of ``slsdet.Detector`` that records
every call and replays PSI's
virtual JUNGFRAU's packets (tests/test_sls_control.py), not against a detector.
"""
from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["SlsControl", "DetectorError", "pedestal_run", "receive_beside", "main"]

#: how often the detector's state is asked while it acquires
POLL_S = 0.05

#: the exit status after an interrupt (as a shell reports SIGINT)
INTERRUPTED = 130


class DetectorError(RuntimeError):
    """The detector said ERROR, or did not finish in time."""


class SlsControl:
    """One detector (all its modules) through an ``slsdet.Detector``, or an object with its
    API; ``enums`` is the module with slsdet's ``gainMode``, ``timingMode`` and
    ``runStatus`` (default: slsdet itself)."""

    def __init__(self, det, enums=None):
        if enums is None:
            import slsdet as enums
        self.det, self.enums = det, enums

    @classmethod
    def connect(cls, hostname: str) -> SlsControl:
        """The detector at ``hostname`` (modules joined by ``+``), as slsdet connects to it.
        With ``RDAQ_SLS_DETECTOR=module:callable`` set, ``callable(hostname)`` gives the
        ``SlsControl`` instead (a simulator with slsdet's API; the tests' stand-in)."""
        factory = os.environ.get("RDAQ_SLS_DETECTOR")
        if factory:
            module, _, name = factory.partition(":")
            return getattr(importlib.import_module(module), name)(hostname)
        from slsdet import Detector
        det = Detector()
        det.hostname = hostname
        return cls(det)

    def point_at(self, ip: str, mac: str, port: int, interfaces: int = 1, kind: str = "jungfrau"):
        """Every module's UDP interfaces send to this receiver: ``ip`` and ``mac`` (the
        receiver's data interface), and each its own port from ``port`` on. An EIGER
        (``kind="eiger"``: slsdet's modules are its half-modules, two ports each) sends
        half-module ``j``'s ports to ``port + 2j`` and ``port + 2j + 1``, as ``rdaq receive
        --detector eiger`` listens (four ports per module)."""
        if kind == "eiger":
            return self._point_eiger_at(ip, mac, port)
        if kind != "jungfrau":
            raise ValueError(f"kind {kind!r}: jungfrau or eiger")
        if interfaces not in (1, 2):
            raise ValueError(f"interfaces {interfaces}: 1 or 2")
        modules = len(self.det)
        if not (0 < port and port + modules * interfaces - 1 <= 65535):
            raise ValueError(f"port {port}: {modules * interfaces} ports from it must fit under 65536")
        d = self.det
        d.numinterfaces = interfaces
        d.udp_dstip, d.udp_dstmac = ip, mac
        d.udp_dstport = {m: port + m * interfaces for m in range(modules)}
        if interfaces == 2:
            d.udp_dstip2, d.udp_dstmac2 = ip, mac
            d.udp_dstport2 = {m: port + m * interfaces + 1 for m in range(modules)}

    def _point_eiger_at(self, ip: str, mac: str, port: int):
        halves = len(self.det)
        if not (0 < port and port + 2 * halves - 1 <= 65535):
            raise ValueError(f"port {port}: {2 * halves} ports from it must fit under 65536")
        d = self.det
        d.udp_dstip, d.udp_dstmac = ip, mac
        d.udp_dstport = {j: port + 2 * j for j in range(halves)}
        d.udp_dstport2 = {j: port + 2 * j + 1 for j in range(halves)}

    def bit_depth(self, bits: int):
        """An EIGER's bit depth (slsdet's ``dr``): what ``rdaq receive --bit-depth`` takes."""
        if bits not in (4, 8, 12, 16, 32):
            raise ValueError(f"bit depth {bits}: 4, 8, 12, 16 or 32")
        self.det.dr = bits

    def configure(self, frames: int | None, period_s: float | None, exptime_s: float | None, trigger: str = "internal",
                  triggers: int = 1):
        """Frames per trigger, their period and exposure (seconds; ``None`` leaves the
        detector's: a pedestal procedure sets its frames itself and puts the detector's
        back), and the trigger mode as rdaq names it: internal (the detector's timing),
        external (a trigger signal starts each trigger's frames) or gate (each frame exposed
        while the signal is high)."""
        t = self.enums.timingMode
        timing = {"internal": t.AUTO_TIMING, "external": t.TRIGGER_EXPOSURE, "gate": t.GATED}.get(trigger)
        if timing is None:
            raise ValueError(f"trigger {trigger!r}: internal, external or gate")
        if not (frames is None or frames >= 1) or triggers < 1 or not (period_s is None or period_s >= 0) \
                or not (exptime_s is None or exptime_s > 0):
            raise ValueError(f"frames {frames}, triggers {triggers}, period {period_s} s, exposure {exptime_s} s: frames and "
                             "triggers at least 1, a period of 0 or more and an exposure above 0")
        d = self.det
        d.timing = timing
        if frames is not None:
            d.frames = frames
        d.triggers = triggers
        if period_s is not None:
            d.period = period_s
        if exptime_s is not None:
            d.exptime = exptime_s

    def state(self) -> str:
        """The detector's state as slsdet says it (idle, running, ...; several when its
        modules differ, joined by ``,``)."""
        s = self.det.status
        return ",".join(sorted({x.name.lower() for x in (s if isinstance(s, list) else [s])}))

    def acquire(self, timeout_s: float = 3600.0):
        """Starts the detector and waits until every module is done; stops it on an error,
        a timeout or an interrupt (and raises)."""
        done = {self.enums.runStatus.IDLE, self.enums.runStatus.RUN_FINISHED, self.enums.runStatus.STOPPED}
        self.det.start()
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                s = self.det.status
                states = set(s) if isinstance(s, list) else {s}
                said = ",".join(sorted(x.name.lower() for x in states))
                if self.enums.runStatus.ERROR in states:
                    raise DetectorError(f"the detector says {said}")
                if states <= done:
                    return
                if time.monotonic() > deadline:
                    raise DetectorError(f"not done after {timeout_s} s: {said}")
                time.sleep(POLL_S)
        except BaseException:
            self.det.stop()
            raise

    def pedestal(self, frames: int, on_stage=None):
        """PSI's pedestal procedure: ``frames`` frames in dynamic gain, then in forced G1 and
        forced G2; ``on_stage(name)`` is called before each (``g0``, ``g1``, ``g2``). The gain
        mode and frame count found are restored after, whatever happened."""
        g = self.enums.gainMode
        before = (self.det.gainmode, self.det.frames)
        if isinstance(before[0], list) or isinstance(before[1], list):
            raise DetectorError(f"the modules differ in gain mode or frames ({before}): set them alike first")
        try:
            for name, mode in (("g0", g.DYNAMIC), ("g1", g.FORCE_SWITCH_G1), ("g2", g.FORCE_SWITCH_G2)):
                if on_stage is not None:
                    on_stage(name)
                self.det.gainmode = mode
                self.det.frames = frames
                self.acquire()
        finally:
            self.det.gainmode, self.det.frames = before


def pedestal_run(control: SlsControl, calibration, frames: int, port: int, interfaces: int = 1, rdaq: str = "rdaq",
                 receive_args=(), ready_timeout_s: float = 60.0, bind: str = "127.0.0.1") -> int:
    """A whole JUNGFRAU pedestal run: ``rdaq receive --format sls --pedestal-run
    calibration`` taking ``3 * frames`` frames on ``port`` (and ``interfaces``), started
    first, then the detector's pedestal procedure; returns rdaq receive's exit status (0:
    the calibration was written). The detector's UDP destinations must point at the
    receiver already (``SlsControl.point_at``). A failing procedure stops the receiver."""
    args = ["--frames", 3 * frames, "--pedestal-run", calibration, *receive_args]
    return receive_beside(control, lambda: control.pedestal(frames), port, interfaces, rdaq, args, ready_timeout_s, bind)


def receive_beside(control: SlsControl, drive, port: int, interfaces: int = 1, rdaq: str = "rdaq", receive_args=(),
                   ready_timeout_s: float = 60.0, bind: str = "127.0.0.1") -> int:
    """``rdaq receive --format sls`` on ``bind``, ``port`` (and ``interfaces``) with
    ``receive_args``, started first; once it listens, ``drive()`` (the detector's
    acquisition); returns rdaq receive's exit status. A failing ``drive`` stops the receiver
    and raises."""
    with tempfile.TemporaryDirectory(prefix="rdaq-sls-") as tmp:
        ready = Path(tmp) / "ports.json"
        cmd = [rdaq, "receive", "--format", "sls", "--bind", bind, "--port", str(port), "--interfaces", str(interfaces),
               "--buffers-out", str(ready), *map(str, receive_args)]
        receiver = subprocess.Popen(cmd)
        try:
            _wait_listening(receiver, ready, ready_timeout_s)
            drive()
        except BaseException:
            receiver.terminate()
            receiver.wait(timeout=60)
            raise
        return receiver.wait()


def _wait_listening(receiver, ready: Path, timeout_s: float):
    """Until the receiver says where it listens (its --buffers-out file)."""
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if receiver.poll() is not None:
            raise DetectorError(f"rdaq receive ended before it listened (exit {receiver.returncode})")
        if time.monotonic() > deadline:
            raise DetectorError(f"rdaq receive did not listen within {timeout_s} s")
        time.sleep(0.05)


def _arguments() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m rdaq.sls", description="Drive a JUNGFRAU through slsdet for rdaq's receiver.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pedestal", help="a pedestal run (G0, forced G1, forced G2) into a calibration file")
    a = sub.add_parser("acquire", help="frames into rdaq receive: raw, or processed with --calibration")
    for q in (p, a):
        q.add_argument("--detector", required=True, help="the detector's hostname(s), modules joined by +")
        q.add_argument("--receiver-ip", required=True, help="the receiver's data interface address")
        q.add_argument("--receiver-mac", required=True, help="... and its MAC address")
        q.add_argument("--port", type=int, default=50001, help="rdaq receive's first data port (default 50001)")
        q.add_argument("--interfaces", type=int, default=1, choices=(1, 2))
        q.add_argument("--period-s", type=float, default=0.002)
        q.add_argument("--exptime-s", type=float, default=10e-6)
        q.add_argument("--rdaq", default=os.environ.get("RDAQ", "rdaq"), help="the rdaq binary (default: RDAQ, else rdaq on PATH)")
    d = sub.add_parser("drive", help="the detector alone, for rdaq receive --sls-detector (which runs this): pointed at "
                       "the receiver, set, started and waited for (or the pedestal procedure)")
    d.add_argument("--detector", required=True)
    d.add_argument("--receiver-ip", required=True)
    d.add_argument("--receiver-mac", required=True)
    d.add_argument("--port", type=int, required=True)
    d.add_argument("--interfaces", type=int, default=1, choices=(1, 2))
    d.add_argument("--frames", type=int, required=True, help="frames (with --pedestal: per gain stage)")
    d.add_argument("--period-s", type=float, help="default: the detector's")
    d.add_argument("--exptime-s", type=float, help="default: the detector's")
    d.add_argument("--trigger", default="internal", choices=("internal", "external", "gate"))
    d.add_argument("--pedestal", action="store_true", help="PSI's pedestal procedure: dynamic, forced G1, forced G2")
    d.add_argument("--kind", default="jungfrau", choices=("jungfrau", "eiger"))
    d.add_argument("--bit-depth", type=int, help="an EIGER's dr")
    p.add_argument("--frames", type=int, default=1000, help="dark frames per gain stage (default 1000)")
    p.add_argument("--calibration", required=True, type=Path, help="the calibration file to write")
    a.add_argument("--frames", type=int, required=True, help="frames to take")
    a.add_argument("--out", required=True, type=Path, help="rdaq receive's --out")
    a.add_argument("--receive", action="append", default=[], metavar="ARG",
                   help="one more argument for rdaq receive (repeat: --receive=--calibration --receive=cal.h5)")
    return ap


def main(argv=None) -> int:
    ap = _arguments()
    a = ap.parse_args(argv)
    if not 1 <= a.frames <= 1_000_000_000:
        ap.error(f"--frames {a.frames}: 1 to 10^9")
    try:
        c = SlsControl.connect(a.detector)
        kind = getattr(a, "kind", "jungfrau")
        if kind == "eiger" and (getattr(a, "pedestal", False) or a.command != "drive"):
            raise ValueError("an EIGER is driven by rdaq receive --detector eiger --sls-detector; the pedestal is a JUNGFRAU's")
        c.point_at(a.receiver_ip, a.receiver_mac, a.port, a.interfaces, kind)
        if kind == "eiger" and a.bit_depth is not None:
            c.bit_depth(a.bit_depth)
        pedestal = a.command == "pedestal" or getattr(a, "pedestal", False)
        c.configure(None if pedestal else a.frames, a.period_s, a.exptime_s, getattr(a, "trigger", "internal"))
        if a.command == "drive":
            if a.pedestal:
                c.pedestal(a.frames)
            else:
                c.acquire()
            return 0
        if a.command == "pedestal":
            return pedestal_run(c, a.calibration, a.frames, a.port, a.interfaces, a.rdaq, bind=a.receiver_ip)
        args = ["--frames", a.frames, "--out", a.out, *a.receive]
        return receive_beside(c, c.acquire, a.port, a.interfaces, a.rdaq, args, bind=a.receiver_ip)
    except ImportError:
        print("python -m rdaq.sls: PSI's slsdet is not installed (pip install \"rdaq[sls]\")", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("python -m rdaq.sls: interrupted: the detector was stopped and its gain mode and frames put back", file=sys.stderr)
        return INTERRUPTED
    except (ValueError, DetectorError, RuntimeError) as e:
        print(f"python -m rdaq.sls: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
