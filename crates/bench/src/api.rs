//! `rdaq bench api`: frames per second through the library APIs beside the Rust consumer,
//! in the same run, on the same path, for one JUNGFRAU module (1 MiB frames). Each consumer
//! takes each frame, reads one word of it in place and releases it. Two measurements:
//! - **stream**: the emulator sends `--frames` frames at `--rate` into a receiver with a
//!   ring of 16 slots while the consumer takes them; frames/s from the first frame taken to
//!   the last, and the frames that did not arrive complete (a consumer that does not keep
//!   up makes the ring refuse frames). This is whether an application keeps up.
//! - **drain**: the emulator first fills a ring of `--drain-frames` slots, then the
//!   consumer drains it; only the drain is timed. This is what each API costs per frame.
//!
//! Rows:
//! - Rust: `Receiver::frames()`, `data`, `release` (the baseline);
//! - C API: `rdaq_next_frame`, `frame.data`, `rdaq_release` of librdaq, called from this
//!   process (the same functions a C program links; an FFI call costs nothing more);
//! - Python: `for frame in rdaq.Receiver(...)`, `numpy.asarray(frame)[0, 0]`,
//!   `frame.release()`, in the project venv's interpreter (`--python`).

use std::ffi::CString;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use librdaq::{rdaq_counters, rdaq_next_frame, rdaq_receiver_buffer_map, rdaq_receiver_close, rdaq_receiver_open, rdaq_release, RdaqCounters, RdaqFrame, RdaqStatus};
use rdaq_emulator::{Control, EmulatorConfig};
use rdaq_proto::telegram::{BufferMap, ModuleDtp};
use rdaq_receiver::{Receiver, ReceiverConfig};

#[derive(clap::Args)]
pub struct ApiBenchArgs {
    /// Frames per stream measurement.
    #[arg(long, default_value_t = 2000)]
    frames: u64,
    /// Frames per second the emulator sends in the stream measurement (0: as fast as it
    /// can, which loses frames on loopback on a small machine).
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    /// Frames per drain measurement (the ring has as many slots: 1 MiB each).
    #[arg(long, default_value_t = 256)]
    drain_frames: u64,
    /// Measurements of each row, in turn; the table shows the median and the best.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// The Python with the `rdaq` package (scripts/setup.sh installs it into .venv).
    #[arg(long, default_value = ".venv/bin/python")]
    python: String,
}

/// The two measurements.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Stream,
    Drain,
}

impl Mode {
    fn slots(self, frames: u64) -> u64 {
        match self {
            Mode::Stream => STREAM_SLOTS,
            Mode::Drain => frames,
        }
    }
}

/// The ring of the stream measurement.
const STREAM_SLOTS: u64 = 16;

type Sender = std::thread::JoinHandle<Result<rdaq_emulator::EmulatorReport, rdaq_emulator::EmulatorError>>;

/// Starts sending `frames` frames to the receiver of `map` at `rate` (0: as fast as possible).
fn send(map: &BufferMap, frames: u64, rate: f64) -> Sender {
    let dtps: Vec<ModuleDtp> = (0..map.modules).map(|m| ModuleDtp::single(map, m, SocketAddr::from(([127, 0, 0, 1], map.data_ports[m as usize])))).collect();
    let cfg = EmulatorConfig { modules: map.modules, frames, rate_hz: (rate > 0.0).then_some(rate), frame_pool: 8, ..EmulatorConfig::default() };
    std::thread::spawn(move || rdaq_emulator::run(&cfg, &dtps, Arc::new(Control::default())))
}

/// Waits for the sender; in a drain, also until every frame is queued for the consumer.
fn before_timing(mode: Mode, sender: Sender, frames: u64, complete: impl Fn() -> u64) -> anyhow::Result<Option<Sender>> {
    if mode == Mode::Stream {
        return Ok(Some(sender));
    }
    sender.join().map_err(|_| anyhow::anyhow!("emulator panicked"))??;
    wait_queued(frames, complete)?;
    Ok(None)
}

/// Frames/s of `n` frames taken from `first` to now (a stream times from the first frame
/// taken; a drain from its start).
fn rate(n: u64, first: Option<Instant>, start: Instant, mode: Mode) -> f64 {
    match (mode, first) {
        (Mode::Stream, Some(t)) if n > 1 => (n - 1) as f64 / t.elapsed().as_secs_f64(),
        _ => n as f64 / start.elapsed().as_secs_f64(),
    }
}

fn after_timing(sender: Option<Sender>) -> anyhow::Result<()> {
    if let Some(s) = sender {
        s.join().map_err(|_| anyhow::anyhow!("emulator panicked"))??;
    }
    Ok(())
}

/// Waits until `complete()` reaches `frames` (every frame is queued for the consumer).
fn wait_queued(frames: u64, complete: impl Fn() -> u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while complete() < frames {
        if Instant::now() > deadline {
            bail!("only {} of {frames} frames arrived complete", complete());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// One round of the Rust consumer: frames/s and complete frames taken.
fn rust_round(frames: u64, mode: Mode, rate_hz: f64) -> anyhow::Result<(f64, u64)> {
    let rx = Receiver::start(ReceiverConfig { data_port: 0, slots: mode.slots(frames) as usize, frames: Some(frames), ..ReceiverConfig::default() })?;
    let sender = before_timing(mode, send(rx.buffer_map(), frames, rate_hz), frames, || rx.counters().frames_complete)?;
    let (start, mut first, mut n, mut complete) = (Instant::now(), None, 0u64, 0u64);
    while let Ok(f) = rx.frames().recv() {
        first.get_or_insert_with(Instant::now);
        if let Ok(d) = rx.data(&f) {
            std::hint::black_box(d[0]);
        }
        complete += (f.status() == rdaq_receiver::FrameStatus::Complete) as u64;
        rx.release(f)?;
        n += 1;
    }
    let r = rate(n, first, start, mode);
    after_timing(sender)?;
    Ok((r, complete))
}

/// librdaq's status as a result, with its message.
fn ok(s: RdaqStatus, what: &str) -> anyhow::Result<()> {
    if s == RdaqStatus::Ok {
        return Ok(());
    }
    // SAFETY: librdaq's own NUL-terminated message, read before the next call on this thread.
    let msg = unsafe { std::ffi::CStr::from_ptr(librdaq::rdaq_last_error()) }.to_string_lossy().into_owned();
    bail!("{what}: {s:?} {msg}")
}

/// One round through the C API: frames/s and complete frames taken.
fn c_round(frames: u64, mode: Mode, rate_hz: f64) -> anyhow::Result<(f64, u64)> {
    let config = CString::new(format!("modules = 1\nslots = {}\nframes = {frames}\n", mode.slots(frames)))?;
    let mut h = 0u64;
    // SAFETY: a NUL-terminated config and a writable handle.
    ok(unsafe { rdaq_receiver_open(config.as_ptr(), &mut h) }, "open")?;
    let mut buf = vec![0u8; 1 << 20];
    // SAFETY: `buf` has `buf.len()` writable bytes; `needed` may be null.
    ok(unsafe { rdaq_receiver_buffer_map(h, buf.as_mut_ptr().cast(), buf.len(), std::ptr::null_mut()) }, "buffer map")?;
    let json = std::ffi::CStr::from_bytes_until_nul(&buf)?.to_str()?;
    let sender = send(&serde_json::from_str(json)?, frames, rate_hz);
    let complete = || {
        let mut c = RdaqCounters::default();
        // SAFETY: a writable counters struct.
        unsafe { rdaq_counters(h, &mut c) };
        c.frames_complete
    };
    let sender = before_timing(mode, sender, frames, complete)?;
    let (start, mut first, mut n, mut complete) = (Instant::now(), None, 0u64, 0u64);
    let mut f = std::mem::MaybeUninit::<RdaqFrame>::uninit();
    // SAFETY: a writable frame; after Ok it is initialized, and its data valid until release.
    while unsafe { rdaq_next_frame(h, -1, f.as_mut_ptr()) } == RdaqStatus::Ok {
        // SAFETY: rdaq_next_frame returned Ok, so `f` is initialized and `data` holds at
        // least one byte until the release below.
        let fr = unsafe { f.assume_init_ref() };
        first.get_or_insert_with(Instant::now);
        if !fr.data.is_null() {
            // SAFETY: as above: `data` is the held frame's first byte.
            std::hint::black_box(unsafe { *fr.data });
        }
        complete += (fr.status == 0) as u64;
        ok(rdaq_release(h, fr.id), "release")?;
        n += 1;
    }
    let r = rate(n, first, start, mode);
    ok(rdaq_receiver_close(h), "close")?;
    after_timing(sender)?;
    Ok((r, complete))
}

/// The Python consumer's script: prints one drain rate per round, as JSON.
const PYTHON: &str = r#"
import json, sys, time
import numpy as np, rdaq
frames, slots, drain, rounds, rate = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "drain", int(sys.argv[4]), float(sys.argv[5])
rates = []
for _ in range(rounds):
    with rdaq.Receiver(modules=1, slots=slots, frames=frames) as rx:
        emu = rdaq.Emulator(rx.buffer_map, frames=frames, rate=0 if drain else rate, pool=8)
        emu.start()
        if drain:
            emu.join()
            deadline = time.monotonic() + 30
            while rx.counters()["frames_complete"] < frames:
                assert time.monotonic() < deadline, "frames did not arrive"
                time.sleep(0.005)
        start, first, n, complete = time.perf_counter(), None, 0, 0
        for f in rx:
            if first is None:
                first = time.perf_counter()
            if f.status != "discarded":
                np.asarray(f)[0, 0]
            complete += f.complete
            f.release()
            n += 1
        end = time.perf_counter()
        rates.append([n / (end - start) if drain else (n - 1) / (end - first), complete])
        if not drain:
            emu.join()
print(json.dumps(rates))
"#;

/// Every rate of the Python consumer in `mode`, or why there is none.
fn python_rounds(a: &ApiBenchArgs, frames: u64, mode: Mode) -> anyhow::Result<Vec<(f64, u64)>> {
    let what = if mode == Mode::Drain { "drain" } else { "stream" };
    let out = std::process::Command::new(&a.python)
        .args(["-c", PYTHON, &frames.to_string(), &mode.slots(frames).to_string(), what, &a.rounds.to_string(), &a.rate.to_string()])
        .output()
        .with_context(|| format!("--python {}", a.python))?;
    if !out.status.success() {
        bail!("--python {}: {}", a.python, String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("failed"));
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn median(v: &[(f64, u64)]) -> f64 {
    let mut r: Vec<f64> = v.iter().map(|x| x.0).collect();
    r.sort_by(f64::total_cmp);
    r[r.len() / 2]
}

pub fn bench(a: ApiBenchArgs) -> anyhow::Result<ExitCode> {
    if a.frames < 2 || a.drain_frames < 2 || a.rounds == 0 {
        bail!("--frames and --drain-frames must be at least 2, --rounds at least 1");
    }
    println!("rdaq bench api: one-module (1 MiB) frames; each consumer takes a frame, reads one word in place, releases it; {} rounds per row", a.rounds);
    println!("{}", crate::machine_line());
    println!("{:<44} {:>15} {:>14} {:>9} {:>12}", "measurement / consumer", "median frames/s", "best frames/s", "vs Rust", "not complete");
    let pace = if a.rate > 0.0 { format!("{} Hz", a.rate) } else { "full speed".into() };
    for (mode, frames, what) in [(Mode::Stream, a.frames, format!("stream: {} frames sent at {pace}, ring of {STREAM_SLOTS}", a.frames)), (Mode::Drain, a.drain_frames, format!("drain: a full ring of {} frames", a.drain_frames))] {
        println!("{what}");
        table(&a, frames, mode)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The rows of one measurement.
fn table(a: &ApiBenchArgs, frames: u64, mode: Mode) -> anyhow::Result<()> {
    let (mut rust, mut c) = (Vec::new(), Vec::new());
    for _ in 0..a.rounds {
        rust.push(rust_round(frames, mode, a.rate)?);
        c.push(c_round(frames, mode, a.rate)?);
    }
    let python = python_rounds(a, frames, mode);
    let base = median(&rust);
    // frames of all rounds that did not arrive complete
    let row = |name: &str, v: &[(f64, u64)]| {
        let lost: u64 = v.iter().map(|x| frames - x.1.min(frames)).sum();
        println!("  {:<42} {:>15.0} {:>14.0} {:>8.1}% {:>12}", name, median(v), v.iter().map(|x| x.0).fold(0.0, f64::max), 100.0 * median(v) / base, lost);
    };
    row("Rust (Receiver::frames)", &rust);
    row("C API (rdaq_next_frame, rdaq_release)", &c);
    match python {
        Ok(p) => row("Python (for frame in rdaq.Receiver)", &p),
        Err(e) => println!("  {:<42} not measured: {e:#}", "Python (for frame in rdaq.Receiver)"),
    }
    Ok(())
}
