"""What a stream nobody reads costs a receiver: the CPU of `rdaq receive` (one emulated
JUNGFRAU module, rdaq datagrams, no files) over N frames with the default stream and no
consumer, beside `--stream none`, for each rdaq binary given (e.g. a build before a change
and after it). Runs alternate, so every row sees the same machine; medians of the reps.

    .venv/bin/python bench/stream_idle_cpu.py --frames 20000 --reps 3 /tmp/rdaq_before ./target/release/rdaq

With `--calibration emulated` the frames go through the processing graph (conversion, spots,
compression for whoever takes the chunks) instead of the raw path; the last column then also
gives the frames the graph compressed.
"""
import argparse
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import tempfile
import time


def free_udp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def receive(rdaq, frames, rate, stream, calibration):
    """The receiver's (user, sys) CPU seconds and its summary, for one run."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="rdaq-stream-cpu-"))
    try:
        args = [rdaq, "receive", "--modules", "1", "--port", str(free_udp_port()), "--frames", str(frames),
                "--buffers-out", str(d / "map.json"), "--summary-json", str(d / "s.json"), "--timeout-s", str(frames / rate + 60)]
        if not stream:
            args += ["--stream", "none"]
        if calibration:
            args += ["--calibration", calibration]
        rx = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not (d / "map.json").exists():
            if rx.poll() is not None:
                raise SystemExit(f"{rdaq} receive exited with {rx.returncode}")
            time.sleep(0.02)
        subprocess.run([rdaq, "emulate", "--buffers", str(d / "map.json"), "--frames", str(frames), "--rate", str(rate)], capture_output=True)
        _, _, ru = os.wait4(rx.pid, 0)
        return ru.ru_utime, ru.ru_stime, json.loads((d / "s.json").read_text())
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--frames", type=int, default=20000)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--calibration", help="process the frames with this calibration (e.g. emulated)")
    a = ap.parse_args()
    runs = {(b, s): [] for b in a.binaries for s in (True, False)}
    for _ in range(a.reps):
        for key in runs:
            runs[key].append(receive(key[0], a.frames, a.rate, key[1], a.calibration))
    what = f"processed with calibration {a.calibration}" if a.calibration else "raw"
    print(f"{a.frames} frames of one module at {a.rate:g} Hz, {what}, no files; medians of {a.reps} runs")
    print("| binary | stream | user s | sys s | frames complete | images encoded | frames compressed |")
    print("|---|---|---|---|---|---|---|")
    for (b, s), rs in runs.items():
        med = lambda k: statistics.median(r[k] for r in rs)
        last = rs[-1][2]
        encoded = (last.get("stream") or {}).get("images_encoded", "(not counted)") if s else "-"
        compressed = (last.get("processing") or {}).get("frames_compressed", "-")
        print(f"| {b} | {'default, no consumer' if s else 'none'} | {med(0):.2f} | {med(1):.2f} | {last['frames_complete']} | {encoded} | {compressed} |")


if __name__ == "__main__":
    main()
