//! A detector described as data (`detectors/*.toml`, docs/detectors.md): its packet header,
//! how a module's pixels are cut into ports and packets, where packets go in the module
//! image, the pixel bit depths and bit fields, and the chip gaps. The receiver and the image
//! assembly follow the description, so a detector that sends the sls header needs no code.

use std::collections::BTreeMap;
use std::path::Path;

use rdaq_proto::sls::{DET_TYPE_JUNGFRAU, SLS_HEADER_LEN};
use serde::Deserialize;
use thiserror::Error;

/// The descriptions shipped with rdaq, by the name `--detector` takes.
pub const BUILTIN: [(&str, &str); 3] = [
    ("jungfrau", include_str!("../../../detectors/jungfrau.toml")),
    ("eiger", include_str!("../../../detectors/eiger.toml")),
    // an example of a descrambled detector, not a real one's description (see the file)
    ("percival-like", include_str!("../../../detectors/percival-like.toml")),
];

#[derive(Debug, Error)]
pub enum DescriptionError {
    #[error("cannot read detector description {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("detector description {origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("detector description {origin}: {field}: {why}")]
    Field { origin: String, field: &'static str, why: String },
    #[error("{0:?} is neither a shipped detector ({names}) nor a description file", names = BUILTIN.map(|b| b.0).join(", "))]
    Unknown(String),
}

/// Counting detectors send counts; integrating ones send ADC words with bit fields (gain,
/// coarse, fine) that conversion takes apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Counting,
    Integrating,
}

/// How a port's packets find their place in the module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Place {
    /// The header's row and column name the port block in the detector's port grid; the
    /// packet number is the packet's place in the port image.
    Header,
    /// Each socket is one port, its packets placed by packet number (JUNGFRAU's interfaces
    /// and partial readouts, handled by the receiver's JUNGFRAU rules).
    Packet,
}

/// Which pixel of a byte comes first in 4-bit mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NibbleOrder {
    #[default]
    LowFirst,
    HighFirst,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// "sls": the 48-byte slsDetectorPackage header, version 2 (the only one known).
    pub format: String,
    /// The header's detType of this detector's packets.
    pub det_type: u8,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleSize {
    pub width: usize,
    pub height: usize,
}

/// A module's ports: a `rows x cols` grid of port images of `width x height` pixels.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ports {
    pub rows: usize,
    pub cols: usize,
    pub width: usize,
    pub height: usize,
    pub place: Place,
    /// Per port row: its rows arrive upside down.
    #[serde(default)]
    pub flip: Vec<bool>,
}

/// The chips of a module, for gap pixels between them.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chips {
    pub cols: usize,
    pub rows: usize,
    pub gap_x: usize,
    pub gap_y: usize,
}

/// A bit field of an integrating detector's pixel word.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Field {
    pub name: String,
    pub shift: u32,
    pub bits: u32,
    /// The reset frame's value of this field is subtracted (coarse and fine ADC values;
    /// not a gain code).
    #[serde(default)]
    pub subtract_reset: bool,
}

/// The order in which pixels of a port row leave the sensor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// Left to right.
    #[default]
    Rows,
    /// `adcs` ADCs read a row's `adcs` equal column blocks in parallel and the stream
    /// alternates between them: readout position `k` is column
    /// `(k % adcs) * (width / adcs) + k / adcs`.
    Interleave,
    /// `map[k]` is the column of readout position `k`.
    Map,
}

/// How an integrating detector's raw frames become images (the descramble stage).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Readout {
    #[serde(default)]
    pub order: Order,
    #[serde(default)]
    pub adcs: usize,
    #[serde(default)]
    pub map: Vec<usize>,
    /// Each data frame follows its own reset frame: even frame numbers are reset frames,
    /// frame `2n + 1` the data frame of reset frame `2n`.
    #[serde(default)]
    pub reset_frame: bool,
}

impl Readout {
    /// For each column of a port row `width` pixels wide, its readout position.
    pub fn positions(&self, width: usize) -> Vec<u32> {
        let mut p = vec![0u32; width];
        for k in 0..width {
            p[self.column(k, width)] = k as u32;
        }
        p
    }

    /// The column of readout position `k` of a port row `width` pixels wide.
    pub fn column(&self, k: usize, width: usize) -> usize {
        match self.order {
            Order::Rows => k,
            Order::Interleave => (k % self.adcs) * (width / self.adcs) + k / self.adcs,
            Order::Map => self.map[k],
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pixel {
    pub bit_depths: Vec<u32>,
    pub default_bit_depth: u32,
    #[serde(default)]
    pub nibble_order: NibbleOrder,
    #[serde(default)]
    pub fields: Vec<Field>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// Pixel bytes per packet (after the header).
    pub payload: usize,
}

/// A detector, as its description file says.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Description {
    pub name: String,
    pub kind: Kind,
    pub pixel_size_um: f64,
    pub sensor_material: String,
    pub sensor_thickness_um: f64,
    pub header: Header,
    pub module: ModuleSize,
    pub ports: Ports,
    #[serde(default)]
    pub chips: Option<Chips>,
    pub pixel: Pixel,
    /// Packet payloads by link name ("1g", "10g", ...).
    pub links: BTreeMap<String, Link>,
    /// How raw frames are descrambled (integrating detectors placed by header).
    #[serde(default)]
    pub readout: Option<Readout>,
}

/// Bit depths a port image may have: whole bytes, or 4 and 12 bits packed.
pub const BIT_DEPTHS: [u32; 5] = [4, 8, 12, 16, 32];

impl Description {
    /// A shipped description by name ("eiger", "jungfrau"), or a description file.
    pub fn load(name_or_path: &str) -> Result<Description, DescriptionError> {
        Description::parse(&Description::text(name_or_path)?, name_or_path)
    }

    /// The text of a shipped description by name, or of a description file.
    pub fn text(name_or_path: &str) -> Result<String, DescriptionError> {
        if let Some((_, text)) = BUILTIN.iter().find(|(n, _)| n.eq_ignore_ascii_case(name_or_path)) {
            return Ok((*text).to_owned());
        }
        let path = Path::new(name_or_path);
        if !path.exists() && !name_or_path.contains(['/', '.']) {
            return Err(DescriptionError::Unknown(name_or_path.into()));
        }
        std::fs::read_to_string(path).map_err(|source| DescriptionError::Read { path: path.display().to_string(), source })
    }

    /// A shipped description by name, or a description's TOML text, as a request over the
    /// network names it: never a file, which would be one on this host's disk.
    pub fn named_or_text(s: &str) -> Result<Description, DescriptionError> {
        match BUILTIN.iter().find(|(n, _)| n.eq_ignore_ascii_case(s)) {
            Some((name, text)) => Description::parse(text, name),
            None if s.contains('=') => Description::parse(s, "the request's description"),
            None => Err(DescriptionError::Unknown(s.chars().take(64).collect())),
        }
    }

    /// Parses and checks a description; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Description, DescriptionError> {
        let d: Description = toml::from_str(text).map_err(|e| DescriptionError::Parse { origin: origin.into(), message: one_line(&e.to_string()) })?;
        d.check().map_err(|(field, why)| DescriptionError::Field { origin: origin.into(), field, why })?;
        Ok(d)
    }

    /// The payload of link `name`, or why there is none.
    pub fn link(&self, name: &str) -> Result<usize, String> {
        self.links.get(name).map(|l| l.payload).ok_or_else(|| format!("{} has no link {name:?} (it has {})", self.name, self.links.keys().cloned().collect::<Vec<_>>().join(", ")))
    }

    /// The link used unless one is named: the fastest (largest payload).
    pub fn default_link(&self) -> &str {
        self.links.iter().max_by_key(|(_, l)| l.payload).map_or("", |(n, _)| n.as_str())
    }

    /// Bytes of one port image at `bits` per pixel.
    pub fn port_bytes(&self, bits: u32) -> usize {
        self.ports.width * self.ports.height * bits as usize / 8
    }

    /// Packets per port and frame at `bits` per pixel on a link of `payload` bytes; `None`
    /// when the port image is not a whole number of packets.
    pub fn packets_per_port(&self, bits: u32, payload: usize) -> Option<usize> {
        let b = self.port_bytes(bits);
        (payload > 0 && b % payload == 0).then_some(b / payload)
    }

    /// Whether port row `r` arrives upside down.
    pub fn flipped(&self, r: usize) -> bool {
        self.ports.flip.get(r).copied().unwrap_or(false)
    }

    /// Checks what serde cannot: sizes that fit together. The error names the field.
    fn check(&self) -> Result<(), (&'static str, String)> {
        if self.header.format != "sls" {
            return Err(("header.format", format!("{:?} is not a known header (\"sls\": the 48-byte slsDetectorPackage header)", self.header.format)));
        }
        for (field, um) in [("pixel_size_um", self.pixel_size_um), ("sensor_thickness_um", self.sensor_thickness_um)] {
            // the files' geometry and DIALS' models are made of these: NaN or a negative size
            // would be written as if it were a detector
            if !(um.is_finite() && um > 0.0) {
                return Err((field, format!("{um} µm; a size is finite and greater than 0")));
            }
        }
        let (m, p) = (&self.module, &self.ports);
        if m.width == 0 || m.height == 0 {
            return Err(("module.width", format!("a module of {} x {} pixels has no pixels", m.width, m.height)));
        }
        if p.rows * p.height != m.height || p.cols * p.width != m.width {
            return Err(("ports", format!("{} x {} ports of {} x {} pixels do not tile a {} x {} module", p.rows, p.cols, p.width, p.height, m.width, m.height)));
        }
        if p.flip.len() > p.rows {
            return Err(("ports.flip", format!("{} entries for {} port rows", p.flip.len(), p.rows)));
        }
        self.check_pixel()?;
        self.check_links()?;
        if let Some(c) = &self.chips {
            if c.cols == 0 || c.rows == 0 || m.width % c.cols != 0 || m.height % c.rows != 0 {
                return Err(("chips", format!("{} x {} chips do not divide a {} x {} module", c.rows, c.cols, m.width, m.height)));
            }
        }
        self.check_readout()?;
        if p.place == Place::Packet && (self.header.det_type != DET_TYPE_JUNGFRAU || self.pixel.bit_depths != [16]) {
            return Err(("ports.place", "\"packet\" placement follows JUNGFRAU's rules (detType 3, 16 bits); other detectors are placed by \"header\"".into()));
        }
        Ok(())
    }

    fn check_pixel(&self) -> Result<(), (&'static str, String)> {
        let px = &self.pixel;
        if px.bit_depths.is_empty() {
            return Err(("pixel.bit_depths", "lists no bit depth".into()));
        }
        if let Some(b) = px.bit_depths.iter().find(|b| !BIT_DEPTHS.contains(b)) {
            return Err(("pixel.bit_depths", format!("{b} is not one of {BIT_DEPTHS:?}")));
        }
        if !px.bit_depths.contains(&px.default_bit_depth) {
            return Err(("pixel.default_bit_depth", format!("{} is not in pixel.bit_depths {:?}", px.default_bit_depth, px.bit_depths)));
        }
        if self.ports.width % 2 != 0 && px.bit_depths.iter().any(|&b| b == 4 || b == 12) {
            return Err(("ports.width", "4- and 12-bit pixels come in pairs: a port row needs an even width".into()));
        }
        let word = px.bit_depths.iter().max().copied().unwrap_or(0);
        for f in &px.fields {
            if f.bits == 0 || f.shift + f.bits > word {
                return Err(("pixel.fields", format!("field {:?} (bits {}..{}) is not inside a {word}-bit pixel", f.name, f.shift, f.shift + f.bits)));
            }
        }
        Ok(())
    }

    /// An integrating detector placed by header is descrambled: 16-bit words split into its
    /// fields, in an order that is a permutation of each port row.
    fn check_readout(&self) -> Result<(), (&'static str, String)> {
        let Some(r) = self.descrambled() else {
            return match self.readout.is_some() {
                true => Err(("readout", "only integrating detectors placed by header are descrambled".into())),
                false => Ok(()),
            };
        };
        if self.pixel.bit_depths != [16] || self.pixel.fields.is_empty() {
            return Err(("pixel", "a descrambled detector sends 16-bit words with [[pixel.fields]]".into()));
        }
        if self.pixel.fields.iter().any(|f| f.bits > 15) {
            return Err(("pixel.fields", "a field is at most 15 bits (its reset-subtracted value is a 16-bit signed number)".into()));
        }
        let w = self.ports.width;
        match r.order {
            Order::Interleave if r.adcs == 0 || w % r.adcs != 0 => Err(("readout.adcs", format!("{} ADCs do not divide a port row of {w} pixels", r.adcs))),
            Order::Map if !is_permutation(r.map.iter().copied(), w) => Err(("readout.map", format!("must list each of the {w} columns of a port row once ({} entries)", r.map.len()))),
            _ => Ok(()),
        }
    }

    /// The readout of a descrambled detector (`None`: not descrambled).
    pub fn descrambled(&self) -> Option<Readout> {
        (self.kind == Kind::Integrating && self.ports.place == Place::Header).then(|| self.readout.clone().unwrap_or_default())
    }

    fn check_links(&self) -> Result<(), (&'static str, String)> {
        if self.links.is_empty() {
            return Err(("links", "names no link (e.g. [links.10g] payload = 4096)".into()));
        }
        for (name, l) in &self.links {
            if l.payload == 0 || l.payload > 9000 - SLS_HEADER_LEN {
                return Err(("links.*.payload", format!("link {name}: {} bytes do not fit a datagram (1..={})", l.payload, 9000 - SLS_HEADER_LEN)));
            }
            for &b in &self.pixel.bit_depths {
                if self.packets_per_port(b, l.payload).is_none() {
                    return Err(("links.*.payload", format!("link {name}: a {b}-bit port image of {} bytes is not a whole number of {}-byte packets", self.port_bytes(b), l.payload)));
                }
            }
        }
        Ok(())
    }
}

/// Whether `v` holds each of `0..n` exactly once.
pub fn is_permutation(v: impl ExactSizeIterator<Item = usize>, n: usize) -> bool {
    let mut seen = vec![false; n];
    v.len() == n && v.into_iter().all(|c| c < n && !std::mem::replace(&mut seen[c], true))
}

/// toml's errors span lines (a snippet of the file); logs and the CLI want one.
fn one_line(s: &str) -> String {
    s.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('|') && !l.chars().all(|c| c == '^' || c == ' ')).collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_a_shipped_description_or_gives_its_text_never_a_path() {
        assert_eq!(Description::named_or_text("EIGER").unwrap(), Description::load("eiger").unwrap());
        let text = Description::text("eiger").unwrap();
        assert_eq!(Description::named_or_text(&text).unwrap().name, "EIGER");
        let dir = std::env::temp_dir().join(format!("rdaq-desc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.toml");
        std::fs::write(&path, &text).unwrap();
        assert!(Description::load(path.to_str().unwrap()).is_ok(), "a file is loaded where the user names it");
        assert!(matches!(Description::named_or_text(path.to_str().unwrap()), Err(DescriptionError::Unknown(_))), "a request's path is not read");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn shipped_descriptions_load() {
        let e = Description::load("eiger").unwrap();
        assert_eq!((e.ports.rows * e.ports.cols, e.kind, e.header.det_type), (4, Kind::Counting, 1));
        assert_eq!(e.packets_per_port(16, e.link("1g").unwrap()), Some(256));
        assert_eq!(e.packets_per_port(12, e.link("10g").unwrap()), Some(48));
        assert_eq!(e.packets_per_port(4, 1024), Some(64));
        assert!(e.flipped(1) && !e.flipped(0));
        assert_eq!(e.default_link(), "10g");
        let j = Description::load("JUNGFRAU").unwrap();
        assert_eq!((j.ports.place, j.packets_per_port(16, 8192)), (Place::Packet, Some(128)));
        assert_eq!(j.pixel.fields.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["adc", "gain"]);
    }

    fn eiger_with(from: &str, to: &str) -> Result<Description, DescriptionError> {
        let text = BUILTIN[1].1.replace(from, to);
        assert_ne!(text, BUILTIN[1].1, "the replacement must change the text");
        Description::parse(&text, "test.toml")
    }

    #[test]
    fn errors_name_the_field() {
        let msg = |r: Result<Description, DescriptionError>| r.unwrap_err().to_string();
        assert!(msg(eiger_with("width = 512", "width = 500")).contains("ports:"));
        assert!(msg(eiger_with("default_bit_depth = 16", "default_bit_depth = 24")).contains("pixel.default_bit_depth"));
        assert!(msg(eiger_with("payload = 1024", "payload = 1000")).contains("links.*.payload"));
        assert!(msg(eiger_with("det_type = 1", "det_typ = 1")).contains("det_typ"));
        assert!(msg(eiger_with("format = \"sls\"", "format = \"rdaq\"")).contains("header.format"));
        assert!(msg(eiger_with("flip = [false, true]", "flip = [false, true, true]")).contains("ports.flip"));
        assert!(msg(eiger_with("place = \"header\"", "place = \"packet\"")).contains("ports.place"));
        let e = msg(eiger_with("cols = 4", "cols = 3"));
        assert!(e.contains("chips") && !e.contains('\n'), "{e}");
        assert!(matches!(Description::load("pilatus"), Err(DescriptionError::Unknown(_))));
        let percival = |from: &str, to: &str| Description::parse(&BUILTIN[2].1.replace(from, to), "p.toml").unwrap_err().to_string();
        assert!(percival("adcs = 8", "adcs = 7").contains("readout.adcs"));
        assert!(percival("order = \"interleave\"", "order = \"map\"\nmap = [0, 1]").contains("readout.map"));
        assert!(percival("bits = 5", "bits = 16").contains("pixel.fields"));
        assert!(msg(eiger_with("[links.1g]", "[readout]\nreset_frame = true\n\n[links.1g]")).contains("readout"));
        assert!(matches!(Description::load("/nonexistent/x.toml"), Err(DescriptionError::Read { .. })));
        for bad in ["nan", "-75.0", "0.0", "inf"] {
            assert!(msg(eiger_with("pixel_size_um = 75.0", &format!("pixel_size_um = {bad}"))).contains("pixel_size_um"), "{bad}");
        }
        assert!(msg(eiger_with("sensor_thickness_um = 320.0", "sensor_thickness_um = -nan")).contains("sensor_thickness_um"));
    }
}
