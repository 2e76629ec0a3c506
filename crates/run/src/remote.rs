//! The source of an acquisition of a detector outside this process (`rdaq receive`, and
//! what a program asks of one): which packets arrive (rdaq datagrams, native JUNGFRAU
//! packets on one or two interfaces with a partial readout, a described detector's packets
//! placed by their header, RoCEv2 WRITEs), the receiver that takes them, the image their
//! frames make, and the chain they go through ([`crate::acquisition`]).

use std::sync::Arc;

use anyhow::bail;
use rdaq_detector::description::Place;
use rdaq_detector::{Description, Geometry, ModuleLayout};
use rdaq_process::descramble::Descrambler;
use rdaq_process::spots::Peakfinder8;
use rdaq_receiver::{Format, PortGrid, ReceiverConfig};
use rdaq_sink::{DetectorPart, NxmxMeta, PixelType};
use serde::Deserialize;

use crate::acquisition::Chain;
use crate::assemble::Decoder;
use crate::config::Config;
use crate::counts::{CountFinderKind, Finding};

/// What the detector sends, beyond the configuration: the packets' format and the
/// detector's settings that shape them. Python's `Acquisition(source={...})` gives it as a
/// table of these fields (the detector by name or file).
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Source {
    /// "rdaq", "sls" or "roce" (when no `detector` is named).
    pub format: String,
    /// A detector description whose native packets arrive.
    #[serde(deserialize_with = "described")]
    pub detector: Option<Description>,
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
    /// The global ids of the modules this receiver holds, in slot order (empty:
    /// `0..detector.modules`): a receiver of a spatial plan holds some of them.
    #[serde(skip)]
    pub module_ids: Vec<u16>,
    /// The detector's modules per row, which a header's column counts in (default: the
    /// image's, `detector.module_cols`).
    #[serde(skip)]
    pub grid_cols: Option<u16>,
    /// The whole detector, when `module_ids` are some of its modules stacked in one column
    /// (a receiver of a spatial plan): the files and the stream then say where they go.
    #[serde(skip)]
    pub whole: Option<Geometry>,
    /// How errors name these settings: as the options of `rdaq receive`, or as the fields
    /// of a table (a buffer request's `native`, Python's `source`).
    #[serde(skip)]
    pub naming: Naming,
}

/// How a [`Source`]'s settings are named in its errors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Naming {
    /// `--link` (the command line).
    #[default]
    Options,
    /// `native.link` (the table's name, then the field).
    Fields(&'static str),
}

impl Default for Source {
    fn default() -> Source {
        Source::new("rdaq")
    }
}

/// A description by the name of a shipped one or a description file.
fn described<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Description>, D::Error> {
    let name = String::deserialize(d)?;
    Description::load(&name).map(Some).map_err(serde::de::Error::custom)
}

impl Source {
    /// What the detector sends, as `rdaq receive`'s defaults say (one interface, a full
    /// readout), in `format`, its settings named as options.
    pub fn new(format: &str) -> Source {
        Source {
            format: format.into(),
            detector: None,
            bit_depth: None,
            link: None,
            gap_pixels: false,
            roce_mtu: 4096,
            first_frame: 0,
            interfaces: 1,
            read_rows: rdaq_receiver::engine::JUNGFRAU_ROWS,
            frames: None,
            module_ids: Vec::new(),
            grid_cols: None,
            whole: None,
            naming: Naming::Options,
        }
    }

    /// The name of setting `field` ("bit_depth") in errors: `--bit-depth` or
    /// `native.bit_depth`.
    fn name(&self, field: &str) -> String {
        match self.naming {
            Naming::Options => format!("--{}", field.replace('_', "-")),
            // the detector section names its description `name`
            Naming::Fields("detector") if field == "detector" => "detector.name".into(),
            Naming::Fields(table) => format!("{table}.{field}"),
        }
    }
}

/// What an acquisition of a detector outside this process starts, and what its frames go
/// through.
pub struct Setup {
    pub rcfg: ReceiverConfig,
    pub chain: Chain,
    /// What the files and the stream say of the series: the number of images the source
    /// stops after (unknown without one); the exposure and the period are the caller's to
    /// tell (unknown, 0, until then).
    pub meta: NxmxMeta,
    /// What the operator should know of the packets taken (the ports, the descrambling),
    /// for the caller to print or log.
    pub notes: Vec<String>,
}

/// The receiver that takes `a`'s packets, and the chain its frames take.
pub fn setup(a: &Source, cfg: &Config) -> anyhow::Result<Setup> {
    let format = match &a.detector {
        Some(d) => {
            if d.ports.place == Place::Header {
                return described_setup(a, cfg, d);
            }
            // a description placed by packet number is JUNGFRAU's (checked when loaded)
            if a.bit_depth.is_some_and(|b| b != 16) || a.gap_pixels {
                bail!("{} {}: JUNGFRAU sends 16-bit pixels and has no chip gaps", a.name("detector"), d.name);
            }
            if let Some(l) = &a.link {
                d.link(l).map_err(|e| anyhow::anyhow!("{}: {e}", a.name("link")))?;
            }
            Format::Sls { interfaces: a.interfaces, rows: a.read_rows }
        }
        None if a.bit_depth.is_some() || a.link.is_some() || a.gap_pixels => {
            bail!("{}, {} and {} are settings of a {}", a.name("bit_depth"), a.name("link"), a.name("gap_pixels"), a.name("detector"))
        }
        None => match a.format.as_str() {
            "rdaq" if a.read_rows != rdaq_receiver::engine::JUNGFRAU_ROWS => bail!("{} is a setting of native JUNGFRAU packets (--format sls)", a.name("read_rows")),
            "rdaq" => Format::Rdaq,
            "sls" => Format::Sls { interfaces: a.interfaces, rows: a.read_rows },
            "roce" => Format::Roce { mtu: a.roce_mtu, first_frame: a.first_frame, frame_stride: 1 },
            other => bail!("--format must be rdaq, sls or roce, not {other:?}"),
        },
    };
    if a.read_rows == 0 || a.read_rows > 512 || a.read_rows % 8 != 0 {
        bail!("{} {} must be 8 to 512, a multiple of 8", a.name("read_rows"), a.read_rows);
    }
    let geometry = cfg.geometry().expect("checked").with_module_height(a.read_rows as usize);
    let rcfg = ReceiverConfig { format, module_bytes: geometry.module_bytes() as u64, ..common_config(a, cfg, geometry.module_bytes())? };
    let (mut meta, processing) = crate::plan::plan(cfg, geometry, ids(a))?;
    meta.number_of_images = a.frames;
    held_part(a, cfg, &mut meta);
    let masked = processing.iter().filter(|_| !cfg.emulated_calibration()).map(|p| crate::calibration::masked_said(&geometry, &p.calibration));
    let notes = crate::calibration::psi_said(cfg).into_iter().chain(masked).collect();
    Ok(Setup { rcfg, chain: Chain::new(cfg, geometry, processing, "receiver"), meta, notes })
}

/// Makes `meta` the images of the modules `a` holds of the whole detector it names (a
/// receiver of a spatial plan): its files and stream then say where they go. The beam
/// centre, which the configuration gives for the whole detector (by default its centre), is
/// counted from the part's first module, so that a joiner adding that module's place gets
/// it back (and peakfinder8's radii are the whole detector's).
fn held_part(a: &Source, cfg: &Config, meta: &mut NxmxMeta) {
    let (Some(whole), Some(&first)) = (a.whole, a.module_ids.first()) else { return };
    let ids = &a.module_ids;
    let g = meta.geometry;
    let detector = whole.with_module_size(g.module_width, g.module_height);
    let (r0, c0) = detector.origin(first);
    let d = &cfg.detector;
    let x = d.beam_center_x.unwrap_or(detector.width() as f64 / 2.0);
    let y = d.beam_center_y.unwrap_or(detector.height() as f64 / 2.0);
    meta.beam_center = [x - c0 as f64, y - r0 as f64];
    // the name is the detector's (made from the modules of the image)
    meta.detector_name = meta.detector_name.replacen(&format!(" {}-module", g.modules), &format!(" {}-module", detector.modules), 1);
    meta.part = Some(DetectorPart { module_ids: ids.to_vec(), detector });
}

/// The module ids the calibration is taken for (`None`: the first modules).
fn ids(a: &Source) -> Option<&[u16]> {
    (!a.module_ids.is_empty()).then_some(&a.module_ids[..])
}

/// The receiver of a described detector's native packets placed by their header's row and
/// column, and the decoding of its module frames.
fn described_setup(a: &Source, cfg: &Config, d: &Description) -> anyhow::Result<Setup> {
    if a.read_rows != rdaq_receiver::engine::JUNGFRAU_ROWS || a.interfaces != 1 {
        bail!("{} and {} are settings of JUNGFRAU; {} sends what its description says", a.name("read_rows"), a.name("interfaces"), d.name);
    }
    if cfg.processing() {
        bail!("process: the processing graph is JUNGFRAU's; {} frames are written as the detector counts them (drop --calibration, or process.mode = \"raw\")", d.name);
    }
    let wire = d.wire(a.bit_depth, a.link.as_deref()).map_err(|e| anyhow::anyhow!("{} {}: {}", a.name(e.field), e.value, e.why))?;
    let (bits, payload, packets) = (wire.bits, wire.payload, wire.packets_per_port as u32);
    let layout = ModuleLayout::new(d, bits, a.gap_pixels).map_err(|e| anyhow::anyhow!("{}: {e}", a.name("gap_pixels")))?;
    let module_cols = a.grid_cols.unwrap_or(cfg.detector.module_cols);
    let grid = PortGrid { det_type: d.header.det_type, payload: payload as u32, packets, port_rows: d.ports.rows as u16, port_cols: d.ports.cols as u16, module_cols };
    let rcfg = ReceiverConfig { format: Format::SlsByHeader(grid), module_bytes: grid.module_bytes(), payload_bytes: payload as u32, ..common_config(a, cfg, layout.raw_bytes())? };
    let mask = layout.gap_mask();
    let mut notes = Vec::new();
    let (decoder, pixel) = match Descrambler::for_description(d).map_err(|e| anyhow::anyhow!("{} {}: {e}", a.name("detector"), d.name))? {
        Some(s) => {
            let fields = s.field_names().join(", ");
            let reset = if s.needs_reset() { "; even frame numbers are reset frames, subtracted from the next frame" } else { "" };
            notes.push(format!("descrambling into the int16 planes {fields}, stacked in each module{reset}"));
            (Decoder::Descramble(layout, s), PixelType::Fields)
        }
        None => (Decoder::Layout(layout), PixelType::Counts(bits as u8)),
    };
    let (w, h) = decoder.module_size();
    let geometry = cfg.geometry().expect("checked").with_module_size(w, h);
    let mut meta = NxmxMeta {
        images_per_file: cfg.output.images_per_file,
        photon_energy_kev: cfg.detector.photon_energy_kev,
        rotation: cfg.goniometer.rotation(),
        number_of_images: a.frames,
        ..NxmxMeta::described(geometry, d, pixel, mask)
    };
    cfg.experiment_into(&mut meta);
    held_part(a, cfg, &mut meta);
    notes.push(format!("{} module(s) of {} at {bits} bits on link {}: {} ports of {packets} packets of {payload} bytes per module and frame", cfg.detector.modules, d.name, wire.link, grid.ports()));
    let finding = counting_spots(cfg, d, &decoder, &mut meta)?;
    Ok(Setup { rcfg, chain: Chain { decoder: Some(decoder), finding, ..Chain::new(cfg, geometry, None, "receiver") }, meta, notes })
}

/// With `process.mode = "spots"`, a counting detector's spot finding and veto, and what the
/// files say of them (spot lists, the finder's settings, the codec).
fn counting_spots(cfg: &Config, d: &Description, decoder: &Decoder, meta: &mut NxmxMeta) -> anyhow::Result<Option<Arc<Finding>>> {
    let p = &cfg.process;
    if p.mode != "spots" {
        return Ok(None);
    }
    if d.kind != rdaq_detector::description::Kind::Counting || !matches!(decoder, Decoder::Layout(_)) {
        bail!("process.mode = \"spots\" finds spots in a counting detector's counts; {} integrates (its description's kind), and its planes are written as they come", d.name);
    }
    let finder = count_finder(cfg, meta)?;
    meta.codec = rdaq_process::bitshuffle::Codec::parse(&p.codec, p.zstd_level)?;
    meta.max_spots = p.max_spots;
    meta.processing = Some(cfg.processing_meta(true));
    let PixelType::Counts(bits) = meta.pixel else { bail!("process.mode = \"spots\": {} writes no counts", d.name) };
    Ok(Some(Arc::new(Finding { finder, min_spots: p.min_spots, veto: p.veto, mask: Arc::new(meta.pixel_mask()), bits })))
}

/// The finder `process.finder` names for the counts of the images `meta` describes, its
/// thresholds in counts (a count is a photon).
fn count_finder(cfg: &Config, meta: &NxmxMeta) -> anyhow::Result<CountFinderKind> {
    let (h, w) = (meta.geometry.height(), meta.geometry.width());
    if let Some(params) = cfg.processing_meta(true).peakfinder8(w, h) {
        let [x, y] = meta.beam_center;
        return Ok(CountFinderKind::Peakfinder8(params, Arc::new(Peakfinder8::radius_map(w, h, x, y))));
    }
    let params = crate::plan::finder_params_in(cfg, 1.0);
    params.check(h, w).map_err(|e| anyhow::anyhow!("process: {e}"))?;
    Ok(CountFinderKind::Local(params))
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
        module_ids: a.module_ids.clone(),
        ..ReceiverConfig::default()
    })
}

