//! A PSI detector (JUNGFRAU, EIGER) driven by its receiver (`rdaq receive --sls-detector
//! HOST`, the acquisition service of one receiver), through PSI's own Python client slsdet
//! (`python -m rdaq.sls drive`, from the `sls` extra of rdaq's Python package): once the
//! receiver listens, the detector's UDP destinations are pointed at it, its frames (and
//! period, exposure, trigger mode when given) are set, and it is started; for a pedestal
//! run, PSI's pedestal procedure (dynamic, forced G1, forced G2) runs instead. When the detector says it is done, the receiver ends as soon
//! as the datagrams in flight have landed, instead of waiting for `--quiet-s`.
//!
//! The client runs in a process group of its own, so that Ctrl-C reaches it once, from here:
//! it then stops the detector and puts its gain mode and frame count back.

use std::net::IpAddr;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};

/// The detector to drive, and how.
#[derive(Clone, Debug, Default)]
pub struct Driver {
    /// The detector's hostname (modules joined by `+`); none: nothing is driven.
    pub sls_detector: Option<String>,
    /// The MAC address of the receiver's data interface (the detector's udp_dstmac); none:
    /// the address of the interface that holds the receiver's address.
    pub receiver_mac: Option<String>,
    /// The Python that runs slsdet (the environment rdaq's Python package is installed in).
    pub python: String,
}

/// How long a driven detector may take to end by itself once the receiver has its frames.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Beyond the frame timeout, how long a driven detector's last datagrams may take to land
/// once it says it has finished.
pub const LANDED: Duration = Duration::from_millis(500);

/// The client's exit status once interrupted, having stopped and restored the detector.
const INTERRUPTED: i32 = 130;

/// Which PSI detector is driven: they take their UDP destinations differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// JUNGFRAU (`--format sls`): one or two interfaces per module.
    Jungfrau,
    /// EIGER (`--detector eiger`): two ports per half-module, and its bit depth (`dr`).
    Eiger { bit_depth: u32 },
}

impl Kind {
    /// The driven kind of the detector whose packets `source` takes.
    pub fn of(source: &crate::remote::Source) -> anyhow::Result<Kind> {
        match &source.detector {
            None if source.format == "sls" => Ok(Kind::Jungfrau),
            Some(d) if d.name.eq_ignore_ascii_case("eiger") => Ok(Kind::Eiger { bit_depth: source.bit_depth.unwrap_or(d.pixel.default_bit_depth) }),
            _ => bail!("--sls-detector drives a JUNGFRAU (--format sls) or an EIGER (--detector eiger), whose packets this receiver does not take"),
        }
    }
}

/// What the driven detector is asked for.
pub struct Ask {
    pub kind: Kind,
    pub bind: IpAddr,
    pub port: u16,
    pub interfaces: u8,
    pub frames: u64,
    pub period_s: Option<f64>,
    pub exptime_s: Option<f64>,
    pub pedestal: bool,
    /// internal, external or gate (checked with the configuration).
    pub trigger: String,
}

impl Ask {
    /// What the receiver of `source` under `cfg` asks of the detector it drives: `frames`
    /// (a pedestal's three stages together), the period and exposure when told (above 0),
    /// and the trigger mode.
    pub fn of(cfg: &crate::config::Config, source: &crate::remote::Source, frames: u64, (period_s, exptime_s): (f64, f64), pedestal: bool, trigger: String) -> anyhow::Result<Ask> {
        let told = |t: f64| (t > 0.0).then_some(t);
        Ok(Ask {
            kind: Kind::of(source)?,
            bind: cfg.network.bind,
            port: cfg.network.data_port,
            interfaces: source.interfaces,
            frames,
            period_s: told(period_s),
            exptime_s: told(exptime_s),
            pedestal,
            trigger,
        })
    }
}

/// The detector's client while it drives the detector.
pub struct Drive {
    child: Arc<Mutex<Child>>,
    /// Set once the client has ended (the detector done, or the client failed).
    ended: Arc<AtomicBool>,
    status: Arc<Mutex<Option<ExitStatus>>>,
    watcher: std::thread::JoinHandle<()>,
}

impl Driver {
    /// The client's command line for `ask`; checked before anything starts.
    pub fn command(&self, ask: &Ask) -> anyhow::Result<Option<Command>> {
        let Some(host) = &self.sls_detector else { return Ok(None) };
        if ask.bind.is_unspecified() {
            bail!("--sls-detector needs --bind <the address of the card the detector sends to>: the detector's udp_dstip cannot be {}", ask.bind);
        }
        let mac = match &self.receiver_mac {
            Some(m) => m.clone(),
            None => mac_of(ask.bind)?,
        };
        if !is_mac(&mac) {
            bail!("--receiver-mac {mac:?}: six hexadecimal bytes joined by colons (aa:bb:cc:dd:ee:ff)");
        }
        if ask.frames == 0 {
            bail!("--sls-detector needs a frame count (--frames): the frames the detector takes");
        }
        if ask.pedestal && ask.kind != Kind::Jungfrau {
            bail!("--sls-detector: a pedestal run is a JUNGFRAU's (forced gain switching)");
        }
        let frames = if ask.pedestal {
            if !ask.frames.is_multiple_of(3) {
                bail!("--frames {} with --pedestal-run and --sls-detector: three stages of as many frames each, a multiple of 3", ask.frames);
            }
            ask.frames / 3
        } else {
            ask.frames
        };
        let mut c = Command::new(&self.python);
        c.args(["-m", "rdaq.sls", "drive", "--detector", host, "--receiver-ip", &ask.bind.to_string(), "--receiver-mac", &mac]);
        c.args(["--port", &ask.port.to_string(), "--interfaces", &ask.interfaces.to_string(), "--frames", &frames.to_string()]);
        for (opt, v) in [("--period-s", ask.period_s), ("--exptime-s", ask.exptime_s)] {
            if let Some(v) = v {
                c.args([opt, &v.to_string()]);
            }
        }
        c.args(["--trigger", &ask.trigger]);
        if let Kind::Eiger { bit_depth } = ask.kind {
            c.args(["--kind", "eiger", "--bit-depth", &bit_depth.to_string()]);
        }
        if ask.pedestal {
            c.arg("--pedestal");
        }
        Ok(Some(c))
    }
}

/// The MAC address of the interface that holds `ip`: where the detector is to send.
fn mac_of(ip: IpAddr) -> anyhow::Result<String> {
    let IpAddr::V4(v4) = ip else { bail!("--sls-detector: give --receiver-mac for an IPv6 --bind ({ip})") };
    let iface = rdaq_net::iface::Interface::holding(v4).ok().flatten().with_context(|| format!("--sls-detector: no interface of this host holds --bind {ip}: give --receiver-mac"))?;
    rdaq_net::iface::hardware_address(&iface.name).with_context(|| format!("--sls-detector: the MAC address of {} cannot be read: give --receiver-mac", iface.name))
}

fn is_mac(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() == 6 && parts.iter().all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

impl Drive {
    /// Starts the client (the receiver listens by now).
    pub fn start(mut command: Command) -> anyhow::Result<Drive> {
        use std::os::unix::process::CommandExt;
        let program = command.get_program().to_string_lossy().into_owned();
        let child = command.process_group(0).spawn().with_context(|| format!("--sls-detector: cannot start {program} (--python, RDAQ_PYTHON)"))?;
        let child = Arc::new(Mutex::new(child));
        let ended = Arc::new(AtomicBool::new(false));
        let status = Arc::new(Mutex::new(None));
        let (c, e, s) = (child.clone(), ended.clone(), status.clone());
        let watcher = std::thread::spawn(move || loop {
            let polled = c.lock().unwrap_or_else(std::sync::PoisonError::into_inner).try_wait();
            match polled {
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Ok(Some(st)) => {
                    *s.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(st);
                    e.store(true, Ordering::Release);
                    return;
                }
                Err(_) => {
                    e.store(true, Ordering::Release);
                    return;
                }
            }
        });
        Ok(Drive { child, ended, status, watcher })
    }

    /// Set once the client has ended: the detector has sent what it will send.
    pub fn ended(&self) -> Arc<AtomicBool> {
        self.ended.clone()
    }

    /// After the receiver has ended: a client still driving is given `patience` to end by
    /// itself (the detector's last polls, its settings put back), and is then interrupted
    /// once, so that it stops the detector and restores it; then what the client came to.
    pub fn finish(self, patience: Duration) -> anyhow::Result<()> {
        let until = std::time::Instant::now() + patience;
        while !self.ended.load(Ordering::Acquire) && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut interrupted = false;
        {
            let mut child = self.child.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Ok(None) = child.try_wait() {
                // SAFETY: kill(2) of our child's pid: try_wait said, under the lock that every
                // reaping of it holds, that it is not reaped, so the pid still names it.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
                interrupted = true;
            }
        }
        self.watcher.join().map_err(|_| anyhow::anyhow!("--sls-detector: the client's watcher panicked"))?;
        match *self.status.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
            Some(st) if st.success() => Ok(()),
            // stopped and restored as asked: the summary says what the receiver took
            Some(st) if interrupted && st.code() == Some(INTERRUPTED) => Ok(()),
            Some(st) => bail!("--sls-detector: driving the detector failed (python -m rdaq.sls drive: {st}; its message is above)"),
            None => bail!("--sls-detector: the detector's client could not be waited for"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(frames: u64, pedestal: bool) -> Ask {
        Ask { kind: Kind::Jungfrau, bind: "10.1.1.100".parse().unwrap(), port: 50001, interfaces: 2, frames, period_s: Some(0.002), exptime_s: None, pedestal, trigger: "internal".into() }
    }

    fn args() -> Driver {
        Driver { sls_detector: Some("jf1+jf2".into()), receiver_mac: Some("9c:dc:71:47:e5:d4".into()), python: "python3".into() }
    }

    #[test]
    fn the_client_is_asked_for_what_the_receiver_takes() {
        let c = args().command(&ask(3000, true)).unwrap().unwrap();
        let line: Vec<String> = c.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(line.join(" "), "-m rdaq.sls drive --detector jf1+jf2 --receiver-ip 10.1.1.100 --receiver-mac 9c:dc:71:47:e5:d4 --port 50001 --interfaces 2 --frames 1000 --period-s 0.002 --trigger internal --pedestal");
        assert!(Driver::default().command(&ask(1, false)).unwrap().is_none());
        // without --receiver-mac, the MAC of the interface holding --bind (loopback's: zeros)
        let lo = Driver { receiver_mac: None, ..args() }.command(&Ask { bind: "127.0.0.1".parse().unwrap(), ..ask(3, false) }).unwrap().unwrap();
        assert!(lo.get_args().any(|a| a == "00:00:00:00:00:00"), "{:?}", lo.get_args().collect::<Vec<_>>());
        let c = args().command(&Ask { kind: Kind::Eiger { bit_depth: 8 }, ..ask(5, false) }).unwrap().unwrap();
        let line: Vec<String> = c.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert!(line.join(" ").ends_with("--frames 5 --period-s 0.002 --trigger internal --kind eiger --bit-depth 8"), "{line:?}");
    }

    #[test]
    fn what_the_detector_cannot_take_is_refused_before_anything_starts() {
        let e = |a: Driver, k: Ask| a.command(&k).unwrap_err().to_string();
        assert!(e(args(), ask(1000, true)).contains("a multiple of 3"));
        assert!(e(Driver { receiver_mac: Some("9c:dc:71".into()), ..args() }, ask(3, false)).contains("--receiver-mac"));
        assert!(e(args(), Ask { bind: "0.0.0.0".parse().unwrap(), ..ask(3, false) }).contains("--bind"));
        assert!(e(Driver { receiver_mac: None, ..args() }, Ask { bind: "192.0.2.7".parse().unwrap(), ..ask(3, false) }).contains("no interface of this host holds"));
        assert!(e(args(), Ask { kind: Kind::Eiger { bit_depth: 16 }, ..ask(3, true) }).contains("JUNGFRAU's"));
    }
}
