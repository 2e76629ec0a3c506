"""`rdaq run` with the default online processing: chopper dark frames feed the pedestal,
signal frames are converted to photon counts, spots are found, empty frames vetoed, and
what remains is in the NXmx file with its spot lists. Checked against the synthetic
detector's ground truth (`<name>_truth.csv`)."""
import csv
import json
import os
import subprocess

import h5py
import hdf5plugin  # noqa: F401  (registers the bitshuffle filter with h5py)
import numpy as np


def truth(path):
    frames, spots = {}, {}
    for r in csv.DictReader(open(path)):
        f = int(r["frame"])
        frames[f] = (r["dark"] == "1", r["hit"] == "1")
        if r["x"]:
            spots.setdefault(f, []).append((float(r["x"]), float(r["y"]), float(r["photons"])))
    return frames, spots


def test_run_processes_by_default(rdaq, tmp_path):
    out = tmp_path / "out"
    summary = tmp_path / "s.json"
    r = subprocess.run([str(rdaq), "run", "--frames", "240", "--out", str(out), "--summary-json", str(summary)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "processing  :" in r.stdout and "vetoed" in r.stdout
    s = json.loads(summary.read_text())
    p = s["processing"]
    frames, spots = truth(out / "rdaq_run_truth.csv")
    dark = {f for f, (d, _) in frames.items() if d}
    hits = {f for f, (_, h) in frames.items() if h}
    assert p["dark_frames"] == len(dark) == 120 and p["signal_frames"] == 120
    with h5py.File(out / "rdaq_run_master.h5", "r") as f:
        data = f["entry/data/data"]
        # output "auto": every count the emulated calibration can give fits int16
        assert data.dtype == np.int16 and data.shape[1:] == (1060, 1024)
        numbers = f["entry/data/frame_number"][:].tolist()
        res = f["entry/result_1"]
        n_peaks, hit = res["nPeaks"][:], res["hit"][:]
        xs, ys = res["peakXPosRaw"][:], res["peakYPosRaw"][:]
        # the veto kept exactly the frames with a crystal in the beam
        assert sorted(numbers) == sorted(hits)
        assert hit.all() and len(numbers) == p["hits"] == p["frames_written"]
        assert p["vetoed"] == 120 - len(hits)
        assert abs(p["vetoed_fraction"] - p["vetoed"] / 120) < 1e-9
        its = res["peakTotalIntensity"]
        assert its.attrs["units"] == "photons" and data.attrs["units"] == "photons"
        matched = total = 0
        ratios = []
        for i, fr in enumerate(numbers):
            found = list(zip(xs[i, :n_peaks[i]], ys[i, :n_peaks[i]]))
            for (x, y, ph) in spots.get(fr, []):
                total += 1
                d = [(fx - x) ** 2 + (fy - y) ** 2 for fx, fy in found]
                if d and min(d) <= 0.25:
                    matched += 1
                    ratios.append(its[i, int(np.argmin(d))] / ph)
        assert total > 500 and matched / total >= 0.95, f"recall {matched}/{total}"
        # the spot list speaks the image's unit: a spot's intensity is the photons of its
        # strong pixels, most of the spot's photons (in keV it would be 12.4 times more)
        assert 0.6 < np.median(ratios) < 1.1, np.median(ratios)
        # photon counts: gaps carry the error marker; a frame's photons are the spots'
        # photons plus the background (0.01 per pixel)
        img = data[0]
        assert (img[512:548] == np.iinfo(np.int16).min).all()
        valid = img[img > np.iinfo(np.int16).min].astype(np.int64)
        expected = sum(ph for (_, _, ph) in spots[numbers[0]]) + 0.01 * 2 * 512 * 1024
        assert abs(valid.sum() - expected) < 0.05 * expected, (valid.sum(), expected)
    with h5py.File(out / "rdaq_run_calibration.h5", "r") as f:
        assert f["pedestal"].shape == (3, 1060, 1024)
        g0 = f["pedestal"][0][:512]
        assert 2300 < np.median(g0) < 2600


def test_pedestal_tracking_corrects_a_wrong_pedestal(rdaq, tmp_path):
    """The run starts from a calibration whose G0 pedestal is 300 ADU too high (empty pixels
    read -0.6 photons: -1); dark frames fill a 16-frame window and the tracked pedestal is
    published every 8 of them, after which empty pixels read 0."""
    first = tmp_path / "first"
    r = subprocess.run([str(rdaq), "run", "--frames", "40", "--rate", "200", "--out", str(first)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    with h5py.File(first / "rdaq_run_calibration.h5", "r") as f, h5py.File(tmp_path / "wrong.h5", "w") as g:
        for k in ("pedestal", "gain", "pixel_mask"):
            g[k] = f[k][()]
        g["pedestal"][0] += np.where(f["pixel_mask"][()] == 0, 300, 0).astype(np.float32)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[emulator]\nframes = 160\nrate_hz = 200.0\n[process]\ncalibration = "{tmp_path / "wrong.h5"}"\n'
                   "pedestal_window = 16\npedestal_publish = 8\nveto = false\n")
    out = tmp_path / "out"
    r = subprocess.run([str(rdaq), "run", "--config", str(cfg), "--out", str(out), "--summary-json", str(tmp_path / "s.json")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    p = json.loads((tmp_path / "s.json").read_text())["processing"]
    assert p["pedestal_updates"] == (80 - 16) // 8 + 1
    assert p["frames_written"] == 80 and p["vetoed"] == 0
    with h5py.File(out / "rdaq_run_master.h5", "r") as f:
        order = np.argsort(f["entry/data/frame_number"][:])
        first_img, last_img = f["entry/data/data"][order[0]], f["entry/data/data"][order[-1]]
    assert (first_img[:512] == -1).mean() > 0.9, "before any dark frame: the wrong pedestal"
    assert (last_img[:512] == 0).mean() > 0.95, "after tracking: the dark frames' pedestal"


def test_many_workers_and_pedestal_bands_give_the_same_file_in_order(rdaq, tmp_path):
    """Three process workers on two cores finish frames out of order; the write stage puts
    them back in order, and the data equal a one-worker run's bit for bit (the pedestal is not
    published within 240 frames, so every frame is converted with the same calibration). Two
    pedestal bands track the dark frames."""
    files = {}
    for workers, bands in [(1, 1), (3, 2)]:
        cfg = tmp_path / f"w{workers}.toml"
        cfg.write_text(f"[process]\nworkers = {workers}\npedestal_bands = {bands}\nveto = false\n")
        out = tmp_path / f"out{workers}"
        summary = tmp_path / f"s{workers}.json"
        r = subprocess.run([str(rdaq), "run", "--config", str(cfg), "--frames", "240", "--out", str(out),
                            "--summary-json", str(summary)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        whole = json.loads(summary.read_text())
        p = whole["processing"]
        assert whole["chunks_handed_on"] == p["frames_written"] == 120, "every chunk copied by the writer's I/O threads"
        stages = {s["name"]: s for s in p["stages"]}
        assert stages["process"]["workers"] == workers and stages["process"]["frames"] == 120
        names = ["pedestal"] if bands == 1 else [f"pedestal {i}/{bands}" for i in range(1, bands + 1)]
        assert all(stages[n]["frames"] == 120 for n in names), stages
        assert [s["name"] for s in p["steps"]] == ["convert", "spots + veto", "compress"]
        assert "frames held back for order" in r.stdout
        with h5py.File(out / "rdaq_run_master.h5", "r") as f:
            numbers = f["entry/data/frame_number"][:].tolist()
            assert numbers == sorted(numbers) and len(numbers) == 120
            files[workers] = (numbers, f["entry/data/data"][:], f["entry/result_1/nPeaks"][:])
    (n1, d1, p1), (n3, d3, p3) = files[1], files[3]
    assert n1 == n3 and np.array_equal(d1, d3) and np.array_equal(p1, p3)


def test_the_threads_share_the_cores_and_the_summary_says_how(rdaq, tmp_path):
    """By default the workers and the bands get the cores the receiver, the writer and the
    emulated modules' senders leave, down to one each; the start line and the summary say how,
    and only a configuration that sets more threads than the cores gets a warning."""
    cores = len(os.sched_getaffinity(0))
    for name, args in [("processed", []), ("raw", ["--raw"]), ("set", ["--config", tmp_path / "set.toml"])]:
        (tmp_path / "set.toml").write_text(f"[process]\nworkers = {cores + 1}\n")
        summary = tmp_path / f"{name}.json"
        r = subprocess.run([rdaq, "run", "--frames", "20", "--out", tmp_path / name, "--stream", "none", "--preview", "none",
                            "--summary-json", summary, *args], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        t = json.loads(summary.read_text())["threads"]
        assert t["cores"] == cores and t["busy"] == {"receivers": 1, "writers": 1, "senders": 2}, t
        assert t["workers"] >= 1 and t["bands"] == (0 if name == "raw" else max(1, t["bands"])), t
        busy_bands = t["bands"] if t["dark_share"] > 0 else 0
        assert t["threads"] == 4 + t["workers"] + busy_bands and t["oversubscribed"] == (t["threads"] > cores), t
        assert f"rdaq run: threads: {t['workers']} worker" in r.stderr and "threads     :" in r.stdout
        warned = "threads run busy on" in r.stderr
        if name == "set":
            assert t["set"] and t["workers"] == cores + 1 and warned, r.stderr
        else:
            assert not t["set"] and not warned, r.stderr
            # the budget fills the cores when they are more than the floor of one each
            floor = 4 + 1 + (1 if name == "processed" else 0)
            assert t["threads"] == max(cores, floor), t


def test_the_veto_is_said_at_start_and_in_the_summary(rdaq, tmp_path):
    """The start line says whether the veto is on and with which min_spots; a run that vetoes
    every frame warns with the settings to change; with the veto off, the saved line says
    every signal frame was written."""
    def run(name, settings):
        cfg = tmp_path / f"{name}.toml"
        cfg.write_text(f"[process]\n{settings}\n")
        r = subprocess.run([str(rdaq), "run", "--config", str(cfg), "--frames", "20", "--out", str(tmp_path / name),
                            "--stream", "none", "--preview", "none"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        return r
    r = run("all_vetoed", "min_spots = 100000")
    assert "veto on: a signal frame with fewer than 100000 spots is not written" in r.stderr, r.stderr
    assert "warning     : every signal frame was vetoed (none had 100000 spots)" in r.stdout, r.stdout
    assert "process.veto = false" in r.stdout
    r = run("no_veto", "veto = false")
    assert "veto off: every signal frame is written" in r.stderr, r.stderr
    assert "saved       : 10 frames written (every signal frame: the veto is off)" in r.stdout, r.stdout
    assert "warning     : every signal frame" not in r.stdout


def spot_lists(path):
    with h5py.File(path, "r") as f:
        r = f["entry/result_1"]
        n = r["nPeaks"][()]
        return n, [tuple(r[k][i, :n[i]].tolist() for k in ("peakXPosRaw", "peakYPosRaw", "peakTotalIntensity")) for i in range(len(n))]


def test_reprocessing_a_runs_file_takes_the_runs_finder_settings(rdaq, tmp_path):
    """The master keeps the processing settings; `rdaq process spots` on it takes them as its
    defaults and says so. On a keV file it finds the run's spots exactly; on photon counts
    (rounded) a few differ: 964 spots against the run's 987 on these 60 frames (2.3%), the
    tolerance below."""
    for output in ("kev", "auto"):
        cfg = tmp_path / f"{output}.toml"
        cfg.write_text(f'[process]\noutput = "{output}"\n')
        out = tmp_path / output
        r = subprocess.run([str(rdaq), "run", "--frames", "60", "--config", str(cfg), "--out", str(out)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        master = out / "rdaq_run_master.h5"
        with h5py.File(master, "r") as f:
            settings = json.loads(f.attrs["rdaq_series"])["processing"]
        assert settings["finder"] == "local" and settings["threshold_photons"] == 0.5 and settings["veto_min_spots"] == 10
        spots = tmp_path / f"{output}_spots.h5"
        r = subprocess.run([str(rdaq), "process", "spots", "--input", str(master), "--output", str(spots)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert "defaults from the run that wrote" in r.stderr and "snr 3, box half-size 15, 4-200 pixels" in r.stderr
        (n_run, run), (n_again, again) = spot_lists(master), spot_lists(spots)
        assert len(n_run) == len(n_again) > 0
        if output == "kev":
            assert "threshold 6.2 keV (0.5 photons)" in r.stderr
            assert again == run, "the run's spots, from its own keV images"
        else:
            assert "threshold 0.5 photons" in r.stderr
            assert abs(int(n_again.sum()) - int(n_run.sum())) <= 0.05 * n_run.sum(), (n_again.sum(), n_run.sum())
    # an option given overrides the file's setting
    r = subprocess.run([str(rdaq), "process", "spots", "--input", str(tmp_path / "kev" / "rdaq_run_master.h5"),
                        "--output", str(tmp_path / "strict.h5"), "--snr", "6"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert spot_lists(tmp_path / "strict.h5")[0].sum() < spot_lists(tmp_path / "kev_spots.h5")[0].sum()


def test_a_raw_run_converted_with_the_calibration_gives_the_online_spots_bit_for_bit(rdaq, tmp_path):
    """The same 60 emulated frames, once processed (keV written) and once raw: the raw frames
    converted offline with the processed run's calibration (no pedestal was published within
    60 frames) and searched give its spot lists exactly. No option names a setting: the raw
    run's master keeps those it would have processed with (the invalid gain, the finder's),
    convert takes them and passes them on with the keV frames, and spots takes them there;
    each says so on one line."""
    (tmp_path / "kev.toml").write_text('[process]\noutput = "kev"\n')
    for args in (["--config", str(tmp_path / "kev.toml"), "--out", str(tmp_path / "proc")], ["--raw", "--out", str(tmp_path / "raw")]):
        r = subprocess.run([str(rdaq), "run", "--frames", "60", *args], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    said = []
    for cmd in (["convert", "--input", tmp_path / "raw" / "rdaq_run_master.h5", "--calibration", tmp_path / "proc" / "rdaq_run_calibration.h5",
                 "--output", tmp_path / "kev.h5"],
                ["spots", "--input", tmp_path / "kev.h5", "--output", tmp_path / "spots.h5"]):
        r = subprocess.run([str(rdaq), "process", *cmd], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        said.append(r.stderr)
    assert "defaults from the run that wrote" in said[0] and "invalid gain error" in said[0], said[0]
    assert "threshold 6.2 keV (0.5 photons)" in said[1], said[1]
    with h5py.File(tmp_path / "raw" / "rdaq_run_master.h5", "r") as f:
        raw_numbers = f["entry/data/frame_number"][()].tolist()
    with h5py.File(tmp_path / "proc" / "rdaq_run_master.h5", "r") as f:
        online_numbers = f["entry/data/frame_number"][()].tolist()
    n_online, online = spot_lists(tmp_path / "proc" / "rdaq_run_master.h5")
    n_offline, offline = spot_lists(tmp_path / "spots.h5")
    assert len(online) > 0 and len(offline) == len(raw_numbers) == 60
    by_number = dict(zip(raw_numbers, offline))
    for number, spots in zip(online_numbers, online):
        assert by_number[number] == spots, number
