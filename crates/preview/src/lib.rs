//! The live preview: one image with its Bragg spots rendered as the picture a scientist looks
//! at: a color map over the counts, gaps and masked pixels dark, every spot circled, and a
//! scale bar.
//!
//! - [`render`]: the picture (sans I/O: pixels in, RGB out) and its PNG encoding.
//! - [`source`]: where the image comes from: the preview stream of a run, or a frame of a
//!   master file.

pub mod render;
pub mod source;

pub use render::{render, write_png, Picture, Shown};
pub use source::{from_file, from_stream, Preview, PreviewError};
