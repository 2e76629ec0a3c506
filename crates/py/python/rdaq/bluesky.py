"""rdaq as a Bluesky detector: an ophyd-async ``StandardDetector`` over the acquisition
service (`rdaq manage --data-root DIR --serve ADDR`, docs/control-systems.md). Install with
the ``bluesky`` extra (``pip install rdaq[bluesky]``; written against ophyd-async 0.21).

    from bluesky import RunEngine
    import bluesky.plans as bp
    from ophyd_async.core import StaticPathProvider, UUIDFilenameProvider, init_devices
    from rdaq.bluesky import RdaqDetector

    RE = RunEngine()
    with init_devices():
        det = RdaqDetector("http://127.0.0.1:7200", StaticPathProvider(UUIDFilenameProvider(), "/data/bluesky"))
    RE(bp.count([det], num=3))

How a run maps onto the service: ``stage`` leaves the service idle; ``prepare`` (or the
first ``trigger`` without one) arms an open-ended dataset (``triggers`` 0) named by the path
provider, with as many frames per trigger as the ``TriggerInfo`` asks for exposures (the
``collections_per_event`` of a step scan's point, the whole of a fly scan's kickoff) and
its ``livetime + deadtime`` as the frame period; each ``trigger`` or ``kickoff`` is one
service trigger; ``unstage`` disarms, which closes the dataset's files normally. External
edge triggers (``DetectorTrigger.EXTERNAL_EDGE``) arm one frame per trigger and let each
``trigger`` or ``kickoff`` wait for its frames, which triggers from elsewhere start (the
service's ``/trigger``, from a fly-scan controller, or a detector's trigger input); gates
(``EXTERNAL_LEVEL``) likewise, each frame exposed while its gate is high (the files' count
time is then 0, unknown). The trigger mode goes into the files (``internal``, ``external``,
``gate``). The exposure is ``livetime``, else the detector's ``acquire_time``;
``image_counter`` is the dataset's frames written and ``file_path`` its master. The documents are StreamResource (the dataset's NXmx master,
``/entry/data/data``, one frame per collection) and StreamDatum, counted by the frames the
service says were written.

Reduced form, said here and in the docs: the dataset's master file is written when the
dataset ends (at ``unstage``): the StreamDatum documents point into a file that exists
once the run is over (live readers take the Stream V2 stream). The frames are raw (the
service's ``process`` off): with online processing the hit veto would leave frames out and
the StreamDatum indices would no longer be frames. They are described as JUNGFRAU's 16-bit
words (``<u2``); a described detector of another bit depth is not described right yet.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import PurePosixPath

from ophyd_async.core import (
    DetectorAcquireLogic,
    DetectorDataLogic,
    DetectorTriggerLogic,
    PathProvider,
    StandardDetector,
    StreamResourceDataProvider,
    StreamResourceInfo,
    TriggerInfo,
    soft_signal_r_and_setter,
    soft_signal_rw,
)

from .control import Service

__all__ = ["RdaqDetector"]

#: how often the service is asked how far a trigger came
POLL_S = 0.05
_log = logging.getLogger("rdaq.bluesky")


class _Link:
    """What the three logics share: the service client, the dataset armed, and the frames
    written so far (the collections-written signal)."""

    def __init__(self, service):
        self.service = service
        self.frames = 1
        self.period_s = 0.0
        self.count_time_s = 0.0
        self.named = None  # (directory, prefix) of the dataset armed
        self.triggers = 0  # triggers sent (or, external, waited for) in the dataset armed
        self.external = 0  # external triggers: the frames each trigger or kickoff waits for
        self.mode = "internal"  # the service's trigger mode: internal, external or gate
        self.written, self.set_written = soft_signal_r_and_setter(int, initial_value=0)
        self.file_path, self.set_file_path = soft_signal_r_and_setter(str, initial_value="")
        self.poller = None

    async def call(self, method, *args, **kwargs):
        """A blocking client call, off the event loop."""
        return await asyncio.to_thread(getattr(self.service, method), *args, **kwargs)

    async def arm(self):
        directory, prefix = self.named
        await self.call("arm", frames_per_trigger=self.frames, prefix=prefix, triggers=0, period_s=self.period_s,
                        count_time_s=self.count_time_s, directory=directory, process=False, trigger_mode=self.mode)

    async def idle(self):
        """Leaves the service idle: an arm dropped, an open dataset's files closed, a
        dataset under way cancelled."""
        state = (await self.call("acquisition"))["state"]
        if state == "acquiring":
            await self.call("cancel")
        elif state == "armed":
            await self.call("disarm")
        if state in ("acquiring", "armed"):
            a = await self.call("wait", ("idle", "error"))
            d = a["dataset"] or {}
            if d.get("warning"):
                _log.warning("rdaq: dataset %s: %s", d["master"], d["warning"])
        self.named, self.triggers = None, 0

    async def follow(self, frames=None):
        """Brings the written count up to the service's until the trigger under way ends
        or, with ``frames``, until the dataset has written that many."""
        while True:
            a = await self.call("acquisition")
            d = a["dataset"] or {}
            written = d.get("frames_written", 0)
            self.set_written(written)
            if frames is None and a["state"] != "acquiring":
                return a
            if frames is not None and (written >= frames or a["state"] in ("idle", "error")):
                return a
            await asyncio.sleep(POLL_S)


class _Trigger(DetectorTriggerLogic):
    """Internal triggers: ``num`` frames per service trigger, ``livetime + deadtime`` apart;
    external edges and gates: one frame per trigger from elsewhere. A plan that does not
    prepare takes ``frames_per_point`` frames per point, ``period_s`` apart, each ``acquire_time``
    long (with ``OPHYD_ASYNC_PRESERVE_DETECTOR_STATE=YES``, as for ophyd-async's
    areaDetectors)."""

    def __init__(self, link, frames_per_point, period_s, acquire_time):
        self.link = link
        self.frames_per_point, self.period_s, self.acquire_time = frames_per_point, period_s, acquire_time

    def config_sigs(self):
        return {self.frames_per_point, self.period_s, self.acquire_time}

    async def default_trigger_info(self):
        frames, period, exposure = await asyncio.gather(self.frames_per_point.get_value(), self.period_s.get_value(),
                                                        self.acquire_time.get_value())
        return TriggerInfo(collections_per_event=max(1, frames), livetime=max(0.0, exposure),
                           deadtime=max(0.0, period - exposure))

    async def prepare_internal(self, num, livetime, deadtime):
        livetime = livetime or await self.acquire_time.get_value()
        await self._prepare(num, livetime + deadtime, livetime, 0, "internal")

    async def prepare_edge(self, num, livetime):
        livetime = livetime or await self.acquire_time.get_value()
        await self._prepare(1, 0.0, livetime, num, "external")

    async def prepare_level(self, num):
        # each frame is exposed while its gate is high: the gate sets the exposure
        await self._prepare(1, 0.0, 0.0, num, "gate")

    async def _prepare(self, frames, period_s, count_time_s, external, mode):
        link = self.link
        changed = (frames, period_s, count_time_s, mode) != (link.frames, link.period_s, link.count_time_s, link.mode)
        if (changed or external != link.external) and link.triggers:
            raise ValueError(f"{frames} frames per trigger every {period_s} s ({mode}): the dataset under way "
                             f"takes {link.frames} every {link.period_s} s ({link.mode}) (unstage first)")
        link.frames, link.period_s, link.count_time_s, link.external, link.mode = frames, period_s, count_time_s, external, mode
        if changed and link.named:
            await link.arm()


class _Acquire(DetectorAcquireLogic):
    """One service trigger per ``trigger`` or ``kickoff``; with external triggers, a wait
    for the frames they bring (counted from the arm, so triggers that came early count)."""

    def __init__(self, link):
        self.link = link

    async def start_acquiring(self):
        link = self.link
        if link.external:
            link.triggers += 1
            link.poller = asyncio.ensure_future(link.follow(frames=link.external * link.triggers))
            return
        await link.call("trigger")
        link.triggers += 1
        link.poller = asyncio.ensure_future(link.follow())

    async def wait_for_idle(self):
        if self.link.poller is None:
            return
        a = await self.link.poller
        self.link.poller = None
        if a["state"] == "error":
            raise RuntimeError(f"rdaq: {a['error']}")
        if a["state"] == "idle" and self.link.external:
            raise RuntimeError(f"rdaq: dataset {a['dataset']['number']} ended while waiting for external triggers")

    async def ensure_stopped(self):
        if self.link.poller is not None:
            self.link.poller.cancel()
            self.link.poller = None
        await self.link.idle()


class _Data(DetectorDataLogic):
    """The dataset's master: arms the dataset the path provider names, and describes its
    frames."""

    def __init__(self, link, path_provider):
        self.link = link
        self.path_provider = path_provider

    async def prepare_unbounded(self, datakey_name):
        a = await self.link.call("acquisition")
        info = self.path_provider(datakey_name)
        root = PurePosixPath(a["data_root"])
        directory = PurePosixPath(info.directory_path)
        if directory != root and root not in directory.parents:
            raise ValueError(f"{directory}: the path provider must name a directory under the service's data root {root}")
        rel = directory.relative_to(root)
        self.link.named = ("" if rel == PurePosixPath(".") else str(rel), info.filename)
        await self.link.arm()
        self.link.set_written(0)
        d = (await self.link.call("acquisition"))["dataset"]
        self.link.set_file_path(d["master"])
        image = a["image"]
        resource = StreamResourceInfo(data_key=datakey_name, shape=(image["height"], image["width"]),
                                      chunk_shape=(1, image["height"], image["width"]), dtype_numpy="<u2",
                                      parameters={"dataset": d["dataset"]})
        return StreamResourceDataProvider(uri=f"file://localhost{d['master']}", resources=[resource],
                                          mimetype="application/x-hdf5", collections_written_signal=self.link.written)

    def get_hinted_fields(self, datakey_name):
        return [datakey_name]


class RdaqDetector(StandardDetector):
    """A detector of frames from the rdaq acquisition service at ``url``, written where
    ``path_provider`` says (a directory under the service's data root). ``frames_per_point``,
    ``period_s`` and ``acquire_time`` are what a plan that does not prepare the detector
    gets (``acquire_time``, each frame's exposure, also when a ``TriggerInfo``'s livetime
    is 0); ``image_counter`` counts the frames the dataset wrote, ``file_path`` is its
    master file."""

    def __init__(self, url: str, path_provider: PathProvider, token: str | None = None, name: str = ""):
        self._link = _Link(Service(url, token=token))
        self.frames_per_point = soft_signal_rw(int, initial_value=1)
        self.period_s = soft_signal_rw(float, initial_value=0.0, units="s")
        self.acquire_time = soft_signal_rw(float, initial_value=0.0, units="s")
        self.image_counter = self._link.written
        self.file_path = self._link.file_path
        self.add_detector_logics(_Trigger(self._link, self.frames_per_point, self.period_s, self.acquire_time),
                                 _Acquire(self._link), _Data(self._link, path_provider))
        super().__init__(name=name)

    async def connect(self, mock=False, timeout=10.0, force_reconnect=False):
        """Connects; a service that does not answer raises ``ApiError``."""
        if not mock:
            await self._link.call("acquisition")
        await super().connect(mock=mock, timeout=timeout, force_reconnect=force_reconnect)
