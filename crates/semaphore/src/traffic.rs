//! [`Traffic`]: whether work is being submitted to a device, from a count of its submissions
//! ([`DeviceEvent::submissions`](crate::DeviceEvent::submissions)), so that whoever polls the
//! device's events can hold back while its queries would contend with the submitters.

use std::time::{Duration, Instant};

/// Watches a device's submission count: traffic once it moved by two or more within one pace.
/// One submission alone (a host signal releasing one piece of work, say) is not traffic, so a
/// round trip's wait never holds back for it.
#[derive(Debug, Clone)]
pub struct Traffic {
    pace: Duration,
    seen: u64,
    since: Instant,
}

impl Traffic {
    /// Starts watching, with the count at `count` now. A zero `pace` never sees traffic.
    pub fn new(count: u64, pace: Duration) -> Self {
        Traffic {
            pace,
            seen: count,
            since: Instant::now(),
        }
    }

    /// Whether the count, now `count` at `now`, moved by two or more since the window began;
    /// a new window begins when it did, or once the last one is a pace old.
    pub fn busy(&mut self, count: u64, now: Instant) -> bool {
        if self.pace.is_zero() {
            return false;
        }
        let busy = count.wrapping_sub(self.seen) >= 2;
        if busy || now.saturating_duration_since(self.since) > self.pace {
            self.seen = count;
            self.since = now;
        }
        busy
    }

    /// How long to hold back a query while there is traffic.
    pub fn pace(&self) -> Duration {
        self.pace
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_submissions_within_a_pace_are_traffic_one_is_not() {
        let now = Instant::now();
        let mut traffic = Traffic::new(10, Duration::from_secs(3600));
        assert!(!traffic.busy(10, now));
        assert!(!traffic.busy(11, now), "one submission is not traffic");
        assert!(traffic.busy(12, now));
        assert!(!traffic.busy(12, now), "a new window begins after traffic");
        let mut off = Traffic::new(0, Duration::ZERO);
        assert!(!off.busy(100, now), "no pace, never traffic");
    }

    #[test]
    fn submissions_further_apart_than_the_pace_are_not_traffic() {
        let start = Instant::now();
        let mut traffic = Traffic::new(0, Duration::from_millis(1));
        assert!(!traffic.busy(1, start + Duration::from_millis(2)));
        assert!(!traffic.busy(2, start + Duration::from_millis(4)));
        assert!(traffic.busy(4, start + Duration::from_millis(4)));
    }
}
