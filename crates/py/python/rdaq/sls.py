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

Reduced form, said here and in docs/processing.md: this is the Python layer only; ``rdaq
receive`` and the acquisition service do not call it yet, and it has run against a stand-in
of ``slsdet.Detector`` that records every call (tests/test_sls_control.py), not a detector.
"""
from __future__ import annotations

import time

__all__ = ["SlsControl", "DetectorError"]

#: how often the detector's state is asked while it acquires
POLL_S = 0.05


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
        """The detector at ``hostname`` (modules joined by ``+``), as slsdet connects to it."""
        from slsdet import Detector
        det = Detector()
        det.hostname = hostname
        return cls(det)

    def point_at(self, ip: str, mac: str, port: int, interfaces: int = 1):
        """Every module's UDP interfaces send to this receiver: ``ip`` and ``mac`` (the
        receiver's data interface), and each its own port from ``port`` on."""
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

    def configure(self, frames: int, period_s: float, exptime_s: float, trigger: str = "internal", triggers: int = 1):
        """Frames per trigger, their period and exposure (seconds), and the trigger mode as
        rdaq names it: internal (the detector's timing), external (a trigger signal starts
        each trigger's frames) or gate (each frame exposed while the signal is high)."""
        t = self.enums.timingMode
        timing = {"internal": t.AUTO_TIMING, "external": t.TRIGGER_EXPOSURE, "gate": t.GATED}.get(trigger)
        if timing is None:
            raise ValueError(f"trigger {trigger!r}: internal, external or gate")
        if frames < 1 or triggers < 1 or not period_s >= 0 or not exptime_s > 0:
            raise ValueError(f"frames {frames}, triggers {triggers}, period {period_s} s, exposure {exptime_s} s: frames and "
                             "triggers at least 1, a period of 0 or more and an exposure above 0")
        d = self.det
        d.timing = timing
        d.frames, d.triggers = frames, triggers
        d.period, d.exptime = period_s, exptime_s

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
