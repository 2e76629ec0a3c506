//! The reorder step of a write stage: workers (the graph's process workers, the raw frames'
//! assemble workers) finish frames in whatever order their cores allow, and the file and the
//! stream take them in the order the source handed them on (vetoed frames pass through too,
//! so that nothing waits for them).

use std::collections::BTreeMap;

/// Items numbered 0, 1, 2, ... by their source, given back in that order.
pub(crate) struct Reorder<T> {
    next: u64,
    waiting: BTreeMap<u64, T>,
    /// The most items held at once, waiting for an earlier one.
    pub(crate) high_water: usize,
}

impl<T> Reorder<T> {
    pub(crate) fn new() -> Self {
        Reorder { next: 0, waiting: BTreeMap::new(), high_water: 0 }
    }

    /// Takes item `seq` and gives `out` every item that is now next in order. The number of
    /// items held is bounded by what the source can have in flight (its pool).
    pub(crate) fn push(&mut self, seq: u64, item: T, mut out: impl FnMut(T)) {
        assert!(seq >= self.next && !self.waiting.contains_key(&seq), "item {seq} given twice");
        if seq != self.next {
            self.waiting.insert(seq, item);
            self.high_water = self.high_water.max(self.waiting.len());
            return;
        }
        out(item);
        self.next += 1;
        while let Some(item) = self.waiting.remove(&self.next) {
            out(item);
            self.next += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Reorder;

    #[test]
    fn items_leave_in_order_whatever_order_they_come_in() {
        let mut r = Reorder::new();
        let mut out = Vec::new();
        for seq in [2u64, 0, 3, 1, 5, 4, 6] {
            r.push(seq, seq, |x| out.push(x));
        }
        assert_eq!(out, (0..7).collect::<Vec<_>>());
        assert_eq!((r.waiting.len(), r.high_water), (0, 2));
    }

    #[test]
    #[should_panic(expected = "given twice")]
    fn an_item_given_twice_is_refused() {
        let mut r = Reorder::new();
        r.push(0, (), |_| {});
        r.push(0, (), |_| {});
    }
}
