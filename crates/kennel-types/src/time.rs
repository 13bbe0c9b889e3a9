//! Durations as the wire carries them.

use std::time::Duration;

/// `d` in whole milliseconds, as every `*_ms` field carries a duration; a duration past
/// `u64::MAX` ms (585 million years) saturates rather than wraps.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_milliseconds_and_saturation() {
        assert_eq!(millis(Duration::from_micros(2_999)), 2);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }
}
