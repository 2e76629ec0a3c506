"""Native JUNGFRAU ingest: real packets captured from PSI's virtual JUNGFRAU server are replayed
over UDP to `rdaq receive --format sls`; the frames in the file must show the pixel pattern the
capture's README describes (ADC = packet number + 1; gain G0 for columns 0-299, G1 for 300-599,
G2 for 600-1023)."""
import json
import socket
import subprocess

import h5py
import hdf5plugin  # noqa: F401
import numpy as np
import pytest

from conftest import INTEROP, read_capture, wait_for_file


def expected_frame():
    rows = np.arange(512) // 4  # packet p carries rows 4p..4p+3
    adc = (rows + 1).astype(np.uint16)[:, None] * np.ones((1, 1024), np.uint16)
    gain = np.zeros(1024, np.uint16)
    gain[300:600] = 0x4000
    gain[600:] = 0xC000
    return adc | gain[None, :]


def start_receiver(rdaq, tmp_path, interfaces, frames, policy="keep"):
    ready = tmp_path / "ports.json"
    out = tmp_path / "sls.h5"
    summary = tmp_path / "summary.json"
    proc = subprocess.Popen(
        [str(rdaq), "receive", "--format", "sls", "--interfaces", str(interfaces), "--modules", "1",
         "--port", "0", "--frames", str(frames), "--timeout-s", "20", "--frame-timeout-ms", "200",
         "--policy", policy, "--ring-mib", "16", "--out", str(out), "--buffers-out", str(ready),
         "--summary-json", str(summary)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ports = wait_for_file(ready, proc)["data_ports"]
    assert len(ports) == interfaces
    return proc, ports, out, summary


def replay(captures_and_ports):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for capture, port in captures_and_ports:
        for payload in read_capture(INTEROP / capture):
            s.sendto(payload, ("127.0.0.1", port))
    s.close()


def finish(proc, summary):
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, out + err
    return json.loads(summary.read_text())


@pytest.mark.parametrize("capture,frames", [("jungfrau_virtual.bin", [14, 15, 16]),
                                            ("jungfrau_virtual_imagetest.bin", [17])])
def test_one_interface(rdaq, tmp_path, capture, frames):
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 1, len(frames))
    replay([(capture, ports[0])])
    s = finish(proc, summary)
    assert s["frames_complete"] == len(frames) and s["datagrams_dropped"] == 0
    assert s["datagrams_placed"] == 128 * len(frames)
    with h5py.File(out, "r") as f:
        data = f["entry/data/data"]
        assert f["entry/data/frame_number"][:].tolist() == frames
        want = expected_frame() if "imagetest" not in capture else np.full((512, 1024), 0x0FFE, np.uint16)
        for i in range(len(frames)):
            assert np.array_equal(data[i], want), f"frame {frames[i]}"


def test_two_interfaces(rdaq, tmp_path):
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 2, 2)
    replay([("jungfrau_virtual_2if_port50001.bin", ports[0]), ("jungfrau_virtual_2if_port50002.bin", ports[1])])
    s = finish(proc, summary)
    assert s["frames_complete"] == 2 and s["datagrams_placed"] == 256 and s["datagrams_dropped"] == 0
    with h5py.File(out, "r") as f:
        assert f["entry/data/frame_number"][:].tolist() == [367018, 367019]
        for i in range(2):
            assert np.array_equal(f["entry/data/data"][i], expected_frame())


def test_partial_readout_is_kept_with_missing_pixels_marked(rdaq, tmp_path):
    """256-row readout: packets 32..95 only. Policy keep: the frame is written, the rows of
    the missing packets hold the error word 0xFFFF and are flagged in the per-frame mask."""
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 1, 1)
    replay([("jungfrau_virtual_readnrows256.bin", ports[0])])
    s = finish(proc, summary)
    assert s["frames_incomplete"] == 1 and s["frames_complete"] == 0 and s["cells_missing"] == 64
    with h5py.File(out, "r") as f:
        img = f["entry/data/data"][0]
        assert f["entry/data/frame_complete"][:].tolist() == [0]
        assert f["entry/data/incomplete_frame_number"][:].tolist() == [367020]
        mask = f["entry/data/incomplete_pixel_mask"][0]
    want = expected_frame()
    assert np.array_equal(img[128:384], want[128:384]), "received rows are exact"
    assert (img[:128] == 0xFFFF).all() and (img[384:] == 0xFFFF).all()
    assert (mask[:128] == 2).all() and (mask[384:] == 2).all() and (mask[128:384] == 0).all()


def test_partial_readout_is_discarded_under_discard(rdaq, tmp_path):
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 1, 1, policy="discard")
    replay([("jungfrau_virtual_readnrows256.bin", ports[0])])
    s = finish(proc, summary)
    assert s["frames_discarded"] == 1 and s["frames_written"] == 0
    with h5py.File(out, "r") as f:
        assert f["entry/data/data"].shape[0] == 0


def test_garbage_on_the_port_is_counted_and_the_stream_survives(rdaq, tmp_path):
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 1, 3)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    records = read_capture(INTEROP / "jungfrau_virtual.bin")
    garbage = [b"", b"x" * 10, b"\x00" * 8240, records[0][:100], records[0] + b"extra"]
    for g in garbage:
        s.sendto(g, ("127.0.0.1", ports[0]))
    for payload in records:
        s.sendto(payload, ("127.0.0.1", ports[0]))
    s.close()
    st = finish(proc, summary)
    assert st["frames_complete"] == 3
    reasons = dict(st["dropped_by_reason"])
    assert sum(reasons.values()) == len(garbage), reasons
    assert reasons == {"truncated": 2, "bad_sls_packet": 2, "oversized": 1}, reasons
