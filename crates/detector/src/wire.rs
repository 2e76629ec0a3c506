//! What a described detector puts on the wire at a bit depth and over a link: the payload
//! of its packets and how many each port sends per frame. The receivers, the manager's
//! topology check and the emulated modules all derive their sizes from this one answer.

use thiserror::Error;

use crate::description::{Description, Place};

/// A described detector's packets at one bit depth and link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wire {
    pub bits: u32,
    /// The link's name in the description.
    pub link: String,
    /// Pixel bytes per packet (after the header).
    pub payload: usize,
    pub packets_per_port: usize,
    /// Ports per module.
    pub ports: usize,
}

/// Why a bit depth or link does not fit a description; `field` is the setting at fault
/// (`bit_depth` or `link`), for the caller to name as its users know it, and `value` what
/// it was (the default where none was given).
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{field} {value}: {why}")]
pub struct WireError {
    pub field: &'static str,
    pub value: String,
    pub why: String,
}

impl Wire {
    /// Bytes of one module frame's payloads.
    pub fn module_bytes(&self) -> usize {
        self.ports * self.packets_per_port * self.payload
    }
}

impl Description {
    /// The packets of this detector at `bit_depth` (none: its default) over `link` (none:
    /// the fastest); only a detector whose packets are placed by their header has them.
    pub fn wire(&self, bit_depth: Option<u32>, link: Option<&str>) -> Result<Wire, WireError> {
        let bad = |field, value: &dyn std::fmt::Display, why| WireError { field, value: value.to_string(), why };
        let bits = bit_depth.unwrap_or(self.pixel.default_bit_depth);
        if self.ports.place != Place::Header {
            return Err(bad("bit_depth", &bits, format!("bit_depth and link are settings of a detector placed by header; {} sends 16-bit rdaq datagrams", self.name)));
        }
        if !self.pixel.bit_depths.contains(&bits) {
            return Err(bad("bit_depth", &bits, format!("{} sends {:?}-bit pixels, not {bits}", self.name, self.pixel.bit_depths)));
        }
        let link = link.unwrap_or_else(|| self.default_link()).to_owned();
        let payload = self.link(&link).map_err(|why| bad("link", &link, why))?;
        let packets_per_port = self
            .packets_per_port(bits, payload)
            .ok_or_else(|| bad("link", &link, format!("a {bits}-bit port image is not a whole number of {payload}-byte packets")))?;
        Ok(Wire { bits, link, payload, packets_per_port, ports: self.ports.rows * self.ports.cols })
    }

    /// The name of the link whose packets carry `payload` bytes, if there is one.
    pub fn link_of_payload(&self, payload: usize) -> Option<&str> {
        self.links.iter().find(|(_, l)| l.payload == payload).map(|(n, _)| n.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eiger_defaults_to_its_fastest_link_and_bit_depth() {
        let d = Description::load("eiger").unwrap();
        let w = d.wire(None, None).unwrap();
        assert_eq!(w.bits, d.pixel.default_bit_depth);
        assert_eq!(w.payload, d.links[d.default_link()].payload);
        assert_eq!(w.module_bytes(), d.module.width * d.module.height * w.bits as usize / 8);
        assert_eq!(d.link_of_payload(w.payload), Some(w.link.as_str()));
    }

    #[test]
    fn each_wrong_setting_names_its_field() {
        let d = Description::load("eiger").unwrap();
        assert_eq!(d.wire(Some(7), None).unwrap_err().field, "bit_depth");
        assert_eq!(d.wire(None, Some("nope")).unwrap_err().field, "link");
        let jf = Description::load("jungfrau").unwrap();
        assert_eq!(jf.wire(None, None).unwrap_err().field, "bit_depth");
    }
}
