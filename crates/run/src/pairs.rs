//! A descrambled detector's data frames paired with their reset frames (docs/detectors.md):
//! reset frame `2n` belongs to data frame `2n + 1`. Frames finish in any order (a frame
//! with a lost packet finishes at its timeout, after later ones), so a frame waits for its
//! partner until the partner finishes, is known to be gone (discarded), or `max_waiting`
//! newer pairs have started waiting (a frame of which nothing arrived never finishes).
//! Waiting frames hold their ring slots, hence the bound.

use std::collections::VecDeque;

/// What a frame is known by.
pub trait Numbered {
    fn number(&self) -> u64;
}

impl Numbered for rdaq_receiver::FrameReady {
    fn number(&self) -> u64 {
        self.frame()
    }
}

/// What became of the frames offered.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome<F> {
    /// A data frame and its reset frame.
    Pair { data: F, reset: F },
    /// A data frame whose reset frame will not come.
    WithoutReset(F),
    /// A reset frame whose data frame will not come.
    UnusedReset(F),
}

/// One pair's frames so far; `gone` when one of them was discarded.
#[derive(Debug)]
struct Waiting<F> {
    pair: u64,
    reset: Option<F>,
    data: Option<F>,
    gone: bool,
}

/// The pairs waiting for a frame, oldest first.
#[derive(Debug)]
pub struct Pairs<F> {
    waiting: VecDeque<Waiting<F>>,
    max_waiting: usize,
}

impl<F: Numbered> Pairs<F> {
    /// At most `max_waiting` pairs wait at once (at least 1).
    pub fn new(max_waiting: usize) -> Pairs<F> {
        Pairs { waiting: VecDeque::new(), max_waiting: max_waiting.max(1) }
    }

    /// Takes a finished frame; calls `out` for what it settles.
    pub fn offer(&mut self, f: F, mut out: impl FnMut(Outcome<F>)) {
        let n = f.number();
        let w = self.entry(n / 2);
        if n % 2 == 0 {
            w.reset = Some(f);
        } else {
            w.data = Some(f);
        }
        self.settle(n / 2, &mut out);
        self.trim(&mut out);
    }

    /// Frame `number` was discarded: its partner, waiting or still to come, is settled.
    pub fn gone(&mut self, number: u64, mut out: impl FnMut(Outcome<F>)) {
        self.entry(number / 2).gone = true;
        self.settle(number / 2, &mut out);
        self.trim(&mut out);
    }

    /// Everything still waiting, at the end: none of their partners will come.
    pub fn finish(&mut self, mut out: impl FnMut(Outcome<F>)) {
        while let Some(w) = self.waiting.pop_front() {
            unpaired(w, &mut out);
        }
    }

    /// The waiting pair `pair`, made (in order) when new.
    fn entry(&mut self, pair: u64) -> &mut Waiting<F> {
        let at = match self.waiting.iter().position(|w| w.pair >= pair) {
            Some(i) if self.waiting[i].pair == pair => i,
            at => {
                let at = at.unwrap_or(self.waiting.len());
                self.waiting.insert(at, Waiting { pair, reset: None, data: None, gone: false });
                at
            }
        };
        &mut self.waiting[at]
    }

    /// The oldest pairs give up while more than `max_waiting` wait.
    fn trim(&mut self, out: &mut impl FnMut(Outcome<F>)) {
        while self.waiting.len() > self.max_waiting {
            let oldest = self.waiting.pop_front().expect("more than one waits");
            unpaired(oldest, out);
        }
    }

    /// Pair `pair`, settled when both frames came or one is gone.
    fn settle(&mut self, pair: u64, out: &mut impl FnMut(Outcome<F>)) {
        let Some(i) = self.waiting.iter().position(|w| w.pair == pair) else { return };
        let w = &self.waiting[i];
        // a pair with one frame gone and none come stays, to settle the other when it comes
        if (w.reset.is_some() && w.data.is_some()) || (w.gone && (w.reset.is_some() || w.data.is_some())) {
            let w = self.waiting.remove(i).expect("found above");
            match (w.data, w.reset) {
                (Some(data), Some(reset)) => out(Outcome::Pair { data, reset }),
                (data, reset) => unpaired(Waiting { pair, reset, data, gone: true }, out),
            }
        }
    }
}

/// The frames of a pair that will not be completed.
fn unpaired<F>(w: Waiting<F>, out: &mut impl FnMut(Outcome<F>)) {
    if let Some(d) = w.data {
        out(Outcome::WithoutReset(d));
    }
    if let Some(r) = w.reset {
        out(Outcome::UnusedReset(r));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Numbered for u64 {
        fn number(&self) -> u64 {
            *self
        }
    }

    /// Offers frames (a negative number: that frame discarded) with at most `max` pairs waiting.
    fn run(order: &[i64], max: usize) -> Vec<Outcome<u64>> {
        let mut p = Pairs::new(max);
        let mut got = Vec::new();
        for &f in order {
            if f < 0 {
                p.gone(-f as u64, |o| got.push(o));
            } else {
                p.offer(f as u64, |o| got.push(o));
            }
        }
        p.finish(|o| got.push(o));
        got
    }

    use Outcome::*;

    #[test]
    fn frames_pair_in_any_order() {
        assert_eq!(run(&[2, 3, 4, 5], 4), [Pair { data: 3, reset: 2 }, Pair { data: 5, reset: 4 }]);
        assert_eq!(run(&[3, 2, 5, 4], 4), [Pair { data: 3, reset: 2 }, Pair { data: 5, reset: 4 }]);
        // a reset frame that finishes at its timeout, after the next pair
        assert_eq!(run(&[3, 4, 5, 2], 4), [Pair { data: 5, reset: 4 }, Pair { data: 3, reset: 2 }]);
    }

    #[test]
    fn a_frame_whose_partner_is_gone_is_given_back_once() {
        assert_eq!(run(&[3, -2, 4, 5], 4), [WithoutReset(3), Pair { data: 5, reset: 4 }], "reset 2 discarded");
        assert_eq!(run(&[-3, 2, 4, 5], 4), [UnusedReset(2), Pair { data: 5, reset: 4 }], "data 3 discarded first");
        assert_eq!(run(&[3], 4), [WithoutReset(3)]);
        assert_eq!(run(&[2], 4), [UnusedReset(2)]);
        // reset 2 never arrives at all: data 3 waits until 2 newer pairs wait beside it
        assert_eq!(run(&[3, 4, 6, 5], 2), [WithoutReset(3), Pair { data: 5, reset: 4 }, UnusedReset(6)]);
        // every frame comes out exactly once
        let mut seen: Vec<u64> = run(&[7, 2, 3, 10, 6, 11, 9, 8, 20, 13, 15], 3)
            .into_iter()
            .flat_map(|o| match o {
                Pair { data, reset } => vec![data, reset],
                WithoutReset(f) | UnusedReset(f) => vec![f],
            })
            .collect();
        seen.sort();
        assert_eq!(seen, [2, 3, 6, 7, 8, 9, 10, 11, 13, 15, 20]);
    }
}
