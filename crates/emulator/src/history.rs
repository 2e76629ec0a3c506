//! A module's frames: what they hold (a synthetic image or a test pattern), and where the
//! recent ones stay so that they can be sent again without a copy.

use rdaq_detector::rng;
use rdaq_detector::synth::{as_bytes, ModuleSynth};

/// The module's frames: the pool (benchmarks) or the history ring that the frames are made
/// in, so that the history costs no copy.
pub(crate) struct Store {
    pub(crate) pool: Vec<Vec<u16>>,
    pub(crate) ring: Vec<Vec<u16>>,
    pub(crate) tags: Vec<Option<u64>>,
}

impl Store {
    pub(crate) fn bytes(&self, frame: u64) -> Option<&[u8]> {
        if !self.pool.is_empty() {
            return Some(as_bytes(&self.pool[(frame % self.pool.len() as u64) as usize]));
        }
        let i = (frame % self.ring.len() as u64) as usize;
        (self.tags[i] == Some(frame)).then(|| as_bytes(&self.ring[i]))
    }
}

/// The content of a module frame: a synthetic JUNGFRAU image, or a test pattern of any
/// size that depends only on (seed, module, frame).
pub(crate) enum Content {
    Jungfrau(Box<ModuleSynth>),
    Pattern { seed: u64, module: u16 },
}

impl Content {
    pub(crate) fn make(&mut self, frame: u64, out: &mut [u16]) {
        match self {
            Content::Jungfrau(s) => s.frame(frame, out),
            Content::Pattern { seed, module } => {
                let key = rng::key(&[*seed, *module as u64, frame, 0x7e57]);
                for (i, c) in out.chunks_mut(4).enumerate() {
                    let w = rng::at(key, i as u64);
                    for (j, x) in c.iter_mut().enumerate() {
                        *x = (w >> (16 * j)) as u16;
                    }
                }
            }
        }
    }
}
