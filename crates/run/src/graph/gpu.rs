//! The graph's GPU stage (issue 13, in progress; not yet run on a GPU): one worker that
//! assembles a signal frame's raw words from its slot (gaps as the error word, masked by the
//! calibration), gives the slot back, converts the frame to keV on the device
//! (`rdaq_gpu::GpuConverter`), finds its strong pixels there and groups them on the host
//! (`rdaq_gpu::GpuLocalSnr`), then judges the frame as the process workers do. It takes a
//! newly published pedestal before the next frame. Synchronous per frame: the overlapped
//! three-stream pipeline is still to come, and so is turning a device error in the middle
//! of a run into a counted error (today it stops the run: the worker panics).

use std::sync::atomic::Ordering;

use rdaq_detector::jungfrau::WORD_ERROR;
use rdaq_detector::{as_words, Geometry};
use rdaq_gpu::{Device, GpuConverter, GpuLocalSnr, GpuPedestal};
use rdaq_process::pipeline::{Emit, WorkerFn};

use super::{DarkTracker, Graph, Setup, Work, OWN_FRAME};

/// What the GPU worker holds: made before the graph starts, so that a kernel that does not
/// compile is an error of the run, not a panic of a worker.
pub(super) struct GpuParts {
    conv: GpuConverter,
    finder: GpuLocalSnr,
    pedestal: Option<GpuTracker>,
}

/// The GPU's pedestal tracker as the pedestal stage drives it: dark frames assembled into
/// raw image words on the host, tracked on the device.
pub(super) struct GpuTracker {
    tracker: GpuPedestal,
    raw: Vec<u16>,
}

impl DarkTracker for GpuTracker {
    fn push_frame(&mut self, g: &Geometry, words: &[u16]) {
        assemble(g, words, &mut self.raw);
        self.tracker.push(&self.raw).expect("the GPU tracks a dark frame");
    }

    fn frames(&self) -> u64 {
        self.tracker.frames()
    }

    fn mean_into(&mut self, out: &mut [f32]) {
        out.copy_from_slice(&self.tracker.mean().expect("the GPU returns the pedestal"));
    }
}

impl GpuParts {
    pub(super) fn new(dev: &Device, setup: &Setup) -> anyhow::Result<GpuParts> {
        let g = setup.geometry;
        Ok(GpuParts {
            conv: GpuConverter::new(dev, &setup.calibration, setup.invalid)?,
            finder: GpuLocalSnr::new(dev, setup.finder)?,
            pedestal: Some(GpuTracker { tracker: GpuPedestal::new(dev, g.height() * g.width(), 0, setup.window)?, raw: vec![WORD_ERROR; g.height() * g.width()] }),
        })
    }

    /// The pedestal tracker, for the pedestal stage's worker.
    pub(super) fn take_pedestal(&mut self) -> GpuTracker {
        self.pedestal.take().expect("taken once")
    }
}

/// Copies the modules of a frame's slot into the assembled image of raw words (gap pixels
/// keep the error word).
fn assemble(g: &Geometry, words: &[u16], raw: &mut [u16]) {
    let mp = g.module_pixels();
    for m in 0..g.modules {
        let module = &words[m as usize * mp..(m as usize + 1) * mp];
        g.module_runs(m, |from, at, run| raw[at..at + run].copy_from_slice(&module[from..from + run]));
    }
}

impl Graph<'_> {
    pub(super) fn gpu_worker<'g>(&'g self, mut parts: GpuParts) -> WorkerFn<'g, Box<Work>> {
        let g = self.setup.geometry;
        let (w, h) = (g.width(), g.height());
        let mut raw = vec![WORD_ERROR; w * h];
        let mut seen = 0u64;
        Box::new(move |mut wk: Box<Work>, e: &Emit<Box<Work>>| {
            let gen = self.cal.generation.load(Ordering::Acquire);
            if gen != seen {
                seen = gen;
                let cal = self.cal.cal.read().expect("not poisoned").clone();
                parts.conv.set_calibration(&cal).expect("the tracked pedestal is finite and of the image's size");
            }
            let f = wk.ready.take().expect("signal frames come with their slot");
            assemble(&g, as_words(self.rx.data(&f).expect(OWN_FRAME)), &mut raw);
            self.rx.release(f).expect(OWN_FRAME);
            parts.conv.to_kev_into(&raw, &mut wk.image).expect("the GPU converts a frame");
            let mut found = std::mem::take(&mut wk.spots);
            parts.finder.find(&wk.image, w, h, &mut found).expect("the GPU finds the strong pixels");
            wk.spots = found;
            self.judge(&mut wk);
            e.send(0, wk);
        })
    }
}
