"""Numbers from the command line that become durations and rates, and a closed stdout: each
gets a one-line answer (exit 2) or a quiet end, never a panic (exit 101) or a hang."""
import subprocess

import pytest

from conftest import free_port


def no_panic(r):
    assert r.returncode != 101 and "panicked" not in r.stderr, r.stderr


def one_line_error(r, *words):
    no_panic(r)
    assert r.returncode == 2, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert all(w in last for w in words), r.stderr


@pytest.mark.parametrize("value", ["inf", "NaN", "1e308", "0", "-1"])
def test_timeouts_from_the_command_line_are_bounded(rdaq, tmp_path, value):
    for args in (["receive", "--port", "0", "--frames", "1", f"--timeout-s={value}"],
                 ["preview", "--from", f"tcp://127.0.0.1:{free_port()}", "--png", tmp_path / "p.png", f"--timeout-s={value}"],
                 ["write", "--from", f"tcp://127.0.0.1:{free_port()}", "--out", tmp_path, f"--idle-timeout-s={value}"]):
        r = subprocess.run([rdaq, *args], capture_output=True, text=True, timeout=60)
        no_panic(r)
        assert r.returncode == 2 and "timeout-s" in r.stderr and "30 days" in r.stderr, r.stderr


@pytest.mark.parametrize("rate", ["1e-300", "-5", "1e300", "nan"])
def test_rates_from_the_command_line_are_bounded(rdaq, tmp_path, rate):
    r = subprocess.run([rdaq, "run", "--frames", "3", f"--rate={rate}", "--out", tmp_path, "--stream", "none", "--preview", "none"],
                       capture_output=True, text=True, timeout=60)
    one_line_error(r, "emulator.rate_hz", "1000000")
    assert not list(tmp_path.iterdir()), "a run refused at its start leaves nothing"
    rx = subprocess.Popen([rdaq, "receive", "--port", "0", "--frames", "1", "--timeout-s", "20", "--buffers-out", tmp_path / "bm.json"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if (tmp_path / "bm.json").exists() and (tmp_path / "bm.json").stat().st_size > 0:
                break
            subprocess.run(["sleep", "0.05"])
        r = subprocess.run([rdaq, "emulate", "--buffers", tmp_path / "bm.json", "--frames", "2", f"--rate={rate}"],
                           capture_output=True, text=True, timeout=60)
        one_line_error(r, "rate", "1000000")
    finally:
        rx.kill()
        rx.wait()


@pytest.mark.parametrize("kev", ["inf", "1e300", "nan", "0", "-3"])
def test_absurd_photon_energies_are_refused(rdaq, tmp_path, kev):
    r = subprocess.run([rdaq, "run", "--frames", "3", f"--photon-energy-kev={kev}", "--out", tmp_path, "--stream", "none", "--preview", "none"],
                       capture_output=True, text=True, timeout=60)
    one_line_error(r, "photon_energy_kev", "200")


@pytest.mark.parametrize("option", ["--box-half=100000000000000", "--snr=nan", "--snr=-1", "--threshold=0", "--threshold=inf"])
def test_absurd_finder_settings_are_refused(rdaq, tmp_path, option):
    import h5py
    import numpy as np
    with h5py.File(tmp_path / "img.h5", "w") as f:
        f["entry/data/data"] = np.zeros((1, 64, 64), np.float32)
    r = subprocess.run([rdaq, "process", "spots", "--input", tmp_path / "img.h5", "--output", tmp_path / "s.h5", option],
                       capture_output=True, text=True, timeout=60)
    one_line_error(r, option.split("=")[0].lstrip("-").replace("-", "_"))
    assert not (tmp_path / "s.h5").exists()


def test_a_closed_stdout_ends_the_printing_quietly_after_the_data_is_safe(rdaq, tmp_path):
    """`rdaq run | true`: the summary finds its reader gone; the run still writes its files and
    the summary JSON and exits with its own status."""
    out = tmp_path / "out"
    p = subprocess.run(f"'{rdaq}' run --frames 10 --out '{out}' --stream none --preview none --summary-json '{tmp_path}/s.json' | true; "
                       "echo \"rc=${PIPESTATUS[0]}\"", shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=120)
    assert "rc=0" in p.stdout and "panicked" not in p.stderr, p.stdout + p.stderr
    assert (out / "rdaq_run_master.h5").exists() and (tmp_path / "s.json").stat().st_size > 0
    p = subprocess.run(f"'{rdaq}' recover '{out}/rdaq_run_master.h5' | true; echo \"rc=${{PIPESTATUS[0]}}\"", shell=True, executable="/bin/bash",
                       capture_output=True, text=True, timeout=120)
    assert "rc=0" in p.stdout and "panicked" not in p.stderr, p.stdout + p.stderr


def test_a_frame_timeout_beyond_a_minute_is_refused(rdaq):
    r = subprocess.run([rdaq, "receive", "--port", "0", "--frames", "1", "--timeout-s", "1", "--frame-timeout-ms", "4294967295"],
                       capture_output=True, text=True, timeout=60)
    one_line_error(r, "receiver.frame_timeout_ms", "60000")


def test_the_timeout_ends_a_receive_whatever_its_frame_timeout(rdaq, tmp_path):
    """--timeout-s is the limit in any case: a receiver told to wait a minute for quiet ports
    (the frame timeout) stops at its deadline all the same (it waited the minute before)."""
    r = subprocess.run([rdaq, "receive", "--port", "0", "--frames", "5", "--timeout-s", "1", "--frame-timeout-ms", "60000",
                        "--out", tmp_path / "m.h5"], capture_output=True, text=True, timeout=40)
    no_panic(r)
    assert r.returncode == 1 and "lost" in r.stdout.lower() + r.stderr.lower(), r.stdout + r.stderr


@pytest.mark.parametrize("name", ["a\\nb", ".", "..", ".hidden", "x\\u001b[31m", "a/b", "n" * 201])
def test_an_output_name_in_a_configuration_is_a_plain_file_name(rdaq, tmp_path, name):
    """As the APIs refuse them: no newline or escape sequence printed raw, no hidden file."""
    (tmp_path / "c.toml").write_text(f'[output]\nname = "{name}"\n')
    r = subprocess.run([rdaq, "run", "--config", tmp_path / "c.toml", "--frames", "2", "--out", tmp_path / "out", "--stream", "none", "--preview", "none"],
                       capture_output=True, text=True, timeout=60)
    one_line_error(r, "output.name", "plain file name")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_a_run_that_cannot_open_its_stream_leaves_no_file(rdaq, tmp_path):
    """Another acquisition holds the stream's port: the run stops at its start (exit 2, one
    line naming the stream) before any file of it exists."""
    import socket
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        r = subprocess.run([rdaq, "run", "--frames", "3", "--out", tmp_path / "out", "--stream", f"tcp://127.0.0.1:{held.getsockname()[1]}",
                            "--preview", "none"], capture_output=True, text=True, timeout=60)
    no_panic(r)
    assert r.returncode == 2 and "in use" in r.stderr.lower(), r.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir()), list((tmp_path / "out").iterdir())


def test_a_call_without_parameters_refuses_a_body_it_cannot_take(rdaq, tmp_path):
    """`POST /stop` of `rdaq run --serve` takes nothing or `{}`: malformed JSON, a field and a
    2 MB body are refused, and the run goes on until a proper stop."""
    import json
    import signal
    import time
    import urllib.error
    import urllib.request

    port = free_port()
    p = subprocess.Popen([rdaq, "run", "--frames", "100000", "--rate", "50", "--out", tmp_path / "out", "--stream", "none", "--preview", "none",
                          "--serve", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def post(body):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/stop", data=body, method="POST", headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def state():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as r:
            return json.loads(r.read())["state"]
    try:
        deadline = time.monotonic() + 30
        while True:
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.poll() is not None else "not acquiring"
            try:
                if state() == "acquiring":
                    break
            except OSError:
                pass
            time.sleep(0.1)
        for body, code in [(b"{not json", 400), (b'{"reason": "x"}', 400), (b"[]", 400)]:
            got, answer = post(body)
            assert got == code and "error" in answer, (body[:20], got, answer)
        # a 2 MB body: the server answers 413 once it has read past its limit and closes,
        # which can reset the connection before the client reads the answer; the refusal is
        # what is checked, on one of a few tries
        answers = []
        for _ in range(5):
            try:
                answers.append(post(b" " + b"x" * 2_000_000))
                break
            except (ConnectionResetError, BrokenPipeError, urllib.error.URLError) as e:
                answers.append(e)
        assert any(isinstance(a, tuple) and a[0] == 413 and "error" in a[1] for a in answers), answers
        assert state() == "acquiring", "refused stops stopped nothing"
        assert post(b"{}")[0] == 200
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)


def test_a_run_whose_default_stream_ports_are_taken_streams_on_free_ones(rdaq, tmp_path):
    """Two runs on one host both work: the second finds the default stream and preview ports
    taken (held here, or by another acquisition), says so, and streams on free ports that its
    summary names."""
    import json
    import socket
    held = []
    for port in (31001, 31002):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
            held.append(s)
        except OSError:  # another acquisition has it: taken as well
            s.close()
    try:
        r = subprocess.run([rdaq, "run", "--raw", "--frames", "5", "--out", tmp_path, "--summary-json", tmp_path / "s.json"],
                           capture_output=True, text=True, timeout=120)
    finally:
        for s in held:
            s.close()
    assert r.returncode == 0, r.stdout + r.stderr
    for field, default in (("stream.endpoint", "tcp://127.0.0.1:31001"), ("stream.preview", "tcp://127.0.0.1:31002")):
        assert f"warning: {field}: {default} is taken" in r.stderr, r.stderr
    st = json.loads((tmp_path / "s.json").read_text())["stream"]
    assert st["endpoint"].startswith("tcp://127.0.0.1:") and st["endpoint"] != "tcp://127.0.0.1:31001", st
    assert st["preview"].startswith("tcp://127.0.0.1:") and st["preview"] != "tcp://127.0.0.1:31002", st
