//! Fault injection in the send path (the kernel here has no netem): loss in bursts,
//! reordering, duplication, delay and bit corruption, each decided per datagram by a pure
//! function of (seed, module, sequence number, attempt). A first transmission therefore
//! meets the same fate in every run with the same seed, whatever the timing; the fate of a
//! retransmission depends on how many resends came before it on its channel, which depends
//! on timing, so only first transmissions are exactly reproducible. A slow module takes longer
//! for every frame than the others (a thread that a busy machine runs less often).

use std::time::Duration;

use rdaq_detector::rng;

#[derive(Clone, Debug, PartialEq)]
pub struct FaultConfig {
    pub seed: u64,
    /// Fraction of datagrams lost.
    pub loss: f64,
    /// Mean length of a loss burst in datagrams (1: independent losses). Bursts are
    /// uniform in length between 1 and `2 * burst - 1`.
    pub burst: f64,
    /// Fraction sent late, after `reorder_depth` later datagrams of their channel.
    pub reorder: f64,
    pub reorder_depth: u32,
    /// Fraction sent twice.
    pub duplicate: f64,
    /// Fraction held back for `delay_time`.
    pub delay: f64,
    pub delay_time: Duration,
    /// Fraction with one bit flipped (anywhere in the datagram).
    pub corrupt: f64,
    /// One module slower than the others, as a busy machine runs one thread less often.
    pub slow: Option<Slow>,
}

/// Module `module` takes `per_frame` longer for every frame than it would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slow {
    pub module: u16,
    pub per_frame: Duration,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            seed: 1,
            loss: 0.0,
            burst: 1.0,
            reorder: 0.0,
            reorder_depth: 16,
            duplicate: 0.0,
            delay: 0.0,
            delay_time: Duration::from_millis(2),
            corrupt: 0.0,
            slow: None,
        }
    }
}

impl FaultConfig {
    /// Checks the rates; the message names the field.
    pub fn check(&self) -> Result<(), String> {
        for (name, v) in [
            ("loss", self.loss),
            ("reorder", self.reorder),
            ("duplicate", self.duplicate),
            ("delay", self.delay),
            ("corrupt", self.corrupt),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("faults.{name} = {v} must be a fraction in 0..=1"));
            }
        }
        if !(1.0..=1000.0).contains(&self.burst) {
            return Err(format!("faults.burst = {} must be a mean burst length in 1..=1000", self.burst));
        }
        if self.corrupt + self.duplicate + self.reorder + self.delay > 1.0 {
            return Err("faults: corrupt + duplicate + reorder + delay must not exceed 1".into());
        }
        Ok(())
    }

    /// True when no fault is asked for.
    pub fn is_clean(&self) -> bool {
        self.loss == 0.0 && self.reorder == 0.0 && self.duplicate == 0.0 && self.delay == 0.0 && self.corrupt == 0.0 && self.slow.is_none()
    }
}

/// What happens to one datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    Pass,
    Drop,
    Duplicate,
    /// Flip bit `bit` of byte `byte % len`.
    Corrupt { byte: u32, bit: u8 },
    /// Send after this many later datagrams of the channel.
    Reorder(u32),
    Delay,
}

/// What the injector did, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, derive_more::AddAssign)]
pub struct FaultStats {
    pub dropped: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    pub reordered: u64,
    pub delayed: u64,
}

impl FaultStats {
    pub fn count(&mut self, f: Fate) {
        match f {
            Fate::Pass => {}
            Fate::Drop => self.dropped += 1,
            Fate::Duplicate => self.duplicated += 1,
            Fate::Corrupt { .. } => self.corrupted += 1,
            Fate::Reorder(_) => self.reordered += 1,
            Fate::Delay => self.delayed += 1,
        }
    }
}

/// Decides fates; one per module (its channels share the module's key).
#[derive(Clone, Debug)]
pub struct Faults {
    cfg: FaultConfig,
    key: u64,
    /// Probability that a burst starts at a given datagram, and the longest burst.
    start: f64,
    longest: u32,
}

impl Faults {
    pub fn new(cfg: &FaultConfig, module: u16) -> Self {
        let longest = (2.0 * cfg.burst - 1.0).round().max(1.0) as u32;
        let mean = (1 + longest) as f64 / 2.0;
        Faults { cfg: cfg.clone(), key: rng::key(&[cfg.seed, module as u64, 0xfa_17]), start: cfg.loss / mean, longest }
    }

    /// Length of the burst that starts at `seq`, or 0.
    #[inline]
    fn burst_at(&self, seq: u32) -> u32 {
        let w = rng::at(self.key, seq as u64);
        if rng::unit(w) < self.start {
            1 + (rng::mix64(w) % self.longest as u64) as u32
        } else {
            0
        }
    }

    /// The fate of the datagram with sequence number `seq` on its `attempt`-th sending
    /// (0: first). Bursts apply to first sendings; later ones are lost independently at the
    /// loss rate.
    pub fn fate(&self, seq: u32, attempt: u64) -> Fate {
        if self.cfg.is_clean() {
            return Fate::Pass;
        }
        let lost = if attempt == 0 {
            self.start > 0.0 && (0..self.longest).any(|back| self.burst_at(seq.wrapping_sub(back)) > back)
        } else {
            rng::unit(rng::at(self.key ^ 0x5e_7d, rng::key(&[seq as u64, attempt]))) < self.cfg.loss
        };
        if lost {
            return Fate::Drop;
        }
        let w = rng::at(self.key ^ 0xf0_7e, rng::key(&[seq as u64, attempt]));
        let u = rng::unit(w);
        let c = &self.cfg;
        let mut edge = c.corrupt;
        if u < edge {
            let r = rng::mix64(w);
            return Fate::Corrupt { byte: (r >> 8) as u32, bit: (r & 7) as u8 };
        }
        edge += c.duplicate;
        if u < edge {
            return Fate::Duplicate;
        }
        edge += c.reorder;
        if u < edge {
            return Fate::Reorder(c.reorder_depth.max(1));
        }
        edge += c.delay;
        if u < edge {
            return Fate::Delay;
        }
        Fate::Pass
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(f: &Faults, n: u32) -> (FaultStats, Vec<u32>) {
        let mut st = FaultStats::default();
        let mut bursts = Vec::new();
        let mut run = 0;
        for s in 0..n {
            let fate = f.fate(s, 0);
            st.count(fate);
            if fate == Fate::Drop {
                run += 1;
            } else if run > 0 {
                bursts.push(run);
                run = 0;
            }
        }
        (st, bursts)
    }

    #[test]
    fn rates_and_bursts_match_the_configuration() {
        let cfg = FaultConfig { seed: 7, loss: 0.01, burst: 4.0, reorder: 0.01, duplicate: 0.001, corrupt: 0.002, ..Default::default() };
        let f = Faults::new(&cfg, 0);
        let n = 2_000_000;
        let (st, bursts) = tally(&f, n);
        let rate = |k: u64| k as f64 / n as f64;
        // overlapping bursts merge, so the loss rate is a little below the target
        assert!((rate(st.dropped) - 0.01).abs() < 0.001, "loss {}", rate(st.dropped));
        let mean = bursts.iter().sum::<u32>() as f64 / bursts.len() as f64;
        assert!((mean - 4.0).abs() < 0.3, "mean burst {mean}");
        assert!(bursts.iter().all(|&b| b <= 14), "bursts are at most 7 long, two may touch");
        assert!((rate(st.reordered) - 0.0099).abs() < 0.001);
        assert!((rate(st.duplicated) - 0.001).abs() < 0.0002);
        assert!((rate(st.corrupted) - 0.002).abs() < 0.0003);
    }

    #[test]
    fn same_seed_same_fates_other_seed_other_fates() {
        let cfg = FaultConfig { seed: 3, loss: 0.05, burst: 2.0, corrupt: 0.05, ..Default::default() };
        let a: Vec<Fate> = (0..10_000).map(|s| Faults::new(&cfg, 1).fate(s, 0)).collect();
        let b: Vec<Fate> = (0..10_000).map(|s| Faults::new(&cfg, 1).fate(s, 0)).collect();
        assert_eq!(a, b);
        let c: Vec<Fate> = (0..10_000).map(|s| Faults::new(&FaultConfig { seed: 4, ..cfg.clone() }, 1).fate(s, 0)).collect();
        assert_ne!(a, c);
        assert!(Faults::new(&FaultConfig::default(), 0).fate(5, 0) == Fate::Pass);
    }

    #[test]
    fn bad_rates_are_refused_by_name() {
        let e = FaultConfig { loss: 1.5, ..Default::default() }.check().unwrap_err();
        assert!(e.contains("faults.loss"), "{e}");
        assert!(FaultConfig { burst: 0.5, ..Default::default() }.check().unwrap_err().contains("faults.burst"));
    }
}
