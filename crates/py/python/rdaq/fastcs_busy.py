"""``Acquire`` as a busy record on Channel Access, as areaDetector's is: a put of 1 completes
(its callback: ``caput -c``, ophyd's ``set(..., wait=True)``) when the dataset has ended, not
when it is armed, and the record goes back to 0; a plain put of 0 while it waits cancels
the dataset.

FastCS 0.14.4 (pinned) makes every output record blocking and completes a put when the
attribute's ``put`` returns, for every transport alike. Only Channel Access's ``Acquire``
waits for the dataset: its output record is made through FastCS's CA IOC's
``_make_out_record``, wrapped once per process by ``busy_acquire_on_ca`` for attributes that
carry a ``rdaq_busy`` coroutine (true when it waited for a dataset). While the record waits it is active, so EPICS writes a plain
put's value into its VAL field and processes it again once the wait ends: the wait watches
VAL for that 0 and cancels at once. A put of 0 with a callback waits, as EPICS queues it
behind the active record (areaDetector clients stop with a plain put, as ophyd-async's
``stop_busy_record`` does). PV Access and Tango complete the put when the dataset is armed.
"""
from __future__ import annotations


def busy_acquire_on_ca():
    """Wraps FastCS's CA output records from now on (call it before the transport starts;
    calling it again changes nothing)."""
    import fastcs.transports.epics.ca.ioc as ca_ioc

    make = ca_ioc._make_out_record
    if getattr(make, "rdaq_busy", False):
        return

    def make_busy(pv, attribute, on_update):
        until_done = getattr(attribute, "rdaq_busy", None)
        if until_done is None:
            return make(pv, attribute, on_update)
        made = []

        async def put_and_wait(value):
            await on_update(value)
            if value and await until_done(lambda: _val_is_zero(made[0])):
                # back to 0 once the dataset has ended, as areaDetector's Acquire; not
                # processed, so nothing is cancelled (a refused put keeps 1 and its alarm)
                made[0].set(False, process=False)

        made.append(make(pv, attribute, put_and_wait))
        return made[0]

    make_busy.rdaq_busy = True
    ca_ioc._make_out_record = make_busy


def _val_is_zero(record) -> bool:
    """Whether a plain put of 0 reached the busy record's VAL (a bo's state name or digit)."""
    return record.get_field("VAL") in ("0", "False")
