//! Detector models: detectors described as data ([`description`], [`layout`]), the
//! JUNGFRAU module ([`jungfrau`]) and deterministic synthetic frames
//! ([`synth`]) that stand in for a real detector in the emulator and the tests.

pub mod description;
pub mod geometry;
pub mod jungfrau;
pub mod layout;
pub mod rng;
pub mod synth;
pub mod wire;

pub use description::{Description, DescriptionError};
pub use geometry::Geometry;
pub use layout::{ModuleLayout, Span};
pub use jungfrau::{Gain, ModuleCalibration, MODULE_BYTES, MODULE_COLS, MODULE_PIXELS, MODULE_ROWS};
pub use wire::{Wire, WireError};
pub use synth::{as_bytes, as_bytes_mut, as_words, Chopper, ModuleSynth, Spot, SynthConfig};
