//! What requests and configurations say of an experiment beside the frames: the photon
//! energy, the detector's distance, where the beam meets it, the sample's name and how the
//! frames are triggered, bounded where they are read. Each error names the field as the
//! request spells it.

/// Photon energies a detector of this kind is used at (JUNGFRAU: 2-25 keV), with room.
pub const MIN_PHOTON_KEV: f64 = 0.1;
pub const MAX_PHOTON_KEV: f64 = 200.0;
/// The farthest detector distance, in metres.
pub const MAX_DISTANCE_M: f64 = 100.0;
/// The farthest beam centre from the image's origin, in pixels (either axis).
pub const MAX_BEAM_CENTER_PX: f64 = 1e6;
/// The longest sample name, in bytes.
pub const MAX_SAMPLE_NAME: usize = 200;

pub type Refused = (&'static str, String);

pub fn photon_energy(field: &'static str, kev: f64) -> Result<(), Refused> {
    if (MIN_PHOTON_KEV..=MAX_PHOTON_KEV).contains(&kev) {
        return Ok(());
    }
    Err((field, format!("{kev} keV; from {MIN_PHOTON_KEV} to {MAX_PHOTON_KEV}")))
}

pub fn distance(field: &'static str, m: f64) -> Result<(), Refused> {
    if m > 0.0 && m <= MAX_DISTANCE_M {
        return Ok(());
    }
    Err((field, format!("{m} m; above 0 and at most {MAX_DISTANCE_M}")))
}

pub fn beam_center(field: &'static str, px: f64) -> Result<(), Refused> {
    if px.is_finite() && px.abs() <= MAX_BEAM_CENTER_PX {
        return Ok(());
    }
    Err((field, format!("{px} pixels; a finite position within {MAX_BEAM_CENTER_PX} pixels of the origin")))
}

/// A sample name: at most [`MAX_SAMPLE_NAME`] bytes, no control characters.
pub fn sample_name(field: &'static str, name: &str) -> Result<(), Refused> {
    if name.len() <= MAX_SAMPLE_NAME && !name.chars().any(char::is_control) {
        return Ok(());
    }
    Err((field, format!("{:?}: at most {MAX_SAMPLE_NAME} bytes without control characters", name.chars().take(40).collect::<String>())))
}

/// How the detector's frames are triggered, for the files: `internal` (the detector's own
/// timing), `external` (each trigger signal starts a trigger's frames) or `gate` (each frame
/// is exposed while the trigger signal is high, so the gate sets its exposure).
pub const TRIGGER_MODES: [&str; 3] = ["internal", "external", "gate"];

pub fn trigger_mode(field: &'static str, mode: &str) -> Result<(), Refused> {
    if TRIGGER_MODES.contains(&mode) {
        return Ok(());
    }
    Err((field, format!("{:?}: one of internal, external, gate", mode.chars().take(40).collect::<String>())))
}

/// A gate sets each frame's exposure: a count time given beside it says something else.
pub fn gate_exposure(field: &'static str, mode: &str, count_time_s: f64) -> Result<(), Refused> {
    if mode == "gate" && count_time_s > 0.0 {
        return Err((field, format!("{count_time_s} s with trigger mode gate, where the gate sets each exposure: leave it 0")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_value_is_bounded_and_named() {
        assert!(photon_energy("e", 12.4).is_ok() && distance("d", 0.12).is_ok() && beam_center("x", -3.5).is_ok() && sample_name("s", "lyso 3").is_ok());
        for v in [f64::NAN, f64::INFINITY, -1.0, 1e9] {
            assert_eq!(photon_energy("e", v).unwrap_err().0, "e");
            assert_eq!(distance("d", v).unwrap_err().0, "d");
        }
        assert!(distance("d", 0.0).is_err());
        assert!(beam_center("x", f64::NAN).is_err() && beam_center("x", 2e6).is_err());
        assert!(sample_name("s", "a\nb").is_err() && sample_name("s", &"x".repeat(201)).is_err());
    }

    #[test]
    fn trigger_modes_are_named_and_a_gate_takes_no_count_time() {
        assert!(TRIGGER_MODES.iter().all(|m| trigger_mode("t", m).is_ok()));
        assert_eq!(trigger_mode("t", "Gate").unwrap_err().0, "t");
        assert!(gate_exposure("c", "gate", 0.0).is_ok() && gate_exposure("c", "external", 0.01).is_ok());
        assert_eq!(gate_exposure("c", "gate", 0.01).unwrap_err().0, "c");
    }
}
