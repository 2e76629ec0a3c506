//! A frame's exposure (count time) and period (frame time) as control messages carry them:
//! seconds, 0 where unknown, bounded where they are read.

/// The longest count or frame time a message may give: an hour.
pub const MAX_TIME_S: f64 = 3600.0;

/// Checks a count time and a frame time (0: unknown): finite, 0 to [`MAX_TIME_S`], and the
/// exposure no longer than the period when both are known. The error names the field.
pub fn check(count_time_s: f64, frame_time_s: f64) -> Result<(), (&'static str, String)> {
    for (field, t) in [("count_time_s", count_time_s), ("frame_time_s", frame_time_s)] {
        if !(t.is_finite() && (0.0..=MAX_TIME_S).contains(&t)) {
            return Err((field, format!("{t}; from 0 (unknown) to {MAX_TIME_S} s")));
        }
    }
    if count_time_s > frame_time_s && frame_time_s > 0.0 {
        return Err(("count_time_s", format!("{count_time_s} s is longer than the frame time, {frame_time_s} s")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_bounded_and_the_exposure_fits_the_period() {
        assert_eq!(check(0.0, 0.0), Ok(()));
        assert_eq!(check(0.005, 0.01), Ok(()));
        assert_eq!(check(0.5, 0.0), Ok(()), "an unknown period bounds nothing");
        assert_eq!(check(0.02, 0.01).unwrap_err().0, "count_time_s");
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e9] {
            assert_eq!(check(bad, 0.0).unwrap_err().0, "count_time_s");
            assert_eq!(check(0.0, bad).unwrap_err().0, "frame_time_s");
        }
    }
}
