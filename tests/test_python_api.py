"""The Python API (`import rdaq`, crates/py, installed into the venv by scripts/setup.sh):
a Python receiver gets frames from the emulator bit-exact with its manifest, as numpy
arrays that lie inside the receiver's ring (no copy); misuse raises clearly and never
reads a slot the receiver owns again."""
import ctypes
import gc
import pathlib
import subprocess
import sys
import time

import h5py
import hdf5plugin  # noqa: F401
import numpy as np
import pytest
import xxhash

import rdaq
from conftest import RDAQ
from test_control_api import daemons  # noqa: F401 (a fixture)

MODULE_ROWS, MODULE_COLS = 512, 1024


def test_frames_arrive_bit_exact_in_place_as_numpy_arrays():
    frames, modules = 12, 2
    # a slot for every frame: a consumer descheduled on a busy machine never fills the ring
    with rdaq.Receiver(modules=modules, frames=frames, slots=16) as rx:
        start, end = rx.ring
        emu = rdaq.Emulator(rx.buffer_map, frames=frames, rate=200)
        emu.start()
        got = {}
        for f in rx:
            with f:
                a = np.asarray(f)
                assert a.dtype == np.uint16 and a.shape == (modules * MODULE_ROWS, MODULE_COLS) == f.shape
                assert not a.flags.writeable and not a.flags.owndata
                # no copy: the array's memory is the receiver's slot
                addr = a.__array_interface__["data"][0]
                assert start <= addr and addr + a.nbytes <= end, (hex(addr), hex(start), hex(end))
                assert f.complete and f.status == "complete" and not f.missing_mask.any()
                got[f.number] = [xxhash.xxh3_64_intdigest(a[m * MODULE_ROWS:(m + 1) * MODULE_ROWS].tobytes()) for m in range(modules)]
                del a
        manifest = emu.join()
        c = rx.counters()
        assert c["frames_complete"] == frames and c["dropped"] == 0 and c["ring"]["slots"] == 16, c
    assert len(manifest) == frames * modules
    want = {}
    for frame, module, h in manifest:
        want.setdefault(frame, [None] * modules)[module] = h
    assert got == want


def test_release_with_arrays_alive_is_refused_and_released_frames_raise():
    with rdaq.Receiver(modules=1, frames=3, slots=4) as rx:
        emu = rdaq.Emulator(rx.buffer_map, frames=3, rate=100)
        emu.start()
        f = rx.next_frame(timeout=20)
        assert f is not None
        a = f.array
        view = memoryview(f)
        with pytest.raises(BufferError, match="still read its slot"):
            f.release()
        assert int(a[0, 0]) == int(np.asarray(view)[0, 0])
        del a, view
        gc.collect()
        f.release()
        assert f.released
        with pytest.raises(rdaq.FrameReleased, match=f"frame {f.number} was released"):
            np.asarray(f)
        with pytest.raises(rdaq.FrameReleased):
            f.array
        with pytest.raises(rdaq.FrameReleased):
            f.missing_mask
        f.release()  # twice: nothing more to give back
        # writing through the buffer protocol is refused: the receiver owns the data
        g = rx.next_frame(timeout=20)
        with pytest.raises((BufferError, TypeError), match="writable|read-only"):
            (ctypes.c_char * 16).from_buffer(g)  # needs a writable buffer
        assert not np.asarray(g).flags.writeable
        g.release()
        # frames dropped without release give their slots back (the 3rd still arrives)
        h = rx.next_frame(timeout=20)
        assert h is not None
        del h
        emu.join()


def test_frames_freed_by_python_give_their_slots_back():
    # three slots (one held here, one queued, one filling), twelve frames: without the
    # slots coming back, frames would be refused after the third
    with rdaq.Receiver(modules=1, frames=12, slots=3) as rx:
        emu = rdaq.Emulator(rx.buffer_map, frames=12, rate=20)
        emu.start()
        numbers = [f.number for f in rx]  # each frame is freed when the next one is bound
        emu.join()
        assert numbers == list(range(12))
        assert rx.counters()["frames_refused"] == 0


def test_bad_arguments_raise_with_the_field_named():
    with pytest.raises(ValueError, match="bind"):
        rdaq.Receiver(bind="not-an-address")
    with pytest.raises(ValueError, match="policy"):
        rdaq.Receiver(policy="sometimes")
    with pytest.raises(ValueError, match="engine"):
        rdaq.Receiver(engine="carrier-pigeon")
    with pytest.raises(ValueError, match="slots"):
        rdaq.Receiver(slots=1)
    with pytest.raises(ValueError, match="buffer_map"):
        rdaq.Emulator("{}")
    with pytest.raises(ValueError, match="rate"):
        rdaq.Emulator(rdaq.Receiver().buffer_map, rate=-1)
    with pytest.raises(TypeError):
        rdaq.Receiver(modules="two")
    rx = rdaq.Receiver()
    rx.close()
    with pytest.raises(ValueError, match="closed"):
        rx.next_frame(timeout=0.1)
    with pytest.raises(ValueError, match="timeout"):
        rdaq.Receiver().next_frame(timeout=-1)


# ---- the processing stages on numpy arrays ----

ROWS, COLS = 512, 1024


def calibration(rng):
    pedestal = np.stack([rng.normal(m, 0.03 * m, (ROWS, COLS)) for m in (2450, 13600, 14100)]).astype(np.float32)
    gain = np.stack([rng.normal(m, abs(0.02 * m), (ROWS, COLS)) for m in (41.0, -1.439, -0.1145)]).astype(np.float32)
    return pedestal, gain


def test_convert_is_bit_exact_with_aare():
    import aare
    rng = np.random.default_rng(3)
    pedestal, gain = calibration(rng)
    codes = rng.choice(np.array([0, 1, 2, 3], dtype=np.uint16), size=(ROWS, COLS), p=[0.8, 0.1, 0.02, 0.08])
    raw = (codes << 14) | rng.integers(0, 1 << 14, size=(ROWS, COLS), dtype=np.uint16)
    kev = rdaq.convert(raw, pedestal, gain, invalid_gain="g0")  # aare treats code 10 as G0
    ref = aare.apply_calibration(raw[None], pd=pedestal, cal=gain)[0]
    normal = (raw != 0xC000) & (raw != 0x4000) & (raw != 0xFFFF)
    assert kev.dtype == np.float32 and kev.shape == raw.shape
    assert np.array_equal(kev[normal].view(np.uint32), ref[normal].view(np.uint32))
    with pytest.raises(TypeError):
        rdaq.convert(raw.astype(np.int32), pedestal, gain)
    with pytest.raises(ValueError, match="raw: shape"):
        rdaq.convert(raw[:100], pedestal, gain)
    with pytest.raises(ValueError, match="pedestal and gain"):
        rdaq.Converter(pedestal[:2], gain[:2])
    with pytest.raises(ValueError, match="invalid_gain"):
        rdaq.Converter(pedestal, gain, invalid_gain="g7")


def test_pedestal_is_bit_exact_with_aare():
    import aare
    rng = np.random.default_rng(4)
    rows, cols, window = 64, 128, 16
    dark = np.clip(rng.normal(2450, 12, (40, rows, cols)), 0, 16383).astype(np.uint16)
    ours, ref = rdaq.Pedestal(rows, cols, window=window), aare.Pedestal_d(rows, cols, window)
    for frame in dark:
        ours.push(frame)
        ref.push(frame)
    assert ours.frames == 40
    assert np.array_equal(ours.mean().view(np.uint32), ref.mean().astype(np.float32).view(np.uint32))
    with pytest.raises(ValueError, match="raw: shape"):
        ours.push(dark[0, :10])


def test_compress_gives_chunks_the_bitshuffle_library_reads():
    import bitshuffle
    rng = np.random.default_rng(5)
    counts = rng.poisson(0.05, (ROWS, COLS)).astype(np.int32)
    chunk = rdaq.compress(counts)
    total, block = int.from_bytes(chunk[:8], "big"), int.from_bytes(chunk[8:12], "big")
    assert total == counts.nbytes
    back = bitshuffle.decompress_lz4(np.frombuffer(chunk[12:], np.uint8), counts.shape, counts.dtype, block // counts.itemsize)
    assert np.array_equal(back, counts)
    assert len(chunk) < counts.nbytes / 10
    with pytest.raises(ValueError, match="codec"):
        rdaq.compress(counts, codec="gzip")
    with pytest.raises(ValueError, match="contiguous"):
        rdaq.compress(counts[:, ::2])


@pytest.mark.usefixtures("rdaq")  # the conftest fixture: the CLI is built
def test_find_spots_equals_the_cli(tmp_path):
    import h5py
    rng = np.random.default_rng(6)
    img = rng.poisson(0.02, (ROWS, COLS)).astype(np.float32) * 12.4
    yy, xx = np.mgrid[0:ROWS, 0:COLS]
    for x, y in rng.uniform(20, [COLS - 20, ROWS - 20], (30, 2)):
        img += (200 * np.exp(-((xx - x) ** 2 + (yy - y) ** 2) / 2.0)).astype(np.float32)
    spots = rdaq.find_spots(img, threshold=6.2)
    assert spots.shape[1] == 4 and len(spots) >= 25
    with h5py.File(tmp_path / "img.h5", "w") as f:
        f["entry/data/data"] = img[None]
    subprocess.run([str(RDAQ), "process", "spots", "--input", tmp_path / "img.h5", "--output", tmp_path / "spots.h5",
                    "--threshold", "6.2"], check=True, capture_output=True)
    with h5py.File(tmp_path / "spots.h5", "r") as f:
        n = f["entry/result_1/nPeaks"][0]
        cli = np.stack([f["entry/result_1/" + k][0, :n] for k in ("peakXPosRaw", "peakYPosRaw", "peakTotalIntensity", "peakNPixels")], axis=1)
    assert np.array_equal(spots, cli)
    with pytest.raises(TypeError):
        rdaq.find_spots(img.astype(np.float64), threshold=6.2)
    with pytest.raises(ValueError, match="threshold"):
        rdaq.find_spots(img, threshold=0)


@pytest.mark.usefixtures("rdaq")
def test_a_runs_finder_settings_find_its_spots_again(tmp_path):
    """run_finder reads the settings a processed run kept in its master: find_spots with them
    on the run's keV images gives the run's spot lists."""
    (tmp_path / "kev.toml").write_text('[process]\noutput = "kev"\n')
    subprocess.run([str(RDAQ), "run", "--frames", "40", "--config", str(tmp_path / "kev.toml"), "--out", str(tmp_path / "run")],
                   check=True, capture_output=True, timeout=300)
    master = tmp_path / "run" / "rdaq_run_master.h5"
    kw = rdaq.run_finder(master)
    assert kw == {"threshold": pytest.approx(6.2), "snr": 3.0, "box_half": 15, "min_pixels": 4, "max_pixels": 200}
    with h5py.File(master, "r") as f:
        r = f["entry/result_1"]
        assert len(r["nPeaks"]) > 0
        for i in range(len(r["nPeaks"])):
            n = r["nPeaks"][i]
            run = np.stack([r[k][i, :n] for k in ("peakXPosRaw", "peakYPosRaw", "peakTotalIntensity", "peakNPixels")], axis=1)
            again = rdaq.find_spots(np.ascontiguousarray(f["entry/data/data"][i], dtype=np.float32), **kw)
            assert np.array_equal(again, run), i
    assert rdaq.run_converter(master) == {"invalid_gain": "error"}
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["entry/data/data"] = np.zeros((1, 4, 4), np.float32)
    assert rdaq.run_finder(tmp_path / "plain.h5") is None and rdaq.run_converter(tmp_path / "plain.h5") is None


@pytest.mark.usefixtures("rdaq")
def test_a_raw_runs_conversion_settings_are_kept(tmp_path):
    """A raw run's master keeps the settings it would have processed with: run_converter
    gives its conversion rule (here `process.invalid_gain = "g2"`), run_finder nothing (the
    images are raw words)."""
    (tmp_path / "g2.toml").write_text('[process]\ninvalid_gain = "g2"\nmode = "raw"\n')
    subprocess.run([str(RDAQ), "run", "--frames", "4", "--config", str(tmp_path / "g2.toml"), "--out", str(tmp_path / "raw")],
                   check=True, capture_output=True, timeout=300)
    master = tmp_path / "raw" / "rdaq_run_master.h5"
    assert rdaq.run_converter(master) == {"invalid_gain": "g2"}
    assert rdaq.run_finder(master) is None


def test_the_readme_example_runs():
    import pathlib
    import re
    text = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 10 and all(" complete " in ln for ln in lines), out.stdout


@pytest.mark.usefixtures("rdaq")
def test_the_api_bench_measures_all_three_consumers():
    # a smoke run of the command (the numbers belong to bench/RESULTS.md, not to a test)
    out = subprocess.run([str(RDAQ), "bench", "api", "--frames", "40", "--drain-frames", "8", "--rounds", "1", "--rate", "200"],
                         capture_output=True, text=True, timeout=120, cwd=RDAQ.parent.parent.parent)
    assert out.returncode == 0, out.stderr
    for row in ["Rust (Receiver::frames)", "C API (rdaq_next_frame, rdaq_release)", "Python (for frame in rdaq.Receiver)"]:
        assert out.stdout.count(row) == 2, out.stdout
    assert "not measured" not in out.stdout, out.stdout


# ---- the control client and the stream consumer ----

def test_control_client_drives_the_receiver_daemon_and_reports_refusals(daemons):
    from test_control_api import request
    dr = rdaq.control.Receiver(daemons["dr0"], token="")
    det = rdaq.control.Detector(daemons["det"], token="")
    assert dr.telegram()["name"] == "dr0" and det.telegram()["modules"] == 2
    with pytest.raises(rdaq.control.ApiError, match="slots") as e:
        dr.buffers(request(slots=1))
    assert e.value.status == 400
    m = dr.buffers(request())
    assert m["modules"] == 2 and dr.status()["state"] == "configured"
    answer = dr.start()
    assert answer["state"] == "acquiring" and dr.status()["state"] == "acquiring"
    with pytest.raises(rdaq.control.ApiError, match="already running") as e:
        dr.start()
    assert e.value.status == 409
    stop = dr.stop()
    assert stop["frames_complete"] == 0 and dr.status()["state"] == "configured"
    page = dr.events(since=answer["events_from"])
    assert page["next"] >= answer["events_from"]
    assert "rdaq_frames_complete_total" in dr.metrics()
    with pytest.raises(rdaq.control.ApiError, match="cannot reach"):
        rdaq.control.Receiver("http://127.0.0.1:9", timeout=2).status()


@pytest.mark.usefixtures("rdaq")
def test_stream_consumer_yields_the_images_of_the_file(tmp_path):
    import threading

    import h5py
    import hdf5plugin  # noqa: F401

    from conftest import free_port
    port = free_port()
    got, failed = [], []

    def consume():
        try:
            got.extend(rdaq.stream.messages(f"tcp://127.0.0.1:{port}", timeout_ms=20000))
        except Exception as e:  # reported below; the run then ends by its timeout
            failed.append(e)
    t = threading.Thread(target=consume)
    t.start()
    r = subprocess.run([str(RDAQ), "run", "--frames", "12", "--out", str(tmp_path), "--stream", f"tcp://127.0.0.1:{port}",
                        "--stream-policy", "block", "--preview", "none"], capture_output=True, text=True, timeout=90)
    t.join()
    assert not failed, failed
    assert r.returncode == 0, r.stderr
    assert got[0]["type"] == "start" and got[-1]["type"] == "end"
    images = [m for m in got if m["type"] == "image"]
    with h5py.File(tmp_path / "rdaq_run_master.h5", "r") as f:
        data = f["entry/data/data"]
        assert len(images) == data.shape[0] > 0
        for i, m in enumerate(images):
            assert m["image"].dtype == data.dtype and np.array_equal(m["image"], data[i]), f"image {i}"
    with pytest.raises(ValueError, match="chunk"):
        rdaq.decompress(b"not a chunk", 4)


def test_incomplete_frames_mark_exactly_their_missing_pixels():
    with rdaq.Receiver(modules=1, frames=8, frame_timeout_ms=100) as rx:
        emu = rdaq.Emulator(rx.buffer_map, frames=8, rate=50, loss=0.03, retransmit=False, seed=3)
        emu.start()
        incomplete = 0
        for f in rx:
            with f:
                mask, a = f.missing_mask, np.asarray(f)
                assert mask.shape == a.shape and mask.dtype == np.bool_
                if f.complete:
                    assert not mask.any()
                else:
                    incomplete += 1
                    # a lost datagram carries 4096 pixels; the receiver fills them with 0xFFFF
                    assert mask.sum() > 0 and mask.sum() % 4096 == 0
                    assert np.all(a[mask] == 0xFFFF)
                del mask, a
        emu.join()
    assert incomplete > 0
    with pytest.raises(ValueError, match="loss"):
        rdaq.Emulator(rdaq.Receiver().buffer_map, loss=2.0)


def test_an_acquisition_hands_its_processed_frames_as_numpy_arrays_in_place(tmp_path):
    """rdaq.Acquisition runs what `rdaq run` runs, from the same configuration file; its
    frames' photon counts are the processing graph's buffer, read by numpy without a copy,
    and equal the frames the files hold (their type and markers too); the summary is `rdaq
    run`'s."""
    (tmp_path / "run.toml").write_text('[stream]\nendpoint = "none"\npreview = "none"\n[output]\nname = "py"\n')
    got = {}
    with rdaq.Acquisition(config=tmp_path / "run.toml", frames=12, rate_hz=50, out=tmp_path) as acq:
        assert acq.shape == (2 * 512 + 36, 1024)
        for frame in acq:
            a = np.asarray(frame)
            assert a.dtype in (np.int16, np.int32) and a.shape == acq.shape and not a.flags.writeable
            # no copy: the array is the frame's buffer, which stays until released
            assert np.shares_memory(a, frame.array)
            with pytest.raises(BufferError):
                frame.release()
            got[frame.number] = (a.copy(), frame.hit, len(frame.spots))
            del a
            frame.release()
            with pytest.raises(rdaq.FrameReleased):
                np.asarray(frame)
    s = acq.summary
    assert s["frames_written"] == len(got) > 0 and s["processing"]["hits"] == len(got)
    with h5py.File(tmp_path / "py_master.h5", "r") as f:
        numbers = f["entry/data/frame_number"][:].tolist()
        assert sorted(numbers) == sorted(got)
        for i, n in enumerate(numbers):
            counts, hit, spots = got[n]
            # the file's counts, in its type (markers included)
            assert f["entry/data/data"].dtype == counts.dtype and np.array_equal(f["entry/data/data"][i], counts), f"frame {n}"
            assert hit and f["entry/result_1/nPeaks"][i] == spots


def test_an_acquisition_is_stopped_and_read_from_another_thread_while_one_iterates(tmp_path):
    """Stopping from another thread is how an acquisition is ended early: while one thread
    iterates, another reads its properties and stops it, and the iteration ends with the
    summary of the frames sent."""
    import threading
    (tmp_path / "run.toml").write_text('[stream]\nendpoint = "none"\npreview = "none"\n')
    acq = rdaq.Acquisition(config=tmp_path / "run.toml", frames=100000, rate_hz=50, out=tmp_path)
    seen, ended = [], threading.Event()

    def iterate():
        for frame in acq:
            seen.append(frame.number)
            frame.release()
        ended.set()

    t = threading.Thread(target=iterate)
    t.start()
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seen, "frames came"
    assert acq.shape == (2 * 512 + 36, 1024) and acq.ports == [] and acq.summary is None
    acq.stop()
    assert ended.wait(60), "the iterating thread ended after stop()"
    t.join()
    s = acq.summary
    assert s["stopped_early_of"] == 100000 and s["frames_expected"] < 100000 and s["frames_written"] == len(seen), s


def test_an_acquisition_refuses_a_raw_configuration(tmp_path):
    (tmp_path / "raw.toml").write_text('[process]\nmode = "raw"\n')
    with pytest.raises(ValueError, match="process.mode"):
        rdaq.Acquisition(config=tmp_path / "raw.toml")
    (tmp_path / "bad.toml").write_text('[process]\nveto = "yes"\n')
    with pytest.raises(ValueError, match="process.veto"):
        rdaq.Acquisition(config=tmp_path / "bad.toml")


def test_a_chunk_claiming_more_than_it_holds_is_a_value_error():
    """A 28-byte chunk whose header claims 32 GiB: refused before anything is allocated."""
    chunk = (32 << 30).to_bytes(8, "big") + (8192).to_bytes(4, "big") + bytes(16)
    with pytest.raises(ValueError, match="claims"):
        rdaq.decompress(chunk, 2, "lz4")


def test_arrays_asked_for_are_bounded_before_they_are_allocated():
    with pytest.raises(MemoryError, match="Pedestal: 1000000x1000000 pixels"):
        rdaq.Pedestal(10**6, 10**6)
    with pytest.raises(MemoryError, match="radius_map"):
        rdaq.radius_map(10**6, 10**6, 0, 0)
    with pytest.raises(MemoryError):
        rdaq.Pedestal(2**63, 4)
    with pytest.raises(ValueError, match="no pixel"):
        rdaq.Pedestal(0, 1024)
    assert rdaq.radius_map(4, 2, 0, 0).shape == (2, 4)


def test_closing_a_receiver_another_thread_iterates_ends_that_iteration():
    """As the C API's close does: the waiting thread is woken (its loop ends), no error."""
    import threading
    rx = rdaq.Receiver(modules=1)
    seen, errors = [], []

    def iterate():
        try:
            seen.extend(f.number for f in rx)
        except Exception as e:  # noqa: BLE001 - the test reports any
            errors.append(e)

    t = threading.Thread(target=iterate)
    t.start()
    time.sleep(0.3)
    rx.close()
    t.join(timeout=10)
    assert not t.is_alive(), "the iterating thread was woken"
    assert errors == [] and seen == []
    with pytest.raises(ValueError, match="closed"):
        rx.next_frame(timeout=0.1)
    rx.close()
