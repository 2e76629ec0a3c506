"""rdaq as a Bluesky detector (rdaq.bluesky, ophyd-async's StandardDetector) with the real
RunEngine against the acquisition service over the emulated detector and the daemons: a
count with several frames per point, a step scan over a soft motor, a fly scan. Every
document validates against event-model's schemas, and the frames the StreamResource and
StreamDatum documents point to, read with h5py, equal what the emulator's manifest says
was sent."""
import urllib.parse

import bluesky.plan_stubs as bps
import bluesky.plans as bp
import bluesky.preprocessors as bpp
import h5py
import pytest
from bluesky import RunEngine
from event_model import DocumentNames, schema_validators
from ophyd_async.core import StaticPathProvider, TriggerInfo, UUIDFilenameProvider, init_devices
from ophyd_async.sim import SimMotor

from rdaq.bluesky import RdaqDetector
from test_service import frames_as_sent, service  # noqa: F401 (the fixture)


@pytest.fixture
def bluesky(service):  # noqa: F811
    svc, root, _ = service
    RE = RunEngine({})
    docs = []
    RE.subscribe(lambda name, doc: docs.append((name, doc)))
    with init_devices():
        det = RdaqDetector(svc.url, StaticPathProvider(UUIDFilenameProvider(), root / "bluesky"))
        motor = SimMotor()
    yield RE, det, motor, docs, svc
    RE.loop.call_soon_threadsafe(RE.loop.stop)


def check(docs, frames_per_event, events):
    """Every document valid; the frames the stream documents point to equal the manifest's."""
    for name, doc in docs:
        schema_validators[DocumentNames(name)].validate(doc)
    resources = [d for n, d in docs if n == "stream_resource"]
    datums = [d for n, d in docs if n == "stream_datum"]
    assert len(resources) == 1, resources
    r = resources[0]
    assert r["mimetype"] == "application/x-hdf5" and r["parameters"]["dataset"] == "/entry/data/data"
    path = urllib.parse.urlparse(r["uri"]).path
    descriptor = next(d for n, d in docs if n == "descriptor" and r["data_key"] in d["data_keys"])
    assert descriptor["data_keys"][r["data_key"]]["shape"][0] == frames_per_event
    stop = 0
    for d in datums:
        assert d["stream_resource"] == r["uid"] and d["indices"]["start"] == stop
        stop = d["indices"]["stop"]
    assert stop == events, "one index per event"
    assert frames_as_sent(path) == list(range(events * frames_per_event))
    with h5py.File(path, "r") as f:
        assert f[r["parameters"]["dataset"]].shape[0] == events * frames_per_event
    assert next(d for n, d in docs if n == "stop")["exit_status"] == "success"


def test_count_with_several_frames_per_point(bluesky, monkeypatch):
    """As with ophyd-async's areaDetectors: the frames per point are the detector's setting,
    which a plan that does not prepare reads (OPHYD_ASYNC_PRESERVE_DETECTOR_STATE)."""
    RE, det, _, docs, svc = bluesky
    monkeypatch.setenv("OPHYD_ASYNC_PRESERVE_DETECTOR_STATE", "YES")
    RE(bps.mv(det.frames_per_point, 4, det.period_s, 0.005))
    RE(bp.count([det], num=3))
    check(docs, 4, 3)
    a = svc.acquisition()
    assert a["state"] == "idle" and not a["dataset"]["cancelled"] and a["dataset"]["triggers_done"] == 3
    assert (a["dataset"]["request"]["frames_per_trigger"], a["dataset"]["request"]["period_s"]) == (4, 0.005)
    config = next(d for n, d in docs if n == "descriptor")["configuration"][det.name]["data"]
    assert config[det.frames_per_point.name] == 4


def test_a_prepared_plan_takes_its_frames_per_point(bluesky):
    RE, det, _, docs, _ = bluesky

    @bpp.stage_decorator([det])
    @bpp.run_decorator()
    def plan():
        yield from bps.prepare(det, TriggerInfo(collections_per_event=3), wait=True)
        for _ in range(2):
            yield from bps.trigger_and_read([det])

    RE(plan())
    check(docs, 3, 2)


def test_step_scan_over_a_soft_motor(bluesky):
    RE, det, motor, docs, _ = bluesky
    RE(bp.scan([det], motor, 0, 1, 5))
    check(docs, 1, 5)
    events = [d for n, d in docs if n == "event"]
    assert [e["data"][motor.name] for e in events] == pytest.approx([0, 0.25, 0.5, 0.75, 1])


def test_fly_scan(bluesky):
    RE, det, _, docs, svc = bluesky

    @bpp.stage_decorator([det])
    @bpp.run_decorator()
    def fly():
        yield from bps.prepare(det, TriggerInfo(number_of_events=30, deadtime=0.005), wait=True)
        yield from bps.declare_stream(det, name="primary", collect=True)
        yield from bps.kickoff(det, wait=True)
        yield from bps.collect_while_completing(flyers=[det], dets=[det], flush_period=0.2)

    RE(fly())
    check(docs, 1, 30)
    assert svc.acquisition()["dataset"]["request"]["period_s"] == pytest.approx(0.005)


def test_two_runs_make_two_datasets(bluesky):
    RE, det, _, docs, svc = bluesky
    RE(bp.count([det], num=2))
    first = svc.acquisition()["dataset"]
    RE(bp.count([det], num=2))
    second = svc.acquisition()["dataset"]
    assert second["number"] == first["number"] + 1 and second["master"] != first["master"]


@pytest.mark.parametrize("trigger, count_time_s, code", [("EXTERNAL_EDGE", 0.002, "exts"), ("EXTERNAL_LEVEL", 0.0, "exte")])
def test_external_triggers_from_elsewhere(bluesky, trigger, count_time_s, code):
    """EXTERNAL_EDGE: the dataset takes one frame per trigger, and the kickoff's wait ends
    when the triggers sent from elsewhere (here a thread calling the service) brought them;
    the exposure is the detector's acquire_time when the TriggerInfo gives no livetime.
    EXTERNAL_LEVEL (gates) the same, with the exposure the gate's (count time 0). The mode
    is in the master, in Dectris's codes."""
    import threading
    import time

    from ophyd_async.core import DetectorTrigger
    RE, det, _, docs, svc = bluesky
    RE(bps.mv(det.acquire_time, 0.002))

    failed = []

    def hardware():
        try:
            deadline = time.monotonic() + 60
            while svc.acquisition()["state"] != "armed":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            for _ in range(5):
                svc.trigger()
                svc.wait(("armed", "idle"))
        except Exception as e:  # noqa: BLE001 (reported below)
            failed.append(e)

    sender = threading.Thread(target=hardware, daemon=True)

    @bpp.stage_decorator([det])
    @bpp.run_decorator()
    def fly():
        yield from bps.prepare(det, TriggerInfo(number_of_events=5, trigger=DetectorTrigger[trigger]), wait=True)
        sender.start()
        yield from bps.declare_stream(det, name="primary", collect=True)
        yield from bps.kickoff(det, wait=True)
        yield from bps.collect_while_completing(flyers=[det], dets=[det], flush_period=0.2)

    RE(fly())
    sender.join(timeout=30)
    assert not failed and not sender.is_alive()
    check(docs, 1, 5)
    d = svc.acquisition()["dataset"]
    assert (d["request"]["frames_per_trigger"], d["request"]["count_time_s"], d["triggers_done"]) == (1, count_time_s, 5)
    with h5py.File(d["master"], "r") as f:
        assert f["entry/instrument/detector/detectorSpecific/trigger_mode"][()].decode() == code
        assert f["entry/instrument/detector/count_time"][()] == count_time_s
    values = {}

    def read():
        values["counter"] = yield from bps.rd(det.image_counter)
        values["file"] = yield from bps.rd(det.file_path)

    RE(read())
    assert values == {"counter": 5, "file": d["master"]}
