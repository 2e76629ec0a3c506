//! Transport tuning users otherwise check by hand, read at start and reported, never
//! changed: socket buffers granted against asked and `net.core.rmem_max`, the backlog queue,
//! busy polling, the interface's MTU against the datagrams, where the receive thread and the
//! interface's interrupts run, and the huge pages the ring got. A setting known to lose
//! data or time gets a warning that names it.

use std::net::IpAddr;

use crate::engine::EngineKind;
use crate::iface::Interface;

/// What a receiver asked for and got, for [`check`].
#[derive(Clone, Debug)]
pub struct Setup {
    pub engine: EngineKind,
    pub bind: IpAddr,
    /// Largest datagram (UDP payload) the receiver takes.
    pub datagram_bytes: usize,
    pub recv_buffer_asked: usize,
    pub recv_buffer_granted: usize,
    /// The CPU the receive thread is pinned to.
    pub recv_cpu: Option<usize>,
    pub ring_bytes: usize,
    /// Ring bytes in huge pages, where known.
    pub ring_huge_bytes: Option<usize>,
}

/// One setting as found, with a warning when it is known to hurt.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub setting: String,
    pub value: String,
    pub warning: Option<String>,
}

fn finding(setting: &str, value: impl ToString, warning: Option<String>) -> Finding {
    Finding { setting: setting.into(), value: value.to_string(), warning }
}

/// A number under /proc/sys.
fn sysctl(path: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/sys/{path}")).ok()?.trim().parse().ok()
}

/// The findings for `s` on this host.
pub fn check(s: &Setup) -> Vec<Finding> {
    let mut out = vec![buffers(s), backlog(), busy_poll()];
    let itf = match s.bind {
        IpAddr::V4(ip) => Interface::holding(ip).ok().flatten(),
        IpAddr::V6(_) => None,
    };
    if let Some(i) = &itf {
        out.push(mtu(i, s.datagram_bytes));
        out.push(placement(i, s.recv_cpu));
    }
    out.push(huge_pages(s));
    out
}

fn buffers(s: &Setup) -> Finding {
    let max = sysctl("net/core/rmem_max");
    let value = format!("{} MiB asked, {} MiB granted (net.core.rmem_max {})", s.recv_buffer_asked >> 20, s.recv_buffer_granted >> 20, max.map_or("unknown".into(), |m| format!("{} KiB", m >> 10)));
    // Linux reports twice the size asked (half for its bookkeeping)
    let short = s.engine != EngineKind::AfXdp && s.recv_buffer_granted < s.recv_buffer_asked;
    let warning = short.then(|| "the kernel granted less socket buffer than asked: raise net.core.rmem_max (sysctl -w net.core.rmem_max=...), or run as root (SO_RCVBUFFORCE)".to_string());
    finding("socket receive buffer", value, warning)
}

fn backlog() -> Finding {
    let b = sysctl("net/core/netdev_max_backlog");
    let warning = b.filter(|&b| b < 4096).map(|b| {
        format!("net.core.netdev_max_backlog is {b}: a burst of more datagrams than that per CPU is dropped before any socket on loopback, veth and drivers without NAPI (sysctl -w net.core.netdev_max_backlog=65536)")
    });
    finding("net.core.netdev_max_backlog", b.map_or("unknown".into(), |b| b.to_string()), warning)
}

fn busy_poll() -> Finding {
    let (read, poll) = (sysctl("net/core/busy_read"), sysctl("net/core/busy_poll"));
    let show = |v: Option<u64>| v.map_or("unknown".into(), |v| if v == 0 { "off".to_string() } else { format!("{v} us") });
    finding("busy polling", format!("net.core.busy_read {}, net.core.busy_poll {} (off: interrupt-driven, no core spent spinning)", show(read), show(poll)), None)
}

fn mtu(i: &Interface, datagram: usize) -> Finding {
    // IPv4 + UDP headers
    let needed = datagram + 28;
    let warning = (!i.loopback && (i.mtu as usize) < needed).then(|| {
        let pieces = needed.div_ceil(i.mtu as usize - 20);
        format!("interface {} has MTU {} below the {needed}-byte IP packets: each datagram travels as {pieces} IP fragments, and one lost fragment loses it (set mtu 9000 on the path)", i.name, i.mtu)
    });
    finding("interface MTU", format!("{} on {}", i.mtu, i.name), warning)
}

/// Where the receive thread and the interface's interrupts run.
fn placement(i: &Interface, cpu: Option<usize>) -> Finding {
    let irqs = interface_irqs(&i.name);
    let cpus: Vec<usize> = irqs.iter().flat_map(|&q| irq_cpus(q)).collect();
    let thread = cpu.map_or("receive thread not pinned".into(), |c| format!("receive thread on CPU {c}"));
    let irq = if irqs.is_empty() { "no interrupts of its own (a virtual interface: delivery runs on the sender's CPU)".to_string() } else { format!("{} interrupt(s) on CPUs {:?}", irqs.len(), dedup(cpus.clone())) };
    let warning = cpu.filter(|c| cpus.contains(c)).map(|c| format!("the receive thread's CPU {c} also takes {}'s interrupts: move it (--recv-cpu) or the interrupts (/proc/irq/N/smp_affinity_list)", i.name));
    finding("CPU placement", format!("{thread}; {}: {irq}", i.name), warning)
}

fn dedup(mut v: Vec<usize>) -> Vec<usize> {
    v.sort_unstable();
    v.dedup();
    v
}

/// IRQ numbers whose /proc/interrupts line names the interface (e.g. `eth0-TxRx-3`).
fn interface_irqs(name: &str) -> Vec<u32> {
    let text = std::fs::read_to_string("/proc/interrupts").unwrap_or_default();
    text.lines()
        .filter(|l| l.split_whitespace().last().is_some_and(|d| d == name || d.starts_with(&format!("{name}-"))))
        .filter_map(|l| l.split(':').next()?.trim().parse().ok())
        .collect()
}

/// The CPUs an IRQ is delivered to ("0-3,8" lists).
fn irq_cpus(irq: u32) -> Vec<usize> {
    let text = std::fs::read_to_string(format!("/proc/irq/{irq}/effective_affinity_list")).or_else(|_| std::fs::read_to_string(format!("/proc/irq/{irq}/smp_affinity_list"))).unwrap_or_default();
    parse_cpu_list(text.trim())
}

/// "0-2,5" as [0, 1, 2, 5].
pub fn parse_cpu_list(s: &str) -> Vec<usize> {
    s.split(',')
        .filter_map(|part| match part.split_once('-') {
            Some((a, b)) => Some((a.trim().parse().ok()?..=b.trim().parse().ok()?).collect::<Vec<usize>>()),
            None => part.trim().parse().ok().map(|c| vec![c]),
        })
        .flatten()
        .collect()
}

fn huge_pages(s: &Setup) -> Finding {
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let mode = thp.split_whitespace().find(|w| w.starts_with('[')).map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string()).unwrap_or_else(|| "unknown".into());
    let got = s.ring_huge_bytes.map_or("unknown".into(), |h| format!("{} of {} MiB", h >> 20, s.ring_bytes >> 20));
    let warning = (mode == "never").then(|| "transparent huge pages are off (/sys/kernel/mm/transparent_hugepage/enabled = never): the ring is in 4 KiB pages, and the copy into it takes more TLB misses (set madvise or always)".to_string());
    finding("ring in huge pages", format!("{got} (transparent huge pages: {mode})"), warning)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_read_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-2,5"), vec![0, 1, 2, 5]);
        assert_eq!(parse_cpu_list("7"), vec![7]);
        assert_eq!(parse_cpu_list(""), Vec::<usize>::new());
    }

    #[test]
    fn a_short_mtu_and_a_capped_buffer_are_named() {
        let lo = Interface { name: "eth9".into(), index: 1, mtu: 1500, rx_queues: 1, loopback: false };
        let f = mtu(&lo, 8192 + 48);
        assert!(f.warning.as_deref().unwrap().contains("6 IP fragments"), "{f:?}");
        assert!(mtu(&Interface { mtu: 9000, ..lo }, 8240).warning.is_none());
        let s = Setup { engine: EngineKind::Recvmmsg, bind: "127.0.0.1".parse().unwrap(), datagram_bytes: 8240, recv_buffer_asked: 64 << 20, recv_buffer_granted: 4 << 20, recv_cpu: None, ring_bytes: 1 << 30, ring_huge_bytes: None };
        assert!(buffers(&s).warning.unwrap().contains("net.core.rmem_max"));
        assert!(buffers(&Setup { recv_buffer_granted: 128 << 20, ..s }).warning.is_none());
    }
}
