"""rdaq in EPICS and Tango through FastCS: one controller over the acquisition service
(`rdaq manage --data-root DIR --serve ADDR`), with areaDetector's names, served as EPICS PV
Access and Channel Access PVs and as a Tango device (docs/control-systems.md). Install with
the ``fastcs`` extra (``pip install rdaq[fastcs]``; FastCS 0.14.4 pinned: its Controller /
AttrRW / transport API is the one written against).

    python -m rdaq.fastcs --service http://127.0.0.1:7200 --prefix BL01:RDAQ --tango-port 18000

PVs (``<prefix>:<name>``; settings have a ``_RBV`` readback; docs/control-systems.md maps
each to its areaDetector and LImA counterpart):

- ``Acquire`` (1: arm the dataset below and, with ``TriggerMode`` Internal, send its
  triggers one after the other; 0: cancel; the readback is 1 while a dataset is under way;
  on Channel Access a busy record: a put of 1 completes when the dataset has ended),
  ``ImageMode`` (Single: one frame per trigger; Multiple: ``NumImages``; Continuous is
  refused), ``TriggerMode`` (Internal; External: the triggers come from elsewhere; Gate: as
  External, each frame exposed while its trigger is high),
  ``NumImages`` (frames per trigger), ``NumTriggers``, ``NumExposures`` (1),
  ``AcquirePeriod`` (s; 0: as fast as the detector goes), ``AcquireTime`` (each frame's
  exposure, s; 0: unknown), ``FilePath`` (the directory under the service's data root),
  ``FileName`` (the files' prefix), ``FileNumber`` and ``AutoIncrement`` (1: the prefix is
  ``<FileName>_<FileNumber, 3 digits>`` and FileNumber counts up at each arm), ``Process``
  (online processing on or off), ``ArrayCounter`` (frames written since it was set), and the
  dataset's metadata for the files, named as ADEiger and ADPilatus name theirs:
  ``PhotonEnergy`` (eV), ``DetDist`` (mm), ``BeamX`` and ``BeamY`` (pixels), and
  ``SampleName`` (each at 0, or empty, leaves the service's configuration's);
- ``NumCaptured_RBV`` and ``NumImagesCounter_RBV`` (frames written in the dataset),
  ``DetectorState_RBV`` (ADDriver's states and indices: Idle, Acquire, Waiting (armed for a
  trigger), Error, Aborted (after a cancel), Disconnected (the service does not answer)),
  ``StatusMessage_RBV`` (why it is in Error or Disconnected; at Idle, a warning when the last
  dataset lost frames), ``FullFileName_RBV`` (the master of the last dataset),
  ``FilePathExists_RBV`` (1: ``FilePath`` is a directory under the data root, as the IOC's
  host sees it; the service makes a missing one at the first trigger),
  ``FrameRate_RBV`` (frames written per second), ``FramesLost_RBV`` and
  ``FramesIncomplete_RBV`` (of the last dataset), ``DatagramsDropped_RBV`` (the dataset's),
  ``HitRate_RBV`` and ``SpotsPerFrame_RBV`` (online processing);
- ``Pedestal`` (a command: a JUNGFRAU pedestal dataset of 3 x ``PedestalFrames`` dark
  frames, ``<FileName>_pedestal``, armed and triggered on the service of one receiver, which
  drives the detector through PSI's procedure and processes with the calibration from then
  on) and ``Calibration_RBV`` (the calibration the last pedestal wrote).

A refused put (the service says why: existing files, a bad path, a dataset under way) fails
on PV Access and leaves the PV in MAJOR alarm on Channel Access, with the reason in
``StatusMessage_RBV``. While the service does not answer, every readback is in INVALID alarm
(communication).

The Tango device has the same attributes, named as FastCS names them for Tango (``Acquire``,
``NumImages``, ..., ``NumcapturedRbv`` for ``NumCaptured_RBV``), LImA's names beside them
(rdaq.fastcs_tango), and a State that follows the acquisition (ON, RUNNING, FAULT, UNKNOWN
when the service does not answer). ``--tango-port`` serves it without a Tango database
(pytango's device test context), as ``<prefix with / for :>``.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from dataclasses import dataclass
from pathlib import PurePath

from fastcs.attributes import AttributeIO, AttributeIORef, AttrR, AttrRW
from fastcs.controllers import Controller
from fastcs.datatypes import Bool, Enum, Float, Int, String
from fastcs.methods import command, scan

from .control import ApiError, Service
from .fastcs_alarm import Readbacks, record_pva_readbacks
from .fastcs_busy import busy_acquire_on_ca
from .fastcs_state import DetectorState, ImageMode, TriggerMode

__all__ = ["RdaqController", "DetectorState", "ImageMode", "TriggerMode", "main"]

#: how often the PVs follow the service, and how long one look may take before the
#: service counts as unreachable
SCAN_S = 0.2
LOOK_TIMEOUT_S = 2.0
#: how often a busy Acquire put looks for its dataset's end
BUSY_POLL_S = 0.1


@dataclass
class _Acquire(AttributeIORef):
    """The ``Acquire`` setting: writing it starts or cancels a dataset."""


class _AcquireIO(AttributeIO[bool, _Acquire]):
    def __init__(self, controller):
        super().__init__()
        self.controller = controller

    async def send(self, attr, value):
        await self.controller.put_acquire(bool(value))


@dataclass
class _OneExposure(AttributeIORef):
    """``NumExposures``: areaDetector's exposures per frame; rdaq's frames are one each."""


class _OneExposureIO(AttributeIO[int, _OneExposure]):
    async def send(self, attr, value):
        if value != 1:
            raise ValueError(f"NumExposures {value}: each frame is one exposure (1)")
        await attr.update(value)


class RdaqController(Controller):
    """The acquisition service at ``url`` as areaDetector-style attributes (their
    descriptions fit Channel Access's 40-character DESC)."""

    acquire = AttrRW(Bool(), io_ref=_Acquire(), description="1: arm and trigger; 0: cancel")
    image_mode = AttrRW(Enum(ImageMode), initial_value=ImageMode.Multiple, description="Single: 1 frame per trigger")
    trigger_mode = AttrRW(Enum(TriggerMode), initial_value=TriggerMode.Internal, description="External: triggers come from elsewhere")
    num_images = AttrRW(Int(min=1), initial_value=1, description="Frames per trigger")
    num_triggers = AttrRW(Int(min=1), initial_value=1, description="Triggers of the dataset")
    num_exposures = AttrRW(Int(min=1), io_ref=_OneExposure(), initial_value=1, description="Exposures per frame (1)")
    acquire_period = AttrRW(Float(units="s", min=0.0, prec=6), initial_value=0.0, description="Frame period (0: fastest)")
    acquire_time = AttrRW(Float(units="s", min=0.0, prec=6), initial_value=0.0, description="Exposure per frame (0: unknown)")
    file_path = AttrRW(String(length=256), initial_value="", description="Directory under the data root")
    file_name = AttrRW(String(length=200), initial_value="rdaq", description="Prefix of the dataset's files")
    file_number = AttrRW(Int(min=0), initial_value=0, description="Next number in the prefix")
    auto_increment = AttrRW(Bool(), initial_value=False, description="1: prefix FileName_FileNumber")
    process = AttrRW(Bool(), initial_value=True, description="Online processing on or off")
    # the dataset's metadata, named as ADEiger and ADPilatus name theirs (0: the service's)
    photon_energy = AttrRW(Float(units="eV", min=0.0, prec=1), initial_value=0.0, description="Photon energy (0: as configured)")
    det_dist = AttrRW(Float(units="mm", min=0.0, prec=3), initial_value=0.0, description="Detector distance (0: as configured)")
    beam_x = AttrRW(Float(units="pixel", prec=2), initial_value=0.0, description="Beam centre x (both 0: as configured)")
    beam_y = AttrRW(Float(units="pixel", prec=2), initial_value=0.0, description="Beam centre y (both 0: as configured)")
    sample_name = AttrRW(String(length=200), initial_value="", description="The sample's name in the files")
    array_counter = AttrRW(Int(min=0), initial_value=0, description="Frames written since set")
    pedestal_frames = AttrRW(Int(min=1), initial_value=1000, description="Dark frames per gain (Pedestal)")
    NumCaptured_RBV = AttrR(Int(), description="Frames written in the dataset")
    NumImagesCounter_RBV = AttrR(Int(), description="Frames written in the dataset")
    DetectorState_RBV = AttrR(Enum(DetectorState))
    StatusMessage_RBV = AttrR(String(length=256), description="Error, or the last dataset's warning")
    FullFileName_RBV = AttrR(String(length=256), description="Master file of the last dataset")
    FilePathExists_RBV = AttrR(Bool(), description="FilePath is a directory there")
    FrameRate_RBV = AttrR(Float(units="Hz"), description="Frames written per second")
    FramesLost_RBV = AttrR(Int(), description="Frames the last dataset lost")
    FramesIncomplete_RBV = AttrR(Int(), description="Frames with data missing")
    DatagramsDropped_RBV = AttrR(Int(), description="Datagrams the receivers dropped")
    HitRate_RBV = AttrR(Float(), description="Hits per signal frame")
    SpotsPerFrame_RBV = AttrR(Float(), description="Bragg spots per signal frame")
    Calibration_RBV = AttrR(String(length=256), description="Calibration of the last pedestal")

    def __init__(self, url: str, token: str | None = None, prefix: str = "RDAQ"):
        super().__init__(ios=[_AcquireIO(self), _OneExposureIO()])
        self.set_path([prefix])
        self.service = Service(url, token=token)
        # the scan's own client: a service that does not answer is seen within seconds
        self._look = Service(url, token=token, timeout=LOOK_TIMEOUT_S)
        self._readbacks = Readbacks(prefix, self)
        self._triggers: asyncio.Task | None = None
        # Channel Access's Acquire waits for the dataset through this (rdaq.fastcs_busy)
        self.acquire.rdaq_busy = self._until_dataset_ends
        self._put_armed = False
        self._rate = (0, time.monotonic())
        # (dataset number, frames written) last counted into ArrayCounter
        self._counted: tuple[int, int] | None = None

    async def connect(self):
        await asyncio.to_thread(self.service.acquisition)
        await super().connect()

    async def put_acquire(self, on: bool):
        """Acquire = 1 arms the dataset the settings describe and, with internal triggers,
        sends its triggers one after the other; Acquire = 0 cancels it. A refusal shows in
        StatusMessage_RBV and fails the put."""
        self._put_armed = False
        try:
            if on:
                await self._arm()
                self._put_armed = True
                if self.trigger_mode.get() == TriggerMode.Internal:
                    self._triggers = asyncio.ensure_future(self._send_triggers())
            else:
                await self._cancel()
        except (ApiError, ValueError) as e:
            await self.StatusMessage_RBV.update(getattr(e, "message", str(e))[:256])
            raise
        await self.acquire.update(on)

    async def _cancel(self):
        """Cancels the dataset under way; with none (an Acquire 0 after the dataset ended, as
        a busy record's stop may come), nothing happens, as on areaDetector."""
        if self._triggers is not None:
            self._triggers.cancel()
        try:
            await asyncio.to_thread(self.service.cancel)
        except ApiError as e:
            if e.status != 409 or (await asyncio.to_thread(self.service.acquisition))["state"] not in ("idle", "error"):
                raise

    async def _until_dataset_ends(self, cancel_asked):
        """Channel Access's busy Acquire: after a put of 1 that armed a dataset, waits until
        the dataset has ended (idle or error), cancelling it when ``cancel_asked()`` (a plain
        put of 0 arrived meanwhile); a refused put returns False at once. While the service
        does not answer the put waits (the readbacks say so)."""
        if not self._put_armed:
            return False
        cancelled = False
        while True:
            await asyncio.sleep(BUSY_POLL_S)
            if not cancelled and cancel_asked():
                cancelled = True
                await self._cancel()
            try:
                a = await asyncio.to_thread(self._look.acquisition)
            except (ApiError, OSError):
                continue
            if a["state"] in ("idle", "error"):
                return True

    def _frames_per_trigger(self) -> int:
        mode = self.image_mode.get()
        if mode == ImageMode.Continuous:
            raise ValueError("ImageMode Continuous: a dataset has a frame count (Single or Multiple)")
        return 1 if mode == ImageMode.Single else self.num_images.get()

    def _prefix(self) -> str:
        if not self.auto_increment.get():
            return self.file_name.get()
        return f"{self.file_name.get()}_{self.file_number.get():03d}"

    def _metadata(self) -> dict:
        """The arm's metadata in the service's units; a setting at 0 leaves the service's."""
        energy_ev, distance_mm = self.photon_energy.get(), self.det_dist.get()
        beam = (self.beam_x.get(), self.beam_y.get())
        return {"sample_name": self.sample_name.get(),
                "photon_energy_kev": energy_ev / 1000.0 if energy_ev > 0 else None,
                "detector_distance_m": distance_mm / 1000.0 if distance_mm > 0 else None,
                "beam_center_x": beam[0] if beam != (0.0, 0.0) else None,
                "beam_center_y": beam[1] if beam != (0.0, 0.0) else None}

    async def _arm(self):
        mode = self.trigger_mode.get()
        await asyncio.to_thread(self.service.arm, frames_per_trigger=self._frames_per_trigger(), prefix=self._prefix(),
                                triggers=self.num_triggers.get(), period_s=self.acquire_period.get(),
                                # behind a gate the exposure is the gate's
                                count_time_s=0.0 if mode == TriggerMode.Gate else self.acquire_time.get(),
                                directory=self.file_path.get(), process=self.process.get(), trigger_mode=mode.service_name,
                                **self._metadata())
        if self.auto_increment.get():
            await self.file_number.put(self.file_number.get() + 1, sync_setpoint=True)
        await self.StatusMessage_RBV.update("")

    async def _send_triggers(self):
        """Internal triggers: the next once the previous one's frames are written."""
        for _ in range(self.num_triggers.get()):
            await asyncio.to_thread(self.service.trigger)
            a = await asyncio.to_thread(self.service.wait, ("armed", "idle", "error"), 24 * 3600.0)
            if a["state"] != "armed":
                return

    @command()
    async def pedestal(self):
        """A JUNGFRAU pedestal (the service of one receiver; beam off): arms a pedestal
        dataset of 3 x PedestalFrames frames, ``<FileName>_pedestal`` in FilePath, and
        triggers it; the detector the service drives takes them in dynamic, forced G1 and
        forced G2 gain. Returns once it is under way; Calibration_RBV names the calibration
        once it is written, and the datasets after it are processed with it."""
        try:
            await asyncio.to_thread(self.service.arm, frames_per_trigger=3 * self.pedestal_frames.get(),
                                    prefix=f"{self.file_name.get()}_pedestal", directory=self.file_path.get(),
                                    period_s=self.acquire_period.get(), count_time_s=self.acquire_time.get(), pedestal=True)
            await asyncio.to_thread(self.service.trigger)
        except (ApiError, ValueError) as e:
            await self.StatusMessage_RBV.update(getattr(e, "message", str(e))[:256])
            raise
        await self.StatusMessage_RBV.update("")

    @scan(SCAN_S)
    async def follow(self):
        """The PVs brought up to the service; an unreachable service says so, with every
        readback INVALID, and is asked again."""
        try:
            a = await asyncio.to_thread(self._look.acquisition)
        except (ApiError, OSError) as e:
            message = f"service unreachable: {getattr(e, 'message', e)}"[:256]
            await self.StatusMessage_RBV.update(message)
            await self.DetectorState_RBV.update(DetectorState.Disconnected)
            self._readbacks.invalid(message)
            return
        if self.StatusMessage_RBV.get().startswith("service unreachable"):
            await self.StatusMessage_RBV.update("")
        self._readbacks.valid()
        await self._show(a)

    async def _show(self, a):
        """Counts and results first, the state and Acquire's readback last: a client that
        sees Idle reads the finished dataset's file and counts."""
        state = DetectorState.of(a)
        d = a["dataset"] or {}
        written = d.get("frames_written", 0)
        await self.NumCaptured_RBV.update(written)
        await self.NumImagesCounter_RBV.update(written)
        await self._count_arrays(d.get("number", 0), written)
        summary = d.get("summary")
        if summary:
            await self.FullFileName_RBV.update(d["master"][:256])
            await self.FramesLost_RBV.update(d.get("frames_lost") or 0)
            if summary.get("calibration"):
                await self.Calibration_RBV.update(summary["calibration"][:256])
        live = a["live"]
        await self.FramesIncomplete_RBV.update(live["frames_incomplete"])
        await self.DatagramsDropped_RBV.update(live["datagrams_dropped"])
        p = live["processing"]
        if p and p["signal_frames"]:
            await self.HitRate_RBV.update(p["hits"] / p["signal_frames"])
            await self.SpotsPerFrame_RBV.update(p["spots_found"] / p["signal_frames"])
        before, then = self._rate
        now = time.monotonic()
        rate = max(0, written - before) / (now - then) if state == DetectorState.Acquire and now > then else 0.0
        self._rate = (written, now)
        await self.FrameRate_RBV.update(rate)
        await self.FilePathExists_RBV.update(self._file_path_exists(a["data_root"]))
        if state == DetectorState.Error:
            await self.StatusMessage_RBV.update((a["error"] or "")[:256])
        elif summary and d.get("warning") and state in (DetectorState.Idle, DetectorState.Aborted):
            await self.StatusMessage_RBV.update(f"warning: {d['warning']}"[:256])
        # armed between triggers (or for external ones), the dataset is under way
        busy = state in (DetectorState.Acquire, DetectorState.Waiting)
        if self.acquire.get() != busy:
            await self.acquire.update(busy)
        await self.DetectorState_RBV.update(state)

    def _file_path_exists(self, root: str) -> bool:
        """Whether FilePath is a directory under the data root as this host sees it (the
        service makes a missing one at the dataset's first trigger, as areaDetector's
        CreateDirectory does; a path it would refuse is not there)."""
        rel = PurePath(self.file_path.get())
        if rel.is_absolute() or ".." in rel.parts:
            return False
        return os.path.isdir(os.path.join(root, rel))

    async def _count_arrays(self, number: int, written: int):
        """ArrayCounter counts on by the frames written since the last look (the datasets
        that ended before the IOC started are not counted)."""
        if self._counted is not None:
            seen_number, seen = self._counted
            new = written - seen if number == seen_number else written
            if new > 0:
                await self.array_counter.update(self.array_counter.get() + new)
        self._counted = (number, written)


def main(argv=None):
    from fastcs import FastCS
    from fastcs.transports import EpicsCATransport, EpicsPVATransport

    ap = argparse.ArgumentParser(prog="python -m rdaq.fastcs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--service", required=True, help="the acquisition service's URL (rdaq manage --data-root --serve)")
    ap.add_argument("--prefix", default="RDAQ", help="PV prefix (default RDAQ)")
    ap.add_argument("--token", help="the service's API token (default: RDAQ_TOKEN)")
    ap.add_argument("--no-ca", action="store_true", help="no Channel Access")
    ap.add_argument("--no-pva", action="store_true", help="no PV Access")
    ap.add_argument("--tango-port", type=int, help="also serve a Tango device on this port, without a database")
    ap.add_argument("--tango-name", help="the Tango device's name (default: the prefix, : as /, three parts)")
    a = ap.parse_args(argv)
    try:
        Service(a.service, token=a.token).acquisition()
    except ApiError as e:
        ap.exit(2, f"rdaq.fastcs: --service: {e}\n")
    controller = RdaqController(a.service, token=a.token, prefix=a.prefix)
    record_pva_readbacks()
    busy_acquire_on_ca()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    served = []
    transports = []
    if not a.no_pva:
        transports.append(EpicsPVATransport())
    if not a.no_ca:
        transports.append(EpicsCATransport())
    if a.tango_port:
        parts = a.prefix.replace(":", "/").split("/")
        name = a.tango_name or "/".join((parts + ["1", "1"])[:3])
        from .fastcs_tango import tango_transport
        transports.append(tango_transport(controller, a.tango_port, name, lambda: served[0].cancel()))
    if not transports:
        ap.error("nothing to serve: --no-ca and --no-pva without --tango-port")
    served.append(loop.create_task(FastCS(controller, transports, loop).serve(interactive=False)))
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, served[0].cancel)
    loop.run_until_complete(served[0])


if __name__ == "__main__":
    main()
