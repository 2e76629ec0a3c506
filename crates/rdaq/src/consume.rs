//! The consumer side of a receiver: takes finished frames, writes them to the NXmx file,
//! gives the slots back, and counts what it saw.

use std::time::Instant;

use anyhow::Context;
use indicatif::ProgressBar;
use rdaq_receiver::placement::{FrameReady, FrameStatus};
use rdaq_receiver::Receiver;
use rdaq_sink::NxmxWriter;

#[derive(Clone, Copy, Debug, Default)]
pub struct ConsumeStats {
    pub written: u64,
    pub complete: u64,
    pub incomplete: u64,
    pub discarded: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub first: Option<Instant>,
    pub last: Option<Instant>,
}

/// Byte ranges of the frame that the missing cells cover.
fn missing_ranges(rx: &Receiver, f: &FrameReady) -> Vec<(usize, usize)> {
    let g = rx.grid();
    f.missing.iter().map(|&c| (g.cell_offset(c) as usize, g.cell_len(c) as usize)).collect()
}

/// Consumes frames until the receiver finishes. Without a writer, frames are only counted.
pub fn consume(rx: &Receiver, mut writer: Option<&mut NxmxWriter>, bar: &ProgressBar) -> anyhow::Result<ConsumeStats> {
    let mut s = ConsumeStats::default();
    for f in rx.frames().iter() {
        let now = Instant::now();
        s.first.get_or_insert(now);
        s.last = Some(now);
        bar.inc(1);
        match f.status {
            FrameStatus::Discarded => {
                s.discarded += 1;
                continue;
            }
            FrameStatus::Complete => s.complete += 1,
            FrameStatus::Incomplete => s.incomplete += 1,
        }
        if let Some(w) = writer.as_deref_mut() {
            let before = w.bytes_written;
            let missing = missing_ranges(rx, &f);
            let data = rx.data(&f);
            w.write_frame(f.frame, data, &missing).with_context(|| format!("writing frame {}", f.frame))?;
            s.bytes_in += data.len() as u64;
            s.bytes_out += w.bytes_written - before;
            s.written += 1;
        }
        rx.release(f);
    }
    Ok(s)
}
