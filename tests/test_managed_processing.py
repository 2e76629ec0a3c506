"""Online processing in a managed system: a topology with a `[process]` section makes every
receiver daemon take its share of the frames through the processing graph (the same as `rdaq
run`'s), and the manager's report sums their counts. All daemons on one host."""
import json
import os
import shutil
import signal
import subprocess
import time

import h5py
import hdf5plugin
import numpy as np
import pytest

from conftest import ROOT, free_port
from test_control_api import scrape
from test_readme_daemons import wait_up

FRAMES = 40


def topology(tmp_path, process, streams=("none", "none"), previews=("none", "none"), mode="temporal"):
    """The topology file of the system `run_system` starts, on ports the kernel finds free
    (kept in ports.json beside it); the receivers' data ports any free ones."""
    ports = {"det": free_port(), "dr0": free_port(), "dr1": free_port(), "mgr": free_port()}
    (tmp_path / "ports.json").write_text(json.dumps(ports))
    text = (f'[detector]\nmodules = 4\nmodule_cols = 1\ncontrol = "127.0.0.1:{ports["det"]}"\nphoton_energy_kev = 12.4\n\n'
            f'[transfer]\nmode = "{mode}"\n')
    for k, name in enumerate(("dr0", "dr1")):
        text += (f'\n[[receivers]]\nname = "{name}"\ncontrol = "127.0.0.1:{ports[name]}"\ndata = "127.0.0.1"\n'
                 f'data_port = 0\nmemory_mib = 256\nstream = "{streams[k]}"\npreview = "{previews[k]}"\n')
    text += process
    path = tmp_path / "topology.toml"
    path.write_text(text)
    return path


def run_system(rdaq, tmp_path, topo, rc=0, receiver_args=()):
    ports = json.loads((tmp_path / "ports.json").read_text())
    det, mgr_url = f"127.0.0.1:{ports['det']}", f"http://127.0.0.1:{ports['mgr']}"
    procs = [subprocess.Popen([rdaq, "emulate", "--serve", det, "--modules", "4"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)]
    try:
        wait_up(f"http://{det}/status", procs[0])
        for name in ("dr0", "dr1"):
            (tmp_path / name).mkdir()
            procs.append(subprocess.Popen([rdaq, "receive", "--serve", f"127.0.0.1:{ports[name]}", "--name", name,
                                           "--memory-mib", "256", "--out-dir", tmp_path / name, *receiver_args],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            wait_up(f"http://127.0.0.1:{ports[name]}/status", procs[-1])
        mgr = subprocess.Popen([rdaq, "manage", "--topology", topo, "--frames", str(FRAMES), "--rate", "20",
                                "--out", tmp_path / "report", "--serve", f"127.0.0.1:{ports['mgr']}"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(mgr)
        # the manager serves its dashboard until Ctrl-C once the report is written
        deadline = time.monotonic() + 120
        while not (tmp_path / "report" / "report.json").exists():
            assert mgr.poll() is None and time.monotonic() < deadline, mgr.stderr.read()
            time.sleep(0.1)
        snapshot = json.loads(wait_up(f"{mgr_url}/dashboard/snapshot", mgr))
        mgr.send_signal(signal.SIGINT)
        out, err = mgr.communicate(timeout=30)
        assert mgr.returncode == rc, out + err
        metrics = {name: scrape(f"http://127.0.0.1:{ports[name]}") for name in ("dr0", "dr1")}
        return out, snapshot, metrics
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)


@pytest.mark.parametrize("how", ["topology", "daemon"])
def test_each_receiver_processes_its_share_and_the_report_sums_them(rdaq, tmp_path, how):
    """The processing asked for in the topology's [process], or by each daemon's own
    configuration (`rdaq receive --serve --calibration emulated`). With the topology, dr0
    serves a live preview too (its `preview` endpoint), which `rdaq preview` renders."""
    viewer = None
    if how == "topology":
        port = free_port()
        topo, receiver_args = topology(tmp_path, '\n[process]\ncalibration = "emulated"\n', previews=(f"tcp://127.0.0.1:{port}", "none")), []
        viewer = subprocess.Popen([rdaq, "preview", "--from", f"tcp://127.0.0.1:{port}", "--png", tmp_path / "live.png", "--timeout-s", "60"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    else:
        topo, receiver_args = topology(tmp_path, ""), ["--calibration", "emulated"]
    stdout, snapshot, metrics = run_system(rdaq, tmp_path, topo, receiver_args=receiver_args)
    if viewer is not None:
        out, err = viewer.communicate(timeout=90)
        assert viewer.returncode == 0 and (tmp_path / "live.png").exists(), out + err
        with h5py.File(tmp_path / "dr0" / "dr0_master.h5", "r") as f:
            assert int(out.split("frame ")[1].split(",")[0]) in f["entry/data/frame_number"][:].tolist(), "a frame dr0 wrote"
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    per = {name: rep["processing"] for name, rep in report["receivers"].items()}
    assert all(p is not None for p in per.values()), per
    total = report["processing"]
    for k in ("signal_frames", "hits", "vetoed", "spots_found", "frames_written"):
        assert total[k] == sum(p[k] for p in per.values()), k
    # the emulator daemon has no chopper: every frame is a signal frame, each on one receiver
    assert total["signal_frames"] == FRAMES and total["dark_frames"] == 0
    assert total["hits"] + total["vetoed"] == FRAMES and total["hits"] > 0
    assert total["frames_written"] == total["hits"], "the veto writes hits only"
    assert "processing :" in stdout
    for name, m in metrics.items():
        assert m[("rdaq_process_hits_total", (("receiver", name),))] == per[name]["hits"], "/metrics"
    shown = snapshot["process"]
    assert {k: shown[k] for k in ("signal_frames", "hits", "vetoed", "spots_found")} == \
        {k: total[k] for k in ("signal_frames", "hits", "vetoed", "spots_found")}, "the dashboard shows the sums"
    written = 0
    for name in ("dr0", "dr1"):
        with h5py.File(tmp_path / name / f"{name}_master.h5", "r") as f:
            data = f["entry/data/data"]
            assert data.dtype in (np.int16, np.int32), "photon counts, not raw words"
            assert data.shape[0] == per[name]["frames_written"]
            assert f["entry/result_1/nPeaks"][:].min() >= 10, "every written frame is a hit"
            written += data.shape[0]
    assert written == total["frames_written"]
    # one master over both receivers' data files: every frame once, in frame order
    joined = tmp_path / "report" / "acquisition_master.h5"
    assert report["master"] == str(joined), report["master_note"]
    with h5py.File(joined, "r") as j:
        numbers = j["entry/data/frame_number"][:].tolist()
        assert numbers == sorted(numbers) and len(numbers) == written == len(set(numbers))
        data = j["entry/data/data"]
        hits = j["entry/result_1/nPeaks"][:]
        for name in ("dr0", "dr1"):
            with h5py.File(tmp_path / name / f"{name}_master.h5", "r") as f:
                for i, frame in enumerate(f["entry/data/frame_number"][:]):
                    k = numbers.index(frame)
                    assert np.array_equal(data[k], f["entry/data/data"][i]), f"frame {frame}"
                    assert hits[k] == f["entry/result_1/nPeaks"][i]
    masters = [tmp_path / name / f"{name}_master.h5" for name in ("dr0", "dr1")]
    again = subprocess.run([rdaq, "join", "--out", joined, *masters], capture_output=True, text=True)
    assert again.returncode == 2 and "exists" in again.stderr, again.stderr
    twice = subprocess.run([rdaq, "join", "--out", tmp_path / "twice_master.h5", masters[0], masters[0]], capture_output=True, text=True)
    assert twice.returncode == 2 and "is in" in twice.stderr and not (tmp_path / "twice_master.h5").exists(), twice.stderr
    if shutil.which("dials.import"):  # installed by scripts/setup.sh (Debian's package)
        env = dict(os.environ, HDF5_PLUGIN_PATH=hdf5plugin.PLUGIN_PATH)
        r = subprocess.run(["dials.import", joined], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"num images: {written}" in r.stdout, r.stdout


def test_a_bad_process_section_is_refused_before_anything_starts(rdaq, tmp_path):
    topo = topology(tmp_path, '\n[process]\nveto = "yes"\n')
    r = subprocess.run([rdaq, "manage", "--topology", topo, "--frames", "5", "--out", tmp_path / "report"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "process.veto" in r.stderr and "topology.toml" in r.stderr, r.stderr


def test_one_joined_stream_of_every_receivers_share(rdaq, tmp_path):
    """`rdaq write --stream` publishes the receivers' shares (a temporal plan: alternate
    frames) again as one Stream V2 series, without files: a consumer strict about every
    field of the specification sees one start, every frame once in frame order with
    image_id from 0, and one end; frame numbers, chunks and spot counts equal the joined
    master's."""
    import threading

    import stream_consumer as sc
    import stream_v2_strict as strict
    streams = (f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
    joined = f"tcp://127.0.0.1:{free_port()}"
    topo = topology(tmp_path, '\n[process]\ncalibration = "emulated"\n', streams)
    joiner = subprocess.Popen([rdaq, "write", "--from", streams[0], "--from", streams[1], "--stream", joined, "--stream-policy", "block",
                               "--idle-timeout-s", "60", "--summary-json", tmp_path / "j.json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got = []
    consumer = threading.Thread(target=lambda: got.extend(sc.receive(joined, timeout_ms=120000)))
    consumer.start()
    try:
        run_system(rdaq, tmp_path, topo, receiver_args=["--stream-policy", "block"])
        out, err = joiner.communicate(timeout=60)
    finally:
        joiner.kill()
    consumer.join(60)
    assert joiner.returncode == 0, out + err
    assert [m["type"] for m in got].count("start") == 1 and got[0]["type"] == "start", [m["type"] for m in got][:3]
    assert [m["type"] for m in got].count("end") == 1 and got[-1]["type"] == "end"
    for m in got:
        assert strict.problems(m) == [], strict.problems(m)
    images = [m for m in got if m["type"] == "image"]
    assert [m["image_id"] for m in images] == list(range(len(images)))
    numbers = [m["user_data"]["rdaq"]["frame_number"] for m in images]
    with h5py.File(tmp_path / "report" / "acquisition_master.h5", "r") as j:
        assert numbers == j["entry/data/frame_number"][:].tolist()
        n_peaks = j["entry/result_1/nPeaks"][:].tolist()
        for i in range(0, len(images), 7):
            assert np.array_equal(sc.decode_array(images[i]["data"]["data"]), j["entry/data/data"][i]), f"image {i}"
    kept = got[0]["user_data"]["rdaq"]["max_spots"]
    assert [len(m["user_data"]["rdaq"]["spots"]["x"]) for m in images] == [min(n, kept) for n in n_peaks]
    w = json.loads((tmp_path / "j.json").read_text())
    assert w["ended"] and w["master"] is None and w["stream"]["images_sent"] == len(images) and w["stream"]["end_sent"]
    assert got[-1]["user_data"]["rdaq"] == {"images_sent": len(images), "images_dropped": 0, "images_missing": 0}, got[-1]


def test_rdaq_write_takes_every_receivers_stream_into_one_series(rdaq, tmp_path):
    """Each receiver streams its share; `rdaq write` with one --from per receiver writes one
    series with every frame once, in frame order: the frames of the joined master."""
    streams = (f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
    topo = topology(tmp_path, '\n[process]\ncalibration = "emulated"\n', streams)
    writer = subprocess.Popen([rdaq, "write", "--from", streams[0], "--from", streams[1], "--out", tmp_path / "wr",
                               "--name", "copy", "--idle-timeout-s", "60", "--summary-json", tmp_path / "w.json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_system(rdaq, tmp_path, topo, receiver_args=["--stream-policy", "block"])
        out, err = writer.communicate(timeout=60)
    finally:
        writer.kill()
    assert writer.returncode == 0, out + err
    w = json.loads((tmp_path / "w.json").read_text())
    assert w["ended"] and w["images_missing"] == 0 and len(w["sources"]) == 2
    assert w["images_written"] == FRAMES and w["images_out_of_order"] == 0
    with h5py.File(tmp_path / "wr" / "copy_master.h5", "r") as c, h5py.File(tmp_path / "report" / "acquisition_master.h5", "r") as j:
        assert c["entry/data/frame_number"][:].tolist() == list(range(FRAMES))
        assert np.array_equal(c["entry/data/frame_number"][:], j["entry/data/frame_number"][:])
        for i in range(0, FRAMES, 7):
            assert np.array_equal(c["entry/data/data"][i], j["entry/data/data"][i]), f"frame {i}"
        assert np.array_equal(c["entry/result_1/nPeaks"][:], j["entry/result_1/nPeaks"][:])


def test_one_joined_stream_of_a_spatial_plan_carries_whole_images(rdaq, tmp_path):
    """Receivers that each hold two of the four modules (a spatial plan) stream parts of
    every image; `rdaq write --stream --out` joins the parts of each frame into the whole
    image. Each receiver's veto judges its own modules, so some frames come from one
    receiver only: the consumer (strict about every field) sees one start and one end, every
    frame either receiver kept once, in frame order, each module's pixels equal to the
    receiver's file that holds it, the modules of a receiver that did not keep the frame
    marked missing, and the spots of both parts in the whole image's coordinates; the files
    `rdaq write` writes equal the stream."""
    import threading

    import stream_consumer as sc
    import stream_v2_strict as strict
    streams = (f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
    joined = f"tcp://127.0.0.1:{free_port()}"
    topo = topology(tmp_path, '\n[process]\ncalibration = "emulated"\nmin_spots = 60\n', streams, mode="spatial")
    joiner = subprocess.Popen([rdaq, "write", "--from", streams[0], "--from", streams[1], "--stream", joined, "--stream-policy", "block",
                               "--out", tmp_path / "wr", "--name", "whole", "--idle-timeout-s", "60", "--summary-json", tmp_path / "j.json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got = []
    consumer = threading.Thread(target=lambda: got.extend(sc.receive(joined, timeout_ms=120000)))
    consumer.start()
    try:
        out, _, _ = run_system(rdaq, tmp_path, topo, receiver_args=["--stream-policy", "block"])
        jout, jerr = joiner.communicate(timeout=60)
    finally:
        joiner.kill()
    consumer.join(60)
    assert joiner.returncode == 0, jout + jerr
    types = [m["type"] for m in got]
    assert types.count("start") == 1 and types[0] == "start" and types.count("end") == 1 and types[-1] == "end", types[:3]
    for m in got:
        assert strict.problems(m) == [], strict.problems(m)
    start, images = got[0], [m for m in got if m["type"] == "image"]
    assert (start["image_size_x"], start["image_size_y"]) == (1024, 4 * 512 + 3 * 36), "the whole detector"
    assert (start["beam_center_x"], start["beam_center_y"]) == (512, (4 * 512 + 3 * 36) / 2)
    assert [m["image_id"] for m in images] == list(range(len(images)))
    numbers = [m["user_data"]["rdaq"]["frame_number"] for m in images]
    parts = {}
    for name in ("dr0", "dr1"):
        with h5py.File(tmp_path / name / f"{name}_master.h5", "r") as f:
            frames = f["entry/data/frame_number"][:].tolist()
            parts[name] = {fr: (f["entry/data/data"][i], f["entry/result_1/nPeaks"][i]) for i, fr in enumerate(frames)}
    assert numbers == sorted(set(parts["dr0"]) | set(parts["dr1"])), "every frame a receiver kept, once, in order"
    alone = [fr for fr in numbers if (fr in parts["dr0"]) != (fr in parts["dr1"])]
    assert alone and len(alone) < len(numbers), "some frames kept by one receiver only, some by both"
    rows = 2 * 512 + 36  # a part: two modules and the gap between them
    w = json.loads((tmp_path / "j.json").read_text())
    assert w["ended"] and w["images_written"] == len(images) and w["images_with_parts_absent"] == len(alone) and w["parts_late"] == 0
    with h5py.File(tmp_path / "wr" / "whole_master.h5", "r") as c:
        assert c["entry/data/frame_number"][:].tolist() == numbers
        incomplete = c["entry/data/incomplete_frame_number"][:].tolist() if "incomplete_frame_number" in c["entry/data"] else []
        assert sorted(incomplete) == alone, "a frame with a part absent is written incomplete"
        for i, m in enumerate(images):
            image = sc.decode_array(m["data"]["data"])
            assert np.array_equal(image, c["entry/data/data"][i]), f"file and stream, image {i}"
            missing = np.zeros(image.size, bool)
            for first, count in m["user_data"]["rdaq"]["missing_pixels"]:
                missing[first:first + count] = True
            missing = missing.reshape(image.shape)
            fr = numbers[i]
            for name, top in (("dr0", 0), ("dr1", rows + 36)):
                if fr in parts[name]:
                    assert np.array_equal(image[top:top + rows], parts[name][fr][0]), f"frame {fr}: {name}'s modules"
                    assert not missing[top:top + rows].any()
                else:
                    assert missing[top:top + 512].all() and missing[top + 548:top + rows].all(), f"frame {fr}: {name}'s modules marked"
            assert np.array_equal(image[rows:rows + 36], image[512:548]), "the gap between the parts holds the gaps' value"
            spots = m["user_data"]["rdaq"]["spots"]
            want = sum(int(parts[name][fr][1]) for name in ("dr0", "dr1") if fr in parts[name])
            assert len(spots["x"]) == min(want, start["user_data"]["rdaq"]["max_spots"]), f"frame {fr} spots"
            lower = [y for y in spots["y"] if y >= rows + 36]
            if fr not in parts["dr1"]:
                assert not lower, f"frame {fr}: no spots where dr1's modules are"
    assert "processing :" in out
