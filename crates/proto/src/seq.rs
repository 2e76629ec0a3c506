//! Wrap-safe sequence numbers (serial number arithmetic, RFC 1982 style) for the 32-bit
//! per-channel sequence of the rdaq datagram.

/// Signed distance from `from` to `to`, correct across the 2^32 wrap as long as the true
/// distance is below 2^31.
#[inline]
pub fn distance(from: u32, to: u32) -> i32 {
    to.wrapping_sub(from) as i32
}

/// True when `a` comes after `b` in sequence order.
#[inline]
pub fn is_after(a: u32, b: u32) -> bool {
    distance(b, a) > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps() {
        assert_eq!(distance(u32::MAX, 0), 1);
        assert_eq!(distance(0, u32::MAX), -1);
        assert!(is_after(2, u32::MAX - 3));
        assert!(!is_after(u32::MAX - 3, 2));
    }

    proptest! {
        #[test]
        fn distance_matches_offset(base: u32, step in -(1i64 << 30)..(1i64 << 30)) {
            let to = (base as i64 + step).rem_euclid(1 << 32) as u32;
            prop_assert_eq!(distance(base, to) as i64, step);
        }
    }
}
