"""Access control of the control APIs: every mutating endpoint of every daemon, without a
token, with a wrong one and with the right one; refusals change nothing and are counted; the
manager carries the token; reads can be protected too."""
import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import free_port

TOKEN = "0f3c8e2a9b7d41c6a5e0f9d8c7b6a594"


def call(method, url, body=None, token=None):
    data = None if body is None else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null"), r.headers
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        try:
            body = json.loads(text)
        except json.JSONDecodeError:
            body = {"error": text}
        return e.code, body, e.headers


def wait_up(url, token=None):
    deadline = time.monotonic() + 20
    while True:
        try:
            if call("GET", url + "/telegram", token=token)[0] == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{url} did not come up"
        time.sleep(0.1)


@pytest.fixture
def secured(rdaq, tmp_path):
    """A detector daemon and a receiver daemon that need TOKEN for changes."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    ports = {"det": free_port(), "dr0": free_port()}
    logs = {k: open(tmp_path / f"{k}.log", "w") for k in ports}
    procs = [
        subprocess.Popen([str(rdaq), "emulate", "--serve", str(ports["det"]), "--modules", "2", "--token-file", str(token_file)],
                         stdout=subprocess.DEVNULL, stderr=logs["det"]),
        subprocess.Popen([str(rdaq), "receive", "--serve", str(ports["dr0"]), "--name", "dr0", "--memory-mib", "64",
                          "--out-dir", str(tmp_path), "--stream", "none", "--token-file", str(token_file), "--log-format", "json"],
                         stdout=subprocess.DEVNULL, stderr=logs["dr0"]),
    ]
    urls = {k: f"http://127.0.0.1:{p}" for k, p in ports.items()}
    for u in urls.values():
        wait_up(u)
    yield urls, token_file
    for p in procs:
        p.kill()
        p.wait()
    for f in logs.values():
        f.close()


def buffer_request():
    return {"version": 1, "modules": [0, 1], "module_bytes": 1048576, "payload_bytes": 8192, "slots": 4, "data_port": 0}


MUTATING = [
    ("dr0", "PUT", "/buffers", buffer_request()),
    ("dr0", "POST", "/start", {}),
    ("dr0", "POST", "/stop", {}),
    ("det", "PUT", "/dtp", {"dtps": []}),
    ("det", "POST", "/start", {"frames": 1}),
    ("det", "POST", "/stop", {}),
]


def test_every_mutating_endpoint_needs_the_token(secured, tmp_path):
    urls, _ = secured
    for n, (who, method, path, body) in enumerate(MUTATING):
        url = urls[who] + path
        code, answer, headers = call(method, url, body)
        assert code == 401 and "token" in answer["error"], (url, code, answer)
        assert headers["www-authenticate"] == 'Bearer realm="rdaq"'
        code, answer, _ = call(method, url, body, token=TOKEN[:-1] + "0")
        assert code == 403 and answer["error"] == "wrong API token", (url, code, answer)
        # nothing changed: the receiver has no buffers, the detector no DTPs
        assert call("GET", urls["dr0"] + "/status")[1]["state"] == "idle"
        assert call("GET", urls["det"] + "/status")[1]["dtps"] is False
    # reads stay open; refusals are counted per daemon, and logged with the caller
    assert call("GET", urls["dr0"] + "/status")[1]["api_refused"] == 6
    assert call("GET", urls["det"] + "/status")[1]["api_refused"] == 6
    from test_control_api import scrape
    assert scrape(urls["dr0"])[("rdaq_api_refused_total", (("receiver", "dr0"),))] == 6
    log = (tmp_path / "dr0.log").read_text()
    assert "refused PUT /buffers from 127.0.0.1:" in log and "wrong API token" in log, log
    assert TOKEN not in log, "the token is never printed"
    refusals = [json.loads(line) for line in log.splitlines() if "refused" in line]
    assert len(refusals) == 6 and all(r["level"] == "WARN" and r["fields"]["peer"].startswith("127.0.0.1:") for r in refusals), refusals
    # with the token each call reaches its handler (which judges the request itself)
    answers = {(who, method, path): call(method, urls[who] + path, body, token=TOKEN)[0] for who, method, path, body in MUTATING}
    assert answers == {
        ("dr0", "PUT", "/buffers"): 200,
        ("dr0", "POST", "/start"): 200,
        ("dr0", "POST", "/stop"): 200,
        ("det", "PUT", "/dtp"): 400,  # an empty DTP list is a bad request, not a refusal
        ("det", "POST", "/start"): 409,
        ("det", "POST", "/stop"): 409,
    }, answers


def test_the_manager_carries_the_token_and_runs(rdaq, secured, tmp_path):
    urls, token_file = secured
    topo = tmp_path / "t.toml"
    topo.write_text(f'[detector]\nmodules = 2\ncontrol = "{urls["det"][7:]}"\n'
                    f'[[receivers]]\nname = "dr0"\ncontrol = "{urls["dr0"][7:]}"\ndata = "127.0.0.1"\ndata_port = 0\nmemory_mib = 64\n')
    r = subprocess.run([str(rdaq), "manage", "--topology", str(topo), "--frames", "2", "--out", str(tmp_path / "a")],
                       capture_output=True, text=True, timeout=60, env={k: v for k, v in os.environ.items() if k != "RDAQ_TOKEN"})
    assert r.returncode == 2 and "401" in r.stderr, r.stderr
    env = dict(os.environ, RDAQ_TOKEN=TOKEN)
    r = subprocess.run([str(rdaq), "manage", "--topology", str(topo), "--frames", "10", "--rate", "100", "--out", str(tmp_path / "b")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((tmp_path / "b" / "report.json").read_text())["frames_complete"] == 10
    # the receiver daemon logs (JSON here) one summary line per acquisition
    logs = [json.loads(line) for line in (tmp_path / "dr0.log").read_text().splitlines()]
    done = [e["fields"] for e in logs if e["fields"].get("message") == "acquisition finished"]
    assert done and done[0]["frames_complete"] == 10 and done[0]["frames_written"] == 10 and done[0]["receiver"] == "dr0", done
    r = subprocess.run([str(rdaq), "manage", "--topology", str(topo), "--frames", "2", "--out", str(tmp_path / "c"),
                        "--overwrite", "--token-file", str(token_file)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_protected_reads_short_tokens_and_open_listeners(rdaq, tmp_path):
    short = tmp_path / "short"
    short.write_text("secret\n")
    r = subprocess.run([str(rdaq), "receive", "--serve", str(free_port()), "--token-file", str(short)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--token-file" in r.stderr and "at least 16" in r.stderr, r.stderr
    r = subprocess.run([str(rdaq), "emulate", "--serve", str(free_port()), "--protect-reads"],
                       capture_output=True, text=True, timeout=30, env={k: v for k, v in os.environ.items() if k != "RDAQ_TOKEN"})
    assert r.returncode == 2 and "--protect-reads needs a token" in r.stderr, r.stderr
    # a token variable set blank does not leave the API open
    r = subprocess.run([str(rdaq), "receive", "--serve", str(free_port())], capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, RDAQ_TOKEN="  "))
    assert r.returncode == 2 and "RDAQ_TOKEN is set but blank" in r.stderr, r.stderr

    port = free_port()
    p = subprocess.Popen([str(rdaq), "emulate", "--serve", f"127.0.0.1:{port}", "--protect-reads"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ, RDAQ_TOKEN=TOKEN))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_up(url, token=TOKEN)
        for path in ("/telegram", "/status", "/events"):
            assert call("GET", url + path)[0] == 401, path
            assert call("GET", url + path, token="x" * 32)[0] == 403, path
            assert call("GET", url + path, token=TOKEN)[0] == 200, path
    finally:
        p.kill()
        p.communicate()

    # an open daemon on all addresses says so
    p = subprocess.Popen([str(rdaq), "emulate", "--serve", f"0.0.0.0:{free_port()}"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env={k: v for k, v in os.environ.items() if k != "RDAQ_TOKEN"})
    try:
        line = ""
        deadline = time.monotonic() + 20
        while "WARN" not in line and time.monotonic() < deadline:
            line = p.stderr.readline()
        assert "without a token: anyone on the network can reconfigure or stop this daemon" in line, line
    finally:
        p.kill()
        p.communicate()


@pytest.fixture
def open_daemons(rdaq, tmp_path):
    """A detector daemon and a receiver daemon without a token, as the README starts them."""
    ports = {"det": free_port(), "dr0": free_port()}
    procs = [
        subprocess.Popen([str(rdaq), "emulate", "--serve", str(ports["det"]), "--modules", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen([str(rdaq), "receive", "--serve", str(ports["dr0"]), "--name", "dr0", "--memory-mib", "64", "--out-dir", str(tmp_path),
                          "--stream", "none", "--allow-host", "rx.beamline.example"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]
    urls = {k: f"http://127.0.0.1:{p}" for k, p in ports.items()}
    for u in urls.values():
        wait_up(u)
    yield urls
    for p in procs:
        p.kill()
        p.wait()


def raw(method, url, body=b"", headers=()):
    """A call with exactly these headers (urllib adds Host and, with a body, its length)."""
    req = urllib.request.Request(url, data=body or None, method=method, headers=dict(headers))
    if body:
        req.add_header("Content-Type", dict(headers).get("Content-Type", "text/plain"))
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("content-type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type"), e.read()


def test_a_foreign_web_page_cannot_stop_or_read_an_open_daemon(open_daemons):
    urls = open_daemons
    assert call("PUT", urls["dr0"] + "/buffers", buffer_request())[0] == 200
    evil = ("Origin", "http://evil.example")
    for who, method, path in [("dr0", "POST", "/stop"), ("dr0", "POST", "/start"), ("det", "POST", "/stop"), ("dr0", "PUT", "/buffers")]:
        # a cross-site "simple" request: text/plain from another origin
        code, ctype, body = raw(method, urls[who] + path, b"{}", [evil, ("Content-Type", "text/plain")])
        assert code == 403 and ctype == "application/json" and "origin" in json.loads(body)["error"], (who, path, code, body)
        # no Origin (a script) but not JSON: refused too
        code, _, body = raw(method, urls[who] + path, b"{}", [("Content-Type", "text/plain")])
        assert code == 415 and "application/json" in json.loads(body)["error"], (who, path, code, body)
    assert call("GET", urls["dr0"] + "/status")[1]["state"] == "configured", "the buffers stayed"
    # DNS rebinding: a page of evil.example whose name now resolves to this host
    for who in urls:
        code, _, body = raw("GET", urls[who] + "/status", headers=[("Host", "evil.example:1234")])
        assert code == 421 and "Host" in json.loads(body)["error"], (who, code, body)
    assert raw("GET", urls["dr0"] + "/status", headers=[("Host", "rx.beamline.example:7001")])[0] == 200, "--allow-host"
    assert raw("GET", urls["dr0"] + "/status", headers=[("Host", "localhost")])[0] == 200
    # the daemon's own page (same origin, JSON) and a script's POST without a body still work
    port = urls["dr0"].rsplit(":", 1)[1]
    code, _, _ = raw("POST", urls["dr0"] + "/stop", b"{}", [("Origin", f"http://127.0.0.1:{port}"), ("Content-Type", "application/json")])
    assert code in (200, 409), code
    assert call("GET", urls["dr0"] + "/status")[1]["api_refused"] == 7


def test_every_error_answer_is_json(open_daemons):
    url = open_daemons["dr0"]
    json_body = [("Content-Type", "application/json")]
    cases = [
        ("PUT", "/buffers", b"{not json", json_body, 400),
        ("PUT", "/buffers", json.dumps({**buffer_request(), "colour": "red"}).encode(), json_body, 422),
        ("PUT", "/buffers", b"[1]", json_body, 422),
        ("PUT", "/buffers", b" " * (3 << 20), json_body, 413),
        ("GET", "/no/such/path", b"", [], 404),
        ("DELETE", "/status", b"", [], 405),
    ]
    for method, path, body, headers, status in cases:
        code, ctype, answer = raw(method, url + path, body, headers)
        assert (code, ctype) == (status, "application/json"), (path, code, ctype, answer[:200])
        error = json.loads(answer)["error"]
        assert error and "\n" not in error, error
    code, _, answer = raw("PUT", url + "/buffers", json.dumps({**buffer_request(), "colour": "red"}).encode(), json_body)
    assert "colour" in json.loads(answer)["error"], "names the unknown field"
