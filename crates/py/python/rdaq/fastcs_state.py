"""areaDetector's enumerations as the IOC serves them, with ADDriver's indices (what a
beamline screen and ophyd's ``ADBase`` expect). A module of their own: ``python -m
rdaq.fastcs`` runs that module as ``__main__``, and the Tango device needs the same classes."""
from __future__ import annotations

import enum


class DetectorState(enum.Enum):
    """``DetectorState_RBV``; the service's states map onto it (``of``)."""

    Idle = 0
    Acquire = 1
    Readout = 2
    Correct = 3
    Saving = 4
    Aborting = 5
    Error = 6
    Waiting = 7
    Initializing = 8
    Disconnected = 9
    Aborted = 10

    @classmethod
    def of(cls, acquisition: dict) -> DetectorState:
        """``idle`` (``Aborted`` after a cancelled dataset), ``armed`` (``Waiting`` for a
        trigger), ``acquiring`` (``Acquire``), ``error``."""
        state, d = acquisition["state"], acquisition["dataset"] or {}
        if state == "idle":
            return cls.Aborted if d.get("cancelled") else cls.Idle
        return {"armed": cls.Waiting, "acquiring": cls.Acquire, "error": cls.Error}[state]


class ImageMode(enum.Enum):
    """``ImageMode``: Single takes one frame per trigger, Multiple ``NumImages``; Continuous
    (until stopped) is refused: a dataset has a frame count."""

    Single = 0
    Multiple = 1
    Continuous = 2


class TriggerMode(enum.Enum):
    """``TriggerMode``: Internal, the IOC sends the dataset's triggers one after the other;
    External, it arms the dataset and the triggers come from elsewhere (the service's
    ``/trigger``, from a fly-scan controller or a detector's trigger input); Gate, as
    External with each frame exposed while its trigger signal is high (the files' count time
    is then unknown, 0). The mode is the files' ``detectorSpecific/trigger_mode``."""

    Internal = 0
    External = 1
    Gate = 2

    @property
    def service_name(self) -> str:
        """The mode as the service's arm names it."""
        return self.name.lower()
