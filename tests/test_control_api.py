"""Bad topologies and bad control requests get clear errors and change nothing."""
import json
import re
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import free_port


def scrape(url):
    """`/metrics` parsed by prometheus_client's OpenMetrics parser: {(name, labels): value}."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
    with urllib.request.urlopen(url + "/metrics") as r:
        assert r.headers["content-type"].startswith("application/openmetrics-text")
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def call(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        try:
            return e.code, json.loads(text)
        except json.JSONDecodeError:
            return e.code, {"error": text}


@pytest.fixture
def daemons(rdaq, tmp_path):
    ports = {"det": free_port(), "dr0": free_port()}
    procs = [
        subprocess.Popen([str(rdaq), "emulate", "--serve", f"127.0.0.1:{ports['det']}", "--modules", "2"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen([str(rdaq), "receive", "--serve", f"127.0.0.1:{ports['dr0']}", "--name", "dr0",
                          "--memory-mib", "64", "--out-dir", str(tmp_path), "--stream", f"tcp://127.0.0.1:{free_port()}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]
    urls = {k: f"http://127.0.0.1:{p}" for k, p in ports.items()}
    deadline = time.monotonic() + 20
    for url in urls.values():
        while True:
            try:
                urllib.request.urlopen(url + "/telegram", timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline, f"{url} did not come up"
                time.sleep(0.1)
    yield urls
    for p in procs:
        p.kill()
        p.wait()


def request(**kw):
    r = {"version": 1, "modules": [0, 1], "module_bytes": 1048576, "payload_bytes": 8192, "slots": 4, "data_port": 0}
    r.update(kw)
    return r


def test_receiver_api_refuses_bad_requests_and_is_idempotent(daemons, tmp_path):
    dr = daemons["dr0"]
    assert call("POST", dr + "/start", {})[0] == 409, "no buffers yet"
    assert call("POST", dr + "/stop", {})[0] == 409, "nothing to stop"
    code, body = call("PUT", dr + "/buffers", request(slots=100))
    assert code == 400 and "slots" in body["error"], body
    code, body = call("PUT", dr + "/buffers", request(module_bytes=1000))
    assert code == 400 and "module_bytes" in body["error"], body
    assert call("PUT", dr + "/buffers", {"modules": "x"})[0] in (400, 422)
    assert call("GET", dr + "/status")[1]["state"] == "idle", "refused requests changed nothing"
    code, first = call("PUT", dr + "/buffers", request())
    assert code == 200 and len(first["buffers"]) == 4
    code, again = call("PUT", dr + "/buffers", request())
    assert again == first, "the same request keeps the same buffers, keys and ports"
    code, body = call("PUT", dr + "/buffers", request(payload_bytes=0))
    assert code == 400 and "payload_bytes" in body["error"], body
    status = call("GET", dr + "/status")[1]
    assert status["state"] == "configured" and status["request"]["payload_bytes"] == 8192, "a refused request keeps the buffers in place"
    assert call("PUT", dr + "/buffers", request())[1] == first, "the same buffers, keys and ports still"
    # a port another program holds: the bind fails, and the buffers in place stay, untouched
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        code, body = call("PUT", dr + "/buffers", request(data_port=taken.getsockname()[1], slots=3))
        assert code == 400, body
    assert call("GET", dr + "/status")[1]["request"]["slots"] == 4, "the old buffers are still configured"
    assert call("PUT", dr + "/buffers", request())[1] == first, "with the same keys and ports"
    # a request that wants the old buffers' port and one another program holds: the old
    # buffers go for the first, the second fails, and the old request is set up again (new keys)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        try:
            taken.bind(("127.0.0.1", first["data_ports"][0] + 1))
        except OSError:
            taken = None
        if taken is not None:
            code, body = call("PUT", dr + "/buffers", request(data_port=first["data_ports"][0], slots=3))
            assert code == 400 and "upload the DTPs again" in body["error"], body
            status = call("GET", dr + "/status")[1]
            assert status["state"] == "configured" and status["request"]["slots"] == 4, status
    code, first = call("PUT", dr + "/buffers", request())
    # the old buffers' own ports are given up for a request that needs them
    code, moved = call("PUT", dr + "/buffers", request(data_port=first["data_ports"][0], slots=3))
    assert code == 200 and moved["data_ports"][0] == first["data_ports"][0], moved
    code, first = call("PUT", dr + "/buffers", request())
    assert code == 200
    code, body = call("POST", dr + "/start", {"output": "../escape.h5"})
    assert code == 400 and "output" in body["error"]
    code, body = call("POST", dr + "/start", {"gap_y": 1000000})
    assert code == 400 and "gap_y" in body["error"], body
    code, body = call("POST", dr + "/start", {"detector": {"modules": 1, "module_cols": 1}})
    assert code == 400 and "detector.modules" in body["error"], "modules 0 and 1 are not part of a 1-module detector"
    code, body = call("POST", dr + "/start", {"detector": {"modules": 4, "module_cols": 3}})
    assert code == 400 and "detector.module_cols" in body["error"], body
    code, body = call("POST", dr + "/start", {"config": {"process": {"workers": 10 ** 9}}})
    assert code == 400 and "process.workers" in body["error"], body
    assert call("GET", dr + "/status")[1]["state"] == "configured", "answers at once, and nothing started"
    code, body = call("POST", dr + "/start", {"output": "run.h5\nforged log line"})
    assert code == 400 and "output" in body["error"], "a control character in a name is refused"
    code, body = call("PUT", dr + "/buffers", dict(request(), colour="red"))
    assert code in (400, 422) and "colour" in str(body), "unknown fields are refused"
    # a start refused for its stream (the port is taken) makes no file: the retry starts
    import socket
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        code, body = call("POST", dr + "/start", {"output": "ok.h5", "directory": "sub", "stream": f"tcp://127.0.0.1:{held.getsockname()[1]}"})
        assert code == 409 and body["error"].startswith("stream"), body
    assert not (tmp_path / "sub").exists() and not (tmp_path / "ok.h5").exists(), "the refused start left nothing"
    assert call("POST", dr + "/start", {"output": "ok.h5"})[0] == 200
    assert call("POST", dr + "/start", {})[0] == 409, "started twice"
    code, body = call("PUT", dr + "/buffers", request(slots=3))
    assert code == 409, "no reconfiguration mid-run"
    code, stop = call("POST", dr + "/stop", {})
    assert code == 200 and stop["frames_complete"] == 0
    assert stop["output"] is None and not (tmp_path / "ok.h5").exists(), "an acquisition that saved nothing keeps no file"
    # an existing output is refused, and kept, unless the start asks to overwrite it
    (tmp_path / "precious.h5").write_bytes(b"data")
    code, body = call("POST", dr + "/start", {"output": "precious.h5"})
    assert code == 409 and "precious.h5 exists" in body["error"], body
    assert (tmp_path / "precious.h5").read_bytes() == b"data"
    assert call("POST", dr + "/start", {"output": "precious.h5", "overwrite": True})[0] == 200
    assert call("POST", dr + "/stop", {})[0] == 200
    assert call("GET", dr + "/status")[1]["state"] == "configured"
    # a directory under the output directory: made; nothing a client names escapes it
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (tmp_path / "escape").symlink_to(outside)
    for d in ["../x", "/tmp/x", "a/../../x", "escape/x", "escape"]:
        code, body = call("POST", dr + "/start", {"output": "d.h5", "directory": d})
        assert code == 400 and body["error"].startswith("directory"), (d, body)
    assert list(outside.iterdir()) == [], "nothing was made through the link"
    assert call("POST", dr + "/start", {"directory": "a"})[0] == 400, "a directory needs an output"
    assert call("GET", dr + "/status")[1]["state"] == "configured", "refused starts started nothing"
    assert call("POST", dr + "/start", {"output": "d.h5", "directory": "run1/scan2"})[0] == 200
    assert (tmp_path / "run1" / "scan2").is_dir()
    assert call("POST", dr + "/stop", {})[0] == 200
    # an acquisition publishes a stream; its counts reach /status, /metrics and the answer
    assert call("POST", dr + "/start", {})[0] == 200
    assert call("GET", dr + "/status")[1]["stream"] == {"images_sent": 0, "images_dropped": 0, "waits": 0, "consumers": 0, "images_encoded": 0}
    assert scrape(dr)[("rdaq_stream_images_dropped_total", (("receiver", "dr0"),))] == 0
    code, stopped = call("POST", dr + "/stop", {})
    assert code == 200 and stopped["stream"]["endpoint"].startswith("tcp://127.0.0.1:") and stopped["stream"]["images_sent"] == 0
    m = scrape(dr)
    assert m[("rdaq_dropped_total", (("reason", "bad_key"), ("receiver", "dr0")))] == 0
    assert all(("rdaq_" + k + "_total", (("receiver", "dr0"),)) in m for k in ("landed_in_place", "copied", "evacuated"))
    assert m[("rdaq_ring_slots", (("receiver", "dr0"),))] == 4 and m[("rdaq_ring_slots_handed", (("receiver", "dr0"),))] == 0
    assert m[("rdaq_consumer_buffer_waits_total", (("receiver", "dr0"),))] == 0, "no frames, so no wait for a buffer"
    assert m[("rdaq_writer_chunks_handed_on_total", (("receiver", "dr0"),))] == 0 and ("rdaq_writer_io_waits_total", (("receiver", "dr0"),)) in m
    # every series the shipped Grafana dashboard asks for is one the receiver exports
    import pathlib
    import re
    dashboard = (pathlib.Path(__file__).parent.parent / "docs" / "grafana-dashboard.json").read_text()
    wanted = set(re.findall(r"rdaq_[a-z_]+", dashboard))
    exported = {name for name, _ in m}
    assert wanted and wanted <= exported, wanted - exported


def test_detector_api_refuses_bad_requests(daemons):
    det = daemons["det"]
    assert call("POST", det + "/start", {"frames": 1})[0] == 409, "no DTPs yet"
    code, body = call("PUT", det + "/dtp", {"dtps": []})
    assert code == 400 and "dtps" in body["error"]
    route = {"receiver": "dr0", "data": "127.0.0.1:9", "buffers": [{"id": 1, "key": 1, "size": 2 * 1048576}], "offset": 0}
    good = {"version": 1, "module": 0, "module_bytes": 1048576, "payload_bytes": 8192, "broadcast": False, "routes": [route]}
    for bad_field, why in [({"payload_bytes": 0}, "payload_bytes 0"), ({"module_bytes": 0}, "module"), ({"routes": []}, "no route"),
                           ({"module": 7}, "module 7")]:
        dtps = [dict(good, **bad_field), dict(good, module=1)]
        code, body = call("PUT", det + "/dtp", {"dtps": dtps})
        assert code == 400 and why in body["error"], (bad_field, body)
    assert call("POST", det + "/start", {"frames": 1})[0] == 409, "the refused DTPs were not kept"
    assert call("POST", det + "/stop", {})[0] == 409
    assert call("PUT", det + "/dtp", {"dtps": [good, dict(good, module=1)]})[0] == 200
    code, body = call("POST", det + "/start", {"frames": 2, "first_frame": 2**64 - 1})
    assert code == 400 and "first_frame" in body["error"] and "2^64" in body["error"], "a run past 2^64 would never end"
    for rate in (1e-300, -1.0, 1e300):
        code, body = call("POST", det + "/start", {"frames": 2, "rate_hz": rate})
        assert code == 400 and "rate_hz" in body["error"] and "1000000" in body["error"], (rate, body)
    assert call("GET", det + "/status")[1]["state"] != "running"


def test_manage_refuses_bad_topologies_before_touching_anything(rdaq, daemons, tmp_path):
    det, dr = daemons["det"], daemons["dr0"]
    base = (f'[detector]\nmodules = 2\ncontrol = "{det[7:]}"\n'
            f'[[receivers]]\nname = "dr0"\ncontrol = "{dr[7:]}"\ndata = "127.0.0.1"\ndata_port = 0\nmemory_mib = 64\n')
    cases = {
        "transfer.receivers": base + '[transfer]\nreceivers = ["dr9"]\n',
        "memory_mib": base.replace("memory_mib = 64", "memory_mib = 2"),
        "module_cols": base.replace("modules = 2", "modules = 2\nmodule_cols = 3"),
        "detector.modules": base.replace("modules = 2", "modules = 4"),
        "answers as": base.replace('name = "dr0"', 'name = "drX"'),
    }
    for needle, text in cases.items():
        topo = tmp_path / "t.toml"
        topo.write_text(text)
        r = subprocess.run([str(rdaq), "manage", "--topology", str(topo), "--frames", "2", "--out", str(tmp_path / "o")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (needle, r.stderr)
        assert needle in r.stderr, (needle, r.stderr)
        assert call("GET", dr + "/status")[1]["state"] == "idle", needle


def one_receiver_topology(tmp_path, daemons, extra=""):
    """A topology of the fixture's detector daemon (2 modules) and receiver dr0; `extra`
    adds to dr0's entry."""
    det, dr = daemons["det"], daemons["dr0"]
    topo = tmp_path / "t.toml"
    topo.write_text(f'[detector]\nmodules = 2\ncontrol = "{det[7:]}"\n'
                    f'[[receivers]]\nname = "dr0"\ncontrol = "{dr[7:]}"\ndata = "127.0.0.1"\ndata_port = 0\nmemory_mib = 64\n{extra}')
    return topo


def assert_documents(url, paths):
    """`url` serves a valid OpenAPI document that lists `paths`, each call that changes
    something behind the bearer token."""
    from openapi_spec_validator import validate
    code, doc = call("GET", url + "/openapi.json")
    assert code == 200, doc
    validate(doc)
    assert set(paths) <= set(doc["paths"]), sorted(doc["paths"])
    for item in doc["paths"].values():
        for method in ("post", "put"):
            if method in item:
                assert item[method]["security"] == [{"bearer": []}], item


def test_the_daemons_serve_their_openapi_documents(daemons):
    """The receiver and detector daemons each serve a valid OpenAPI document of their routes."""
    assert_documents(daemons["dr0"], ["/telegram", "/buffers", "/start", "/stop", "/status", "/metrics", "/events", "/dashboard/snapshot"])
    assert_documents(daemons["det"], ["/telegram", "/dtp", "/start", "/stop", "/status", "/manifest", "/events"])


def test_manager_api_shows_events_and_the_report(rdaq, daemons, tmp_path):
    import signal
    dr = daemons["dr0"]
    topo = one_receiver_topology(tmp_path, daemons)
    port = free_port()
    mgr = subprocess.Popen([str(rdaq), "manage", "--topology", str(topo), "--frames", "20", "--rate", "50",
                            "--out", str(tmp_path / "o"), "--serve", f"127.0.0.1:{port}"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert mgr.poll() is None and time.monotonic() < deadline, "manager ended or hung"
            try:
                if call("GET", url + "/status")[1]["state"] == "done":
                    break
            except OSError:
                pass
            time.sleep(0.2)
        code, report = call("GET", url + "/report")
        assert code == 200 and report["frames_complete"] == 20 and report["frames_lost"] == []
        assert_documents(url, ["/status", "/events", "/report", "/stop", "/dashboard/snapshot"])
        code, page = call("GET", url + "/events?since=0&limit=100000")
        kinds = [e["type"] for e in page["events"]]
        assert kinds.count("frame_complete") == 20
        assert kinds.count("end_of_frame") == 40 and kinds.count("end_of_transfer") == 2
        # the receiver's per-frame latency, step by step, as a Prometheus summary
        m = scrape(dr)
        step = (("receiver", "dr0"), ("step", "received_to_complete"))
        assert m[("rdaq_frame_latency_seconds_count", step)] == 20, m
        assert m[("rdaq_frame_latency_seconds_bucket", (("le", "+Inf"),) + step)] == 20
        assert m[("rdaq_frame_latency_seconds_sum", step)] > 0
        assert m[("rdaq_frames_complete_total", (("receiver", "dr0"),))] == 20
        mgr.send_signal(signal.SIGINT)
        assert mgr.wait(timeout=20) == 0
        # a second run into the same directory would replace the report: refused before anything starts
        r = subprocess.run([str(rdaq), "manage", "--topology", str(topo), "--frames", "2", "--out", str(tmp_path / "o")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "report.json exists" in r.stderr, r.stderr
        assert call("GET", dr + "/status")[1]["state"] != "acquiring"
    finally:
        if mgr.poll() is None:
            mgr.kill()


def test_a_managed_receiver_streams_on_a_free_port_when_its_default_is_taken(rdaq, daemons, tmp_path):
    """Another acquisition on this host holds the first receiver's default stream port: the
    managed acquisition still runs, its receiver streams on a free port, and the manager says
    which."""
    import socket
    dr = daemons["dr0"]
    topo = one_receiver_topology(tmp_path, daemons)
    held = socket.socket()
    try:
        try:
            held.bind(("127.0.0.1", 31001))
            held.listen()
        except OSError:
            pass  # another acquisition holds it already: the same case
        r = subprocess.run([str(rdaq), "manage", "--topology", str(topo), "--frames", "5", "--rate", "50", "--out", str(tmp_path / "o")],
                           capture_output=True, text=True, timeout=120)
    finally:
        held.close()
    assert r.returncode == 0, r.stderr
    moved = re.findall(r"streaming on a free port.*? receiver=dr0 stream=(tcp://127\.0\.0\.1:\d+) default=tcp://127\.0\.0\.1:31001", r.stderr)
    assert moved and moved[0] != "tcp://127.0.0.1:31001", r.stderr


def test_sigterm_ends_one_managed_acquisition_with_its_report_and_files(rdaq, daemons, tmp_path):
    """`rdaq manage` of one acquisition told to end (SIGTERM, as Ctrl-C): the detector is
    stopped, the receivers' files closed, the report written; it exits by itself."""
    import signal
    import h5py
    dr = daemons["dr0"]
    topo = one_receiver_topology(tmp_path, daemons, 'stream = "none"\n')
    port = free_port()
    mgr = subprocess.Popen([str(rdaq), "manage", "--topology", str(topo), "--frames", "2000", "--rate", "20",
                            "--out", str(tmp_path / "o"), "--serve", f"127.0.0.1:{port}"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert mgr.poll() is None and time.monotonic() < deadline, "manager ended or hung"
            try:
                if call("GET", dr + "/status")[1]["state"] == "acquiring" and call("GET", f"http://127.0.0.1:{port}/status")[1]["state"] == "running":
                    break
            except OSError:
                pass
            time.sleep(0.1)
        time.sleep(0.5)
        mgr.send_signal(signal.SIGTERM)
        out, err = mgr.communicate(timeout=60)
    finally:
        if mgr.poll() is None:
            mgr.kill()
    assert mgr.returncode in (0, 1), err
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert 0 < report["frames_complete"] < 2000, report
    with h5py.File(report["receivers"]["dr0"]["output"], "r") as f:
        assert f["entry/data/data"].shape[0] == report["receivers"]["dr0"]["frames_written"] > 0
    assert call("GET", dr + "/status")[1]["state"] != "acquiring"
