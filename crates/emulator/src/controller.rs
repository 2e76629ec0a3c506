//! The RASHPA controller (RC) of one emulated module: its frame loop (make, record, pace,
//! send per DTP) and its request service (resend what receivers ask for, probe the tail).

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdaq_detector::synth::ModuleSynth;
use rdaq_detector::MODULE_BYTES;
use rdaq_proto::events::Event;
use rdaq_proto::nack::{self, Missing};
use rdaq_proto::seq::distance;
use rdaq_proto::telegram::LocalBufferInfo;

use crate::config::{EmulatorConfig, EmulatorError};
use crate::control::Control;
use crate::faults::Faults;
use crate::history::{Content, Store};
use crate::link::{channel, send_frame, Channel, Channels, Record};
use crate::packetize::MAX_HEADER;
use crate::report::{EmulatorReport, ManifestEntry};
use crate::roce::{self, RoceLinks, Spoil};
use crate::trigger::Trigger;

/// Tail probes after the last frame, and the time between them.
const PROBES: u32 = 3;
const PROBE_EVERY: Duration = Duration::from_millis(50);

/// The sending state of one RASHPA controller, shared by its frame loop and its request
/// service.
struct Controller<'a> {
    cfg: &'a EmulatorConfig,
    module: u16,
    content: Content,
    store: Store,
    faults: Option<Faults>,
    delay: Duration,
    history: usize,
    report: EmulatorReport,
    control: &'a Control,
    /// RoCEv2 queue pairs, by receiver data address.
    roce: RoceLinks,
}

impl Controller<'_> {
    /// Sends datagram `k` of a recorded frame again, marked as retransmitted.
    fn resend(&mut self, ch: &mut Channel, rec: Record, k: usize) -> io::Result<()> {
        let Some(bytes) = self.store.bytes(rec.frame) else {
            self.report.retransmit.history_misses += 1;
            return Ok(());
        };
        let mut hdr = [0u8; MAX_HEADER];
        let seq = rec.first_seq.wrapping_add(k as u32);
        let hl = ch.pk.encode(rec.frame, &rec.buf, rec.offset, k, seq, true, bytes, &mut hdr);
        ch.link.resends += 1;
        let part = [(&hdr[..hl], ch.pk.payload(k, bytes), seq, ch.link.resends)];
        ch.link.send(&part, self.faults.as_ref(), self.delay, &mut self.report.faults)?;
        self.report.retransmit.resent += 1;
        Ok(())
    }

    /// Answers every request waiting on the channel; true if there was one.
    fn serve(&mut self, ch: &mut Channel) -> io::Result<bool> {
        let mut buf = [0u8; 2048];
        let mut any = false;
        while let Some(len) = ch.link.tx.try_recv(&mut buf)? {
            any = true;
            self.report.retransmit.nacks += 1;
            let entries = match nack::decode(&buf[..len]) {
                Ok((m, e)) if m == self.module => e,
                _ => {
                    self.report.retransmit.bad_nacks += 1;
                    continue;
                }
            };
            let n = ch.pk.datagrams();
            for e in entries {
                match e {
                    Missing::Seq { start, end } => {
                        let want = end.wrapping_sub(start) as u64;
                        self.report.retransmit.requested += want;
                        // only the part of the range the records cover is walked
                        let Some(first) = ch.records.front().map(|r| r.first_seq) else {
                            self.report.retransmit.history_misses += want;
                            continue;
                        };
                        let covered = (ch.records.len() * n) as i64;
                        let lo = (distance(first, start) as i64).max(0);
                        let hi = (distance(first, start) as i64 + want as i64).min(covered);
                        self.report.retransmit.history_misses += want - (hi - lo).max(0) as u64;
                        for rel in lo..hi {
                            let rec = ch.records[rel as usize / n];
                            self.resend(ch, rec, rel as usize % n)?;
                        }
                    }
                    Missing::Frame { frame, start, end } => {
                        let want = (end - start) as u64;
                        self.report.retransmit.requested += want;
                        let found = ch.records.binary_search_by_key(&frame, |r| r.frame).ok().map(|i| ch.records[i]);
                        let Some(rec) = found.filter(|_| (end as usize) <= n) else {
                            self.report.retransmit.history_misses += want;
                            continue;
                        };
                        for k in start..end {
                            self.resend(ch, rec, k as usize)?;
                        }
                    }
                }
            }
        }
        Ok(any)
    }

    /// After the last frame: flush what the fault injector holds, probe each channel's tail
    /// and answer requests until none came for `linger`.
    fn linger(&mut self, channels: &mut Channels, linger: Duration) -> io::Result<()> {
        for ch in channels.values_mut() {
            ch.link.release(true)?;
        }
        // RoCEv2 queue pairs recover by their own acknowledgements (`drain_roce`)
        if self.history == 0 || channels.is_empty() {
            return Ok(());
        }
        let mut fds: Vec<libc::pollfd> =
            channels.values().map(|c| libc::pollfd { fd: c.link.tx.socket().as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
        let mut last = Instant::now();
        let mut next_probe = Instant::now();
        let mut probes = 0;
        while !self.control.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if probes < PROBES && now >= next_probe {
                for ch in channels.values_mut() {
                    if let Some(&rec) = ch.records.back() {
                        let k = ch.pk.datagrams() - 1;
                        self.resend(ch, rec, k)?;
                        self.report.retransmit.probes += 1;
                    }
                }
                probes += 1;
                next_probe = now + PROBE_EVERY;
                last = now;
            }
            for ch in channels.values_mut() {
                if self.serve(ch)? {
                    last = Instant::now();
                }
                ch.link.release(false)?;
            }
            if probes >= PROBES && last.elapsed() >= linger {
                break;
            }
            rdaq_net::socket::wait_readable(&mut fds, 5)?;
        }
        for ch in channels.values_mut() {
            ch.link.release(true)?;
        }
        Ok(())
    }
}

impl Controller<'_> {
    /// Takes the RoCEv2 answers waiting on every queue pair (and resends what they ask for).
    fn serve_roce(&mut self) -> io::Result<bool> {
        let Controller { roce, store, faults, report, .. } = self;
        let bytes = |f: u64| store.bytes(f);
        let mut any = false;
        for l in roce.values_mut() {
            let mut spoil = Spoil { faults: faults.as_ref(), stats: &mut report.faults };
            any |= l.serve(&bytes, &mut spoil, &mut report.retransmit)?;
        }
        Ok(any)
    }

    /// Waits until no queue pair still needs the history slot frame `frame` is made in.
    fn roce_window(&mut self, frame: u64) -> io::Result<()> {
        let ring = self.store.ring.len() as u64;
        while self.roce.values().any(|l| l.oldest_frame().is_some_and(|o| frame >= o + ring)) {
            self.wait_roce()?;
        }
        Ok(())
    }

    /// Serves the queue pairs, or waits up to a millisecond for an answer.
    fn wait_roce(&mut self) -> io::Result<()> {
        if !self.serve_roce()? {
            let mut fds: Vec<libc::pollfd> = self.roce.values().map(|l| libc::pollfd { fd: l.fd(), events: libc::POLLIN, revents: 0 }).collect();
            rdaq_net::socket::wait_readable(&mut fds, 1)?;
        }
        Ok(())
    }

    /// After the last frame: until every WRITE is acknowledged (or the receiver is gone).
    fn drain_roce(&mut self) -> io::Result<()> {
        while self.roce.values().any(|l| l.outstanding() > 0) && !self.control.stop.load(Ordering::Relaxed) {
            self.wait_roce()?;
        }
        Ok(())
    }
}

/// Runs module `module`'s RC: every frame of the run, then the request service until the
/// receivers are quiet. `start` is the time of frame 0 of the run.
pub(crate) fn run_module(cfg: &EmulatorConfig, module: u16, start: Instant, control: &Control, trigger: &Trigger) -> Result<EmulatorReport, EmulatorError> {
    let err = |source| EmulatorError::Send { module, source };
    let mut rc = Controller::new(cfg, module, control);
    let mut channels = Channels::new();
    let period = cfg.rate_hz.map(|r| Duration::from_secs_f64(1.0 / r));
    let mut dests: Vec<(usize, LocalBufferInfo)> = Vec::new();
    for i in 0..cfg.frames {
        if control.stop.load(Ordering::Relaxed) {
            break;
        }
        if rc.history > 0 {
            for ch in channels.values_mut() {
                rc.serve(ch).map_err(err)?;
            }
        }
        rc.serve_roce().map_err(err)?;
        if let Some(slow) = cfg.faults.as_ref().and_then(|f| f.slow).filter(|s| s.module == module) {
            std::thread::sleep(slow.per_frame);
        }
        if trigger.wait(i, &control.stop) {
            rc.report.held_back += 1;
        }
        let frame_start = period.map(|p| (start + p.mul_f64(i as f64), p));
        rc.send_frame(cfg.first_frame + i, frame_start, &mut channels, &mut dests).map_err(err)?;
        trigger.finished(module, i);
    }
    trigger.leave(module);
    rc.finish(channels).map_err(err)
}

impl<'a> Controller<'a> {
    /// The RC of module `module`: what its frames hold, the pool (benchmarks) or the history
    /// ring they are made in, and its fault injector.
    fn new(cfg: &'a EmulatorConfig, module: u16, control: &'a Control) -> Controller<'a> {
        let words = (cfg.module_bytes / 2) as usize;
        let mut content = if cfg.module_bytes == MODULE_BYTES as u64 {
            Content::Jungfrau(Box::new(ModuleSynth::new(cfg.synth.clone(), module)))
        } else {
            Content::Pattern { seed: cfg.synth.seed, module }
        };
        let pool: Vec<Vec<u16>> = (0..cfg.frame_pool as u64)
            .map(|f| {
                let mut w = vec![0u16; words];
                content.make(f, &mut w);
                w
            })
            .collect();
        let history = (cfg.history_bytes / cfg.module_bytes) as usize;
        let ring_len = if pool.is_empty() { history.max(1) } else { 0 };
        Controller {
            cfg,
            module,
            content,
            store: Store { pool, ring: vec![vec![0u16; words]; ring_len], tags: vec![None; ring_len] },
            faults: cfg.faults.as_ref().map(|f| Faults::new(f, module)),
            delay: cfg.faults.as_ref().map_or(Duration::ZERO, |f| f.delay_time),
            history,
            report: EmulatorReport { gso: true, ..Default::default() },
            control,
            roce: RoceLinks::new(),
        }
    }

    /// Makes frame `frame` and sends it to every destination its DTP names, spread over the
    /// frame period (`frame_start`: when it starts, and the period) or at full speed.
    fn send_frame(&mut self, frame: u64, frame_start: Option<(Instant, Duration)>, channels: &mut Channels, dests: &mut Vec<(usize, LocalBufferInfo)>) -> io::Result<()> {
        let Some(dtps) = self.control.start_frame(frame) else {
            return Ok(());
        };
        let dtp = &dtps[self.module as usize];
        if self.store.pool.is_empty() {
            self.roce_window(frame)?;
            let slot = (frame % self.store.ring.len() as u64) as usize;
            self.content.make(frame, &mut self.store.ring[slot]);
            self.store.tags[slot] = Some(frame);
        }
        let bytes = self.store.bytes(frame).expect("the frame was just made");
        self.report.manifest.push(ManifestEntry { frame, module: self.module, xxh3: xxhash_rust::xxh3::xxh3_64(bytes) });
        if frame_start.is_some_and(|(t0, p)| Instant::now() > t0 + p) {
            self.report.late_frames += 1;
        }
        dests.clear();
        dtp.destinations(frame, |r, b| dests.push((r, *b)));
        // the packets of all destinations spread over the frame period
        let per_dest = dtp.module_bytes.div_ceil(dtp.payload_bytes as u64) as usize;
        let total = dests.len() * per_dest;
        let sent_in_frame = std::cell::Cell::new(0usize);
        self.control.sent.mark(frame);
        let pace = |m: usize| {
            if let Some((t0, p)) = frame_start {
                rdaq_net::pace::wait_until(t0 + p.mul_f64(sent_in_frame.get() as f64 / total as f64));
            }
            sent_in_frame.set(sent_in_frame.get() + m);
        };
        for &(r, buf) in dests.iter() {
            let route = &dtp.routes[r];
            if let Some(qp) = route.roce {
                let link = roce::link(&mut self.roce, route, qp, self.cfg.send_buffer)?;
                let mut spoil = Spoil { faults: self.faults.as_ref(), stats: &mut self.report.faults };
                let store = &self.store;
                let bytes = |f: u64| store.bytes(f);
                link.write_frame(frame, &buf, route.offset, &bytes, &mut spoil, &mut self.report.retransmit, pace)?;
                continue;
            }
            let ch = channel(channels, self.cfg, dtp, route)?;
            ch.pk.frame(frame, &buf, route.offset, bytes);
            if self.history > 0 {
                if ch.records.len() >= self.history {
                    ch.records.pop_front();
                }
                ch.records.push_back(Record { frame, first_seq: ch.pk.first_seq(), buf, offset: route.offset });
            }
            send_frame(ch, bytes, self.faults.as_ref(), self.delay, &mut self.report.faults, pace)?;
        }
        self.control.event(Event::EndOfFrame { module: self.module, frame, imm: frame as u32 });
        self.control.module_frames.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// After the last frame: the request service until the receivers are quiet, then the
    /// report and the end-of-transfer events.
    fn finish(mut self, mut channels: Channels) -> io::Result<EmulatorReport> {
        let (module, control) = (self.module, self.control);
        self.report.refused_in_frames = channels.values().map(|c| c.link.tx.stats.refused).sum();
        self.linger(&mut channels, self.cfg.linger)?;
        self.drain_roce()?;
        let mut report = self.report;
        for l in self.roce.values() {
            report.sent.datagrams += l.packets;
            report.sent.bytes += l.bytes;
            report.roce_refused += l.refused();
        }
        for ch in channels.values() {
            report.sent += ch.link.tx.stats;
            report.gso &= ch.link.tx.gso();
        }
        if report.late_frames > 0 {
            control.event(Event::SourceOverflow { module, late_frames: report.late_frames });
        }
        control.event(Event::EndOfTransfer { module, frames: report.manifest.len() as u64, datagrams: report.sent.datagrams });
        Ok(report)
    }
}
