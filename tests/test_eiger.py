"""EIGER ingest and assembly: every capture of PSI's virtual EIGER (one module, four ports,
1GbE and 10GbE, 4/8/12/16/32 bits) is replayed over UDP to `rdaq receive --detector eiger`,
and every frame in the file must equal, pixel for pixel, the image that an independent numpy
decoder written from the capture README makes of the same packets (tests/eiger_oracle.py)."""
import json
import pathlib
import subprocess
import threading

import h5py
import hdf5plugin  # noqa: F401
import numpy as np
import pytest

import eiger_oracle as oracle
import stream_consumer as sc
from conftest import free_port, read_capture, send_udp, wait_for_file

EIGER = pathlib.Path(__file__).parent / "data" / "sls-eiger-virtual"
CAPTURES = [  # (name, link, bits, frames)
    ("eiger_1g_dr16", "1g", 16, 3), ("eiger_1g_dr32", "1g", 32, 2), ("eiger_1g_dr8", "1g", 8, 2),
    ("eiger_1g_dr4", "1g", 4, 2), ("eiger_1g_dr12", "1g", 12, 1), ("eiger_1g_dr16_imagetest", "1g", 16, 1),
    ("eiger_10g_dr16", "10g", 16, 2), ("eiger_10g_dr32", "10g", 32, 1), ("eiger_10g_dr8", "10g", 8, 2),
    ("eiger_10g_dr4", "10g", 4, 2), ("eiger_10g_dr12", "10g", 12, 1),
]
DTYPE = {4: np.uint8, 8: np.uint8, 12: np.uint16, 16: np.uint16, 32: np.uint32}


def capture(name):
    """The datagrams of the four ports (50011..50014), port by port."""
    return [read_capture(EIGER / f"{name}_port{p}.bin") for p in range(50011, 50015)]


def receive(rdaq, tmp_path, frames, args, ports=4, rc=0, send=None, timeout_s=20, stream=None):
    """Runs `rdaq receive` with `args` until `frames` frames; `send(ports)` sends the data;
    publishes on `stream` when given. Returns the summary (with the process's output) and
    the output file."""
    ready, out, summary = tmp_path / "ports.json", tmp_path / "eiger.h5", tmp_path / "summary.json"
    cmd = [str(rdaq), "receive", *args, "--port", "0", "--frames", str(frames), "--timeout-s", str(timeout_s),
           "--frame-timeout-ms", "300", "--ring-mib", "32", "--out", str(out), "--buffers-out", str(ready),
           "--summary-json", str(summary), "--stream", stream or "none"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    data_ports = wait_for_file(ready, proc)["data_ports"]
    assert len(data_ports) == ports
    send(data_ports)
    o, e = proc.communicate(timeout=40)
    assert proc.returncode == rc, o + e
    s = json.loads(summary.read_text())
    s["stdout"], s["stderr"] = o, e
    return s, out


@pytest.mark.parametrize("name,link,bits,frames", CAPTURES, ids=[c[0] for c in CAPTURES])
def test_every_capture_assembles_as_the_numpy_decoder(rdaq, tmp_path, name, link, bits, frames):
    streams = capture(name)
    # the bottom half-module's streams go to each other's sockets: placement is by header
    order = [0, 1, 3, 2]
    s, out = receive(rdaq, tmp_path, frames, ["--detector", "eiger", "--bit-depth", str(bits), "--link", link],
                     send=lambda ports: send_udp([(p, ports[i]) for i, st in zip(order, streams) for p in st]))
    packets = sum(len(st) for st in streams)
    assert s["frames_complete"] == frames and s["datagrams_dropped"] == 0 and s["datagrams_placed"] == packets
    want = oracle.port_images([p for st in streams for p in st], bits)
    with h5py.File(out, "r") as f:
        data = f["entry/data/data"]
        assert data.dtype == DTYPE[bits] and data.shape[1:] == (512, 1024)
        numbers = f["entry/data/frame_number"][:].tolist()
        assert numbers == sorted(want)
        for i, n in enumerate(numbers):
            expect = oracle.module_image(want[n], dtype=DTYPE[bits])
            assert np.array_equal(data[i], expect), f"frame {n}: {np.argwhere(data[i] != expect)[:5]}"
        det = f["entry/instrument/detector"]
        assert det["saturation_value"][()] == 2 ** bits - 1 and det["bit_depth_readout"][()] == bits
        assert det["description"][()].decode().startswith("EIGER")


def test_gap_pixels_share_the_edge_counts(rdaq, tmp_path):
    streams = capture("eiger_1g_dr12")  # a ramp: every edge pixel differs
    s, out = receive(rdaq, tmp_path, 1, ["--detector", "eiger", "--bit-depth", "12", "--link", "1g", "--gap-pixels"],
                     send=lambda ports: send_udp([(p, ports[i]) for i, st in enumerate(streams) for p in st]))
    assert s["frames_complete"] == 1
    (frame, ports), = oracle.port_images([p for st in streams for p in st], 12).items()
    expect = oracle.with_gap_pixels(oracle.module_image(ports))
    with h5py.File(out, "r") as f:
        assert np.array_equal(f["entry/data/data"][0], expect)
        mask = f["entry/instrument/detector/pixel_mask"][:]
        assert mask.shape == (514, 1030) and (mask != 0).sum() == 514 * 1030 - 512 * 1024
        assert mask[:, 256:258].all() and mask[256:258, :].all() and not mask[:256, :256].any()


def moved(payload, row, column):
    """The datagram with its header's row and column moved by (row, column)."""
    h = list(oracle.HDR.unpack_from(payload))
    h[6] += row
    h[7] += column
    return oracle.HDR.pack(*h) + payload[48:]


def test_a_two_by_two_module_detector_follows_the_module_grid(rdaq, tmp_path):
    streams = capture("eiger_10g_dr16")
    copies = [(r, c) for r in (0, 2) for c in (0, 2)]  # each module's port rows and columns
    datagrams = [moved(p, r, c) for r, c in copies for st in streams for p in st]
    s, out = receive(rdaq, tmp_path, 2, ["--detector", "eiger", "--modules", "4", "--module-cols", "2"], ports=16,
                     send=lambda ports: send_udp([(d, ports[k % 16]) for k, d in enumerate(datagrams)]))
    assert s["frames_complete"] == 2 and s["datagrams_placed"] == len(datagrams)
    want = oracle.port_images(datagrams, 16)
    with h5py.File(out, "r") as f:
        data = f["entry/data/data"]
        assert data.shape[1:] == (2 * 512 + 36, 2 * 1024 + 8)
        for i, n in enumerate(f["entry/data/frame_number"][:]):
            assert np.array_equal(data[i], oracle.module_image(want[n], module_cols=2, rows=2))
        assert f["entry/instrument/detector/pixel_mask"][512:548, :].all()


@pytest.mark.parametrize("name,bits", [("eiger_10g_dr4", 4), ("eiger_10g_dr8", 8), ("eiger_10g_dr12", 12),
                                       ("eiger_10g_dr16", 16), ("eiger_10g_dr32", 32), ("eiger_1g_dr32", 32)])
def test_lost_packets_make_incomplete_frames_with_their_pixels_masked(rdaq, tmp_path, name, bits):
    """Every pixel type through the missing-pixel mask: the pixels of a lost packet, and only
    they, are masked (a 32-bit frame panicked here before)."""
    streams = capture(name)
    frames = next(c[3] for c in CAPTURES if c[0] == name)
    lost = streams[3][5]  # bottom, column 0 (port 50014): packet 5 of the first frame
    h = oracle.header(lost)
    assert h["packet"] == 5 and h["row"] == 1 and h["column"] == 0
    kept = [[p for p in st if p is not lost] for st in streams]
    s, out = receive(rdaq, tmp_path, frames, ["--detector", "eiger", "--bit-depth", str(bits), "--link", name.split("_")[1]], rc=1,
                     send=lambda ports: send_udp([(p, ports[i]) for i, st in enumerate(kept) for p in st]))
    assert s["frames_complete"] == frames - 1 and s["frames_incomplete"] == 1 and s["frames_written"] == frames
    # the packet's port pixels, a pixel split between two packets included; the bottom half
    # is flipped: port row r is module row 511 - r
    bits_per_packet = (len(lost) - 48) * 8
    first, end = 5 * bits_per_packet // bits, -(-6 * bits_per_packet // bits)
    want = np.zeros((512, 1024), bool)
    for i in range(first, end):
        want[511 - i // 512, i % 512] = True
    with h5py.File(out, "r") as f:
        assert f["entry/data/incomplete_frame_number"][:].tolist() == [h["frame"]]
        mask = f["entry/data/incomplete_pixel_mask"][0]
        assert np.array_equal(mask != 0, want), np.argwhere((mask != 0) != want)[:5]
        assert set(np.unique(mask)) == {0, 2}
        # the frame's other pixels are the detector's
        i = f["entry/data/frame_number"][:].tolist().index(h["frame"])
        expect = oracle.module_image(oracle.port_images([p for st in streams for p in st], bits)[h["frame"]], dtype=DTYPE[bits])
        assert np.array_equal(f["entry/data/data"][i][~want], expect[~want])


TOY = """
name = "TOY"
kind = "counting"
pixel_size_um = 55.0
sensor_material = "CdTe"
sensor_thickness_um = 750.0

[header]
format = "sls"
det_type = 9

[module]
width = 128
height = 32

[ports]
rows = 1
cols = 2
width = 64
height = 32
place = "header"
flip = [true]

[pixel]
bit_depths = [12]
default_bit_depth = 12

[links.toy]
payload = 384
"""


def test_a_new_detector_needs_only_its_description(rdaq, tmp_path):
    """A detector rdaq has no code for: two 64 x 32 ports of 12-bit pixels, 8 packets of 384
    bytes each, rows arriving upside down. Its packets are made here from the description."""
    desc = tmp_path / "toy.toml"
    desc.write_text(TOY)
    rng = np.random.default_rng(7)
    image = rng.integers(0, 4096, (32, 128), dtype=np.uint16)
    datagrams = []
    for col in range(2):
        port = image[::-1, col * 64:(col + 1) * 64].reshape(-1)  # sent upside down
        packed = np.stack([port[0::2] & 0xFF, (port[0::2] >> 8) | (port[1::2] & 0xF) << 4, port[1::2] >> 4], axis=1).astype(np.uint8).tobytes()
        for k in range(8):
            hdr = oracle.HDR.pack(1, 0, k, 0, 0, 0, 0, col, 0, 0, 0, 9, 2)
            datagrams.append(hdr + packed[k * 384:(k + 1) * 384])
    s, out = receive(rdaq, tmp_path, 1, ["--detector", str(desc)], ports=2,
                     send=lambda ports: send_udp([(d, ports[0]) for d in datagrams]))
    assert s["frames_complete"] == 1
    with h5py.File(out, "r") as f:
        assert np.array_equal(f["entry/data/data"][0], image)
        det = f["entry/instrument/detector"]
        assert det["sensor_material"][()].decode() == "CdTe" and det["x_pixel_size"][()] == pytest.approx(55e-6)


def test_a_bad_description_is_refused_naming_the_field(rdaq, tmp_path):
    desc = tmp_path / "bad.toml"
    desc.write_text(TOY.replace("payload = 384", "payload = 400"))
    r = subprocess.run([str(rdaq), "receive", "--detector", str(desc), "--port", "0", "--frames", "1"], capture_output=True, text=True, timeout=20)
    assert r.returncode != 0
    assert "links.*.payload" in r.stderr and "bad.toml" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = subprocess.run([str(rdaq), "receive", "--detector", "eiger", "--bit-depth", "24"], capture_output=True, text=True, timeout=20)
    assert r.returncode != 0 and "--bit-depth 24" in r.stderr, r.stderr


def pattern(frame, module, bits):
    """The emulator's counting pattern (rdaq_emulator::described): module pixel (x, y) of
    module m in frame f counts (131 f + 1009 m + 7 y + x) mod 2^bits."""
    y, x = np.mgrid[0:512, 0:1024]
    return (131 * frame + 1009 * module + 7 * y + x) % (1 << bits)


@pytest.mark.parametrize("bits,link,modules", [(4, "1g", 1), (12, "10g", 2), (32, "10g", 1)])
def test_an_emulated_eiger_runs_end_to_end(rdaq, tmp_path, bits, link, modules):
    frames = 30
    settings = ["--detector", "eiger", "--bit-depth", str(bits), "--link", link]
    grid = ["--modules", str(modules), "--module-cols", str(modules)]

    def emulate(_ports):
        r = subprocess.run([str(rdaq), "emulate", *settings, "--module-cols", str(modules), "--buffers", str(tmp_path / "ports.json"),
                            "--frames", str(frames), "--rate", "100"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"{frames} frames" in r.stdout
    s, out = receive(rdaq, tmp_path, frames, settings + grid, ports=4 * modules, send=emulate)
    assert s["frames_complete"] == frames and s["datagrams_dropped"] == 0
    with h5py.File(out, "r") as f:
        data = f["entry/data/data"]
        assert f["entry/data/frame_number"][:].tolist() == list(range(1, frames + 1))
        for i in (0, frames // 2, frames - 1):
            n = i + 1
            for m in range(modules):
                x0 = m * (1024 + 8)
                assert np.array_equal(data[i][:, x0:x0 + 1024], pattern(n, m, bits)), f"frame {n}, module {m}"


def test_bench_ingest_measures_both_eiger_packet_sizes(rdaq):
    r = subprocess.run([str(rdaq), "bench", "ingest", "--detector", "eiger", "--seconds", "0.2", "--frame-rates", "100", "--no-pin"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "256 packets of 1072 B" in r.stdout and "64 packets of 4144 B" in r.stdout
    rows = [line for line in r.stdout.splitlines() if line.startswith(("linerate", "burst", "spread")) and "rdaq receiver" in line]
    assert len(rows) == 6, r.stdout


def emulated_eiger_stream(rdaq, tmp_path, settings, frames, extra=()):
    """The Stream V2 messages of `rdaq receive` with `settings` and chip gap pixels, fed
    `frames` frames by `rdaq emulate` with the same settings (`extra`: more receive options)."""
    port, got = free_port(), {}
    t = threading.Thread(target=lambda: got.setdefault("m", sc.receive(f"tcp://127.0.0.1:{port}", timeout_ms=30000)))
    t.start()
    ready = tmp_path / "ports.json"
    rx = subprocess.Popen([str(rdaq), "receive", *settings, "--gap-pixels", "--port", "0", "--frames", str(frames), "--timeout-s", "30",
                           "--buffers-out", str(ready), "--stream", f"tcp://127.0.0.1:{port}", "--stream-policy", "block", *extra],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_file(ready, rx)
    subprocess.run([str(rdaq), "emulate", *settings, "--buffers", str(ready), "--frames", str(frames), "--rate", "100"], check=True, capture_output=True, timeout=60)
    o, e = rx.communicate(timeout=60)
    t.join()
    assert rx.returncode == 0, o + e
    return got["m"]


def test_an_eiger_stream_carries_counts_bit_depth_and_chip_gaps(rdaq, tmp_path):
    out = tmp_path / "e.h5"
    messages = emulated_eiger_stream(rdaq, tmp_path, ["--detector", "eiger", "--bit-depth", "8", "--link", "1g"], 10, ["--out", str(out)])
    start, images = messages[0], [m for m in messages if m["type"] == "image"]
    assert start["type"] == "start" and start["image_dtype"] == "uint8" and start["saturation_value"] == 255
    assert (start["image_size_x"], start["image_size_y"]) == (1030, 514)
    with h5py.File(out, "r") as f:
        data = f["entry/data/data"]
        assert len(images) == 10
        for i, m in enumerate(images):
            assert np.array_equal(sc.decode_array(m["data"]["data"]), data[i]), f"image {i}"
        # the chip gaps are in the stream's mask as in the file's
        assert np.array_equal(sc.decode_array(start["pixel_mask"]["data"]), f["entry/instrument/detector/pixel_mask"][:])


@pytest.mark.parametrize("capture,args,hint", [
    ("eiger_1g_dr16", ["--link", "10g"], "check --link"),
    ("eiger_10g_dr16", ["--link", "1g"], "check --link"),
    # 16-bit packets 0-127 fill an 8-bit frame "complete" with wrong pixels: the packets past
    # it are refused, named, and the run exits 1 (it exited 0 before)
    ("eiger_1g_dr16", ["--link", "1g", "--bit-depth", "8"], "sends more bits per pixel; check --bit-depth"),
    ("eiger_1g_dr16", ["--link", "1g", "--bit-depth", "12"], "sends more bits per pixel; check --bit-depth"),
    ("eiger_10g_dr16", ["--link", "10g", "--bit-depth", "8"], "sends more bits per pixel; check --bit-depth"),
    ("eiger_1g_dr8", ["--link", "1g", "--bit-depth", "16"], "fewer bits per pixel (check --bit-depth"),
])
def test_a_wrong_setting_is_named_in_the_summary_and_exits_1(rdaq, tmp_path, capture, args, hint):
    streams = globals()["capture"](capture)
    frames = next(c[3] for c in CAPTURES if c[0] == capture)
    s, _ = receive(rdaq, tmp_path, frames, ["--detector", "eiger", *args], rc=1, timeout_s=4,
                   send=lambda ports: send_udp([(p, ports[i]) for i, st in enumerate(streams) for p in st]))
    assert any(hint in h for h in s["hints"]), s["hints"]
    assert hint in s["stdout"] + s["stderr"] and "loss        : YES" in s["stdout"]


def test_another_detectors_packets_are_named(rdaq, tmp_path):
    """JUNGFRAU packets (8192 pixel bytes) sent to an EIGER receiver are larger than any of
    its packets: refused, the hint names the detType, exit 1."""
    jungfrau = read_capture(pathlib.Path(__file__).parent / "data" / "sls-jungfrau-virtual" / "jungfrau_virtual.bin")
    s, _ = receive(rdaq, tmp_path, 3, ["--detector", "eiger"], rc=1, timeout_s=3,
                   send=lambda ports: send_udp([(p, ports[0]) for p in jungfrau]))
    assert dict(s["dropped_by_reason"]) == {"oversized": len(jungfrau)}
    assert any("detType 3 (JUNGFRAU)" in h and "check --detector" in h for h in s["hints"]), s["hints"]


def test_a_partial_readout_is_named(rdaq, tmp_path):
    """The virtual EIGER with readnrows 128 sends the first half of each port's packets
    (capture README); rdaq takes full readouts only, and says which settings could explain
    frames that all end at the same packet."""
    streams = [[p for p in st if oracle.header(p)["packet"] < 128] for st in capture("eiger_1g_dr16")]
    s, _ = receive(rdaq, tmp_path, 3, ["--detector", "eiger", "--link", "1g"], rc=1, timeout_s=3,
                   send=lambda ports: send_udp([(p, ports[i]) for i, st in enumerate(streams) for p in st]))
    assert s["frames_incomplete"] == 3
    assert any("sends 128 of the 256 packets per port" in h and "partial readout" in h for h in s["hints"]), s["hints"]


def test_detector_and_format_exclude_each_other(rdaq):
    r = subprocess.run([str(rdaq), "receive", "--detector", "eiger", "--format", "sls"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 2 and "cannot be used with" in r.stderr, r.stderr


def test_rdaq_run_emulates_an_eiger_in_process(rdaq, tmp_path):
    """`rdaq run` with `detector.name = "eiger"`: the EIGER's own packets (two modules side by
    side, 12 bits) go to a receiver in this process that takes them as `rdaq receive
    --detector eiger` does; every module of the frames checked has the emulator's pattern,
    the manifest lists every module frame, and settings that do not fit are refused naming
    the field."""
    frames, bits = 20, 12
    conf = tmp_path / "eiger.toml"
    conf.write_text(f'[detector]\nname = "eiger"\nbit_depth = {bits}\nmodules = 2\nmodule_cols = 2\n[emulator]\nframes = {frames}\n'
                    f'rate_hz = 100\n[stream]\nendpoint = "none"\npreview = "none"\n[output]\ndir = "{tmp_path}"\nname = "eiger"\n')
    r = subprocess.run([str(rdaq), "run", "--config", conf, "--summary-json", tmp_path / "s.json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["frames_complete"] == s["frames_written"] == frames and s["processing"] is None, s
    with h5py.File(tmp_path / "eiger_master.h5", "r") as f:
        data = f["entry/data/data"]
        assert data.dtype == np.uint16 and data.shape[1:] == (512, 2 * 1024 + 8)
        assert f["entry/data/frame_number"][:].tolist() == list(range(frames))
        for i in (0, frames // 2, frames - 1):
            for m in range(2):
                x0 = m * (1024 + 8)
                assert np.array_equal(data[i][:, x0:x0 + 1024], pattern(i, m, bits)), f"frame {i}, module {m}"
    assert len((tmp_path / "eiger_manifest.csv").read_text().splitlines()) == 1 + 2 * frames
    eiger = '[detector]\nname = "eiger"\n'
    for text, field in [(eiger + '[process]\nmode = "jungfrau"\n', "process"), (eiger + "[faults]\nloss = 0.1\n", "faults"),
                        ('[detector]\nname = "jungfrau"\nbit_depth = 12\n', "detector.bit_depth"),
                        (eiger + 'link = "100g"\n', "detector.link"), ('[detector]\nname = "nosuch"\n', "detector.name")]:
        bad = tmp_path / "bad.toml"
        bad.write_text(text + f'[output]\ndir = "{tmp_path / "bad"}"\n')
        r = subprocess.run([str(rdaq), "run", "--config", bad], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and field in r.stderr and len(r.stderr.strip().splitlines()) == 1, (text, r.stderr)
