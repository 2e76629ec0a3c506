"""The acquisition service (`rdaq manage --data-root DIR --serve ADDR`): configured once, then
many datasets in a row through its API (the Python client `rdaq.control.Service`), each
one master whose frames are those the emulator's manifest says were sent; bad requests
refused with the field named; nothing written outside the data root; its OpenAPI document
valid. All daemons on one host, the receivers writing under the data root."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import h5py
import pytest
from openapi_spec_validator import validate

from conftest import free_port, free_udp_port, frames_in, manifest
from rdaq.control import ApiError, Service
from test_readme_daemons import wait_up

MODULES = 4


@pytest.fixture
def service(rdaq, tmp_path):
    """The detector daemon, two receiver daemons and the service over them (temporal)."""
    det, rx, svc = free_port(), [free_port(), free_port()], free_port()
    root = tmp_path / "data"
    root.mkdir()
    text = (f'[detector]\nmodules = {MODULES}\nmodule_cols = 1\ncontrol = "127.0.0.1:{det}"\n\n'
            '[transfer]\nmode = "temporal"\n\n[process]\ncalibration = "emulated"\n')
    for k, name in enumerate(("dr0", "dr1")):
        text += (f'\n[[receivers]]\nname = "{name}"\ncontrol = "127.0.0.1:{rx[k]}"\ndata = "127.0.0.1"\n'
                 f'data_port = 0\nmemory_mib = 256\nstream = "none"\npreview = "none"\n')
    topo = tmp_path / "topology.toml"
    topo.write_text(text)
    procs = []
    try:
        procs.append(subprocess.Popen([rdaq, "emulate", "--serve", f"127.0.0.1:{det}", "--modules", str(MODULES)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        wait_up(f"http://127.0.0.1:{det}/status", procs[-1])
        for k, name in enumerate(("dr0", "dr1")):
            procs.append(subprocess.Popen([rdaq, "receive", "--serve", f"127.0.0.1:{rx[k]}", "--name", name,
                                           "--memory-mib", "256", "--out-dir", root],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            wait_up(f"http://127.0.0.1:{rx[k]}/status", procs[-1])
        mgr = subprocess.Popen([rdaq, "manage", "--topology", topo, "--serve", f"127.0.0.1:{svc}", "--data-root", root],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(mgr)
        wait_up(f"http://127.0.0.1:{svc}/acquisition", mgr)
        yield Service(f"http://127.0.0.1:{svc}"), root, procs
        mgr.send_signal(signal.SIGINT)
        out, err = mgr.communicate(timeout=60)
        assert mgr.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
            p.wait(timeout=30)


def frames_as_sent(master):
    """The frame numbers in a dataset's master, in order, each frame's modules equal to
    what the emulator's manifest beside it says was sent."""
    sent = manifest(master.replace("_master.h5", "_manifest.csv"))
    got = frames_in(master)
    for frame, hashes in got.items():
        assert hashes == [sent[(frame, m)] for m in range(MODULES)], f"frame {frame}"
    return sorted(got)


def check_dataset(a, root, frames, raw):
    """The dataset's master holds frames 0..frames-1, each once; raw ones equal to what the
    emulator sent."""
    d = a["dataset"]
    assert os.path.isabs(d["master"]) and d["master"].startswith(str(root)), d["master"]
    assert d["dataset"] == "/entry/data/data" and d["frames_lost"] == 0
    summary = d["summary"]
    assert summary["frames_expected"] == frames and summary["frames_complete"] == frames, summary
    with h5py.File(d["master"], "r") as f:
        numbers = f["entry/data/frame_number"][:].tolist()
        assert f[d["dataset"]].shape[0] == len(numbers) == d["frames_written"]
    if raw:
        assert numbers == list(range(frames)) == frames_as_sent(d["master"])
    else:
        assert numbers == sorted(set(numbers)) and 0 < len(numbers) <= frames, "hits only, in order"
        assert summary["processing"]["signal_frames"] == frames


def test_many_datasets_in_a_row_without_a_restart(service):
    svc, root, _ = service
    assert svc.acquisition()["state"] == "idle"
    # raw frames, three triggers of 5
    svc.arm(frames_per_trigger=5, triggers=3, period_s=0.01, directory="run1", prefix="raw", process=False)
    for k in range(3):
        t = svc.trigger()
        assert (t["first_frame"], t["frames"]) == (5 * k, 5)
        a = svc.wait(("armed", "idle"))
        assert a["dataset"]["triggers_done"] == k + 1
    assert a["state"] == "idle" and not a["dataset"]["cancelled"]
    check_dataset(a, root, 15, raw=True)
    # processed (hits only), in a deeper directory; then the same again under another prefix
    for n, prefix in ((2, "lyso"), (3, "lyso_2")):
        svc.arm(frames_per_trigger=12, period_s=0.005, directory="run2/a", prefix=prefix)
        svc.trigger()
        a = svc.wait("idle")
        assert a["dataset"]["number"] == n
        check_dataset(a, root, 12, raw=False)
    assert sorted(p.name for p in (root / "run2" / "a").glob("*_master.h5")) == \
        ["lyso_2_dr0_master.h5", "lyso_2_dr1_master.h5", "lyso_2_master.h5", "lyso_dr0_master.h5", "lyso_dr1_master.h5", "lyso_master.h5"]


def test_cancel_ends_a_dataset_early_and_keeps_what_was_written(service):
    svc, root, _ = service
    svc.arm(frames_per_trigger=400, period_s=0.02, directory="c", prefix="long", process=False)
    svc.trigger()
    with pytest.raises(ApiError) as e:
        svc.arm(frames_per_trigger=1, prefix="x", directory="never")
    assert e.value.status == 409, "a second arm while acquiring"
    assert not (root / "never").exists(), "a refused arm makes nothing"
    while svc.acquisition()["dataset"]["frames_written"] < 5:
        pass
    svc.cancel()
    a = svc.wait("idle")
    d = a["dataset"]
    assert d["cancelled"] and 5 <= d["frames_written"] < 400
    assert d["summary"]["stopped_early_of"] == 400 and d["frames_lost"] == 0, "the emulator says what it sent"
    with h5py.File(d["master"], "r") as f:
        assert f["entry/data/data"].shape[0] == d["frames_written"]
    # and the service goes on
    svc.arm(frames_per_trigger=4, directory="c", prefix="after", process=False)
    svc.trigger()
    check_dataset(svc.wait("idle"), root, 4, raw=True)


def test_a_client_that_goes_away_changes_nothing(service):
    """A client killed while its dataset is acquiring: the dataset goes on to its end."""
    svc, root, _ = service
    client = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from rdaq.control import Service; s = Service(sys.argv[1]);"
        "s.arm(frames_per_trigger=60, period_s=0.02, directory='gone', prefix='g', process=False);"
        "s.trigger(); print('triggered', flush=True); time.sleep(60)"), svc.url], stdout=subprocess.PIPE, text=True)
    assert client.stdout.readline().strip() == "triggered"
    client.kill()
    client.wait(timeout=10)
    assert svc.acquisition()["state"] == "acquiring"
    check_dataset(svc.wait("idle"), root, 60, raw=True)


def test_a_failure_is_an_error_with_its_reason_until_the_next_arm(service):
    svc, _, procs = service
    procs[2].terminate()  # dr1
    procs[2].wait(timeout=30)
    svc.arm(frames_per_trigger=4, directory="f", prefix="f", process=False)
    with pytest.raises(ApiError) as e:
        svc.trigger()  # the receivers could not all start: the trigger says why
    a = svc.acquisition()
    assert e.value.status == 500 and a["state"] == "error" and "dr1" in a["error"] and a["error"] in str(e.value), a
    with pytest.raises(ApiError) as e:
        svc.trigger()
    assert e.value.status == 409
    a = svc._call("POST", "/arm", {"frames_per_trigger": 4, "prefix": "f2"})
    assert (a["state"], a["error"]) == ("armed", None)


def test_bad_requests_are_refused_naming_the_field_and_change_nothing(service, tmp_path):
    svc, root, _ = service
    calls = [0]

    def refused(status, field, **arm):
        with pytest.raises(ApiError) as e:
            svc._call("POST", "/arm", arm)
        calls[0] += 1
        assert e.value.status == status and field in e.value.message, e.value
        assert svc.acquisition()["state"] == "idle"

    with pytest.raises(ApiError) as e:
        svc.trigger()
    assert e.value.status == 409 and "arm first" in e.value.message
    calls[0] += 1
    refused(400, "frames_per_trigger", frames_per_trigger=-3, prefix="p")
    refused(400, "frames_per_trigger", frames_per_trigger=0, prefix="p")
    refused(400, "colour", frames_per_trigger=3, prefix="p", colour="red")
    refused(400, "period_s", frames_per_trigger=3, prefix="p", period_s=-1)
    refused(400, "prefix", frames_per_trigger=3, prefix="../p")
    # a pedestal dataset is the service of one receiver's
    refused(400, "pedestal", frames_per_trigger=3, prefix="p", pedestal=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    for d in ("..", "../outside", str(outside), "a/../../outside"):
        refused(400, "directory", frames_per_trigger=3, prefix="p", directory=d)
    (root / "link").symlink_to(outside)
    refused(400, "link", frames_per_trigger=3, prefix="p", directory="link")
    refused(400, "link", frames_per_trigger=3, prefix="p", directory="link/deeper")
    assert list(outside.iterdir()) == [], "nothing made outside the data root"
    (root / "taken").mkdir()
    (root / "taken" / "p_master.h5").write_bytes(b"")
    refused(409, "p_master.h5", frames_per_trigger=3, prefix="p", directory="taken")
    # a malformed body, and one that is not JSON
    req = urllib.request.Request(svc.url + "/arm", data=b"{", method="POST", headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400 and "error" in json.loads(e.value.read())
    calls[0] += 1
    assert svc.acquisition()["requests_refused"] == calls[0], "every refusal counted"


def test_the_openapi_document_is_valid_and_the_client_follows_it(service):
    svc, _, _ = service
    doc = svc.openapi()
    validate(doc)
    assert doc["openapi"].startswith("3.")
    methods = {p: set(ops) for p, ops in doc["paths"].items()}
    assert methods == {"/acquisition": {"get"}, "/arm": {"post"}, "/trigger": {"post"}, "/disarm": {"post"}, "/cancel": {"post"},
                       "/status": {"get"}, "/events": {"get"}, "/report": {"get"}, "/stop": {"post"}, "/": {"get"},
                       "/dashboard/assets/{file}": {"get"}, "/dashboard/live": {"get"}, "/dashboard/snapshot": {"get"},
                       "/dashboard/preview.png": {"get"}}
    assert doc["paths"]["/stop"]["post"]["security"] == [{"bearer": []}]
    # the routes described by hand are served (the report answers 409 until a run ended)
    for path in ("/status", "/events", "/report", "/", "/dashboard/snapshot"):
        try:
            svc._call("GET", path)
        except ApiError as e:
            assert e.status == 409, (path, e)
    # the client's arm sends exactly the fields the document describes
    arm = doc["components"]["schemas"]["ArmRequest"]
    import inspect
    params = set(inspect.signature(Service.arm).parameters) - {"self"}
    assert params == set(arm["properties"]), (params, set(arm["properties"]))
    assert set(arm["required"]) == {"frames_per_trigger", "prefix"}
    states = doc["components"]["schemas"]["State"]["enum"]
    assert set(states) == {"idle", "armed", "acquiring", "error"}


def test_sigterm_ends_the_service_and_its_dataset_as_a_cancel_does(service):
    """systemd stops a unit with SIGTERM: the dataset under way is closed as cancelled, its
    master readable with the frames written, and the service exits 0."""
    import time
    svc, root, procs = service
    svc.arm(frames_per_trigger=400, period_s=0.02, directory="t", prefix="term", process=False)
    svc.trigger()
    while svc.acquisition()["dataset"]["frames_written"] < 5:
        time.sleep(0.05)
    mgr = procs[-1]
    mgr.send_signal(signal.SIGTERM)
    assert mgr.wait(timeout=60) == 0, mgr.stderr.read()
    with h5py.File(root / "t" / "term_master.h5", "r") as f:
        numbers = f["entry/data/frame_number"][:].tolist()
        assert f["entry/data/data"].shape[0] == len(numbers) and 5 <= len(numbers) < 400


def test_sigterm_ends_a_receiver_daemon_with_its_files_closed(service):
    """A receiver daemon told to end (SIGTERM) mid-dataset stops its acquisition as
    `POST /stop` does: it exits 0, its files are closed (no writer flag, no leftover)."""
    import time
    svc, root, procs = service
    svc.arm(frames_per_trigger=400, period_s=0.02, directory="t", prefix="term", process=False)
    svc.trigger()
    while svc.acquisition()["dataset"]["frames_written"] < 5:
        time.sleep(0.05)
    dr0 = procs[1]
    dr0.send_signal(signal.SIGTERM)
    assert dr0.wait(timeout=60) == 0, dr0.stderr.read()
    files = sorted(p.name for p in (root / "t").iterdir() if "dr0" in p.name)
    assert files == ["term_dr0_data_000001.h5", "term_dr0_master.h5"], files
    with h5py.File(root / "t" / "term_dr0_master.h5", "r") as f:
        assert f["entry/data/data"].shape[0] == f["entry/data/frame_number"].shape[0] > 0
    svc.cancel()
    svc.wait(("idle", "error"))


def test_a_cancel_at_once_and_a_dropped_arm_leave_a_clean_service(service):
    """A cancel right after the trigger ends the dataset `cancelled` (with what was written,
    perhaps nothing: then it has no master), never in error; an arm dropped before its
    trigger leaves no directory."""
    svc, root, _ = service
    for k in range(5):
        svc.arm(frames_per_trigger=400, period_s=0.02, directory=f"now{k}", prefix="now", process=False)
        svc.trigger()
        svc.cancel()
        a = svc.wait(("idle", "error"))
        d = a["dataset"]
        assert a["state"] == "idle" and a["error"] is None and d["cancelled"], a
        if d["frames_written"] > 0:
            with h5py.File(d["master"], "r") as f:
                assert f["entry/data/data"].shape[0] == d["frames_written"]
        else:
            assert not os.path.exists(d["master"]), "no frame, no master"
    svc.arm(frames_per_trigger=4, directory="dropped/deeper", prefix="x", process=False)
    svc.disarm()
    assert not (root / "dropped").exists()
    assert svc.acquisition()["state"] == "idle"


def test_the_service_outlives_its_only_receiver(rdaq, tmp_path):
    """The only receiver daemon dies mid-dataset (kill -9): the service stays up, stops the
    detector, and the dataset ends in `error` saying which receiver went away; the frames
    the receiver had written are recovered into the dataset's master, and its report says
    so and counts every frame asked for that the receiver never confirmed as lost."""
    import pathlib
    import time
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "scripts"))
    import soak_service
    system = soak_service.System(str(rdaq), tmp_path)
    try:
        svc = Service(system.url)
        svc.arm(frames_per_trigger=1000, period_s=0.02, directory="d", prefix="gone", process=False)
        svc.trigger()
        # past the writer's first flush (every second): what a crash leaves is readable
        while svc.acquisition()["dataset"]["frames_written"] < 100:
            time.sleep(0.05)
        system.procs["receiver"].kill()
        a = svc.wait(("idle", "error"))
        assert a["state"] == "error" and "dr0" in a["error"] and "no receiver is left" in a["error"], a
        assert system.procs["manager"].poll() is None, "the service is still up"
        assert svc.acquisition()["state"] == "error"
        d = a["dataset"]
        recovered = d["summary"]["receivers"]["dr0"]["recovered"]["frames"]
        assert recovered >= 1 and d["frames_lost"] == 1000 - d["summary"]["frames_complete"], d
        assert d["summary"]["master"] == d["master"] and pathlib.Path(d["master"].replace("_master.h5", "_report.json")).exists()
        with h5py.File(d["master"], "r") as f:
            assert f["entry/data/data"].shape[0] == recovered
    finally:
        system.close()
    assert system.procs["manager"].returncode == 0


def test_each_dataset_counts_its_own_dropped_datagrams(rdaq, tmp_path):
    """The receivers' drop counters run on from dataset to dataset; a dataset's `live`
    counts only what it dropped: 50 stray datagrams during the first dataset, none during
    the second."""
    import pathlib
    import socket
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "scripts"))
    import soak_service
    port = free_udp_port()
    system = soak_service.System(str(rdaq), tmp_path, modules=1, data_port=port)
    try:
        svc = Service(system.url)
        dropped = []
        for k, strays in enumerate((50, 0)):
            svc.arm(frames_per_trigger=20, period_s=0.05, prefix=f"d{k}", process=False)
            svc.trigger()
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                for _ in range(strays):
                    s.sendto(b"not a datagram", ("127.0.0.1", port))
            dropped.append(svc.wait("idle")["live"]["datagrams_dropped"])
        assert dropped == [50, 0], dropped
    finally:
        system.close()


def test_between_triggers_the_service_says_what_it_waits_for(service):
    """A trigger while one is under way is refused saying so (not "arm first"), and waiting
    for `idle` between two triggers fails at once, where it could only time out."""
    svc, root, _ = service
    svc.arm(frames_per_trigger=30, triggers=2, period_s=0.02, prefix="two", process=False)
    svc.trigger()
    with pytest.raises(ApiError) as e:
        svc.trigger()
    assert e.value.status == 409 and "trigger 1 of dataset" in e.value.message and "under way" in e.value.message, e.value
    assert svc.wait("armed")["dataset"]["triggers_done"] == 1
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="trigger 2 of 2"):
        svc.wait("idle", timeout=30)
    assert time.monotonic() - started < 5
    svc.trigger()
    assert svc.wait("idle")["dataset"]["triggers_done"] == 2
    (root / "two_master.h5").unlink()
    (root / "two_report.json").touch()
    with pytest.raises(ApiError) as e:
        svc.arm(frames_per_trigger=1, prefix="two", process=False)
    assert e.value.status == 409 and "never overwrites" in e.value.message and "--overwrite" not in e.value.message, e.value


def test_the_arm_times_are_the_files_times(service):
    """The arm's period and exposure are the master's frame_time and count_time (they
    were 0 in every master the manager's service wrote); an exposure longer than the period
    is refused naming count_time_s."""
    svc, root, _ = service
    svc.arm(frames_per_trigger=4, period_s=0.01, count_time_s=0.004, prefix="timed", process=False)
    svc.trigger()
    master = svc.wait("idle")["dataset"]["master"]
    with h5py.File(master, "r") as f:
        det = f["entry/instrument/detector"]
        assert (det["frame_time"][()], det["count_time"][()]) == (0.01, 0.004)
    with pytest.raises(ApiError) as e:
        svc.arm(frames_per_trigger=4, period_s=0.01, count_time_s=0.02, prefix="too_long")
    assert e.value.status == 400 and "count_time_s" in e.value.message, e.value


def test_the_arm_metadata_is_in_the_master(service):
    """The sample's name, the photon energy, the detector's distance and the beam centre
    of an arm are in the dataset's master (NXmx, read with h5py), and out-of-range values
    are refused naming the field."""
    svc, root, _ = service
    svc.arm(frames_per_trigger=3, prefix="meta", process=False, sample_name="lysozyme 7", photon_energy_kev=9.5,
            detector_distance_m=0.155, beam_center_x=1021.5, beam_center_y=-12.0)
    svc.trigger()
    master = svc.wait("idle")["dataset"]["master"]
    with h5py.File(master, "r") as f:
        det = f["entry/instrument/detector"]
        assert f["entry/sample/name"][()].decode() == "lysozyme 7"
        assert abs(f["entry/instrument/beam/incident_wavelength"][()] - 12.398419843320026 / 9.5) < 1e-9
        assert det["distance"][()] == 0.155
        assert (det["beam_center_x"][()], det["beam_center_y"][()]) == (1021.5, -12.0)
    for field, value in [("photon_energy_kev", 500.0), ("detector_distance_m", 0.0), ("beam_center_x", float("inf")), ("sample_name", "a\nb")]:
        with pytest.raises(ApiError) as e:
            svc._call("POST", "/arm", {"frames_per_trigger": 1, "prefix": "bad", field: value if value != float("inf") else 1e300})
        assert e.value.status == 400 and field in e.value.message, e.value
