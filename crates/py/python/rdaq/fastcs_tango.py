"""The FastCS controller as a Tango device without a Tango database (pytango's device test
context), with what a Tango client of a LImA detector expects beside FastCS's attributes: the
State and Status of the acquisition, and LImA's names (``acq_nb_frames``, ``acq_expo_time``,
``acq_status``, ``last_image_saved``, ``saving_directory``, ``saving_prefix``, the commands
``startAcq``, ``stopAcq`` and ``abortAcq``)."""
from __future__ import annotations

import asyncio
import dataclasses
import threading

from .fastcs_state import DetectorState

#: LImA's ``acq_status`` for each ADDriver state
LIMA_STATUS = {DetectorState.Idle: "Ready", DetectorState.Aborted: "Ready", DetectorState.Waiting: "Running",
               DetectorState.Acquire: "Running", DetectorState.Error: "Fault", DetectorState.Disconnected: "Fault"}


def tango_state(state: DetectorState):
    """Tango's State for an ADDriver state: ON when ready, RUNNING while a dataset is under
    way (armed between triggers too), FAULT in error, UNKNOWN when the service does not
    answer."""
    from tango import DevState

    return {DetectorState.Idle: DevState.ON, DetectorState.Aborted: DevState.ON, DetectorState.Waiting: DevState.RUNNING,
            DetectorState.Acquire: DevState.RUNNING, DetectorState.Error: DevState.FAULT,
            DetectorState.Disconnected: DevState.UNKNOWN}.get(state, DevState.UNKNOWN)


def lima_device(base: type, controller, loop: asyncio.AbstractEventLoop) -> type:
    """``base`` (the device class FastCS made) with the State, the Status and LImA's names;
    writes and commands run on FastCS's loop, as its own attributes' do."""
    from tango import AttrWriteType
    from tango.server import attribute, command

    async def on_loop(coro):
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    c = controller

    class RdaqDetector(base):
        acq_nb_frames = attribute(dtype=int, access=AttrWriteType.READ_WRITE, doc="frames per trigger (NumImages)")
        acq_expo_time = attribute(dtype=float, access=AttrWriteType.READ_WRITE, unit="s", doc="exposure per frame (AcquireTime)")
        acq_status = attribute(dtype=str, doc="Ready, Running or Fault")
        last_image_saved = attribute(dtype=int, doc="index of the dataset's last frame written (-1: none)")
        saving_directory = attribute(dtype=str, access=AttrWriteType.READ_WRITE, doc="directory under the data root (FilePath)")
        saving_prefix = attribute(dtype=str, access=AttrWriteType.READ_WRITE, doc="prefix of the files (FileName)")

        def dev_state(self):
            return tango_state(c.DetectorState_RBV.get())

        def dev_status(self):
            state = c.DetectorState_RBV.get()
            message = c.StatusMessage_RBV.get()
            return f"{state.name}: {message}" if message else state.name

        def read_acq_nb_frames(self):
            return c.num_images.get()

        async def write_acq_nb_frames(self, value):
            await on_loop(c.num_images.put(int(value), sync_setpoint=True))

        def read_acq_expo_time(self):
            return c.acquire_time.get()

        async def write_acq_expo_time(self, value):
            await on_loop(c.acquire_time.put(float(value), sync_setpoint=True))

        def read_acq_status(self):
            return LIMA_STATUS.get(c.DetectorState_RBV.get(), "Fault")

        def read_last_image_saved(self):
            return c.NumCaptured_RBV.get() - 1

        def read_saving_directory(self):
            return c.file_path.get()

        async def write_saving_directory(self, value):
            await on_loop(c.file_path.put(value, sync_setpoint=True))

        def read_saving_prefix(self):
            return c.file_name.get()

        async def write_saving_prefix(self, value):
            await on_loop(c.file_name.put(value, sync_setpoint=True))

        @command
        async def startAcq(self):  # noqa: N802 (LImA's name)
            await on_loop(c.acquire.put(True, sync_setpoint=True))

        @command
        async def stopAcq(self):  # noqa: N802
            await on_loop(c.acquire.put(False, sync_setpoint=True))

        @command
        async def abortAcq(self):  # noqa: N802
            await on_loop(c.acquire.put(False, sync_setpoint=True))

    RdaqDetector.__name__ = base.__name__
    return RdaqDetector


def tango_transport(controller, port: int, name: str, on_stop):
    """A FastCS transport serving ``controller`` as Tango device ``name`` on ``port``. Tango's
    server takes SIGTERM and SIGINT for itself and stops: ``on_stop`` is called then, to stop
    the rest."""
    from fastcs.transports import Transport
    from fastcs.transports.tango.dsr import TangoDSR
    from tango.test_context import DeviceTestContext

    class TangoNoDbTransport(Transport):
        def connect(self, controller_apis, loop):
            # the device class is named after the controller's id, which is the PV prefix
            # (with ':'): Tango takes a plain name
            apis = [dataclasses.replace(api, path=["RdaqDetector"]) for api in controller_apis]
            self._device = lima_device(TangoDSR(apis, loop)._devices[0], controller, loop)

        async def serve(self):
            stop = threading.Event()
            try:
                await asyncio.to_thread(self._run, stop)
            finally:
                stop.set()
            on_stop()

        def _run(self, stop):
            context = DeviceTestContext(self._device, device_name=name, host="127.0.0.1", port=port, process=False)
            context.start()
            try:
                while not stop.wait(0.2) and context.thread.is_alive():
                    pass
            finally:
                # a server that took a signal has stopped already (and cannot be asked to)
                if context.thread.is_alive():
                    context.stop()

        def __repr__(self):
            return f"TangoNoDbTransport(tango://127.0.0.1:{port}/{name}#dbase=no)"

    return TangoNoDbTransport()
