//! The thread budget: how an acquisition shares the host's cores. Some threads must run
//! whenever frames come, and each keeps a core busy at the detector's rate: the receiver's,
//! the writer's, and in `rdaq run` the emulated detector's senders (one per module). The
//! processing threads get the cores left, down to one each: the process workers (or the
//! raw chain's assemble workers) and, when the chopper sends dark frames, the pedestal bands,
//! which get the share of the cores that the dark frames' work takes. The writer's I/O
//! threads (`rdaq_sink::deferred`) are not counted: they do the copy that was the writer
//! thread's, busy as much as the data rate needs.
//!
//! Threads beyond the cores do not add throughput: they take turns on the cores and wait for
//! each other (a worker descheduled while it holds the frame the writer needs next stalls
//! the reorder). A budget that needs more threads than there are cores says so.

use serde::Serialize;

/// What a dark frame's pedestal tracking costs against a signal frame's processing
/// (conversion, spots and the veto, compression) on one core.
pub const DARK_COST: f64 = 0.5;

/// The threads that must run beside the processing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Busy {
    pub receivers: usize,
    pub writers: usize,
    /// The emulated detector's senders, in this process (`rdaq run`).
    pub senders: usize,
}

impl Busy {
    pub fn total(&self) -> usize {
        self.receivers + self.writers + self.senders
    }
}

/// The processing threads the configuration asks for (0: the budget chooses).
#[derive(Clone, Copy, Debug, Default)]
pub struct Asked {
    pub workers: usize,
    pub bands: usize,
}

/// How the cores are shared (the summary's `threads`, `/status`'s too).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ThreadBudget {
    /// The cores this process may run on.
    pub cores: usize,
    pub busy: Busy,
    pub workers: usize,
    /// Pedestal bands (0 for raw frames, which have none).
    pub bands: usize,
    /// The fraction of the processing work that is pedestal tracking (the chopper's dark
    /// frames at [`DARK_COST`]); 0: the bands idle and take no core of the budget.
    pub dark_share: f64,
    /// Whether the workers and the bands were set by the configuration, not chosen.
    pub set: bool,
    /// Threads that keep a core busy at the detector's rate: the busy ones, the workers,
    /// and the bands when there are dark frames.
    pub threads: usize,
    /// Whether those threads are more than the cores.
    pub oversubscribed: bool,
}

impl ThreadBudget {
    /// Shares `cores` among the `busy` threads and the processing, whose work is `dark_share`
    /// pedestal tracking; `bands` false: raw frames (no bands).
    pub fn share(cores: usize, busy: Busy, dark_share: f64, bands: bool, asked: Asked) -> ThreadBudget {
        let cores = cores.max(1);
        let left = cores.saturating_sub(busy.total());
        let dark_share = if bands { dark_share.clamp(0.0, 1.0) } else { 0.0 };
        let chosen_bands = match (bands, dark_share > 0.0) {
            (false, _) => 0,
            // no dark frames after the start: one band, idle
            (true, false) => 1,
            (true, true) => ((left as f64 * dark_share).round() as usize).clamp(1, left.saturating_sub(1).max(1)),
        };
        let bands_n = if bands && asked.bands > 0 { asked.bands } else { chosen_bands };
        let busy_bands = if dark_share > 0.0 { bands_n } else { 0 };
        let workers = match asked.workers {
            0 => left.saturating_sub(busy_bands).max(1),
            n => n,
        };
        let threads = busy.total() + workers + busy_bands;
        let set = asked.workers > 0 || (bands && asked.bands > 0);
        ThreadBudget { cores, busy, workers, bands: bands_n, dark_share, set, threads, oversubscribed: threads > cores }
    }

    /// The bands that keep pace with `workers` process workers when dark frames make
    /// `dark_share` of the work (at least one): the budget's proportion, for a count of
    /// workers given rather than cores (`rdaq bench pipeline`).
    pub fn bands_beside(workers: usize, dark_share: f64) -> usize {
        let s = dark_share.clamp(0.0, 0.99);
        ((workers as f64 * s / (1.0 - s)).round() as usize).max(1)
    }

    /// The share of the processing work that dark frames make on this chopper schedule.
    pub fn dark_share(dark: u32, signal: u32) -> f64 {
        let d = dark as f64 * DARK_COST;
        if d == 0.0 {
            0.0
        } else {
            d / (d + signal as f64)
        }
    }

    /// What the start line says of the sharing.
    pub fn describe(&self) -> String {
        let b = &self.busy;
        let mut busy = vec![plural(b.receivers, "receiver"), plural(b.writers, "writer")];
        if b.senders > 0 {
            busy.push(plural(b.senders, "sender"));
        }
        let bands = match (self.bands, self.dark_share > 0.0) {
            (0, _) => String::new(),
            (n, true) => format!(" + {}", plural(n, "pedestal band")),
            (n, false) => format!(" + {} (idle: no dark frames)", plural(n, "pedestal band")),
        };
        let how = if self.set { "as set" } else { "chosen" };
        format!("{}{bands} ({how}) beside {} on {}", plural(self.workers, "worker"), busy.join(", "), plural(self.cores, "core"))
    }

    /// The warning a configuration that oversubscribes the cores gets at start; a budget the
    /// cores force down to one worker and one band only says so in the start line.
    pub fn warning(&self) -> Option<String> {
        (self.set && self.oversubscribed).then(|| {
            format!(
                "{} threads run busy on {} cores ({}): they take turns, and a descheduled one stalls the others; \
                 leave process.workers and process.pedestal_bands at 0 to fit them to the cores",
                self.threads,
                self.cores,
                self.describe()
            )
        })
    }
}

fn plural(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN4: Busy = Busy { receivers: 1, writers: 1, senders: 4 };

    #[test]
    fn the_processing_gets_the_cores_left_and_the_bands_the_dark_share() {
        let chopper = ThreadBudget::dark_share(1, 1);
        assert!((chopper - 1.0 / 3.0).abs() < 1e-12);
        let b = ThreadBudget::share(16, RUN4, chopper, true, Asked::default());
        assert_eq!((b.workers, b.bands, b.threads, b.oversubscribed), (7, 3, 16, false));
        let recv = Busy { receivers: 1, writers: 1, senders: 0 };
        let b = ThreadBudget::share(16, recv, chopper, true, Asked::default());
        assert_eq!((b.workers, b.bands), (9, 5));
        assert_eq!(b.describe(), "9 workers + 5 pedestal bands (chosen) beside 1 receiver, 1 writer on 16 cores");
    }

    #[test]
    fn beside_a_count_of_workers_the_bands_keep_the_budgets_proportion() {
        let chopper = ThreadBudget::dark_share(1, 1);
        let bands: Vec<usize> = [1, 2, 4, 8, 14].iter().map(|&w| ThreadBudget::bands_beside(w, chopper)).collect();
        assert_eq!(bands, [1, 1, 2, 4, 7]);
        assert_eq!(ThreadBudget::bands_beside(8, 0.0), 1);
    }

    #[test]
    fn without_dark_frames_one_idle_band_and_raw_frames_none() {
        let recv = Busy { receivers: 1, writers: 1, senders: 0 };
        let b = ThreadBudget::share(16, recv, 0.0, true, Asked::default());
        assert_eq!((b.workers, b.bands, b.threads), (14, 1, 16));
        assert!(b.describe().contains("(idle: no dark frames)"));
        let b = ThreadBudget::share(16, recv, 0.5, false, Asked::default());
        assert_eq!((b.workers, b.bands, b.dark_share), (14, 0, 0.0));
    }

    #[test]
    fn a_small_host_gets_one_of_each_and_no_warning_a_set_excess_gets_one() {
        let b = ThreadBudget::share(2, RUN4, ThreadBudget::dark_share(1, 1), true, Asked::default());
        assert_eq!((b.workers, b.bands, b.oversubscribed), (1, 1, true));
        assert_eq!(b.warning(), None, "the cores forced it");
        let b = ThreadBudget::share(16, RUN4, ThreadBudget::dark_share(1, 1), true, Asked { workers: 14, bands: 0 });
        assert_eq!((b.workers, b.bands), (14, 3));
        let w = b.warning().expect("14 + 3 + 6 threads on 16 cores");
        assert!(w.starts_with("23 threads run busy on 16 cores"), "{w}");
        let b = ThreadBudget::share(16, RUN4, ThreadBudget::dark_share(1, 1), true, Asked { workers: 6, bands: 4 });
        assert_eq!((b.threads, b.warning()), (16, None));
    }

    #[test]
    fn every_budget_has_a_worker_and_fits_the_cores_when_it_can() {
        for cores in 1..=64 {
            for senders in 0..=8 {
                for (dark, signal) in [(0, 0), (1, 1), (1, 9), (9, 1), (1, 0)] {
                    let busy = Busy { receivers: 1, writers: 1, senders };
                    let b = ThreadBudget::share(cores, busy, ThreadBudget::dark_share(dark, signal), true, Asked::default());
                    assert!(b.workers >= 1 && b.bands >= 1);
                    let floor = busy.total() + 1 + usize::from(dark > 0);
                    assert!(b.threads <= cores.max(floor), "{cores} cores, {b:?}");
                }
            }
        }
    }
}
