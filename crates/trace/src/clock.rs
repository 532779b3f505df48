//! The trace clock: host nanoseconds since a process-wide epoch.
//!
//! Every timestamp a sink receives, CPU or GPU, is on this clock, so CPU zones and GPU zones
//! line up in a viewer. It is `Instant` (CLOCK_MONOTONIC on Linux) measured from the first time
//! anything in the process asked for it; a `u64` of nanoseconds lasts 584 years.

use std::sync::OnceLock;
use std::time::Instant;

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds on the trace clock, now.
#[inline]
pub fn now_ns() -> u64 {
    let epoch = *EPOCH.get_or_init(Instant::now);
    // A u64 of nanoseconds overflows after 584 years of uptime; saturate rather than wrap.
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The epoch of the trace clock, as an `Instant` (fixed on first use).
pub fn epoch() -> Instant {
    *EPOCH.get_or_init(Instant::now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_is_monotonic_and_tracks_instant() {
        let a = now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = now_ns();
        assert!(b >= a + 2_000_000, "{a} -> {b}");
        let since_epoch = epoch().elapsed().as_nanos() as u64;
        assert!(since_epoch >= b);
    }
}
