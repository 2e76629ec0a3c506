//! The receiver configuration librdaq takes: a TOML text with the options of
//! `rdaq receive` that an embedded receiver needs.

use std::net::IpAddr;
use std::time::Duration;

use rdaq_receiver::{IncompletePolicy, ReceiverConfig};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Options {
    modules: u16,
    bind: String,
    port: u16,
    slots: usize,
    frames: Option<u64>,
    frame_timeout_ms: u64,
    policy: String,
    engine: String,
}

impl Default for Options {
    fn default() -> Self {
        Options { modules: 1, bind: "127.0.0.1".into(), port: 0, slots: 16, frames: None, frame_timeout_ms: 500, policy: "keep".into(), engine: "recvmmsg".into() }
    }
}

/// The receiver configuration `text` describes; the error names the field.
pub fn parse(text: &str) -> Result<ReceiverConfig, String> {
    let o: Options = toml::from_str(text).map_err(|e| e.to_string().trim().replace('\n', " "))?;
    let bind: IpAddr = o.bind.parse().map_err(|_| format!("bind: {:?} is not an IP address", o.bind))?;
    let policy: IncompletePolicy = o.policy.parse().map_err(|e| format!("policy: {e}"))?;
    let engine = o.engine.parse().map_err(|e| format!("engine: {e}"))?;
    if o.modules == 0 || o.slots < 2 {
        return Err("modules: at least 1; slots: at least 2".into());
    }
    Ok(ReceiverConfig { bind, data_port: o.port, modules: o.modules, slots: o.slots, frames: o.frames, frame_timeout: Duration::from_millis(o.frame_timeout_ms), policy, engine, ..ReceiverConfig::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_checked_and_named() {
        let c = parse("modules = 2\nslots = 4\nframes = 10\n").unwrap();
        assert_eq!((c.modules, c.slots, c.frames), (2, 4, Some(10)));
        assert!(parse("").is_ok(), "every field has a default");
        assert!(parse("modulez = 2").unwrap_err().contains("modulez"));
        assert!(parse("bind = \"here\"").unwrap_err().starts_with("bind:"));
        assert!(parse("policy = \"maybe\"").unwrap_err().starts_with("policy:"));
        assert!(parse("engine = \"pigeon\"").unwrap_err().starts_with("engine:"));
        assert!(parse("slots = 1").unwrap_err().contains("slots"));
        assert!(parse("modules = \"two\"").unwrap_err().contains("modules"));
    }
}
