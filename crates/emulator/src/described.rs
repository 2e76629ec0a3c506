//! A detector described as data (EIGER, or any description placed by header), emulated: its
//! native packets (the sls header with row, column and packet number, as its description
//! cuts a module into ports and packets) carrying a deterministic counting pattern
//! ([`DescribedDetector::value`]), sent paced to a receiver's data ports. The pattern is
//! not physics; it makes every pixel of every frame checkable by a formula.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdaq_detector::description::{Description, Readout};
use rdaq_detector::{ModuleLayout, Wire};
use rdaq_net::send::{BatchSender, SendStats};
use rdaq_proto::sls::{SlsHeader, SLS_HEADER_LEN, SLS_HEADER_VERSION};
use xxhash_rust::xxh3::Xxh3;

use crate::control::Control;
use crate::report::{EmulatorReport, ManifestEntry};

/// How one described detector's modules cut their frames into packets.
#[derive(Clone, Debug)]
pub struct DescribedDetector {
    name: String,
    det_type: u8,
    payload: usize,
    /// Ports, their places and flips, and the packing of pixels (as the receiver unpacks).
    layout: ModuleLayout,
    /// The order pixels of a port row are sent in (descrambled detectors).
    readout: Readout,
    modules: u16,
    module_cols: u16,
}

impl DescribedDetector {
    /// `modules` modules of `d` (`module_cols` per row) sending the packets of `wire`
    /// ([`Description::wire`]).
    pub fn new(d: &Description, wire: &Wire, modules: u16, module_cols: u16) -> Result<DescribedDetector, String> {
        if d.wire(Some(wire.bits), Some(&wire.link)).as_ref() != Ok(wire) {
            return Err(format!("{} does not send {}-bit pixels in {} packets of {} bytes per port over link {:?}", d.name, wire.bits, wire.packets_per_port, wire.payload, wire.link));
        }
        let layout = ModuleLayout::new(d, wire.bits, false)?;
        if modules == 0 || module_cols == 0 || modules % module_cols != 0 {
            return Err(format!("{modules} modules do not fill rows of {module_cols}"));
        }
        Ok(DescribedDetector { name: d.name.clone(), det_type: d.header.det_type, payload: wire.payload, layout, readout: d.descrambled().unwrap_or_default(), modules, module_cols })
    }

    /// Ports per module.
    pub fn ports(&self) -> usize {
        let (r, c) = self.layout.port_grid();
        r * c
    }

    /// The packets' payload bytes.
    pub fn payload(&self) -> usize {
        self.payload
    }

    /// The description's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Packets per port and frame.
    pub fn packets(&self) -> usize {
        self.layout.port_bytes() / self.payload
    }

    /// Bytes of one module frame as a receiver holds it: every port's packets.
    pub fn module_bytes(&self) -> u64 {
        (self.ports() * self.packets() * self.payload) as u64
    }

    /// The pattern: module `m`'s pixel (x, y) of its module image (no gap pixels) in frame
    /// `frame` counts `(131 frame + 1009 m + 7 y + x) mod 2^bits`.
    pub fn value(&self, frame: u64, m: u16, x: usize, y: usize) -> u32 {
        let v = frame.wrapping_mul(131).wrapping_add(m as u64 * 1009 + y as u64 * 7 + x as u64);
        (v & ((1u64 << self.layout.bits()) - 1)) as u32
    }

    /// Whether the detector sends a reset frame before each data frame (even frame numbers).
    pub fn sends_reset_frames(&self) -> bool {
        self.readout.reset_frame
    }

    /// Port `port` of module `m` in frame `frame`, packed as sent (its rows in sending
    /// order: upside down for a flipped port row; each row's pixels in readout order), into
    /// `out`.
    pub fn port_image(&self, frame: u64, m: u16, port: usize, out: &mut Vec<u8>) {
        let pw = self.layout.port_width();
        out.clear();
        for i in 0..self.layout.port_height() {
            let (y, x0) = self.layout.port_row_at(port, i);
            self.layout.pack((0..pw).map(|k| self.value(frame, m, x0 + self.readout.column(k, pw), y)), out);
        }
    }

    /// The header of packet `packet` of port `port` of module `m` in frame `frame`: row and
    /// column name the port in the detector's grid of ports.
    pub fn header(&self, frame: u64, m: u16, port: usize, packet: usize) -> [u8; SLS_HEADER_LEN] {
        let (mr, mc) = ((m / self.module_cols) as usize, (m % self.module_cols) as usize);
        let (rows, cols) = self.layout.port_grid();
        let h = SlsHeader {
            frame_number: frame,
            packet_number: packet as u32,
            mod_id: m,
            row: (mr * rows + port / cols) as u16,
            column: (mc * cols + port % cols) as u16,
            det_type: self.det_type,
            version: SLS_HEADER_VERSION,
            ..SlsHeader::default()
        };
        let mut b = [0u8; SLS_HEADER_LEN];
        h.encode(&mut b);
        b
    }
}

/// What a run of [`send`] did.
#[derive(Clone, Debug, Default)]
pub struct DescribedReport {
    pub frames: u64,
    /// What each module sent for each frame: the xxh3 of its port images, in port order
    /// (the raw module frame a receiver of the same settings holds).
    pub manifest: Vec<ManifestEntry>,
    /// Whether every port's socket sent with UDP generic segmentation offload.
    pub gso: bool,
    pub sent: SendStats,
    /// Frames that started after their time (the sender could not keep the rate).
    pub late_frames: u64,
    pub elapsed: Duration,
}

impl From<DescribedReport> for EmulatorReport {
    /// The described detector's run as the rdaq modules' is reported (no retransmission,
    /// no faults; every refusal happened while sending frames).
    fn from(r: DescribedReport) -> EmulatorReport {
        EmulatorReport { manifest: r.manifest, sent: r.sent, gso: r.gso, elapsed: r.elapsed, late_frames: r.late_frames, refused_in_frames: r.sent.refused, ..EmulatorReport::default() }
    }
}

/// Sends `frames` frames from `first` on, `rate_hz` frames per second (`None`: as fast as
/// possible), port `p` of module `m` to `dests[m * ports + p]`; counts the module frames
/// sent in `progress` and stops early when its `stop` is set.
pub fn send(det: &DescribedDetector, dests: &[SocketAddr], first: u64, frames: u64, rate_hz: Option<f64>, gso: bool, progress: &Control) -> io::Result<DescribedReport> {
    if first.checked_add(frames).is_none() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("first frame {first} + {frames} frames is past the last frame number, 2^64 - 1")));
    }
    crate::config::check_rate(rate_hz).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let ports = det.ports();
    if dests.len() != det.modules as usize * ports {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} data ports for {} modules of {ports} ports", dests.len(), det.modules)));
    }
    let local = |d: &SocketAddr| SocketAddr::new(if d.is_ipv4() { [0, 0, 0, 0].into() } else { [0u16; 8].into() }, 0);
    let mut tx = dests.iter().map(|d| BatchSender::connect(local(d), *d, gso, 8 << 20)).collect::<io::Result<Vec<_>>>()?;
    let (packets, payload) = (det.packets(), det.payload);
    let mut image = Vec::with_capacity(packets * payload);
    let mut headers = vec![[0u8; SLS_HEADER_LEN]; packets];
    let mut r = DescribedReport::default();
    let start = Instant::now();
    for k in 0..frames {
        if progress.stop.load(Ordering::Relaxed) {
            break;
        }
        if let Some(hz) = rate_hz {
            let due = start + Duration::from_secs_f64(k as f64 / hz);
            if Instant::now() > due + Duration::from_secs_f64(1.0 / hz) {
                r.late_frames += 1;
            }
            rdaq_net::pace::wait_until(due);
        }
        let frame = first + k;
        for m in 0..det.modules {
            let mut hash = Xxh3::new();
            for (p, t) in tx[m as usize * ports..(m as usize + 1) * ports].iter_mut().enumerate() {
                det.port_image(frame, m, p, &mut image);
                hash.update(&image);
                headers.iter_mut().enumerate().for_each(|(i, h)| *h = det.header(frame, m, p, i));
                let (img, hdr) = (&image, &headers);
                t.send(packets, |i| (&hdr[i][..], &img[i * payload..(i + 1) * payload]))?;
            }
            r.manifest.push(ManifestEntry { frame, module: m, xxh3: hash.digest() });
            progress.module_frames.fetch_add(1, Ordering::Relaxed);
        }
        r.frames += 1;
    }
    r.elapsed = start.elapsed();
    r.gso = tx.iter().all(BatchSender::gso);
    for t in &tx {
        r.sent += t.stats;
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The emulator packs what the receiver's layout unpacks: every bit depth, flips and all.
    #[test]
    fn packets_decode_to_the_pattern() {
        let d = Description::load("eiger").unwrap();
        for bits in [4, 8, 12, 16, 32] {
            let det = DescribedDetector::new(&d, &d.wire(Some(bits), Some("1g")).unwrap(), 2, 2).unwrap();
            let layout = ModuleLayout::new(&d, bits, false).unwrap();
            let mut raw = Vec::new();
            let mut port = Vec::new();
            for p in 0..det.ports() {
                det.port_image(5, 1, p, &mut port);
                raw.extend_from_slice(&port);
            }
            let pb = layout.pixel_bytes();
            let mut out = vec![0u8; 1024 * 512 * pb];
            layout.decode(&raw, &mut out);
            for (x, y) in [(0, 0), (1, 0), (513, 7), (3, 300), (1023, 511)] {
                let mut w = [0u8; 4];
                w[..pb].copy_from_slice(&out[(y * 1024 + x) * pb..][..pb]);
                assert_eq!(u32::from_le_bytes(w), det.value(5, 1, x, y), "{bits} bits at ({x}, {y})");
            }
        }
        let p = Description::load("percival-like").unwrap();
        let det = DescribedDetector::new(&p, &p.wire(Some(16), None).unwrap(), 1, 1).unwrap();
        let mut port = Vec::new();
        det.port_image(3, 0, 1, &mut port);
        // port 1, row 0: readout position 1 is column 64 of the port (8 interleaved ADCs)
        assert_eq!(u16::from_le_bytes([port[2], port[3]]) as u32, det.value(3, 0, 512 + 64, 0));
        let det = DescribedDetector::new(&d, &d.wire(Some(16), Some("10g")).unwrap(), 2, 2).unwrap();
        let h = SlsHeader::decode(&det.header(9, 1, 2, 63));
        assert_eq!((h.frame_number, h.packet_number, h.row, h.column, h.det_type), (9, 63, 1, 2, 1));
    }
}
