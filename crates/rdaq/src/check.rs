//! `rdaq check`: what this host can run, for an administrator: its CPUs, memory and
//! locked-memory limit, the AF_XDP engine, and the GPU (driver, NVRTC, device) with every
//! kernel compared with its CPU stage on this GPU (the exactness checks built into the
//! binary). Exit status: 0 the GPU path can run here and every kernel equals the CPU;
//! 3 no usable GPU (the rest was checked; the CPU backend runs); 1 a kernel differs from
//! the CPU on this GPU; 2 an error.

use std::process::ExitCode;

/// The exit status for a host without a usable GPU.
pub const NO_GPU: u8 = 3;

#[derive(clap::Args)]
pub struct CheckArgs {
    /// Skip the kernel comparisons (the GPU is still found and named).
    #[arg(long)]
    no_kernels: bool,
}

pub fn check(a: CheckArgs) -> anyhow::Result<ExitCode> {
    host();
    println!("{:<28} {}", "AF_XDP engine", rdaq_net::xdp::available().map_or_else(|e| format!("no: {e}"), |()| "yes (program built, AF_XDP sockets allowed)".into()));
    let dev = match rdaq_gpu::probe() {
        Ok(d) => d,
        Err(e) => {
            println!("{:<28} none: {e}", "GPU");
            println!("result: no usable GPU: the CPU backend runs here (exit {NO_GPU})");
            return Ok(ExitCode::from(NO_GPU));
        }
    };
    let mem = dev.ctx.total_mem().map_or("?".into(), |b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64));
    let cc = dev.ctx.compute_capability().map_or("?".into(), |(a, b)| format!("{a}.{b}"));
    println!("{:<28} {} ({mem}, compute capability {cc})", "GPU", dev.name);
    println!("{:<28} CUDA {}.{}", "driver", dev.driver.0, dev.driver.1);
    println!("{:<28} {:?}", "NVRTC (compiles the kernels)", dev.nvrtc);
    if a.no_kernels {
        println!("result: the GPU backend can start here (kernels not compared: --no-kernels)");
        return Ok(ExitCode::SUCCESS);
    }
    println!("\nevery kernel on this GPU against its CPU stage, bit for bit:");
    println!("  {:<54} {:>8}  result", "check", "ms");
    let checks = rdaq_gpu::selfcheck::all(&dev);
    let mut failed = 0;
    for c in &checks {
        let (mark, text) = match &c.result {
            Ok(t) => ("equal", t.as_str()),
            Err(t) => {
                failed += 1;
                ("DIFFERS", t.as_str())
            }
        };
        println!("  {:<54} {:>8.1}  {mark}: {text}", c.name, c.ms);
    }
    if failed > 0 {
        println!("result: {failed} of {} kernel checks failed on this GPU: do not use the GPU backend here (exit 1)", checks.len());
        return Ok(ExitCode::from(1));
    }
    println!("result: the GPU backend can run here; all {} kernel checks equal the CPU", checks.len());
    Ok(ExitCode::SUCCESS)
}

/// The CPUs, memory and locked-memory limit.
fn host() {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|c| c.lines().find_map(|l| l.strip_prefix("model name").map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())));
    println!("{:<28} {cpus} usable ({})", "CPUs", model.as_deref().unwrap_or("model unknown"));
    println!("{:<28} {} MiB", "memory", rdaq_run::config::physical_mib());
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit struct, which `lim` is.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } == 0;
    let show = |v: libc::rlim_t| if v == libc::RLIM_INFINITY { "unlimited".to_string() } else { format!("{} KiB", v / 1024) };
    let memlock = if ok { format!("{} (hard {}); the AF_XDP engine's buffers are locked memory", show(lim.rlim_cur), show(lim.rlim_max)) } else { "unknown".into() };
    println!("{:<28} {memlock}", "locked memory (memlock)");
}
