"""INVALID alarm severity on the IOC's readbacks while the acquisition service does not
answer, as an areaDetector IOC shows a lost detector: a screen greys them out and a client
knows not to trust the last values.

FastCS 0.14.4 (pinned) gives an attribute no alarm state of its own, so the alarm is set on
what its transports serve: on Channel Access the readbacks are softioc records, found by
name; on PV Access they are FastCS's shared PVs, recorded as FastCS makes them (its PVA IOC's
``make_shared_read_pv``, wrapped once per process by ``record_pva_readbacks``).
"""
from __future__ import annotations

from fastcs.attributes import AttrR, AttrW
from fastcs.datatypes import Enum

_pva_readbacks: list = []


def record_pva_readbacks():
    """Keeps every readback PV FastCS's PVA transport makes from now on (call it before the
    transport starts; calling it again changes nothing)."""
    import fastcs.transports.epics.pva.ioc as pva_ioc

    make = pva_ioc.make_shared_read_pv
    if getattr(make, "rdaq_records", False):
        return

    def make_and_record(attribute):
        pv = make(attribute)
        _pva_readbacks.append((attribute, pv))
        return pv

    make_and_record.rdaq_records = True
    pva_ioc.make_shared_read_pv = make_and_record


class Readbacks:
    """The readbacks of one controller under ``prefix`` on both EPICS transports."""

    def __init__(self, prefix: str, controller):
        self.prefix = prefix
        self.controller = controller
        self.raised: str | None = None

    def invalid(self, message: str):
        """INVALID severity (communication) on every readback, with ``message`` on PVA."""
        if self.raised == message:
            return
        self._set(3, message)
        self.raised = message

    def valid(self):
        """Clears what ``invalid`` set (values that did not change are not posted again by
        FastCS, so the alarm is cleared here)."""
        if self.raised is not None:
            self._set(0, "")
            self.raised = None

    def _set(self, severity: int, message: str):
        from softioc import alarm

        status = alarm.COMM_ALARM if severity else alarm.NO_ALARM
        for record in self._ca_records():
            record.set_alarm(severity, status)
        for attribute, pv in _pva_readbacks:
            pv.post({"value": _pva_value(attribute), "alarm": {"severity": severity, "status": 1 if severity else 0,
                                                               "message": message}})

    def _ca_records(self):
        from softioc.device import ProcessDeviceSupportIn
        from softioc.device_core import LookupRecordList

        names = set(self._ca_names())
        return [r for name, r in list(LookupRecordList()) if name in names and isinstance(r, ProcessDeviceSupportIn)]

    def _ca_names(self):
        from fastcs.util import snake_to_pascal

        for name, attribute in self.controller.attributes.items():
            pv = f"{self.prefix}:{snake_to_pascal(name)}"
            if isinstance(attribute, AttrR):
                yield f"{pv}_RBV" if isinstance(attribute, AttrW) else pv


def _pva_value(attribute):
    value = attribute.get()
    if isinstance(attribute.datatype, Enum):
        return {"index": attribute.datatype.index_of(value), "choices": attribute.datatype.names}
    return attribute.datatype.validate(value)
