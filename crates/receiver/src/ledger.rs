//! Which frame numbers a receiver finished (complete, incomplete or discarded) and which it
//! refused because the ring was full: sets of frame numbers kept as sorted runs, so that the
//! summary can say which frames never arrived at all. Frames come nearly in order, so a
//! million frames with a few gaps cost a few runs, and in-order frames extend the last run.
//! A receiver of a temporal plan holds every n-th frame: one run (16 bytes) per frame.

/// A set of frame numbers as sorted, disjoint, non-adjacent half-open runs `[start, end)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrameSet {
    runs: Vec<(u64, u64)>,
    count: u64,
}

impl FrameSet {
    /// Adds `frame`; false if it was there already.
    pub fn insert(&mut self, frame: u64) -> bool {
        let end = frame.saturating_add(1);
        // the first run that ends at or after `frame` is the only one it can touch
        let i = self.runs.partition_point(|&(_, e)| e < frame);
        if let Some(&(s, e)) = self.runs.get(i) {
            if s <= frame && frame < e {
                return false;
            }
            if e == frame {
                self.runs[i].1 = end;
                if self.runs.get(i + 1).is_some_and(|&(next, _)| next == end) {
                    self.runs[i].1 = self.runs.remove(i + 1).1;
                }
                self.count += 1;
                return true;
            }
            if s == end {
                self.runs[i].0 = frame;
                self.count += 1;
                return true;
            }
        }
        self.runs.insert(i, (frame, end));
        self.count += 1;
        true
    }

    pub fn contains(&self, frame: u64) -> bool {
        let i = self.runs.partition_point(|&(_, e)| e <= frame);
        self.runs.get(i).is_some_and(|&(s, _)| s <= frame)
    }

    /// Frames in the set.
    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The runs, sorted.
    pub fn runs(&self) -> &[(u64, u64)] {
        &self.runs
    }

    pub fn first(&self) -> Option<u64> {
        self.runs.first().map(|r| r.0)
    }

    /// The highest frame in the set.
    pub fn last(&self) -> Option<u64> {
        self.runs.last().map(|r| r.1 - 1)
    }

    /// The runs of `[start, end)` that are in neither this set nor `other`.
    pub fn gaps(&self, other: &FrameSet, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut both: Vec<(u64, u64)> = self.runs.iter().chain(other.runs.iter()).copied().collect();
        both.sort_unstable();
        let mut out = Vec::new();
        let mut at = start;
        for (s, e) in both {
            if s > at && at < end {
                out.push((at, s.min(end)));
            }
            at = at.max(e);
        }
        if at < end {
            out.push((at, end));
        }
        out
    }

    /// Forgets every frame (a new acquisition).
    pub fn clear(&mut self) {
        *self = FrameSet::default();
    }
}

/// What a receiver did with frame numbers over an acquisition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Frames handed on or discarded (complete, incomplete, discarded).
    pub finished: FrameSet,
    /// Frames refused at their first datagram because their slot was still held by the
    /// consumer (the ring was full).
    pub refused: FrameSet,
}

impl Ledger {
    /// Frames of `[start, end)` of which nothing arrived (neither finished nor refused).
    pub fn never_seen(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        self.finished.gaps(&self.refused, start, end)
    }

    /// The lowest and highest frame seen (finished or refused).
    pub fn span(&self) -> Option<(u64, u64)> {
        let first = [self.finished.first(), self.refused.first()].into_iter().flatten().min()?;
        let last = [self.finished.last(), self.refused.last()].into_iter().flatten().max()?;
        Some((first, last))
    }

    pub fn clear(&mut self) {
        self.finished.clear();
        self.refused.clear();
    }
}

/// `[(0, 3), (7, 8)]` as `"0-2, 7"`, at most `max` runs, then `"... (n more runs)"`.
pub fn describe_runs(runs: &[(u64, u64)], max: usize) -> String {
    let mut parts: Vec<String> = runs
        .iter()
        .take(max)
        .map(|&(s, e)| if e - s == 1 { s.to_string() } else { format!("{s}-{}", e - 1) })
        .collect();
    if runs.len() > max {
        parts.push(format!("... ({} more runs)", runs.len() - max));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn runs_merge_and_gaps_are_what_is_in_neither() {
        let mut s = FrameSet::default();
        for f in [5, 3, 4, 9, 6, 20] {
            assert!(s.insert(f));
        }
        assert!(!s.insert(4));
        assert_eq!(s.runs(), &[(3, 7), (9, 10), (20, 21)]);
        let mut r = FrameSet::default();
        r.insert(10);
        assert_eq!(s.gaps(&r, 0, 25), vec![(0, 3), (7, 9), (11, 20), (21, 25)]);
        assert_eq!(describe_runs(&s.gaps(&r, 0, 25), 2), "0-2, 7-8, ... (2 more runs)");
        let l = Ledger { finished: s, refused: r };
        assert_eq!(l.span(), Some((3, 20)));
    }

    proptest! {
        #[test]
        fn the_set_is_the_set_of_frames_inserted(frames in proptest::collection::vec(0u64..300, 0..200)) {
            let mut s = FrameSet::default();
            let mut want = BTreeSet::new();
            for f in frames {
                prop_assert_eq!(s.insert(f), want.insert(f));
            }
            prop_assert_eq!(s.len(), want.len() as u64);
            for f in 0..300 {
                prop_assert_eq!(s.contains(f), want.contains(&f));
            }
            let gaps: BTreeSet<u64> = s.gaps(&FrameSet::default(), 0, 300).iter().flat_map(|&(a, b)| a..b).collect();
            prop_assert_eq!(gaps, (0..300).filter(|f| !want.contains(f)).collect::<BTreeSet<u64>>());
            prop_assert!(s.runs().windows(2).all(|w| w[0].1 < w[1].0), "disjoint and not adjacent");
        }
    }
}
