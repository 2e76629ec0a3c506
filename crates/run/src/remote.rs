//! The source of an acquisition of a detector outside this process (`rdaq receive`, and
//! what a program asks of one): which packets arrive (rdaq datagrams, native JUNGFRAU
//! packets on one or two interfaces with a partial readout, a described detector's packets
//! placed by their header, RoCEv2 WRITEs), the receiver that takes them, the image their
//! frames make, and the chain they go through ([`crate::acquisition`]).

use anyhow::{bail, Context};
use rdaq_detector::description::Place;
use rdaq_detector::{Description, ModuleLayout};
use rdaq_process::descramble::Descrambler;
use rdaq_receiver::{Format, PortGrid, ReceiverConfig};
use rdaq_sink::{NxmxMeta, PixelType};

use crate::acquisition::Chain;
use crate::assemble::Decoder;
use crate::config::Config;

/// What the detector sends, beyond the configuration: the packets' format and the
/// detector's settings that shape them.
#[derive(Clone, Debug)]
pub struct Source {
    /// "rdaq", "sls" or "roce" (when no `detector` is named).
    pub format: String,
    /// A detector description (shipped name or file) whose native packets arrive.
    pub detector: Option<String>,
    /// The pixel bit depth it sends (default: the description's).
    pub bit_depth: Option<u32>,
    /// The link whose packet size it sends (default: the description's largest).
    pub link: Option<String>,
    /// Gap pixels between the chips of each module.
    pub gap_pixels: bool,
    /// RoCEv2: the path MTU and the number of the first frame.
    pub roce_mtu: u32,
    pub first_frame: u64,
    /// JUNGFRAU: UDP interfaces per module, and the rows it reads out.
    pub interfaces: u8,
    pub read_rows: u16,
    /// Stop after this many frames.
    pub frames: Option<u64>,
}

/// What an acquisition of a detector outside this process starts, and what its frames go
/// through.
pub struct Setup {
    pub rcfg: ReceiverConfig,
    pub chain: Chain,
    /// What the files and the stream say of the series (the source's part is unknown:
    /// number of images, exposure, period).
    pub meta: NxmxMeta,
}

/// The receiver that takes `a`'s packets, and the chain its frames take.
pub fn setup(a: &Source, cfg: &Config) -> anyhow::Result<Setup> {
    let format = match &a.detector {
        Some(name) => {
            let d = Description::load(name)?;
            if d.ports.place == Place::Header {
                return described_setup(a, cfg, &d);
            }
            // a description placed by packet number is JUNGFRAU's (checked when loaded)
            if a.bit_depth.is_some_and(|b| b != 16) || a.gap_pixels {
                bail!("--detector {}: JUNGFRAU sends 16-bit pixels and has no chip gaps", d.name);
            }
            if let Some(l) = &a.link {
                d.link(l).map_err(|e| anyhow::anyhow!("--link: {e}"))?;
            }
            Format::Sls { interfaces: a.interfaces, rows: a.read_rows }
        }
        None if a.bit_depth.is_some() || a.link.is_some() || a.gap_pixels => bail!("--bit-depth, --link and --gap-pixels are settings of a --detector"),
        None => match a.format.as_str() {
            "rdaq" if a.read_rows != rdaq_receiver::engine::JUNGFRAU_ROWS => bail!("--read-rows is a setting of native JUNGFRAU packets (--format sls)"),
            "rdaq" => Format::Rdaq,
            "sls" => Format::Sls { interfaces: a.interfaces, rows: a.read_rows },
            "roce" => Format::Roce { mtu: a.roce_mtu, first_frame: a.first_frame, frame_stride: 1 },
            other => bail!("--format must be rdaq, sls or roce, not {other:?}"),
        },
    };
    if a.read_rows == 0 || a.read_rows > 512 || a.read_rows % 8 != 0 {
        bail!("--read-rows {} must be 8 to 512, a multiple of 8", a.read_rows);
    }
    let geometry = cfg.geometry().expect("checked").with_module_height(a.read_rows as usize);
    let rcfg = ReceiverConfig { format, module_bytes: geometry.module_bytes() as u64, ..common_config(a, cfg, geometry.module_bytes())? };
    let (meta, processing) = crate::run::plan(cfg, geometry, None)?;
    Ok(Setup { rcfg, chain: Chain::new(geometry, processing, "receiver", cfg.faults.consumer_delay()), meta })
}

/// The receiver of a described detector's native packets placed by their header's row and
/// column, and the decoding of its module frames.
fn described_setup(a: &Source, cfg: &Config, d: &Description) -> anyhow::Result<Setup> {
    if a.read_rows != rdaq_receiver::engine::JUNGFRAU_ROWS || a.interfaces != 1 {
        bail!("--read-rows and --interfaces are settings of JUNGFRAU; {} sends what its description says", d.name);
    }
    if cfg.processing() {
        bail!("process: the processing graph is JUNGFRAU's; {} frames are written as the detector counts them (drop --calibration, or process.mode = \"raw\")", d.name);
    }
    let bits = a.bit_depth.unwrap_or(d.pixel.default_bit_depth);
    let link = a.link.clone().unwrap_or_else(|| d.default_link().to_owned());
    let payload = d.link(&link).map_err(|e| anyhow::anyhow!("--link: {e}"))?;
    let layout = ModuleLayout::new(d, bits, a.gap_pixels).map_err(|e| anyhow::anyhow!("--bit-depth {bits}: {e}"))?;
    let packets = d.packets_per_port(bits, payload).context("the description's packets per port")? as u32;
    let grid = PortGrid { det_type: d.header.det_type, payload: payload as u32, packets, port_rows: d.ports.rows as u16, port_cols: d.ports.cols as u16, module_cols: cfg.detector.module_cols };
    let rcfg = ReceiverConfig { format: Format::SlsByHeader(grid), module_bytes: grid.module_bytes(), payload_bytes: payload as u32, ..common_config(a, cfg, layout.raw_bytes())? };
    let mask = layout.gap_mask();
    let (decoder, pixel) = match Descrambler::for_description(d).map_err(|e| anyhow::anyhow!("--detector {}: {e}", d.name))? {
        Some(s) => {
            let fields = s.field_names().join(", ");
            let reset = if s.needs_reset() { "; even frame numbers are reset frames, subtracted from the next frame" } else { "" };
            eprintln!("rdaq receive: descrambling into the int16 planes {fields}, stacked in each module{reset}");
            (Decoder::Descramble(layout, s), PixelType::Fields)
        }
        None => (Decoder::Layout(layout), PixelType::Counts(bits as u8)),
    };
    let (w, h) = decoder.module_size();
    let geometry = cfg.geometry().expect("checked").with_module_size(w, h);
    let meta = NxmxMeta {
        images_per_file: cfg.output.images_per_file,
        photon_energy_kev: cfg.detector.photon_energy_kev,
        rotation: cfg.goniometer.rotation(),
        ..NxmxMeta::described(geometry, d, pixel, mask)
    };
    eprintln!("rdaq receive: {} module(s) of {} at {bits} bits on link {link}: {} ports of {packets} packets of {payload} bytes per module and frame", cfg.detector.modules, d.name, grid.ports());
    Ok(Setup { rcfg, chain: Chain { decoder: Some(decoder), ..Chain::new(geometry, None, "receiver", cfg.faults.consumer_delay()) }, meta })
}

/// The receiver settings every format shares, for modules of `module_bytes` bytes.
fn common_config(a: &Source, cfg: &Config, module_bytes: usize) -> anyhow::Result<ReceiverConfig> {
    let modules = cfg.detector.modules;
    let frame_bytes = modules as usize * module_bytes;
    let slots = (cfg.receiver.ring_mib << 20) / frame_bytes.max(1);
    if slots < 2 {
        bail!("receiver.ring_mib (--ring-mib) {} holds fewer than 2 frames of {} bytes", cfg.receiver.ring_mib, frame_bytes);
    }
    cfg.tune(ReceiverConfig {
        bind: cfg.network.bind,
        data_port: cfg.network.data_port,
        modules,
        payload_bytes: cfg.network.payload_bytes,
        slots,
        frames: a.frames,
        ..ReceiverConfig::default()
    })
}

