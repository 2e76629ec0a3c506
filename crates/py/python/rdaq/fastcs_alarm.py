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
        self._set(True, message)
        self.raised = message

    def valid(self):
        """Clears what ``invalid`` set (values that did not change are not posted again by
        FastCS, so the alarm is cleared here)."""
        if self.raised is not None:
            self._set(False, "")
            self.raised = None

    def _set(self, alarmed: bool, message: str):
        from fastcs.transports.epics.pva.types import Severity, Status, p4p_alarm_states
        from softioc import alarm

        severity, status = (alarm.INVALID_ALARM, alarm.COMM_ALARM) if alarmed else (alarm.NO_ALARM, alarm.NO_ALARM)
        for record in self._ca_records():
            record.set_alarm(severity, status)
        states = (p4p_alarm_states(Severity.INVALID, Status.DEVICE, message) if alarmed else p4p_alarm_states()).model_dump()
        for attribute, pv in _pva_readbacks:
            pv.post({"value": _pva_value(attribute), **states})

    def _ca_records(self):
        """The readbacks' softioc records (none when Channel Access is not served, and not
        one FastCS left out for a name too long)."""
        from fastcs.util import snake_to_pascal
        from softioc.device_core import LookupRecord

        for name, attribute in self.controller.attributes.items():
            if not isinstance(attribute, AttrR):
                continue
            pv = f"{self.prefix}:{snake_to_pascal(name)}"
            try:
                yield LookupRecord(f"{pv}_RBV" if isinstance(attribute, AttrW) else pv)
            except KeyError:
                continue


def _pva_value(attribute):
    value = attribute.get()
    if isinstance(attribute.datatype, Enum):
        return {"index": attribute.datatype.index_of(value), "choices": attribute.datatype.names}
    return attribute.datatype.validate(value)
