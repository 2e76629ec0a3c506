"""The web dashboard in a real browser (headless Chromium driven by selenium): during a run
with injected loss it shows the frame counter rising, the loss counters and the incomplete
frames in the event log, renders the preview image at the image's size, refuses a stop
without the token and with a wrong one, and stops the run with the right one. A screenshot
is saved to target/test-artifacts/dashboard.png. Without Chromium (scripts/setup.sh installs
it) these tests fail rather than skip: the dashboard is part of the product."""
import json
import pathlib
import shutil
import signal
import subprocess
import time
import urllib.request

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from conftest import ROOT, free_port
from test_control_api import daemons  # noqa: F401 (a fixture)

TOKEN = "5be1d0c2a7f94e38b6d2c1a0f9e8d7c6"
ARTIFACTS = ROOT / "target" / "test-artifacts"

CONFIG = """
[detector]
modules = 1
[emulator]
frames = 100000
rate_hz = 25.0
[reliability]
retransmit = false
[faults]
loss = 0.002
[output]
dir = "{out}"
tolerate_loss = true
[stream]
endpoint = "none"
preview = "none"
"""


def browser():
    chromium = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    assert chromium and driver, "chromium and chromium-driver are needed (scripts/setup.sh installs them)"
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1500,1750"]:
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(driver), options=opts)


def wait(what, cond, timeout=60.0):
    """Polls `cond` until it returns something truthy; fails naming `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = cond()
            if last:
                return last
        except Exception as e:  # an element not there yet, a number not shown yet
            last = e
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def number(driver, id_):
    return int(driver.find_element(By.ID, id_).text.replace(",", ""))


def snapshot(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/dashboard/snapshot", timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture
def served_run(rdaq, tmp_path):
    """`rdaq run --serve` of a long paced run with 0.2 % datagram loss and no retransmission."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    cfg = tmp_path / "run.toml"
    cfg.write_text(CONFIG.format(out=tmp_path / "out"))
    port = free_port()
    log = open(tmp_path / "run.log", "w")
    p = subprocess.Popen([str(rdaq), "run", "--config", str(cfg), "--serve", str(port), "--token-file", str(token)],
                         stdout=log, stderr=subprocess.STDOUT)
    wait("the run's API", lambda: p.poll() is None and snapshot(port)["state"] == "acquiring", 30)
    yield p, port, tmp_path
    if p.poll() is None:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_dashboard_shows_the_run_and_stops_it_only_with_the_token(served_run):
    p, port, tmp = served_run
    d = browser()
    try:
        d.get(f"http://127.0.0.1:{port}/")
        assert "rdaq run" in wait("the title", lambda: d.find_element(By.ID, "title").text)
        wait("the state", lambda: d.find_element(By.ID, "state").text == "ACQUIRING" or d.find_element(By.ID, "state").text == "acquiring")
        # the frame counter rises while the page stays loaded
        first = wait("frames", lambda: number(d, "frames-complete"))
        wait("more frames", lambda: number(d, "frames-complete") > first + 10)
        assert float(wait("a frame rate", lambda: d.find_element(By.ID, "fps").text.replace("-", ""))) > 0
        # the injected loss shows as lost frames and in the event log
        wait("lost frames", lambda: number(d, "frames-lost") > 0)
        wait("an incomplete frame event", lambda: "incomplete" in d.find_element(By.ID, "events").text)
        # the processing graph runs: its stages and the hit counters
        stages = d.find_element(By.ID, "stages").text
        for s in ["process", "write", "pedestal"]:
            assert s in stages
        # the preview: rendered at the image's size, and not blank
        snap = wait("a preview", lambda: snapshot(port)["preview"])
        img = d.find_element(By.ID, "preview")
        wait("the preview image", lambda: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img))
        size = d.execute_script("return [arguments[0].naturalWidth, arguments[0].naturalHeight]", img)
        assert size == [snap["width"], snap["height"]], (size, snap)
        colors = d.execute_script("""
            const img = arguments[0], c = document.createElement('canvas');
            c.width = img.naturalWidth; c.height = img.naturalHeight;
            const g = c.getContext('2d'); g.drawImage(img, 0, 0);
            const px = g.getImageData(0, 0, c.width, c.height).data, seen = new Set();
            for (let i = 0; i < px.length; i += 4 * 97) seen.add(px[i] << 16 | px[i + 1] << 8 | px[i + 2]);
            return seen.size;""", img)
        assert colors > 20, f"the preview looks blank ({colors} colors)"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        time.sleep(1.5)  # two more updates, so that the plots have a few points
        d.save_screenshot(str(ARTIFACTS / "dashboard.png"))

        # stopping: refused without the token, refused with a wrong one, the run goes on
        stop, token, message = (d.find_element(By.ID, i) for i in ["stop", "token", "message"])
        assert stop.is_enabled()
        stop.click()
        assert "401" in wait("the refusal", lambda: message.text)
        token.send_keys("not-the-token-0123456789")
        stop.click()
        wait("the wrong-token refusal", lambda: "403" in message.text)
        assert snapshot(port)["state"] == "acquiring" and p.poll() is None
        assert snapshot(port)["api_refused"] == 2
        token.clear()
        token.send_keys(TOKEN)
        stop.click()
        wait("the stop", lambda: "Stop sent" in message.text)
        wait("the end of the run", lambda: d.find_element(By.ID, "state").text.lower().startswith("finished"), 60)
        result = wait("the result", lambda: "stopped early" in d.find_element(By.ID, "result").text and d.find_element(By.ID, "result").text)
        assert "frames complete" in result
        assert not stop.is_enabled()
        d.save_screenshot(str(ARTIFACTS / "dashboard-finished.png"))
    finally:
        d.quit()
    # the run ended by itself (the page stays until Ctrl-C); its summary says why
    snap = snapshot(port)
    s = snap["result"]["summary"]
    assert s["stopped_early_of"] == 100000 and s["frames_expected"] < 100000
    assert any(e["type"] == "stop_requested" for e in json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/events").read())["events"])
    p.send_signal(signal.SIGINT)
    assert p.wait(30) == 0, (tmp / "run.log").read_text()
    assert "stopped     : early" in (tmp / "run.log").read_text()


def test_receiver_page_needs_the_token_for_protected_reads_and_starts_and_stops(rdaq, tmp_path):
    """With --protect-reads the page loads (it carries no data), asks for the token, and
    shows the receiver daemon once it has it; with buffers defined it starts and stops an
    acquisition."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    port = free_port()
    p = subprocess.Popen([str(rdaq), "receive", "--serve", str(port), "--name", "dr7", "--memory-mib", "64", "--out-dir", str(tmp_path),
                          "--stream", "none", "--token-file", str(token), "--protect-reads"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    d = browser()
    try:
        d.get(wait("the daemon", lambda: p.poll() is None and urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).status == 200 and f"http://127.0.0.1:{port}/"))
        wait("the token request", lambda: "TOKEN NEEDED" in d.find_element(By.ID, "state").text.upper())
        assert "token" in d.find_element(By.ID, "message").text
        field = d.find_element(By.ID, "token")
        field.send_keys(TOKEN)
        d.execute_script("arguments[0].dispatchEvent(new Event('change'))", field)
        wait("the daemon's state", lambda: d.find_element(By.ID, "state").text.upper() == "IDLE")
        assert d.find_element(By.ID, "title").text == "receiver dr7"
        assert not d.find_element(By.ID, "start").is_displayed(), "no buffers yet: nothing to start"
        # buffers from a manager; then the page can start and stop an acquisition
        body = json.dumps({"version": 1, "modules": [0], "module_bytes": 1048576, "payload_bytes": 8192, "slots": 4, "data_port": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/buffers", data=body, method="PUT",
                                     headers={"content-type": "application/json", "authorization": f"Bearer {TOKEN}"})
        urllib.request.urlopen(req, timeout=10)
        wait("the start button", lambda: d.find_element(By.ID, "start").is_displayed())
        d.find_element(By.ID, "output").send_keys("dash_master.h5")
        d.find_element(By.ID, "start").click()
        wait("the acquisition", lambda: d.find_element(By.ID, "state").text.upper() == "ACQUIRING")
        assert (tmp_path / "dash_master.h5").exists()
        d.find_element(By.ID, "stop").click()
        wait("the end of the acquisition", lambda: d.find_element(By.ID, "state").text.upper().startswith("CONFIGURED"))
        wait("its result", lambda: "nothing lost" in d.find_element(By.ID, "result").text)
        # Ctrl-C with the page still open: the live feed ends, the daemon exits
        p.send_signal(signal.SIGINT)
        assert p.wait(15) == 0
    finally:
        d.quit()
        if p.poll() is None:
            p.kill()
            p.wait()


def test_manager_dashboard_shows_the_plan_and_receivers_and_stops_the_system(rdaq, daemons, tmp_path):
    """`rdaq manage --serve`: the page shows the plan and every receiver's counters from its
    heartbeats; POST /stop ends the run early, and the report expects only what was sent."""
    det, dr = daemons["det"], daemons["dr0"]
    topo = tmp_path / "t.toml"
    topo.write_text(f'[detector]\nmodules = 2\ncontrol = "{det[7:]}"\n'
                    f'[[receivers]]\nname = "dr0"\ncontrol = "{dr[7:]}"\ndata = "127.0.0.1"\ndata_port = 0\nmemory_mib = 64\n')
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    mgr = subprocess.Popen([str(rdaq), "manage", "--topology", str(topo), "--frames", "100000", "--rate", "20", "--tolerate-loss",
                            "--out", str(tmp_path / "o"), "--serve", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    d = browser()
    try:
        s = wait("receiver counters", lambda: mgr.poll() is None and (s := snapshot(port))["receivers"] and s["receivers"][0]["counters"]
                 and s["receivers"][0]["counters"]["frames_complete"] > 5 and s)
        assert s["title"].startswith("manager") and s["state"] == "running" and s["stop"] == "/stop"
        assert s["topology"]["modules"] == 2 and s["topology"]["epochs"][0]["receivers"] == ["dr0"]
        d.get(url + "/")
        wait("the plan on the page", lambda: "from frame 0: dr0 (initial plan" in d.find_element(By.ID, "topology").text)
        wait("the receiver row", lambda: "dr0" in d.find_element(By.ID, "receivers").text)
        req = urllib.request.Request(url + "/stop", data=b"{}", method="POST", headers={"content-type": "application/json"})
        assert json.loads(urllib.request.urlopen(req, timeout=10).read())["state"] == "stopping"
        wait("the report", lambda: snapshot(port)["result"], 60)
        with urllib.request.urlopen(url + "/report", timeout=10) as r:
            report = json.loads(r.read())
        assert report["stopped_early_of"] == 100000 and 5 < report["frames_expected"] < 100000
        assert report["frames_expected"] - report["frames_complete"] <= 1, report
        wait("the result on the page", lambda: "stopped early" in d.find_element(By.ID, "result").text)
    finally:
        d.quit()
        mgr.send_signal(signal.SIGINT)
        try:
            assert mgr.wait(30) == 0, mgr.stderr.read()
        finally:
            if mgr.poll() is None:
                mgr.kill()
