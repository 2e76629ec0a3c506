"""Stream V2 as DECTRIS specifies it: every message of `rdaq run`
(processed and raw) and of an EIGER received by `rdaq receive` is read by a strict reader
written from the specification's field tables (tests/stream_v2_strict.py), and the values
are true: times follow the exposure, the series' date is one, number_of_images says what
the detector takes (the veto sends fewer; docs/stream.md), and the flags say what rdaq does
to the pixels."""
import datetime
import subprocess
import threading

import h5py
import hdf5plugin  # noqa: F401
import pytest

import stream_consumer as sc
import stream_v2_strict as strict
import test_eiger
from conftest import free_port


def checked(messages):
    """The messages of one series, each free of problems; (start, images, end)."""
    assert [m["type"] for m in messages[:1] + messages[-1:]] == ["start", "end"], [m["type"] for m in messages]
    for m in messages:
        assert strict.problems(m) == [], strict.problems(m)
    return messages[0], [m for m in messages if m["type"] == "image"], messages[-1]


def times_follow_the_exposure(start, images):
    count = start["count_time"]
    dates = {m["series_date"] for m in images}
    assert len(dates) == 1, "one series date"
    assert dates.pop() >= start["arm_date"], "the series starts after it was armed"
    last = -1.0
    for m in images:
        a, b = strict.seconds(m["start_time"]), strict.seconds(m["stop_time"])
        assert strict.seconds(m["real_time"]) == pytest.approx(count, abs=1e-9)
        assert b - a == pytest.approx(count, abs=1e-9) and a >= 0
        assert a >= last, "images in the order of their exposure"
        last = a


@pytest.mark.parametrize("mode", ["processed", "raw"])
def test_a_runs_stream_reads_strictly_and_says_what_is_true(rdaq, tmp_path, mode):
    port, got = free_port(), {}
    t = threading.Thread(target=lambda: got.setdefault("m", sc.receive(f"tcp://127.0.0.1:{port}", timeout_ms=30000)))
    t.start()
    extra = ["--raw"] if mode == "raw" else []
    r = subprocess.run([rdaq, "run", "--frames", "60", "--rate", "100", "--out", tmp_path, "--stream", f"tcp://127.0.0.1:{port}",
                        "--stream-policy", "block", "--preview", "none", *extra], capture_output=True, text=True, timeout=180)
    t.join()
    assert r.returncode == 0, r.stdout + r.stderr
    start, images, end = checked(got["m"])
    assert start["count_time"] == start["frame_time"] == pytest.approx(0.01)
    assert start["number_of_images"] == 60, "the detector's images, whatever the veto sends"
    assert start["countrate_correction_enabled"] is False and start["flatfield_enabled"] is False
    assert start["flatfield"] == {} and start["threshold_energy"] == {} and start["countrate_correction_lookup_table"].value == b""
    assert start["pixel_mask_enabled"] is True and start["virtual_pixel_interpolation_enabled"] is False
    with h5py.File(tmp_path / "rdaq_run_master.h5", "r") as f:
        assert start["detector_description"] == f["entry/instrument/detector/description"][()].decode()
        assert start["arm_date"] == datetime.datetime.fromisoformat(f["entry/start_time"][()].decode().replace("Z", "+00:00"))
        assert len(images) == f["entry/data/data"].shape[0]
    if mode == "processed":
        assert 0 < len(images) < 60, "the veto sent only the hits"
    else:
        assert len(images) == 60
    times_follow_the_exposure(start, images)


def test_an_eiger_stream_reads_strictly_with_its_settings(rdaq, tmp_path):
    settings = ["--detector", "eiger", "--bit-depth", "12", "--link", "10g"]
    messages = test_eiger.emulated_eiger_stream(rdaq, tmp_path, settings, 8, ["--count-time-s", "0.002", "--frame-time-s", "0.01"])
    start, images, end = checked(messages)
    assert start["number_of_images"] == 8 and len(images) == 8
    assert (start["count_time"], start["frame_time"]) == (0.002, 0.01)
    assert start["detector_description"].startswith("EIGER")
    # chip gap pixels carry shared counts: interpolated, not masked
    assert start["virtual_pixel_interpolation_enabled"] is True and start["pixel_mask_enabled"] is False
    assert start["saturation_value"] == 4095
    times_follow_the_exposure(start, images)


def test_the_strict_reader_finds_what_is_missing_or_mistyped():
    """The reader is not a formality: it names a missing field, a wrong type, a stranger."""
    good = {"type": "end", "series_id": 1, "series_unique_id": "x"}
    assert strict.problems(good) == []
    assert strict.problems({"type": "end", "series_id": 1}) == ["end: no field series_unique_id"]
    assert strict.problems({**good, "series_id": -1}) == ["end: field series_id is not of its type: -1"]
    assert strict.problems({**good, "extra": 1}) == ["end: field extra is not in the specification"]
    image = {"type": "image", "data": {}, "image_id": 0, "real_time": [0, 0], "series_date": "2026", "series_id": 0,
             "series_unique_id": "x", "start_time": [0, 1], "stop_time": [0, 1], "user_data": {}}
    p = strict.problems(image)
    assert "image: field real_time is not of its type: [0, 0]" in p and any("series_date" in x for x in p) and "image: data has no channel" in p
