//! Host time: one monotonic clock shared by every thread of a measurement, and the date line of
//! the report.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Nanoseconds since a base instant, on the monotonic clock (`CLOCK_MONOTONIC` on Linux, read
/// through the vDSO in about 20 ns). Copies share the base, so stamps taken on different threads
/// compare directly.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        Self {
            base: Instant::now(),
        }
    }

    /// Nanoseconds since the base.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }
}

/// `b - a` in nanoseconds, as a signed float (stamps from two threads may be in either order).
#[inline]
pub fn delta(a: u64, b: u64) -> f64 {
    b as f64 - a as f64
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_utc(secs)
}

/// Formats seconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day): Howard Hinnant's
/// `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_709_210_096), "2024-02-29T12:34:56Z");
        assert_eq!(format_utc(4_102_444_799), "2099-12-31T23:59:59Z");
        assert_eq!(format_utc(1_767_225_600), "2026-01-01T00:00:00Z");
    }

    #[test]
    fn clock_is_monotonic_and_shared_by_copies() {
        let c = Clock::new();
        let copy = c;
        let a = c.now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = copy.now_ns();
        assert!(b >= a + 1_000_000, "{a} {b}");
        assert_eq!(delta(a, b), b as f64 - a as f64);
        assert!(delta(b, a) < 0.0);
    }
}
