//! `rdaq bench`: benchmarks as commands, one module per benchmark. Each prints a table
//! against a baseline measured in the same run, and says what the rows compare.
//!
//! - [`ingest`]: the receive path for rdaq datagrams against a bare `recvmmsg` loop into the
//!   same kind of ring; [`sls`]: CPU per native JUNGFRAU packet against slsReceiver's loop.
//! - [`hosts`]: one against two receivers fed by the same emulated detector.
//! - [`soak`]: many small frames through injected faults, every frame bit-exact.
//! - [`process`]: each processing stage on one core against memory bandwidth and the
//!   reference libraries; [`pipeline`]: `rdaq run`'s whole graph without the network over
//!   1..N workers against the copy bandwidth of as many cores.
//! - [`gpu`]: the GPU stages against the device's own limits (needs a GPU).
//! - [`transport`]: the receive engines side by side: bandwidth, CPU and latency against
//!   message size, and each engine's highest lossless rate, bare and with placement.
//! - [`roce`]: the software RoCEv2 target beside rdaq datagrams on the AF_XDP engine, and
//!   the ICRC's share of its receive CPU.
//! - [`stream`]: the Stream V2 publisher against bare ZeroMQ; [`write`]: the NXmx writer
//!   against a plain sequential write of the same bytes; [`join`]: `rdaq write` joining a
//!   spatial plan's parts against compressing the whole image once.
//! - [`api`]: the C API and the Python iterator against the Rust consumer.

pub mod api;
pub mod gpu;
pub mod hosts;
pub mod ingest;
pub mod join;
pub mod pipeline;
pub mod process;
pub mod roce;
pub mod sls;
pub mod soak;
pub mod stream;
pub mod transport;
pub mod write;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use rdaq_receiver::Receiver;

#[derive(clap::Subcommand)]
pub enum BenchCmd {
    /// Highest lossless receive rate of rdaq datagrams over loopback: placement vs a bare
    /// recvmmsg loop, measured in the same run; with --format sls, CPU per native JUNGFRAU
    /// packet against slsReceiver's recvfrom + copy at the same rates.
    Ingest(ingest::IngestArgs),
    /// Highest lossless aggregate throughput of one and of two receivers (temporal mode) fed
    /// by the same emulated detector; per-receiver efficiency against the single one.
    Hosts(hosts::HostsArgs),
    /// Many small frames through injected loss, reordering, duplication and corruption:
    /// every frame must arrive bit-exact (checksums, loss window, retransmission).
    Soak(soak::SoakArgs),
    /// Each processing stage on one core against memory copy bandwidth and the reference
    /// libraries (aare, cfelpyutils peakfinder8, bitshuffle) on the same frames.
    Process(process::ProcessBenchArgs),
    /// The processing graph of rdaq run without the network (frames handed from a pre-filled
    /// ring) over 1..N process workers, beside the copy bandwidth of as many cores.
    Pipeline(pipeline::PipelineArgs),
    /// The GPU path against the same device's copy bandwidths, kernel by kernel and end to
    /// end, and the CPU (needs a GPU).
    Gpu(gpu::GpuBenchArgs),
    /// Images through the Stream V2 publisher to a consumer, beside a bare ZeroMQ PUSH/PULL
    /// pair with messages of the same size.
    Stream(stream::StreamBenchArgs),
    /// `rdaq write` joining a spatial plan's parts into whole images, beside compressing the
    /// whole image once.
    Join(join::JoinBenchArgs),
    /// The receive engines (recvmmsg, io_uring, AF_XDP) side by side on loopback and a veth
    /// pair: bandwidth, CPU and one-way latency against message size, and the highest
    /// lossless rate of 8 KiB datagrams for each engine's bare loop and full receiver.
    Transport(transport::TransportArgs),
    /// RoCEv2 WRITEs into the software RoCEv2 target beside rdaq datagrams, both on the
    /// AF_XDP engine over a veth pair: rate, receive CPU per 8 KiB, and the ICRC's share.
    Roce(roce::RoceArgs),
    /// The NXmx writer's sustained rate beside a plain sequential write of the same bytes,
    /// both ending with fdatasync.
    Write(write::WriteBenchArgs),
    /// Frames/s through the C API and the Python iterator beside the Rust consumer, draining
    /// the same full ring of 1 MiB module frames.
    Api(api::ApiBenchArgs),
}

/// Reads a count of distinct frames a benchmark keeps in memory (1 MiB or more each): 1 to
/// [`MAX_DISTINCT_FRAMES`].
pub(crate) fn distinct_frames<T: TryFrom<u64>>(s: &str) -> Result<T, String> {
    match s.parse::<u64>() {
        Ok(n) if (1..=MAX_DISTINCT_FRAMES).contains(&n) => T::try_from(n).map_err(|_| format!("{n} is too large here")),
        _ => Err(format!("must be a number of frames from 1 to {MAX_DISTINCT_FRAMES}")),
    }
}

/// The most distinct frames a benchmark cycles through.
pub const MAX_DISTINCT_FRAMES: u64 = 4096;

/// Reads a rate in Hz from the command line: as the emulator takes it, finite and positive.
pub(crate) fn rate_arg(s: &str) -> Result<f64, String> {
    let r: f64 = s.parse().map_err(|_| format!("{s:?} is not a rate in Hz"))?;
    if r > 0.0 {
        rdaq_emulator::config::check_rate(Some(r)).map(|()| r)
    } else {
        Err(format!("{s} Hz: give a rate above 0"))
    }
}

/// Bytes copied per second by `threads` threads at once, each between its own two buffers of
/// `bytes` (far larger than the caches): the memory floor the benchmarks compare with.
pub fn copy_bandwidth(threads: usize, bytes: usize, seconds: f64) -> f64 {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    let (src, mut dst) = (vec![1u8; bytes], vec![0u8; bytes]);
                    dst.copy_from_slice(&src);
                    let t0 = Instant::now();
                    let mut copied = 0usize;
                    while t0.elapsed().as_secs_f64() < seconds {
                        dst.copy_from_slice(std::hint::black_box(&src));
                        std::hint::black_box(&dst);
                        copied += bytes;
                    }
                    copied as f64 / t0.elapsed().as_secs_f64()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("copy thread")).sum()
    })
}

/// Runs the benchmark `b`.
pub fn bench(b: BenchCmd) -> anyhow::Result<ExitCode> {
    match b {
        BenchCmd::Ingest(a) => match a.format.as_str() {
            _ if a.detector.is_some() => sls::ingest_sls(&a),
            "rdaq" => ingest::ingest(a),
            "sls" => sls::ingest_sls(&a),
            other => bail!("--format must be rdaq or sls, not {other:?}"),
        },
        BenchCmd::Hosts(a) => hosts::hosts(a),
        BenchCmd::Soak(a) => soak::soak(a),
        BenchCmd::Process(a) => process::bench(a),
        BenchCmd::Pipeline(a) => pipeline::bench(a),
        BenchCmd::Stream(a) => stream::bench(a),
        BenchCmd::Join(a) => join::bench(a),
        BenchCmd::Gpu(a) => gpu::bench(a),
        BenchCmd::Transport(a) => transport::bench(a),
        BenchCmd::Roce(a) => roce::bench(a),
        BenchCmd::Write(a) => write::bench(a),
        BenchCmd::Api(a) => api::bench(a),
    }
}


/// "machine: N CPUs, Linux VERSION": the line each table names its machine with.
pub(crate) fn machine_line() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    // the machine's, not the calling thread's (a bench may have pinned it)
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1);
    format!("machine: {cpus} CPUs, Linux {}", kernel.trim())
}

/// A measured run the lossless search can judge.
pub(crate) trait Probe {
    /// Datagrams sent and not received.
    fn lost(&self) -> u64;
    /// Datagrams per second received.
    fn rate(&self) -> f64;
}

/// The highest lossless rate below `full` (a lossy full-speed rate), as PERCIVAL searched it
/// by hand: 5 bisecting probes of `probe` datagrams from 30% of `full`, then confirming runs
/// of `count` datagrams, 10% lower each time one loses; `None` after 4 lossy confirmations.
pub(crate) fn search_lossless<R: Probe>(what: &str, full: f64, probe: u64, count: u64, measure: impl Fn(u64, Option<f64>) -> anyhow::Result<R>) -> anyhow::Result<Option<R>> {
    let (mut lo, mut hi) = (0.3 * full, full);
    for _ in 0..5 {
        let mid = 0.5 * (lo + hi);
        let p = measure(probe, Some(mid))?;
        eprintln!("  {what} probe at {mid:.0}/s: lost {}", p.lost());
        if p.lost() == 0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let mut rate = lo;
    for _ in 0..4 {
        let r = measure(count, Some(rate))?;
        eprintln!("  {what} confirm at {rate:.0}/s: lost {}", r.lost());
        if r.lost() == 0 {
            return Ok(Some(r));
        }
        rate *= 0.9;
    }
    Ok(None)
}

/// Takes every frame `rx` hands on and gives its slot straight back, until the receiver
/// ends (stopping it once `stop_when` is set); returns when the first and the last frame
/// came (the consumer of the receive benchmarks, which measure the receive path alone).
pub(crate) fn drain(rx: &Receiver, stop_when: Option<&AtomicBool>) -> (Option<Instant>, Instant) {
    let (mut first, mut last) = (None, Instant::now());
    loop {
        match rx.frames().recv_timeout(Duration::from_millis(50)) {
            Ok(f) => {
                last = Instant::now();
                first.get_or_insert(last);
                rx.release(f).expect("a frame of this receiver");
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                if stop_when.is_some_and(|d| d.load(Ordering::Relaxed)) {
                    rx.stop();
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return (first, last),
        }
    }
}
