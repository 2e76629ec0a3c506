//! `rdaq bench hosts`: the highest lossless aggregate throughput of one and of two receivers
//! (temporal mode) fed by the same emulated detector, and each receiver's efficiency
//! against the single one.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::bail;
use rdaq_proto::telegram::BufferMap;
use rdaq_receiver::{IncompletePolicy, Receiver, ReceiverConfig};

#[derive(clap::Args)]
pub struct HostsArgs {
    #[arg(long, default_value_t = 4)]
    modules: u16,
    /// Frames per measured run.
    #[arg(long, default_value_t = 600)]
    frames: u64,
    /// Distinct frames the emulator synthesizes once and sends in turn (synthesis would
    /// otherwise limit the sender).
    #[arg(long, default_value_t = 8, value_parser = crate::distinct_frames::<usize>)]
    pool: usize,
    #[arg(long, default_value_t = 512)]
    memory_mib: u64,
}

struct HostsOutcome {
    receivers: usize,
    /// Frames per second asked of the emulator.
    rate: f64,
    /// True when the emulator could not send as fast as asked (the sender is the limit).
    sender_limited: bool,
    frames_complete: u64,
    lost: u64,
    bytes: u64,
    window: Duration,
    per_receiver: Vec<(u64, Duration, Duration)>,
}

/// One acquisition over `n` receivers on loopback at `rate` frames/s; consumers only give
/// slots back.
fn hosts_run(a: &HostsArgs, n: usize, rate: f64) -> anyhow::Result<HostsOutcome> {
    let mut text = format!("[detector]\nmodules = {}\n[transfer]\nmode = \"temporal\"\n", a.modules);
    for i in 0..n {
        text += &format!(
            "[[receivers]]\nname = \"dr{i}\"\ncontrol = \"127.0.0.1:{}\"\ndata = \"127.0.0.1\"\ndata_port = 0\nmemory_mib = {}\n",
            7000 + i,
            a.memory_mib
        );
    }
    let t = rdaq_manager::Topology::from_toml(&text)?;
    let plan = rdaq_manager::Plan::new(&t)?;
    let mut receivers = plan
        .buffer_requests(&t)
        .into_iter()
        .map(|(_, req)| {
            Receiver::start(ReceiverConfig {
                recv_buffer: 256 << 20,
                policy: IncompletePolicy::Discard,
                linger: Duration::from_millis(300),
                ..ReceiverConfig::for_request(&req)
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let maps: Vec<BufferMap> = receivers.iter().map(|r| r.buffer_map().clone()).collect();
    let dtps = plan.module_dtps(&t, &maps)?;
    let cfg = rdaq_emulator::EmulatorConfig { modules: a.modules, frames: a.frames, rate_hz: Some(rate), frame_pool: a.pool, ..Default::default() };
    let windows = std::thread::scope(|s| -> anyhow::Result<Vec<(Option<Instant>, Instant)>> {
        let consumers: Vec<_> = receivers
            .iter()
            .map(|rx| {
                s.spawn(move || crate::drain(rx, None))
            })
            .collect();
        let r = rdaq_emulator::run(&cfg, &dtps, std::sync::Arc::new(rdaq_emulator::Control::default()));
        for rx in &receivers {
            rx.stop();
        }
        r?;
        Ok(consumers.into_iter().map(|c| c.join().expect("consumer panicked")).collect())
    })?;
    let first = windows.iter().filter_map(|w| w.0).min();
    let last = windows.iter().map(|w| w.1).max();
    let window = match (first, last) {
        (Some(f), Some(l)) if l > f => l - f,
        _ => Duration::ZERO,
    };
    let mut out =
        HostsOutcome { receivers: n, rate, sender_limited: false, frames_complete: 0, lost: 0, bytes: 0, window, per_receiver: Vec::new() };
    for (rx, w) in receivers.iter_mut().zip(&windows) {
        let c = rx.join()?;
        out.frames_complete += c.frames_complete;
        out.bytes += c.bytes_placed;
        let win = w.0.map_or(Duration::ZERO, |f| w.1 - f);
        out.per_receiver.push((c.bytes_placed, win, c.cpu_time));
    }
    out.lost = a.frames - out.frames_complete.min(a.frames);
    Ok(out)
}

impl HostsOutcome {
    fn achieved(&self) -> f64 {
        self.frames_complete as f64 / self.window.as_secs_f64().max(1e-9)
    }
}

/// Doubles the paced frame rate from 50 Hz until frames are lost (then bisects 4 times), or
/// until the emulator cannot send as fast as asked (then the sender is the limit).
fn highest_lossless(a: &HostsArgs, n: usize) -> anyhow::Result<HostsOutcome> {
    let mut good: Option<HostsOutcome> = None;
    let mut rate = 50.0;
    let bad = loop {
        let mut o = hosts_run(a, n, rate)?;
        eprintln!("  {n} receiver(s) at {rate:.0} frames/s: lost {}, achieved {:.0}/s", o.lost, o.achieved());
        if o.lost > 0 {
            break rate;
        }
        if o.achieved() < 0.8 * rate {
            o.sender_limited = true;
            return Ok(o);
        }
        good = Some(o);
        rate *= 2.0;
    };
    let Some(mut best) = good else { bail!("{n} receiver(s): frames lost even at 50 frames/s") };
    let mut bad = bad;
    for _ in 0..4 {
        let mid = 0.5 * (best.rate + bad);
        let o = hosts_run(a, n, mid)?;
        eprintln!("  {n} receiver(s) at {mid:.0} frames/s: lost {}", o.lost);
        if o.lost == 0 {
            best = o;
        } else {
            bad = mid;
        }
    }
    Ok(best)
}

pub fn hosts(a: HostsArgs) -> anyhow::Result<ExitCode> {
    if a.modules == 0 || a.frames < 100 {
        bail!("--modules must be positive and --frames at least 100");
    }
    eprintln!("rdaq bench hosts: {} modules, {} frames per run, pool of {} distinct frames", a.modules, a.frames, a.pool);
    let one = highest_lossless(&a, 1)?;
    let two = highest_lossless(&a, 2)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!();
    println!("rdaq bench hosts: highest lossless rate, temporal mode over loopback, {} JUNGFRAU modules, {} frames per run", a.modules, a.frames);
    println!("machine: {cores} CPUs shared by the emulator's {} module threads, the receivers and their consumers", a.modules);
    println!(
        "{:<10} {:>9} {:>9} {:>8} {:>6} {:>8} {:>10} {:>24} {:>11}",
        "receivers", "asked/s", "frames/s", "frames", "lost", "GB/s", "GB/s/host", "per host (GB/s, CPU%)", "efficiency"
    );
    let base = one.bytes as f64 / one.window.as_secs_f64().max(1e-9);
    for o in [&one, &two] {
        let agg = o.bytes as f64 / o.window.as_secs_f64().max(1e-9);
        let hosts: Vec<String> = o
            .per_receiver
            .iter()
            .map(|(b, w, cpu)| format!("{:.2} {:.0}%", *b as f64 / w.as_secs_f64().max(1e-9) / 1e9, 100.0 * cpu.as_secs_f64() / o.window.as_secs_f64().max(1e-9)))
            .collect();
        println!(
            "{:<10} {:>9.0} {:>9.0} {:>8} {:>6} {:>8.2} {:>10.2} {:>24} {:>10.0}%{}",
            o.receivers,
            o.rate,
            o.achieved(),
            o.frames_complete,
            o.lost,
            agg / 1e9,
            agg / 1e9 / o.receivers as f64,
            hosts.join(" | "),
            100.0 * agg / (base * o.receivers as f64),
            if o.sender_limited { "  (sender-limited)" } else { "" }
        );
    }
    println!("efficiency: aggregate rate over (receivers x the single receiver's rate). All processes share");
    println!("this machine's {cores} cores, so a second receiver adds no hardware: see docs/scaling.md for real hosts.");
    Ok(ExitCode::SUCCESS)
}

