//! What a wrong setting looks like from the receiver, and the hint that names it. A
//! detector that sends on two interfaces to a receiver set for one (or the reverse), or that
//! reads out fewer rows than the receiver expects, does not lose data at random: the same
//! packets are missing from every frame, or packets come whose numbers the port does not
//! expect. Loss looks different (other packets in other frames), so a pattern that holds for
//! every frame is reported as a setting, not as loss. Packets of another detector or link,
//! and ports whose frame numbers are offset from each other's (modules not started
//! together), are named too.

use rdaq_proto::sls::{det_type_name, DET_TYPE_JUNGFRAU, JUNGFRAU_PACKET_PAYLOAD};

use crate::config::{Format, JUNGFRAU_ROWS};
use crate::grid::Grid;
use crate::source::{Source, SourceKind};

/// Pixel rows per JUNGFRAU packet.
const ROWS_PER_CELL: u32 = 4;

/// What the receiver saw over an acquisition, enough to recognize a wrong setting.
pub struct Seen<'a> {
    pub format: Format,
    pub grid: &'a Grid,
    /// One per data channel, with its port.
    pub sources: &'a [Source],
    pub ports: &'a [u16],
    /// Cells missing from every incomplete frame (`None`: no incomplete frame).
    pub always_missing: Option<&'a [u64]>,
    pub frames_complete: u64,
    pub frames_incomplete: u64,
}

/// The hints for what was seen, one sentence each (empty: nothing points to a setting).
pub fn hints(s: &Seen) -> Vec<String> {
    let mut out = Vec::new();
    for (i, src) in s.sources.iter().enumerate() {
        let port = s.ports[i];
        if let Some(h) = unexpected_packets(s, src, port).or_else(|| foreign(src, port)).or_else(|| more_packets(src, port)) {
            out.push(h);
        }
    }
    if out.is_empty() {
        for m in 0..s.grid.modules {
            if let Some(h) = module_pattern(s, m) {
                out.push(h);
            }
        }
    }
    if out.is_empty() {
        out.extend(frame_numbers_disagree(s));
    }
    out
}

/// Packets whose numbers a port does not expect: another interface's, or rows outside the
/// readout.
fn unexpected_packets(s: &Seen, src: &Source, port: u16) -> Option<String> {
    let (Format::Sls { interfaces, rows }, SourceKind::Sls { module, .. }) = (s.format, src.kind) else { return None };
    let u = src.unexpected;
    if u.packets == 0 {
        return None;
    }
    let per_if = rdaq_proto::sls::JUNGFRAU_PACKETS_PER_FRAME / interfaces as u32;
    if interfaces == 2 && u.highest >= per_if {
        let silent: Vec<u16> = sibling_ports(s, module).filter(|&(_, o)| o.accepted == 0 && o.unexpected.packets == 0).map(|(p, _)| p).collect();
        let nothing = if silent.is_empty() { String::new() } else { format!(" and port {} received nothing", join(&silent)) };
        return Some(format!(
            "module {module}: port {port} received packet numbers up to {} (one interface of two sends 0-{}){nothing}: \
             the detector seems to send on one interface; use --interfaces 1",
            u.highest,
            per_if - 1
        ));
    }
    if rows < JUNGFRAU_ROWS {
        return Some(format!(
            "module {module}: port {port} received {} packets numbered {}-{}, of rows outside the {rows} rows read: \
             the detector reads out more rows than --read-rows {rows}; set it to the detector's readnrows",
            u.packets, u.lowest, u.highest
        ));
    }
    None
}

/// "detType N (NAME)".
fn det_type(t: u8) -> String {
    det_type_name(t).map_or_else(|| format!("detType {t}"), |n| format!("detType {t} ({n})"))
}

/// sls packets a port dropped as not its detector's: another detector (detType), or
/// packets of another size (another link, or another detector's packets).
fn foreign(src: &Source, port: u16) -> Option<String> {
    let (want_type, want_payload) = match src.kind {
        SourceKind::Sls { .. } => (DET_TYPE_JUNGFRAU, JUNGFRAU_PACKET_PAYLOAD),
        SourceKind::SlsByHeader { grid, .. } => (grid.det_type, grid.payload as usize),
        SourceKind::Rdaq => return None,
    };
    let f = src.foreign;
    if f.packets == 0 {
        return None;
    }
    if f.det_type != want_type {
        return Some(format!(
            "port {port} received {} packets of {}, not of this receiver's {}: check --detector (a detector described in detectors/ by that detType)",
            f.packets,
            det_type(f.det_type),
            det_type(want_type)
        ));
    }
    let size = if f.oversized > 0 { "larger packets".to_string() } else { format!("packets of {} pixel bytes", f.payload) };
    Some(match src.kind {
        SourceKind::SlsByHeader { .. } => {
            format!("port {port} received {} {size} where the link set takes {want_payload}: check --link (the detector's tengiga setting)", f.packets)
        }
        _ => format!("port {port} received {} {size} where JUNGFRAU's carry {want_payload}: not a JUNGFRAU's packets; check --detector", f.packets),
    })
}

/// A detector placed by header (EIGER) whose packets are numbered past a frame: it sends
/// more bits per pixel than the receiver was set for.
fn more_packets(src: &Source, port: u16) -> Option<String> {
    let SourceKind::SlsByHeader { grid: g, .. } = src.kind else { return None };
    let u = src.unexpected;
    (u.packets > 0).then(|| {
        format!(
            "port {port} received packet numbers up to {}, where a frame has {} packets per port: the detector sends more bits per pixel; check --bit-depth (its dr)",
            u.highest, g.packets
        )
    })
}

/// Ports whose frames are numbered apart by the same offset from the first frame to the
/// last: the modules' frame numbers disagree (not started together, or one restarted), so
/// the frames of one number are not one exposure.
fn frame_numbers_disagree(s: &Seen) -> Option<String> {
    if s.frames_incomplete == 0 {
        return None;
    }
    let spans: Vec<(u16, u64, u64)> = s.sources.iter().zip(s.ports).filter_map(|(src, &p)| Some((p, src.oldest_frame?, src.newest_frame?))).collect();
    let &(p0, a0, b0) = spans.first()?;
    let &(p, a, b) = spans.iter().find(|&&(_, a, b)| a != a0 && a.wrapping_sub(a0) == b.wrapping_sub(b0))?;
    Some(format!(
        "port {p0} received frames {a0}-{b0} and port {p} frames {a}-{b}: the modules' frame numbers disagree by {}, so no frame number holds one exposure of every module; \
         start the modules together with the same next frame number (sls: nextframenumber)",
        a as i128 - a0 as i128
    ))
}

/// The ports of module `module`'s sources, with the sources.
fn sibling_ports<'a>(s: &'a Seen, module: u16) -> impl Iterator<Item = (u16, &'a Source)> + 'a {
    s.sources.iter().zip(s.ports).filter(move |(o, _)| o.module == module).map(|(o, &p)| (p, o))
}

fn join(ports: &[u16]) -> String {
    ports.iter().map(u16::to_string).collect::<Vec<_>>().join(", ")
}

/// The cells of module `m` missing from every frame, when no frame was complete.
fn always_missing(s: &Seen, m: u16) -> Option<Vec<u32>> {
    let always = s.always_missing?;
    if s.frames_complete > 0 || s.frames_incomplete == 0 {
        return None;
    }
    let cpm = s.grid.cells_per_module;
    let base = m as u32 * cpm;
    let cells: Vec<u32> = (0..cpm).filter(|k| always[(base + k) as usize / 64] & (1 << ((base + k) % 64)) != 0).collect();
    (!cells.is_empty()).then_some(cells)
}

/// A module whose frames all lack the same cells: all of them (it sends elsewhere or not at
/// all), the second interface's half, or the rows at both edges (a partial readout).
fn module_pattern(s: &Seen, m: u16) -> Option<String> {
    let missing = always_missing(s, m)?;
    let cpm = s.grid.cells_per_module;
    let frames = s.frames_incomplete;
    if missing.len() as u32 == cpm {
        let silent: Vec<u16> = sibling_ports(s, m).filter(|(_, o)| o.accepted == 0).map(|(p, _)| p).collect();
        return Some(format!(
            "module {m}: nothing of it arrived in any of the {frames} frames (port {} received nothing): check where it sends \
             (the receiver's --bind address and port)",
            join(&silent)
        ));
    }
    if let Format::SlsByHeader(g) = s.format {
        // fewer bits per pixel than set: each port's frames end early, at the same packet
        let n = missing.iter().map(|k| k % g.packets).min()?;
        let tail = (0..g.ports()).flat_map(|p| (n..g.packets).map(move |k| p * g.packets + k));
        return (missing.iter().copied().eq(tail)).then(|| {
            format!(
                "module {m}: every one of the {frames} frames lacks packets {n}-{} of each port: the detector sends {n} of the {} packets per port: \
                 fewer bits per pixel (check --bit-depth, its dr), or a partial readout (its readnrows; rdaq takes only full readouts of a detector placed by header)",
                g.packets - 1,
                g.packets
            )
        });
    }
    let Format::Sls { interfaces, rows } = s.format else { return None };
    let contiguous = |cells: &[u32]| cells.windows(2).all(|w| w[1] == w[0] + 1);
    // a partial readout sends the rows around the centre: the same number missing at each end
    let edge = missing.iter().take_while(|&&k| k < cpm / 2).count() as u32;
    if missing.len() as u32 == 2 * edge && contiguous(&missing[..edge as usize]) && contiguous(&missing[edge as usize..])
        && missing[0] == 0 && missing[missing.len() - 1] == cpm - 1
    {
        let read = rows as u32 - 2 * edge * ROWS_PER_CELL;
        return Some(format!(
            "module {m}: every one of the {frames} frames lacks its first and last {} rows: the detector reads out {read} rows \
             (readnrows {read}); use --read-rows {read}",
            edge * ROWS_PER_CELL
        ));
    }
    // one interface sends the first half of the module's rows, the second the other half
    if interfaces == 1 && contiguous(&missing) && missing[missing.len() - 1] == cpm - 1 && missing[0] * ROWS_PER_CELL + (JUNGFRAU_ROWS as u32 - rows as u32) / 2 == JUNGFRAU_ROWS as u32 / 2 {
        return Some(format!(
            "module {m}: every one of the {frames} frames lacks the second half of its rows: the detector seems to send on two \
             interfaces (the second to the next port); use --interfaces 2"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::sls_sources;

    fn bitmap(cells: u32, missing: impl Fn(u32) -> bool) -> Vec<u64> {
        let mut b = vec![0u64; cells.div_ceil(64) as usize];
        for c in (0..cells).filter(|&c| missing(c)) {
            b[c as usize / 64] |= 1 << (c % 64);
        }
        b
    }

    fn sources(interfaces: u8, rows: u16, grid: &Grid) -> Vec<Source> {
        sls_sources(0, interfaces, rows).into_iter().map(|k| Source::new(k, 0, 0, grid, None)).collect()
    }

    fn seen<'a>(format: Format, grid: &'a Grid, sources: &'a [Source], always: Option<&'a [u64]>) -> Seen<'a> {
        Seen { format, grid, sources, ports: &[50001, 50002], always_missing: always, frames_complete: 0, frames_incomplete: 3 }
    }

    #[test]
    fn a_partial_readout_is_named_with_its_rows() {
        let grid = Grid::new(1, 1 << 20, 8192);
        let src = sources(1, 512, &grid);
        let always = bitmap(128, |c| !(32..96).contains(&c));
        let h = hints(&seen(Format::sls(1), &grid, &src, Some(&always)));
        assert_eq!(h.len(), 1);
        assert!(h[0].contains("--read-rows 256") && h[0].contains("first and last 128 rows"), "{h:?}");
    }

    #[test]
    fn two_interfaces_into_one_are_named() {
        let grid = Grid::new(1, 1 << 20, 8192);
        let src = sources(1, 512, &grid);
        let always = bitmap(128, |c| c >= 64);
        let h = hints(&seen(Format::sls(1), &grid, &src, Some(&always)));
        assert!(h.len() == 1 && h[0].contains("--interfaces 2"), "{h:?}");
    }

    #[test]
    fn one_interface_into_two_is_named() {
        let grid = Grid::new(1, 1 << 20, 8192);
        let mut src = sources(2, 512, &grid);
        src[0].accepted = 64;
        for p in 64..128 {
            src[0].unexpected.packets += 1;
            src[0].unexpected.highest = p;
        }
        let always = bitmap(128, |c| c >= 64);
        let h = hints(&seen(Format::sls(2), &grid, &src, Some(&always)));
        assert!(h.len() == 1 && h[0].contains("--interfaces 1") && h[0].contains("port 50002 received nothing"), "{h:?}");
    }

    #[test]
    fn loss_at_random_is_no_setting() {
        let grid = Grid::new(1, 1 << 20, 8192);
        let src = sources(1, 512, &grid);
        let always = bitmap(128, |c| c == 17 || c == 90);
        assert!(hints(&seen(Format::sls(1), &grid, &src, Some(&always))).is_empty());
        let mut s = seen(Format::sls(1), &grid, &src, Some(&always));
        s.frames_complete = 1;
        assert!(hints(&s).is_empty(), "some frames complete: no pattern");
    }

    #[test]
    fn frame_numbers_that_disagree_at_both_ends_are_named() {
        let grid = Grid::new(2, 1 << 20, 8192);
        let mut src: Vec<Source> = (0..2).map(|m| Source::new(sls_sources(m, 1, 512)[0], m, m, &grid, None)).collect();
        let spans = |src: &mut [Source], a: (u64, u64), b: (u64, u64)| {
            (src[0].oldest_frame, src[0].newest_frame) = (Some(a.0), Some(a.1));
            (src[1].oldest_frame, src[1].newest_frame) = (Some(b.0), Some(b.1));
        };
        let s = |src: &[Source]| hints(&Seen { format: Format::sls(1), grid: &grid, sources: src, ports: &[50001, 50002], always_missing: None, frames_complete: 2, frames_incomplete: 2 });
        spans(&mut src, (14, 16), (15, 17));
        let h = s(&src);
        assert!(h.len() == 1 && h[0].contains("disagree by 1"), "{h:?}");
        // a receiver started mid-frame: the first frames differ, the last ones do not
        spans(&mut src, (14, 16), (15, 16));
        assert!(s(&src).is_empty());
    }
}
