"""rdaq in EPICS and Tango through FastCS (rdaq.fastcs): the controller over the acquisition
service served as PV Access, Channel Access and a Tango device without a database; a p4p
(PVA), a caproto (CA) and a pytango client each arm, acquire and read the counters of a real
acquisition over the emulated detector and the daemons."""
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

from conftest import free_port
from test_service import frames_as_sent, service  # noqa: F401 (the fixture)

PREFIX = "RDAQTEST:DET"


def udp_port():
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ioc(service, monkeypatch):  # noqa: F811
    """`python -m rdaq.fastcs` over the service, its EPICS servers on ports of their own on
    loopback (the clients here told the same), its Tango device on a free port."""
    svc, root, procs = service
    with fastcs_ioc(svc.url, root.parent / "fastcs.log", monkeypatch) as (ctx, tango_port):
        yield ctx, tango_port, svc, root, procs


@contextlib.contextmanager
def fastcs_ioc(url, log, monkeypatch):
    """`python -m rdaq.fastcs` over the service at `url`, logging to `log`: a PVA client
    context and the Tango device's port while it serves."""
    env = {"EPICS_CA_SERVER_PORT": str(udp_port()), "EPICS_CA_REPEATER_PORT": str(udp_port()),
           "EPICS_CAS_INTF_ADDR_LIST": "127.0.0.1", "EPICS_CA_ADDR_LIST": "127.0.0.1", "EPICS_CA_AUTO_ADDR_LIST": "NO",
           "EPICS_PVA_SERVER_PORT": str(free_port()), "EPICS_PVA_BROADCAST_PORT": str(udp_port()),
           "EPICS_PVAS_INTF_ADDR_LIST": "127.0.0.1", "EPICS_PVA_ADDR_LIST": "127.0.0.1", "EPICS_PVA_AUTO_ADDR_LIST": "NO"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    tango_port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rdaq.fastcs", "--service", url, "--prefix", PREFIX,
                             "--tango-port", str(tango_port)], env={**os.environ, **env},
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, text=True)
    from p4p.client.thread import Context
    ctx = Context("pva")
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            ctx.get(f"{PREFIX}:DetectorState_RBV", timeout=1)
            break
        except TimeoutError:
            assert time.monotonic() < deadline, "the PVs did not come up"
    import tango
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            tango.DeviceProxy(tango_url(tango_port)).ping()
            break
        except tango.DevFailed:
            assert time.monotonic() < deadline, "the Tango device did not come up"
            time.sleep(0.2)
    yield ctx, tango_port
    ctx.close()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode == 0, log.read_text()


def tango_url(port):
    return f"tango://127.0.0.1:{port}/{PREFIX.replace(':', '/')}/1#dbase=no"


def wait_idle(get, frames, timeout=60):
    deadline = time.monotonic() + timeout
    while not (str(get("DetectorState_RBV")) in ("Idle", "0") and get("NumCaptured_RBV") == frames):
        assert time.monotonic() < deadline, (get("DetectorState_RBV"), get("NumCaptured_RBV"))
        time.sleep(0.1)


def test_pva_arms_acquires_and_reads_the_counters(ioc):
    ctx, _, svc, root, _ = ioc

    assert str(ctx.get(f"{PREFIX}:DetectorState_RBV")) == "Idle"
    ctx.put(f"{PREFIX}:FilePath", "epics")
    time.sleep(1)
    assert not ctx.get(f"{PREFIX}:FilePathExists_RBV"), "the directory is made at the first trigger"
    for name, value in (("NumImages", 8), ("NumTriggers", 2), ("AcquirePeriod", 0.005), ("FilePath", "epics"),
                        ("FileName", "pva"), ("Process", False)):
        ctx.put(f"{PREFIX}:{name}", value)
        assert ctx.get(f"{PREFIX}:{name}_RBV") == value, name
    ctx.put(f"{PREFIX}:Acquire", True)
    wait_idle(lambda n: ctx.get(f"{PREFIX}:{n}"), 16)
    master = ctx.get(f"{PREFIX}:FullFileName_RBV").raw.value
    assert master == str(root / "epics" / "pva_master.h5")
    assert ctx.get(f"{PREFIX}:FilePathExists_RBV")
    assert frames_as_sent(master) == list(range(16))
    assert ctx.get(f"{PREFIX}:FramesLost_RBV") == 0 and not ctx.get(f"{PREFIX}:Acquire_RBV")
    assert svc.acquisition()["dataset"]["triggers_done"] == 2


def test_ca_arms_acquires_with_processing_and_reads_the_hit_rate(ioc):
    from caproto.sync.client import read, write
    _, _, svc, root, _ = ioc

    def get(name):
        v = read(f"{PREFIX}:{name}", repeater=False).data
        v = v[0] if len(v) == 1 else v
        return v.decode() if isinstance(v, bytes) else v

    for name, value in (("NumImages", 20), ("FilePath", "epics"), ("FileName", "ca"), ("Process", 1)):
        write(f"{PREFIX}:{name}", value if not isinstance(value, str) else value.encode(), notify=True, repeater=False)
    write(f"{PREFIX}:Acquire", 1, notify=True, repeater=False, timeout=120)
    d = svc.wait("idle")["dataset"]
    wait_idle(get, d["frames_written"])
    assert d["summary"]["processing"]["signal_frames"] == 20
    assert 0 < get("NumCaptured_RBV") <= 20, "hits only"
    hits = d["summary"]["processing"]["hits"]
    deadline = time.monotonic() + 10
    while get("HitRate_RBV") != pytest.approx(hits / 20):
        assert time.monotonic() < deadline, get("HitRate_RBV")
        time.sleep(0.1)
    assert get("SpotsPerFrame_RBV") > 0
    assert get("FramesLost_RBV") == 0 and get("DatagramsDropped_RBV") == 0
    assert bytes(read(f"{PREFIX}:FullFileName_RBV", repeater=False).data).rstrip(b"\0").decode() == str(root / "epics" / "ca_master.h5")


def test_ca_acquire_is_a_busy_record(ioc):
    """On Channel Access a put of 1 with a callback (`caput -c`) completes when the dataset
    has ended, every frame written, and Acquire is 0 again; a plain put of 0 while such a put
    waits cancels the dataset and ends the wait; a put of 0 with nothing under way is no
    error."""
    from caproto import ChannelType
    from caproto.sync.client import read, write
    ctx, _, svc, _, _ = ioc

    def acquire():
        return read(f"{PREFIX}:Acquire", data_type=ChannelType.TIME_ENUM, repeater=False)

    for name, value in (("NumImages", 30), ("AcquirePeriod", 0.01), ("FileName", "busy"), ("Process", False)):
        ctx.put(f"{PREFIX}:{name}", value)
    write(f"{PREFIX}:Acquire", 1, notify=True, repeater=False, timeout=120)
    a = svc.acquisition()
    assert a["state"] == "idle" and a["dataset"]["frames_written"] == 30 and not a["dataset"]["cancelled"], a
    assert acquire().data[0] == 0 and acquire().metadata.severity == 0

    for name, value in (("NumImages", 3000), ("FileName", "busy_cancel")):
        ctx.put(f"{PREFIX}:{name}", value)
    # caproto's sync client is not thread-safe: the waiting put is caproto-put -c, as caput -c
    put = subprocess.Popen([Path(sys.executable).parent / "caproto-put", "--notify", "--no-repeater", "-w", "300",
                            f"{PREFIX}:Acquire", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while True:
        # one look for both: the previous dataset's count must not pass for this one's
        d = svc.acquisition()["dataset"] or {}
        if d.get("request", {}).get("prefix") == "busy_cancel" and d["frames_written"] >= 5:
            break
        assert time.monotonic() < deadline, d
        time.sleep(0.05)
    assert put.poll() is None, "the put waits while its dataset runs"
    write(f"{PREFIX}:Acquire", 0, repeater=False)
    out, _ = put.communicate(timeout=60)
    assert put.returncode == 0, out
    d = svc.acquisition()["dataset"]
    assert d["cancelled"] and 5 <= d["frames_written"] < 3000, d
    write(f"{PREFIX}:Acquire", 0, notify=True, repeater=False, timeout=30)
    assert acquire().data[0] == 0 and acquire().metadata.severity == 0
    assert svc.acquisition()["state"] == "idle"


def test_tango_without_a_database_arms_acquires_and_reads_the_counters(ioc):
    import tango
    _, port, svc, root, _ = ioc
    dev = tango.DeviceProxy(tango_url(port))
    dev.NumImages = 6
    dev.NumTriggers = 1
    dev.FilePath = "tango"
    dev.FileName = "t"
    dev.Process = False
    dev.Acquire = True
    wait_idle(lambda n: getattr(dev, {"DetectorState_RBV": "DetectorstateRbv", "NumCaptured_RBV": "NumcapturedRbv"}[n]), 6)
    assert dev.FullfilenameRbv == str(root / "tango" / "t_master.h5")
    assert frames_as_sent(dev.FullfilenameRbv) == list(range(6))
    assert dev.FrameslostRbv == 0


def test_tango_with_lima_names_and_a_state_that_follows(ioc):
    """LImA's attribute and command names; State RUNNING while the dataset is under way and
    ON once stopped; acq_status Running, then Ready."""
    import tango
    _, port, svc, root, _ = ioc
    dev = tango.DeviceProxy(tango_url(port))
    dev.acq_nb_frames = 400
    dev.acq_expo_time = 0.002
    dev.saving_directory = "lima"
    dev.saving_prefix = "l"
    dev.Process = False
    dev.AcquirePeriod = 0.01
    assert (dev.NumImages, dev.AcquireTime, dev.FilePath) == (400, 0.002, "lima")
    assert dev.last_image_saved == -1
    dev.startAcq()
    deadline = time.monotonic() + 20
    while dev.State() != tango.DevState.RUNNING or dev.last_image_saved < 4:
        assert time.monotonic() < deadline, (dev.State(), dev.last_image_saved)
        time.sleep(0.1)
    assert dev.acq_status == "Running"
    dev.stopAcq()
    d = svc.wait("idle")["dataset"]
    assert d["cancelled"] and d["master"] == str(root / "lima" / "l_master.h5")
    assert d["request"]["count_time_s"] == 0.002
    deadline = time.monotonic() + 10
    while dev.State() != tango.DevState.ON:
        assert time.monotonic() < deadline, dev.State()
        time.sleep(0.1)
    assert dev.acq_status == "Ready" and dev.last_image_saved == d["frames_written"] - 1


def test_a_client_that_goes_away_changes_nothing_and_cancel_works(ioc):
    ctx, _, svc, _, _ = ioc
    from p4p.client.thread import Context
    other = Context("pva")
    for name, value in (("NumImages", 500), ("AcquirePeriod", 0.01), ("FileName", "long"), ("Process", False)):
        other.put(f"{PREFIX}:{name}", value)
    other.put(f"{PREFIX}:Acquire", True)
    other.close()
    while svc.acquisition()["dataset"]["frames_written"] < 5:
        assert svc.acquisition()["state"] == "acquiring"
        time.sleep(0.05)
    ctx.put(f"{PREFIX}:Acquire", False)
    d = svc.wait("idle")["dataset"]
    assert d["cancelled"] and 5 <= d["frames_written"] < 500


def ca_severity(name):
    from caproto import ChannelType
    from caproto.sync.client import read
    return read(f"{PREFIX}:{name}", data_type=ChannelType.TIME_LONG, repeater=False).metadata.severity


def pva_severity(ctx, name):
    return ctx.get(f"{PREFIX}:{name}").raw["alarm.severity"]


def test_the_state_says_when_the_service_does_not_answer(ioc):
    """ADDriver's states: Idle, then Disconnected (with the reason) within seconds of the
    service going silent, every readback INVALID on both EPICS transports and the Tango
    State UNKNOWN; Idle, ON and no alarm again once it answers."""
    import tango
    ctx, port, svc, root, procs = ioc
    dev = tango.DeviceProxy(tango_url(port))
    get = lambda n: str(ctx.get(f"{PREFIX}:{n}"))  # noqa: E731
    assert get("DetectorState_RBV") == "Idle" and dev.State() == tango.DevState.ON
    manager = procs[-1]
    os.kill(manager.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 20
        while get("DetectorState_RBV") != "Disconnected":
            assert time.monotonic() < deadline, get("DetectorState_RBV")
            time.sleep(0.2)
        assert ctx.get(f"{PREFIX}:StatusMessage_RBV").raw.value.startswith("service unreachable")
        for name in ("NumCaptured_RBV", "DetectorState_RBV", "NumImages_RBV", "FramesLost_RBV"):
            assert pva_severity(ctx, name) == 3, name
        assert ca_severity("NumCaptured_RBV") == 3 and ca_severity("DetectorState_RBV") == 3
        assert dev.State() == tango.DevState.UNKNOWN and dev.acq_status == "Fault"
        assert "service unreachable" in dev.Status()
    finally:
        os.kill(manager.pid, signal.SIGCONT)
    deadline = time.monotonic() + 20
    while get("DetectorState_RBV") != "Idle":
        assert time.monotonic() < deadline, get("DetectorState_RBV")
        time.sleep(0.2)
    assert ctx.get(f"{PREFIX}:StatusMessage_RBV").raw.value == ""
    assert pva_severity(ctx, "NumCaptured_RBV") == 0 and ca_severity("NumCaptured_RBV") == 0
    assert dev.State() == tango.DevState.ON and dev.acq_status == "Ready"


def test_a_refused_acquire_fails_the_put_and_says_why(ioc):
    """Existing files: the PVA put fails, the CA put leaves Acquire in MAJOR alarm, and
    StatusMessage_RBV says why; ImageMode Continuous is refused the same way."""
    from caproto import ChannelType
    from caproto.sync.client import read, write
    from p4p.client.thread import RemoteError
    ctx, _, svc, root, _ = ioc
    for name, value in (("NumImages", 2), ("FileName", "twice"), ("Process", False)):
        ctx.put(f"{PREFIX}:{name}", value)
    ctx.put(f"{PREFIX}:Acquire", True)
    wait_idle(lambda n: ctx.get(f"{PREFIX}:{n}"), 2)
    with pytest.raises(RemoteError):
        ctx.put(f"{PREFIX}:Acquire", True)
    assert "overwrite" in ctx.get(f"{PREFIX}:StatusMessage_RBV").raw.value
    write(f"{PREFIX}:Acquire", 1, notify=True, repeater=False)
    assert read(f"{PREFIX}:Acquire", data_type=ChannelType.TIME_ENUM, repeater=False).metadata.severity == 2
    ctx.put(f"{PREFIX}:FileName", "continuous")
    ctx.put(f"{PREFIX}:ImageMode", "Continuous")
    with pytest.raises(RemoteError):
        ctx.put(f"{PREFIX}:Acquire", True)
    assert "Continuous" in ctx.get(f"{PREFIX}:StatusMessage_RBV").raw.value
    assert svc.acquisition()["dataset"]["request"]["prefix"] == "twice"
    with pytest.raises(RemoteError):
        ctx.put(f"{PREFIX}:NumExposures", 2)
    assert ctx.get(f"{PREFIX}:NumExposures_RBV") == 1


@pytest.mark.parametrize("mode, code, count_time", [("External", "exts", 0.002), ("Gate", "exte", 0.0)])
def test_external_triggers_single_images_and_numbered_files(ioc, mode, code, count_time):
    """TriggerMode External: Acquire arms and waits (Waiting, Acquire_RBV 1) for triggers
    from elsewhere; ImageMode Single takes one frame per trigger; AutoIncrement numbers the
    files; the counters count the frames. Gate: the same, each exposure the gate's (count
    time 0 whatever AcquireTime says). The mode is in the master, in Dectris's codes."""
    ctx, _, svc, root, _ = ioc
    get = lambda n: ctx.get(f"{PREFIX}:{n}")  # noqa: E731
    for name, value in (("TriggerMode", mode), ("ImageMode", "Single"), ("NumImages", 50), ("NumTriggers", 2), ("AcquireTime", 0.002),
                        ("AutoIncrement", True), ("FileNumber", 7), ("FileName", "ext"), ("Process", False)):
        ctx.put(f"{PREFIX}:{name}", value)
    ctx.put(f"{PREFIX}:Acquire", True)
    deadline = time.monotonic() + 20
    while str(get("DetectorState_RBV")) != "Waiting" or not get("Acquire_RBV"):
        assert time.monotonic() < deadline, (get("DetectorState_RBV"), get("Acquire_RBV"))
        time.sleep(0.1)
    assert get("FileNumber_RBV") == 8
    for _ in range(2):
        svc.trigger()
        svc.wait(("armed", "idle"))
    wait_idle(get, 2)
    master = get("FullFileName_RBV").raw.value
    assert master == str(root / "ext_007_master.h5")
    assert frames_as_sent(master) == [0, 1]
    with h5py.File(master, "r") as f:
        assert f["entry/instrument/detector/detectorSpecific/trigger_mode"][()].decode() == code
        assert f["entry/instrument/detector/count_time"][()] == count_time
    assert get("NumImagesCounter_RBV") == 2 and get("ArrayCounter_RBV") == 2 and not get("Acquire_RBV")


def test_the_metadata_pvs_reach_the_master(ioc):
    """PhotonEnergy (eV), DetDist (mm), BeamX, BeamY and SampleName are in the dataset's
    master in NXmx's units; PhotonEnergy back at 0 leaves the service's energy."""
    ctx, _, svc, root, _ = ioc
    get = lambda n: ctx.get(f"{PREFIX}:{n}")  # noqa: E731
    for name, value in (("PhotonEnergy", 9500.0), ("DetDist", 155.0), ("BeamX", 1021.5), ("BeamY", -12.0),
                        ("SampleName", "lysozyme 7"), ("NumImages", 3), ("FileName", "meta"), ("Process", False)):
        ctx.put(f"{PREFIX}:{name}", value)
    ctx.put(f"{PREFIX}:Acquire", True)
    wait_idle(get, 3)
    with h5py.File(get("FullFileName_RBV").raw.value, "r") as f:
        det = f["entry/instrument/detector"]
        assert f["entry/sample/name"][()].decode() == "lysozyme 7"
        assert abs(f["entry/instrument/beam/incident_wavelength"][()] - 12.398419843320026 / 9.5) < 1e-9
        assert abs(det["distance"][()] - 0.155) < 1e-12
        assert (det["beam_center_x"][()], det["beam_center_y"][()]) == (1021.5, -12.0)
    ctx.put(f"{PREFIX}:PhotonEnergy", 0.0)
    ctx.put(f"{PREFIX}:FileName", "meta_default")
    ctx.put(f"{PREFIX}:Acquire", True)
    deadline = time.monotonic() + 60
    while not get("FullFileName_RBV").raw.value.endswith("meta_default_master.h5"):
        assert time.monotonic() < deadline, get("FullFileName_RBV")
        time.sleep(0.1)
    wait_idle(get, 3)
    with h5py.File(get("FullFileName_RBV").raw.value, "r") as f:
        assert abs(f["entry/instrument/beam/incident_wavelength"][()] - 12.398419843320026 / 9.5) > 1e-3


def test_the_pedestal_action_on_channel_access_and_tango(rdaq, tmp_path, monkeypatch):
    """`Pedestal` on the service of one receiver that drives the (stand-in) detector: a put
    to the CA action PV, and the Tango command, each take a pedestal dataset of 3 x
    PedestalFrames frames through PSI's procedure, and Calibration_RBV names the calibration
    written."""
    from caproto.sync.client import read, write
    import tango

    from conftest import free_udp_port
    from rdaq.control import Service
    from test_readme_daemons import wait_up
    from test_sls_control import MAC, standin_env
    addr, root = f"127.0.0.1:{free_port()}", tmp_path / "data"
    svc_proc = subprocess.Popen([rdaq, "receive", "--format", "sls", "--bind", "127.0.0.1", "--port", str(free_udp_port()),
                                 "--sls-detector", "jf1", "--receiver-mac", MAC, "--modules", "1", "--ring-mib", "16",
                                 "--stream", "none", "--frame-timeout-ms", "200", "--data-root", root, "--serve", addr],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env=standin_env(tmp_path / "standin.jsonl"))
    try:
        wait_up(f"http://{addr}/acquisition", svc_proc)
        svc = Service(f"http://{addr}")
        with fastcs_ioc(svc.url, tmp_path / "fastcs.log", monkeypatch) as (ctx, tango_port):
            def calibration():
                return bytes(read(f"{PREFIX}:Calibration_RBV", repeater=False).data).rstrip(b"\0").decode()

            def until_written(path):
                deadline = time.monotonic() + 120
                while calibration() != str(path):
                    assert time.monotonic() < deadline, (calibration(), svc.acquisition())
                    time.sleep(0.1)

            write(f"{PREFIX}:PedestalFrames", 10, notify=True, repeater=False)
            write(f"{PREFIX}:FileName", b"ca", notify=True, repeater=False)
            write(f"{PREFIX}:Pedestal", 1, notify=True, repeater=False, timeout=60)
            until_written(root / "ca_pedestal_calibration.h5")
            dev = tango.DeviceProxy(tango_url(tango_port))
            dev.FileName = "tango"
            dev.Pedestal()
            until_written(root / "tango_pedestal_calibration.h5")
        for name in ("ca", "tango"):
            with h5py.File(root / f"{name}_pedestal_calibration.h5", "r") as f:
                assert f["pedestal_frames"][:].tolist() == [10, 10, 10]
    finally:
        svc_proc.send_signal(signal.SIGINT)
        _, err = svc_proc.communicate(timeout=60)
    assert svc_proc.returncode == 0, err


def test_the_docs_list_every_pv_the_ioc_serves():
    """docs/control-systems.md's PV table names exactly the IOC's PVs."""
    import re
    from pathlib import Path

    from fastcs.util import snake_to_pascal
    from rdaq.fastcs import RdaqController

    text = (Path(__file__).parent.parent / "docs" / "control-systems.md").read_text()
    table = text[text.index("| PV (`PREFIX:` ...) |"):]
    table = table[:table.index("\n\n")]
    documented = {name for row in table.splitlines()[2:] for name in re.findall(r"`([A-Za-z_]+)`", row.split("|")[1])}
    served = {snake_to_pascal(name) for name in RdaqController("http://127.0.0.1:1").attributes}
    assert documented == served
