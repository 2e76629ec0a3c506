//! The process worker: one signal frame through every step on one core. Conversion and spot
//! finding run in strips of rows: the converter writes a strip of the image, and the finder
//! tests the rows whose box is now complete while the strip is still in this core's caches,
//! so the image is read back from memory once (by compression), not twice.

use std::sync::atomic::Ordering;
use std::time::Instant;

use rdaq_detector::as_words;
use rdaq_process::pipeline::{Emit, WorkerFn};
use rdaq_process::spots::LocalSnr;
use rdaq_process::Converter;

use super::{pin_once, Canned, Graph, Work, OWN_FRAME};

/// Rows converted before the finder looks at what they complete: 16 rows of 4 KiB of keV
/// stay in a core's L2 together with the finder's box of rows.
const STRIP_ROWS: usize = 16;

impl Graph<'_> {
    /// A process worker (the `k`-th): conversion with spot finding, the veto, and
    /// compression, each step timed.
    pub(super) fn process_worker<'g>(&'g self, k: usize) -> WorkerFn<'g, Box<Work>> {
        let (cal, invalid) = (&self.cal, self.setup.invalid);
        let mut conv = Converter::shared(cal.base.clone(), invalid).expect("checked by run");
        let mut seen = 0u64;
        let runs = self.setup.geometry.runs_in_image_order();
        let mut finder = LocalSnr::new(self.setup.finder);
        let mut compress = self.compressor();
        let mut pinned = false;
        Box::new(move |mut wk: Box<Work>, e: &Emit<Box<Work>>| {
            pin_once(&mut pinned, &self.setup.cpus, k);
            if let Some(c) = &self.setup.canned {
                self.hand_on_canned(c, &mut wk);
                e.send(0, wk);
                return;
            }
            #[cfg(test)]
            crate::fault::bug_at(wk.frame);
            seen = cal.follow(seen, &mut conv);
            let (convert_ns, t) = self.convert_and_find(&conv, &runs, &mut finder, &mut wk);
            self.judge(&mut wk);
            let t2 = Instant::now();
            self.compress_if_wanted(&mut compress, &mut wk);
            let ns = |d: std::time::Duration| d.as_nanos() as u64;
            let st = &self.steps;
            st.convert.fetch_add(convert_ns, Ordering::Relaxed);
            st.spots.fetch_add(ns(t2 - t).saturating_sub(convert_ns), Ordering::Relaxed);
            st.compress.fetch_add(ns(t2.elapsed()), Ordering::Relaxed);
            st.frames.fetch_add(1, Ordering::Relaxed);
            e.send(0, wk);
        })
    }

    /// The serial-ceiling benchmark's worker: gives the slot back and hands on the canned
    /// spots and chunk (judged and counted as a frame's own), without the steps' work.
    fn hand_on_canned(&self, c: &Canned, wk: &mut Work) {
        self.rx.release(wk.ready.take().expect("signal frames come with their slot")).expect(OWN_FRAME);
        wk.spots.clone_from(&c.spots);
        self.judge(wk);
        wk.chunked = !wk.vetoed && self.demand.wanted();
        if wk.chunked {
            wk.chunk.make_mut().clone_from(&c.chunk);
        }
    }

    /// Converts the frame's modules straight from the slot into the assembled image (keV) in
    /// strips of rows, the finder following each strip; gives the slot back, then the spots
    /// into `wk.spots`. Returns the time spent converting and when it started.
    fn convert_and_find(&self, conv: &Converter, runs: &[(usize, usize, usize)], finder: &mut LocalSnr, wk: &mut Work) -> (u64, Instant) {
        let g = &self.setup.geometry;
        let (w, h) = (g.width(), g.height());
        let start = Instant::now();
        let mut converting = 0u64;
        let f = wk.ready.take().expect("signal frames come with their slot");
        let words = as_words(self.rx.data(&f).expect(OWN_FRAME));
        let image = &mut wk.image;
        finder.begin(w, h);
        let mut strip_end = STRIP_ROWS * w;
        let mut t = Instant::now();
        for &(src, at, run) in runs {
            conv.to_kev_at(at, &words[src..src + run], &mut image[at..at + run]);
            if at + run >= strip_end {
                let now = Instant::now();
                converting += (now - t).as_nanos() as u64;
                finder.rows_ready(image, (at + run) / w);
                strip_end = (at + run) / w * w + STRIP_ROWS * w;
                t = Instant::now();
            }
        }
        converting += t.elapsed().as_nanos() as u64;
        self.rx.release(f).expect(OWN_FRAME);
        let mut found = std::mem::take(&mut wk.spots);
        finder.end(image, &mut found);
        wk.spots = found;
        wk.image_valid = true;
        (converting, start)
    }
}
