//! The receivers' online processing in a managed acquisition: the topology's `[process]`
//! section and the detector's photon energy, seed and chopper become the configuration
//! sections each receiver's acquisition takes (the run configuration's schema,
//! rdaq.example.toml), and the receivers' processing reports are summed.

use rdaq_manager::Topology;
use rdaq_run::config::Config;

/// The processing counts summed over the receivers.
pub const TOTALS: [&str; 7] = ["dark_frames", "signal_frames", "hits", "vetoed", "spots_found", "frames_written", "pedestal_updates"];

/// The configuration sections every receiver's acquisition gets (`None`: the topology has no
/// `[process]`, the receivers write raw frames), checked as a receiver will check them.
pub fn sections(t: &Topology) -> anyhow::Result<Option<toml::Table>> {
    let Some(process) = &t.process else { return Ok(None) };
    let d = &t.detector;
    let mut detector = toml::Table::new();
    let mut put = |k: &str, v: Option<toml::Value>| {
        if let Some(v) = v {
            detector.insert(k.into(), v);
        }
    };
    put("photon_energy_kev", d.photon_energy_kev.map(toml::Value::Float));
    put("seed", d.seed.map(|s| toml::Value::Integer(s as i64)));
    put("chopper_dark", d.chopper_dark.map(|c| toml::Value::Integer(c.into())));
    put("chopper_signal", d.chopper_signal.map(|c| toml::Value::Integer(c.into())));
    let mut s = toml::Table::new();
    s.insert("detector".into(), toml::Value::Table(detector));
    s.insert("process".into(), toml::Value::Table(process.clone()));
    let mut cfg = Config::with_sections(Config::remote(), s.clone())?;
    (cfg.detector.modules, cfg.stream.endpoint) = (1, "none".into());
    cfg.check()?;
    Ok(Some(s))
}

/// The sum of [`TOTALS`] over the receivers' processing reports; `None` when no receiver
/// processed.
pub fn totals<'a>(reports: impl Iterator<Item = &'a serde_json::Value>) -> Option<serde_json::Value> {
    let mut sum = serde_json::Map::new();
    for r in reports {
        for k in TOTALS {
            let v = sum.entry(k).or_insert(0u64.into());
            *v = (v.as_u64().unwrap_or(0) + r[k].as_u64().unwrap_or(0)).into();
        }
    }
    (!sum.is_empty()).then_some(serde_json::Value::Object(sum))
}
