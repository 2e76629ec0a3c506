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

from conftest import INTEROP, read_capture, send_udp, wait_for_file


def expected_frame():
    rows = np.arange(512) // 4  # packet p carries rows 4p..4p+3
    adc = (rows + 1).astype(np.uint16)[:, None] * np.ones((1, 1024), np.uint16)
    gain = np.zeros(1024, np.uint16)
    gain[300:600] = 0x4000
    gain[600:] = 0xC000
    return adc | gain[None, :]


def start_receiver(rdaq, tmp_path, interfaces, frames, policy="keep", extra=(), port="0", timeout_s="20", net=None):
    """An `rdaq receive --format sls`; with `net`, on that engine and where it runs."""
    ready = tmp_path / "ports.json"
    out = tmp_path / "sls.h5"
    summary = tmp_path / "summary.json"
    port_args = [] if port is None else ["--port", port]
    args = [str(rdaq), "receive", "--format", "sls", "--interfaces", str(interfaces), "--modules", "1",
            *port_args, "--frames", str(frames), "--timeout-s", timeout_s, "--frame-timeout-ms", "200",
            "--policy", policy, "--ring-mib", "16", "--out", str(out), "--buffers-out", str(ready),
            "--summary-json", str(summary), "--stream", "none", *extra, *(net.args() if net else [])]
    popen = net.popen if net else subprocess.Popen
    proc = popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ports = wait_for_file(ready, proc)["data_ports"]
    assert len(ports) == interfaces
    return proc, ports, out, summary


def replay(captures_and_ports, net=None):
    datagrams = [(payload, port) for capture, port in captures_and_ports for payload in read_capture(INTEROP / capture)]
    (net.send if net is not None else send_udp)(datagrams)


def finish(proc, summary, rc=0):
    """The summary of a receiver that ran to its end, which must exit with `rc`: 0 when every
    frame arrived complete, 1 when data was lost or incomplete."""
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == rc, out + err
    s = json.loads(summary.read_text())
    s["stdout"], s["stderr"] = out, err
    return s


@pytest.mark.parametrize("capture,frames", [("jungfrau_virtual.bin", [14, 15, 16]),
                                            ("jungfrau_virtual_imagetest.bin", [17])])
def test_one_interface(rdaq, tmp_path, capture, frames, net):
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 1, len(frames), net=net)
    replay([(capture, ports[0])], net)
    s = finish(proc, summary)
    assert s["engine"].startswith(net.engine)
    assert s["frames_complete"] == len(frames) and s["datagrams_dropped"] == 0
    assert s["datagrams_placed"] == 128 * len(frames)
    with h5py.File(out, "r") as f:
        data = f["entry/data/data"]
        assert f["entry/data/frame_number"][:].tolist() == frames
        want = expected_frame() if "imagetest" not in capture else np.full((512, 1024), 0x0FFE, np.uint16)
        for i in range(len(frames)):
            assert np.array_equal(data[i], want), f"frame {frames[i]}"


def test_two_interfaces(rdaq, tmp_path, net):
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 2, 2, net=net)
    replay([("jungfrau_virtual_2if_port50001.bin", ports[0]), ("jungfrau_virtual_2if_port50002.bin", ports[1])], net)
    s = finish(proc, summary)
    assert s["frames_complete"] == 2 and s["datagrams_placed"] == 256 and s["datagrams_dropped"] == 0
    with h5py.File(out, "r") as f:
        assert f["entry/data/frame_number"][:].tolist() == [367018, 367019]
        for i in range(2):
            assert np.array_equal(f["entry/data/data"][i], expected_frame())


def test_partial_readout_is_kept_with_missing_pixels_marked(rdaq, tmp_path, net):
    """256-row readout into a receiver that expects all 512 rows: packets 32..95 only. Policy
    keep: the frame is written, the rows of the missing packets hold the error word 0xFFFF
    and are flagged in the per-frame mask; the exit status says data is missing, and the
    summary names the setting that is likely wrong."""
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 1, 1, net=net)
    replay([("jungfrau_virtual_readnrows256.bin", ports[0])], net)
    s = finish(proc, summary, rc=1)
    assert s["frames_incomplete"] == 1 and s["frames_complete"] == 0 and s["cells_missing"] == 64
    assert any("--read-rows 256" in h for h in s["hints"]), s["hints"]
    assert "hint        : " in s["stdout"]
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
    s = finish(proc, summary, rc=1)
    assert s["frames_discarded"] == 1 and s["frames_written"] == 0
    assert not out.exists() and s["output"] is None, "no frame written: no data file kept"
    assert "no data file was kept" in s["stdout"]


def test_garbage_on_the_port_is_counted_and_the_stream_survives(rdaq, tmp_path, net):
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 1, 3, net=net)
    records = read_capture(INTEROP / "jungfrau_virtual.bin")
    garbage = [b"", b"x" * 10, b"\x00" * 8240, records[0][:100], records[0] + b"extra"]
    net.send([(g, ports[0]) for g in garbage] + [(r, ports[0]) for r in records])
    st = finish(proc, summary)
    assert st["frames_complete"] == 3
    reasons = dict(st["dropped_by_reason"])
    assert sum(reasons.values()) == len(garbage), reasons
    assert reasons == {"truncated": 2, "bad_sls_packet": 2, "oversized": 1}, reasons


def test_partial_readout_with_read_rows_gives_complete_frames_of_that_height(rdaq, tmp_path):
    """`--read-rows 256` (the detector's readnrows): packets 32..95 make a complete frame of
    the 256 central rows, exact, and the run exits 0."""
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 1, 1, extra=["--read-rows", "256"])
    replay([("jungfrau_virtual_readnrows256.bin", ports[0])])
    s = finish(proc, summary)
    assert s["frames_complete"] == 1 and s["frames_incomplete"] == 0 and s["hints"] == []
    with h5py.File(out, "r") as f:
        data = f["entry/data/data"]
        assert data.shape == (1, 256, 1024)
        assert np.array_equal(data[0], expected_frame()[128:384])
        assert f["entry/data/frame_complete"][:].tolist() == [1]
        assert f["entry/instrument/detector/module_0/data_size"][:].tolist() == [256, 1024]


def test_full_readout_into_read_rows_is_named(rdaq, tmp_path):
    """A full 512-row readout sent to a receiver set for 256 rows: the packets outside the
    rows read are counted as unexpected, the hint says the detector reads more rows, and the
    run exits 1: the frames written are not what the detector sent."""
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 1, 3, extra=["--read-rows", "256"])
    replay([("jungfrau_virtual.bin", ports[0])])
    s = finish(proc, summary, rc=1)
    assert s["frames_complete"] == 3
    # the receiver stops when its third frame is complete, at the packet of row 383 of frame
    # 16: the packets of the rows before it are counted, those after it may come too late
    reasons = dict(s["dropped_by_reason"])
    assert set(reasons) == {"unexpected_packet"} and 2 * 64 + 32 <= reasons["unexpected_packet"] <= 3 * 64, reasons
    assert any("more rows than --read-rows 256" in h for h in s["hints"]), s["hints"]
    assert s["packets_misfit"] == reasons["unexpected_packet"] and "misfit" in s["stdout"] and "loss        : YES" in s["stdout"]


def test_two_interfaces_into_a_receiver_for_one_is_named(rdaq, tmp_path):
    """The detector sends on two interfaces; the receiver listens for one. Half of every
    frame never comes: the summary says so, names --interfaces 2, and exits 1."""
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 1, 2, timeout_s="4")
    closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    closed.bind(("127.0.0.1", 0))  # the second interface's port: nobody receives there
    replay([("jungfrau_virtual_2if_port50001.bin", ports[0]), ("jungfrau_virtual_2if_port50002.bin", closed.getsockname()[1])])
    closed.close()
    s = finish(proc, summary, rc=1)
    assert s["frames_incomplete"] == 2 and s["frames_complete"] == 0
    assert any("--interfaces 2" in h for h in s["hints"]), s["hints"]


def test_one_interface_into_a_receiver_for_two_is_named(rdaq, tmp_path):
    """The detector sends on one interface; the receiver expects two. The packets numbered
    past one interface's range are counted as unexpected and the hint names --interfaces 1."""
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 2, 3, timeout_s="4")
    replay([("jungfrau_virtual.bin", ports[0])])
    s = finish(proc, summary, rc=1)
    assert dict(s["dropped_by_reason"]) == {"unexpected_packet": 3 * 64}
    assert any("--interfaces 1" in h and "received nothing" in h for h in s["hints"]), s["hints"]


def test_default_port_is_the_sls_default(rdaq, tmp_path):
    """Without --port the receiver listens where slsDetectorPackage sends by default."""
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 1, 3, port=None)
    assert ports == [50001]
    replay([("jungfrau_virtual.bin", 50001)])
    assert finish(proc, summary)["frames_complete"] == 3


def test_frames_that_never_arrived_are_counted_with_their_numbers(rdaq, tmp_path):
    """Frames 14 and 16 of the capture arrive, 15 does not: 15 is counted as never seen,
    by number, apart from incomplete frames; nothing is reported dropped that was not."""
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 1, 3, timeout_s="3")
    records = read_capture(INTEROP / "jungfrau_virtual.bin")
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for payload in records:
        if int.from_bytes(payload[:8], "little") != 15:
            s.sendto(payload, ("127.0.0.1", ports[0]))
    s.close()
    st = finish(proc, summary, rc=1)
    assert (st["frames_complete"], st["frames_incomplete"], st["frames_never_seen"]) == (2, 0, 1)
    assert st["frames_never_seen_runs"] == [[15, 16]]
    assert st["datagrams_dropped"] == 0 and st["cells_missing"] == 0
    assert "never seen  : frames 15" in st["stdout"]


def test_a_detector_that_sends_fewer_frames_is_not_waited_for(rdaq, tmp_path):
    """Asked for 10 frames, the detector sends its 3 and stops: the receiver ends about
    --quiet-s after the last datagram, not at --timeout-s, and says why; the 7 frames that
    never came are counted as lost (exit 1)."""
    import time
    t = time.monotonic()
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 1, 10, timeout_s="600", extra=["--quiet-s", "1"])
    replay([("jungfrau_virtual.bin", ports[0])])
    st = finish(proc, summary, rc=1)
    assert time.monotonic() - t < 120, "ended by --timeout-s, not by the quiet"
    assert st["frames_complete"] == 3, st["stdout"]
    assert "no datagram for 1.0 s: the detector has finished (--quiet-s)" in st["stderr"], st["stderr"]


def test_an_existing_output_is_refused_before_anything_starts(rdaq, tmp_path):
    """`--out EXISTING` exits 2 naming the file, which is left as it was; --overwrite replaces it."""
    out = tmp_path / "precious.h5"
    out.write_bytes(b"900 frames of data")
    r = subprocess.run([str(rdaq), "receive", "--format", "sls", "--port", "0", "--out", str(out), "--timeout-s", "1",
                        "--buffers-out", str(tmp_path / "map.json")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stdout + r.stderr
    assert str(out) in r.stderr and "--overwrite" in r.stderr
    assert out.read_bytes() == b"900 frames of data"
    assert not (tmp_path / "map.json").exists(), "refused before the receiver started"


def test_a_receiver_that_gets_nothing_keeps_no_file_and_exits_1(rdaq, tmp_path):
    """Nothing arrives before the timeout: no empty data file is left, and the exit status
    says that data is missing."""
    out = tmp_path / "empty.h5"
    r = subprocess.run([str(rdaq), "receive", "--format", "sls", "--port", "0", "--out", str(out), "--timeout-s", "0.5"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stdout + r.stderr
    assert not out.exists()
    assert "no data file was kept" in r.stdout and "--bind" in r.stderr


def test_af_xdp_on_loopback_is_refused_with_the_reason(rdaq, tmp_path):
    """AF_XDP needs a network interface: on loopback a UDP GSO batch is one unsegmented
    packet. The receiver says so in one line and exits 2 before anything is written."""
    r = subprocess.run([str(rdaq), "receive", "--format", "sls", "--engine", "af_xdp", "--bind", "127.0.0.1", "--port", "0",
                        "--frames", "1", "--timeout-s", "2", "--out", str(tmp_path / "x.h5"), "--stream", "none"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "loopback" in r.stderr and "bind to the address of a NIC or veth" in r.stderr, r.stderr
    assert not (tmp_path / "x.h5").exists()


def test_eiger_packets_into_a_jungfrau_receiver_are_named(rdaq, tmp_path):
    proc, ports, out, summary = start_receiver(rdaq, tmp_path, 1, 1, timeout_s="3")
    eiger = read_capture(INTEROP.parent / "sls-eiger-virtual" / "eiger_10g_dr16_port50011.bin")
    send_udp([(p, ports[0]) for p in eiger])
    s = finish(proc, summary, rc=1)
    assert dict(s["dropped_by_reason"]) == {"bad_sls_packet": len(eiger)}
    assert any("detType 1 (EIGER)" in h and "check --detector" in h for h in s["hints"]), s["hints"]


def shifted(payload, by):
    """The packet with its frame number moved by `by`."""
    return (int.from_bytes(payload[:8], "little") + by).to_bytes(8, "little") + payload[8:]


@pytest.mark.parametrize("by", [1, 100])
def test_modules_whose_frame_numbers_disagree_are_named_and_the_counts_add_up(rdaq, tmp_path, by):
    """Two modules, the second numbering its frames `by` ahead: no frame number holds both
    modules' exposure. The hint names the offset, the run exits 1, and the frame counts add
    up (frames beyond the 3 expected are counted as such, not as 97 never arrived)."""
    ready, summary = tmp_path / "ports.json", tmp_path / "summary.json"
    proc = subprocess.Popen([str(rdaq), "receive", "--format", "sls", "--modules", "2", "--port", "0", "--frames", "3",
                             "--timeout-s", "3", "--frame-timeout-ms", "200", "--ring-mib", "32", "--buffers-out", str(ready),
                             "--summary-json", str(summary), "--stream", "none"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ports = wait_for_file(ready, proc)["data_ports"]
    records = read_capture(INTEROP / "jungfrau_virtual.bin")  # frames 14, 15, 16
    send_udp([(r, ports[0]) for r in records] + [(shifted(r, by), ports[1]) for r in records])
    s = finish(proc, summary, rc=1)
    assert any(f"frame numbers disagree by {by}" in h for h in s["hints"]), s["hints"]
    counted = s["frames_complete"] + s["frames_incomplete"] + s["frames_discarded"] + s["frames_refused"] + s["frames_never_seen"]
    assert counted - s["frames_beyond_expected"] == 3, s
    assert s["frames_incomplete"] >= 2
