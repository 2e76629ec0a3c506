"""The descramble stage on the example integrating detector `percival-like`
(detectors/percival-like.toml: an example of PERCIVAL's kind, not its real readout): scrambled
packets are made here by numpy from an original image and its reset frame, `rdaq receive
--detector percival-like` descrambles them, and its planes must equal both an independent
numpy descrambler's and the fields of the original image. The emulator's scrambling is
checked end to end the same way."""
import struct
import subprocess

import h5py
import hdf5plugin  # noqa: F401
import numpy as np

from test_eiger import receive
from conftest import send_udp

W, H, PORT_W, ADCS, PACKET = 1024, 512, 512, 8, 8192
FIELDS = [("gain", 0, 2, False), ("fine", 2, 8, True), ("coarse", 10, 5, True)]  # name, shift, bits, minus reset
HDR = struct.Struct("<QIIQQHHHHIHBB")
DET_TYPE = 100


def readout_columns():
    """Readout position k of a port row carries column (k % 8) * 64 + k // 8."""
    k = np.arange(PORT_W)
    return (k % ADCS) * (PORT_W // ADCS) + k // ADCS


def scramble(image):
    """The two port images of a module image as sent: each row in readout order."""
    cols = readout_columns()
    return [image[:, p * PORT_W:(p + 1) * PORT_W][:, cols] for p in range(2)]


def descramble(ports):
    """numpy's descramble of raw port images (words in readout order) into the module image."""
    cols = readout_columns()
    image = np.empty((H, W), np.uint16)
    for p, raw in enumerate(ports):
        block = np.empty((H, PORT_W), np.uint16)
        block[:, cols] = raw
        image[:, p * PORT_W:(p + 1) * PORT_W] = block
    return image


def planes(data, reset):
    """The fields of the data words, minus the reset words' where the field says so, stacked."""
    out = []
    for _, shift, bits, minus in FIELDS:
        f = lambda w: ((w.astype(np.int32) >> shift) & ((1 << bits) - 1))  # noqa: E731
        out.append((f(data) - (f(reset) if minus else 0)).astype(np.int16))
    return np.concatenate(out, axis=0)


def packets(frame, image):
    out = []
    for p, port in enumerate(scramble(image)):
        b = port.astype("<u2").tobytes()
        for k in range(len(b) // PACKET):
            out.append(HDR.pack(frame, 0, k, 0, 0, 0, 0, p, 0, 0, 0, DET_TYPE, 2) + b[k * PACKET:(k + 1) * PACKET])
    return out


def test_descrambled_planes_equal_numpy_and_the_original_image(rdaq, tmp_path):
    rng = np.random.default_rng(19)
    originals = {}
    datagrams = []
    for frame in (2, 4):  # reset frame 2n, data frame 2n + 1
        reset, data = (rng.integers(0, 1 << 15, (H, W), dtype=np.uint16) for _ in range(2))
        originals[frame + 1] = (data, reset)
        datagrams += packets(frame, reset) + packets(frame + 1, data)
    s, out = receive(rdaq, tmp_path, 4, ["--detector", "percival-like"], ports=2,
                     send=lambda ports: send_udp([(d, ports[0]) for d in datagrams]))
    assert s["frames_complete"] == 4 and s["frames_written"] == 2 and s["reset_frames"] == 2
    with h5py.File(out, "r") as f:
        got = f["entry/data/data"]
        assert got.dtype == np.int16 and got.shape[1:] == (3 * H, W)
        for i, n in enumerate(f["entry/data/frame_number"][:]):
            data, reset = originals[n]
            # numpy descrambles the same raw words independently...
            raw_data, raw_reset = scramble(data), scramble(reset)
            by_numpy = planes(descramble(raw_data), descramble(raw_reset))
            assert np.array_equal(got[i], by_numpy), f"frame {n}"
            # ...and that is the original image's fields
            assert np.array_equal(by_numpy, planes(data, reset))


def test_frames_without_their_partner_are_counted_and_not_written(rdaq, tmp_path):
    rng = np.random.default_rng(3)
    image = rng.integers(0, 1 << 15, (H, W), dtype=np.uint16)
    # frame 2 (a reset frame) and frame 7 (the data frame of reset frame 6) never sent
    datagrams = packets(3, image) + packets(4, image) + packets(5, image) + packets(6, image)
    s, out = receive(rdaq, tmp_path, 4, ["--detector", "percival-like"], ports=2, rc=1,
                     send=lambda ports: send_udp([(d, ports[1]) for d in datagrams]))
    assert s["frames_written"] == 1 and s["data_without_reset"] == 1 and s["reset_frames"] == 1
    assert s["unused_reset_frames"] == 1
    assert "1 data frames without their reset frame" in s["stdout"]
    assert "1 reset frames without their data frame (not used)" in s["stdout"]


def test_an_emulated_detector_is_descrambled_end_to_end(rdaq, tmp_path):
    frames = 20  # 10 reset + 10 data frames, numbered from 2

    def emulate(_ports):
        r = subprocess.run([str(rdaq), "emulate", "--detector", "percival-like", "--buffers", str(tmp_path / "ports.json"),
                            "--frames", str(frames), "--rate", "100"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    s, out = receive(rdaq, tmp_path, frames, ["--detector", "percival-like"], ports=2, send=emulate)
    assert s["frames_complete"] == frames and s["frames_written"] == frames // 2
    y, x = np.mgrid[0:H, 0:W]
    word = lambda f: ((131 * f + 7 * y + x) % (1 << 16)).astype(np.uint16)  # noqa: E731 (the emulator's pattern)
    with h5py.File(out, "r") as f:
        numbers = f["entry/data/frame_number"][:].tolist()
        assert numbers == list(range(3, 2 + frames, 2))
        for i in (0, len(numbers) - 1):
            n = numbers[i]
            assert np.array_equal(f["entry/data/data"][i], planes(word(n), word(n - 1))), f"frame {n}"


def test_a_reset_frame_that_finishes_late_still_pairs_and_masks_what_it_lost(rdaq, tmp_path):
    rng = np.random.default_rng(5)
    reset, data = (rng.integers(0, 1 << 15, (H, W), dtype=np.uint16) for _ in range(2))
    first = packets(2, reset)
    del first[7]  # port 0, packet 7: port rows 56..63
    datagrams = first + packets(3, data) + packets(4, reset) + packets(5, data)
    s, out = receive(rdaq, tmp_path, 4, ["--detector", "percival-like"], ports=2, rc=1,
                     send=lambda ports: send_udp([(d, ports[0]) for d in datagrams]))
    # frame 3 completes before its reset frame, which finishes at its timeout
    assert s["frames_incomplete"] == 1 and s["frames_written"] == 2 and s["data_without_reset"] == 0
    with h5py.File(out, "r") as f:
        numbers = f["entry/data/frame_number"][:].tolist()
        assert sorted(numbers) == [3, 5]
        i = numbers.index(3)
        expect = planes(data, reset)
        rows = np.r_[56:64]
        keep = np.ones(3 * H, bool)
        for k in range(3):
            keep[k * H + rows] = False
        assert np.array_equal(f["entry/data/data"][i][keep][:, :512], expect[keep][:, :512])
        mask = f["entry/data/incomplete_pixel_mask"][0]
        masked = np.unique(np.nonzero(mask)[0]).tolist()
        assert masked == [k * H + r for k in range(3) for r in rows], masked
