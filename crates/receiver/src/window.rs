//! Loss detection on one data channel: a sliding window over the channel's sequence numbers
//! (RASHPA's design). The window remembers which of the last `size` sequence numbers below
//! the head (the highest seen + 1) arrived; a number counts as missing once the head has
//! moved `lag` past it without it (reordering shorter than the lag is not loss). When the
//! channel goes quiet, [`LossWindow::flush`] declares everything below the head at once, so
//! a loss at the end of a burst is not hidden behind the lag.

use rdaq_proto::seq::distance;

/// What an arriving sequence number was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// At or past the head: the normal case.
    New,
    /// Behind the head, not yet declared missing.
    Reordered,
    /// Declared missing before, arrived now (late, or retransmitted).
    Recovered,
    /// Arrived before.
    Duplicate,
    /// So far behind the head that the window cannot tell.
    TooOld,
}

#[derive(Clone, Debug)]
pub struct LossWindow {
    size: u32,
    lag: u32,
    /// `(head, declared, first)`: one past the highest sequence seen; everything below
    /// `declared` has been judged; the first sequence ever seen (nothing before it is loss).
    state: Option<(u32, u32, u32)>,
    bits: Box<[u64]>,
}

impl LossWindow {
    /// A window of `size` sequence numbers (a multiple of 64) that declares loss `lag`
    /// behind the head (`lag < size`).
    pub fn new(size: u32, lag: u32) -> Self {
        assert!(size >= 64 && size % 64 == 0, "window size must be a positive multiple of 64");
        assert!(lag < size, "the lag must be shorter than the window");
        LossWindow { size, lag, state: None, bits: vec![0; size as usize / 64].into_boxed_slice() }
    }

    #[inline]
    fn bit(&self, s: u32) -> bool {
        let i = (s % self.size) as usize;
        self.bits[i / 64] & (1 << (i % 64)) != 0
    }

    #[inline]
    fn set(&mut self, s: u32, on: bool) {
        let i = (s % self.size) as usize;
        if on {
            self.bits[i / 64] |= 1 << (i % 64);
        } else {
            self.bits[i / 64] &= !(1 << (i % 64));
        }
    }

    /// Records `seq`; calls `missing(start, end)` for each run of sequence numbers that this
    /// arrival makes count as lost (`end` exclusive, wrapping).
    pub fn observe(&mut self, seq: u32, mut missing: impl FnMut(u32, u32)) -> Seen {
        let Some((head, declared, first)) = self.state else {
            self.state = Some((seq.wrapping_add(1), seq.wrapping_sub(self.lag), seq));
            self.set(seq, true);
            return Seen::New;
        };
        let ahead = distance(head, seq);
        if ahead < 0 {
            let age = (-(ahead as i64)) as u32;
            if age > self.size {
                return Seen::TooOld;
            }
            if self.bit(seq) {
                return Seen::Duplicate;
            }
            self.set(seq, true);
            let was_declared = distance(seq, declared) > 0 && distance(first, seq) >= 0;
            return if was_declared { Seen::Recovered } else { Seen::Reordered };
        }
        let new_head = seq.wrapping_add(1);
        // the numbers between the old head and seq never arrived: clear their bits (at most
        // the window's worth; older ones fall out of the window anyway)
        let span = ahead as u32;
        let clear_from = if span >= self.size { new_head.wrapping_sub(self.size) } else { head };
        let mut s = clear_from;
        while s != seq {
            self.set(s, false);
            s = s.wrapping_add(1);
        }
        self.set(seq, true);
        let new_declared = new_head.wrapping_sub(self.lag);
        self.state = Some((new_head, declared, first));
        self.declare(declared, new_declared, &mut missing);
        Seen::New
    }

    /// Declares every number below the head that has not arrived as missing now (the
    /// channel went quiet: nothing still in flight can be waited for).
    pub fn flush(&mut self, mut missing: impl FnMut(u32, u32)) {
        if let Some((head, declared, _)) = self.state {
            self.declare(declared, head, &mut missing);
        }
    }

    /// Judges `from..to` (if `to` is ahead of `from`) and moves the declared mark to `to`.
    fn declare(&mut self, from: u32, to: u32, missing: &mut impl FnMut(u32, u32)) {
        let Some((head, _, first)) = self.state else { return };
        if distance(from, to) <= 0 {
            return;
        }
        // nothing before the first arrival is loss; numbers older than the window (after a
        // jump) never arrived
        let from = if distance(first, from) < 0 { first } else { from };
        let oldest_tracked = head.wrapping_sub(self.size);
        let mut s = from;
        let mut run: Option<u32> = None;
        while distance(s, to) > 0 {
            if distance(s, oldest_tracked) > 0 {
                // a whole untracked stretch, never received: one run up to the tracked part
                let stop = if distance(oldest_tracked, to) > 0 { oldest_tracked } else { to };
                run.get_or_insert(s);
                s = stop;
                continue;
            }
            if self.bit(s) {
                if let Some(r) = run.take() {
                    missing(r, s);
                }
            } else {
                run.get_or_insert(s);
            }
            s = s.wrapping_add(1);
        }
        if let Some(r) = run {
            missing(r, to);
        }
        self.state = Some((head, to, first));
    }

    /// Forgets everything (a new acquisition restarts the channel's numbering).
    pub fn reset(&mut self) {
        self.state = None;
        self.bits.fill(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// Observes `seqs`; the runs declared, adjacent ones merged.
    fn run(w: &mut LossWindow, seqs: &[u32]) -> (Vec<Seen>, Vec<(u32, u32)>) {
        let mut lost: Vec<(u32, u32)> = Vec::new();
        let seen = seqs
            .iter()
            .map(|&s| {
                w.observe(s, |a, b| match lost.last_mut() {
                    Some(l) if l.1 == a => l.1 = b,
                    _ => lost.push((a, b)),
                })
            })
            .collect();
        (seen, lost)
    }

    #[test]
    fn a_gap_counts_once_the_head_is_lag_past_it() {
        let mut w = LossWindow::new(64, 8);
        let seqs: Vec<u32> = (0..30).filter(|s| *s != 5 && *s != 6).collect();
        let mut lost = Vec::new();
        for &s in &seqs {
            w.observe(s, |a, b| lost.push((s, a, b)));
        }
        // s is declared when the head (highest + 1) is more than 8 past it: 5 on the
        // arrival of 13, 6 on that of 14
        assert_eq!(lost, vec![(13, 5, 6), (14, 6, 7)]);
    }

    #[test]
    fn reorder_within_the_lag_is_not_loss_and_late_arrivals_are_recovered() {
        let mut w = LossWindow::new(64, 8);
        let (seen, lost) = run(&mut w, &[0, 1, 3, 4, 2, 2, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
        assert_eq!(seen[4], Seen::Reordered);
        assert_eq!(seen[5], Seen::Duplicate);
        assert!(lost.is_empty());
        let (_, lost) = run(&mut w, &[20, 21, 22, 23, 24, 25, 26, 27]);
        assert_eq!(lost, vec![(16, 20)]);
        let (seen, _) = run(&mut w, &[17]);
        assert_eq!(seen, vec![Seen::Recovered]);
    }

    #[test]
    fn flush_declares_the_tail_and_jumps_declare_one_run() {
        let mut w = LossWindow::new(64, 32);
        let mut lost = Vec::new();
        for s in [10, 11, 13] {
            w.observe(s, |a, b| lost.push((a, b)));
        }
        assert!(lost.is_empty());
        w.flush(|a, b| lost.push((a, b)));
        assert_eq!(lost, vec![(12, 13)]);
        lost.clear();
        w.observe(10_000, |a, b| lost.push((a, b)));
        assert_eq!(lost, vec![(14, 10_001 - 32)]);
        assert_eq!(w.observe(13, |_, _| {}), Seen::TooOld);
    }

    #[test]
    fn works_across_the_wrap() {
        let mut w = LossWindow::new(128, 16);
        let start = u32::MAX - 40;
        let seqs: Vec<u32> = (0..100u32).map(|i| start.wrapping_add(i)).filter(|s| *s != 2).collect();
        let (_, lost) = run(&mut w, &seqs);
        assert_eq!(lost, vec![(2, 3)]);
    }

    proptest! {
        /// Whatever the order, every number that never arrives is declared exactly once
        /// (after a flush); a number that arrives is declared only if it came later than
        /// the lag allows, and then it is reported recovered.
        #[test]
        fn declares_exactly_what_never_came(
            start: u32,
            drops in proptest::collection::btree_set(0u32..400, 0..40),
            swaps in proptest::collection::vec((0usize..400, 1usize..6), 0..40),
        ) {
            let mut order: Vec<u32> = (0..400).filter(|i| !drops.contains(i)).collect();
            for (i, d) in swaps {
                if i + d < order.len() {
                    order.swap(i, i + d);
                }
            }
            let mut w = LossWindow::new(256, 16);
            let mut declared = BTreeSet::new();
            let mut recovered = BTreeSet::new();
            for &i in &order {
                let seen = w.observe(start.wrapping_add(i), |a, b| {
                    let mut s = a;
                    while s != b {
                        assert!(declared.insert(s.wrapping_sub(start)), "declared twice");
                        s = s.wrapping_add(1);
                    }
                });
                if seen == Seen::Recovered {
                    recovered.insert(i);
                }
            }
            w.flush(|a, b| {
                let mut s = a;
                while s != b {
                    assert!(declared.insert(s.wrapping_sub(start)), "declared twice");
                    s = s.wrapping_add(1);
                }
            });
            // drops after the last arrival are invisible, and so are drops before the first
            let first = *order.first().unwrap_or(&0);
            let last = *order.iter().max().unwrap_or(&0);
            let mut expect: BTreeSet<u32> = drops.iter().copied().filter(|d| *d > first && *d < last).collect();
            prop_assert!(recovered.is_disjoint(&drops));
            expect.extend(&recovered);
            prop_assert_eq!(declared, expect);
        }
    }
}
