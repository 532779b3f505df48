//! The GPU's `%globaltimer` on the trace clock: the arithmetic of the clock exchange, with no
//! driver in sight.
//!
//! A one-thread kernel polls a word of mapped host memory; the host writes a round number
//! there and spins until the kernel answers it with its `%globaltimer` (read at the timer's
//! next edge, so the value is the instant the timer took it, whatever its step), in one store
//! with no fence, so both legs are a single PCIe transfer each. The host reads
//! its own clock just before writing and just after seeing the answer: the kernel's reading lies
//! between the two ([`ExchangeRound`]). The round with the smallest round trip is the one whose
//! two legs were both shortest, so its midpoint is the estimate and half its round trip the
//! bound on the error ([`ClockSync::from_rounds`]), as in NTP.
//!
//! CUDA events are tied to the same timer by recording each candidate base event between two
//! kernels that stamp `%globaltimer` on one stream: the event ran after the last stamp of the
//! kernel before it and before the first stamp of the kernel after it ([`GpuBracket`]). Its
//! trace-clock time is then the bracket's midpoint mapped through the exchange, and the events
//! measured from it (`cuEventElapsedTime`) follow.
//!
//! A sink gets a [`ClockSnapshot`] at every (re-)calibration, which says which of the two ways
//! was used, the offset, and how far it can be off.

/// One round of the clock exchange.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ExchangeRound {
    /// The host clock (trace clock) just before the host asked.
    pub host_before_ns: u64,
    /// The `%globaltimer` value the kernel answered with.
    pub gpu_ns: u64,
    /// The host clock just after the host saw the answer.
    pub host_after_ns: u64,
}

impl ExchangeRound {
    /// Host time from asking to seeing the answer (0 for a round whose clock readings are out
    /// of order, which [`ClockSync::from_rounds`] ignores).
    pub fn round_trip_ns(&self) -> u64 {
        self.host_after_ns.saturating_sub(self.host_before_ns)
    }
}

/// A `%globaltimer` reading tied to the trace clock: the result of one clock exchange.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ClockSync {
    /// A `%globaltimer` reading (the chosen round's).
    pub gpu_ns: u64,
    /// The trace-clock time it maps to (the chosen round's midpoint).
    pub host_ns: u64,
    /// How far the map can be off, either way: half the chosen round's round trip.
    pub uncertainty_ns: u64,
    /// The chosen round's round trip (the smallest).
    pub round_trip_ns: u64,
    /// Rounds answered.
    pub rounds: u32,
    /// When the exchange ended, on the trace clock.
    pub taken_at_ns: u64,
}

impl ClockSync {
    /// The map from the round with the smallest round trip (the first of equals), or `None`
    /// when no round is usable (none answered, or every one's host readings out of order).
    pub fn from_rounds(rounds: &[ExchangeRound]) -> Option<Self> {
        let usable = || {
            rounds
                .iter()
                .filter(|r| r.host_after_ns >= r.host_before_ns && r.gpu_ns != 0)
        };
        let best = usable().min_by_key(|r| r.round_trip_ns())?;
        let round_trip_ns = best.round_trip_ns();
        let half = round_trip_ns / 2;
        Some(Self {
            gpu_ns: best.gpu_ns,
            host_ns: best.host_before_ns + half,
            uncertainty_ns: round_trip_ns - half,
            round_trip_ns,
            rounds: u32::try_from(usable().count()).unwrap_or(u32::MAX),
            taken_at_ns: rounds
                .iter()
                .map(|r| r.host_after_ns)
                .max()
                .unwrap_or(best.host_after_ns),
        })
    }

    /// The trace-clock time of the `%globaltimer` reading `gpu_ns` (clamped to the clock's
    /// range; the arithmetic never panics).
    pub fn to_trace_ns(&self, gpu_ns: u64) -> u64 {
        let t = i128::from(self.host_ns) + i128::from(gpu_ns) - i128::from(self.gpu_ns);
        u64::try_from(t.max(0)).unwrap_or(u64::MAX)
    }

    /// Trace clock minus `%globaltimer` (clamped to `i64`).
    pub fn offset_ns(&self) -> i64 {
        let d = i128::from(self.host_ns) - i128::from(self.gpu_ns);
        i64::try_from(d).unwrap_or(if d < 0 { i64::MIN } else { i64::MAX })
    }

    /// How far `earlier`'s map had drifted from this one by this exchange: `earlier`'s trace
    /// time for this exchange's `%globaltimer` reading minus this one's (positive: the earlier
    /// map reads late).
    pub fn drift_since(&self, earlier: &ClockSync) -> i64 {
        let d = i128::from(earlier.to_trace_ns(self.gpu_ns)) - i128::from(self.host_ns);
        i64::try_from(d).unwrap_or(if d < 0 { i64::MIN } else { i64::MAX })
    }
}

/// Where an event ran on `%globaltimer`: after the last stamp of the kernel before it, before
/// the first stamp of the kernel after it.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuBracket {
    /// The last `%globaltimer` stamp of the kernel before the event.
    pub after_ns: u64,
    /// The first stamp of the kernel after it.
    pub before_ns: u64,
}

impl GpuBracket {
    /// Whether the stamps are real (non-zero) and in order.
    pub fn is_valid(&self) -> bool {
        self.after_ns != 0 && self.before_ns >= self.after_ns
    }

    /// The estimate: the midpoint.
    pub fn midpoint_ns(&self) -> u64 {
        self.after_ns + (self.before_ns.saturating_sub(self.after_ns)) / 2
    }

    /// How far the midpoint can be off, either way.
    pub fn half_width_ns(&self) -> u64 {
        let width = self.before_ns.saturating_sub(self.after_ns);
        width - width / 2
    }
}

/// How a calibration placed its base event on the trace clock.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ClockSource {
    /// Through `%globaltimer`: the clock exchange, and the base event between two stamping
    /// kernels.
    GlobalTimer(ClockSync),
    /// The fallback: the base event recorded on an idle stream and waited for, between two
    /// host clock reads (the exchange failed or the backend has none).
    HostBracket,
}

/// A (re-)calibration as a sink records it: a clock snapshot.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ClockSnapshot {
    /// The calibration's number in its context, from 1.
    pub calibration: u64,
    /// When it was taken, on the trace clock.
    pub taken_at_ns: u64,
    /// How the base event was placed.
    pub source: ClockSource,
    /// The base event's trace-clock time.
    pub base_ns: u64,
    /// How far every event time (measured from the base) can be off from the trace clock,
    /// either way: the exchange's uncertainty plus half the base's `%globaltimer` bracket, or
    /// half the host bracket.
    pub uncertainty_ns: u64,
    /// How far the previous exchange's map had drifted by this one
    /// ([`ClockSync::drift_since`]); `None` for the first exchange or without one.
    pub drift_ns: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `%globaltimer` value of the kind the driver reports (nanoseconds since 1970).
    const EPOCH_GPU: u64 = 1_700_000_000_000_000_000;

    fn round(before: u64, gpu: u64, after: u64) -> ExchangeRound {
        ExchangeRound {
            host_before_ns: before,
            gpu_ns: gpu,
            host_after_ns: after,
        }
    }

    #[test]
    fn the_round_with_the_smallest_round_trip_gives_the_offset() {
        // The GPU clock reads EPOCH_GPU + t at trace time t. Three rounds: the first with a
        // slow way down (1,900 ns up, 100 ns back), the second tight and slightly asymmetric
        // (700 up, 500 back), the third symmetric but long (2,000 each way).
        let rounds = [
            round(10_000, EPOCH_GPU + 11_900, 12_000),
            round(20_000, EPOCH_GPU + 20_700, 21_200),
            round(30_000, EPOCH_GPU + 32_000, 34_000),
        ];
        let s = ClockSync::from_rounds(&rounds).unwrap();
        assert_eq!(s.round_trip_ns, 1_200);
        assert_eq!(s.uncertainty_ns, 600);
        assert_eq!(s.gpu_ns, EPOCH_GPU + 20_700);
        // The midpoint of the tight round: 100 ns late (the way back was 200 ns shorter).
        assert_eq!(s.host_ns, 20_600);
        assert_eq!(s.to_trace_ns(EPOCH_GPU + 20_700), 20_600);
        assert_eq!(s.to_trace_ns(EPOCH_GPU + 50_000), 49_900);
        assert_eq!(s.offset_ns(), 20_600 - (EPOCH_GPU + 20_700) as i64);
        assert_eq!(s.rounds, 3);
        assert_eq!(s.taken_at_ns, 34_000);
        // The true time is within the bound.
        assert!(s.to_trace_ns(EPOCH_GPU + 20_700).abs_diff(20_700) <= s.uncertainty_ns);
        // An odd round trip: the uncertainty rounds up, the midpoint down.
        let odd = ClockSync::from_rounds(&[round(100, 7, 103)]).unwrap();
        assert_eq!((odd.host_ns, odd.uncertainty_ns), (101, 2));
    }

    #[test]
    fn unusable_rounds_are_ignored_and_none_is_no_map() {
        assert_eq!(ClockSync::from_rounds(&[]), None);
        // Host readings out of order, or no answer (a zero stamp).
        let bad = [round(500, EPOCH_GPU, 400), round(600, 0, 601)];
        assert_eq!(ClockSync::from_rounds(&bad), None);
        let mut with_good = bad.to_vec();
        with_good.push(round(1_000, EPOCH_GPU, 1_010));
        let s = ClockSync::from_rounds(&with_good).unwrap();
        assert_eq!((s.host_ns, s.uncertainty_ns, s.rounds), (1_005, 5, 1));
    }

    #[test]
    fn mapping_clamps_instead_of_panicking() {
        let s = ClockSync::from_rounds(&[round(1_000, u64::MAX - 10, 1_000)]).unwrap();
        assert_eq!(s.to_trace_ns(0), 0);
        assert_eq!(s.to_trace_ns(u64::MAX), 1_010);
        let s = ClockSync::from_rounds(&[round(u64::MAX - 5, 1, u64::MAX - 5)]).unwrap();
        assert_eq!(s.to_trace_ns(u64::MAX), u64::MAX);
        assert_eq!(s.offset_ns(), i64::MAX);
    }

    #[test]
    fn drift_is_the_earlier_maps_error_at_the_later_exchange() {
        // The GPU clock runs 50 ppm fast: 8 s later it reads 400 us more than the host moved.
        let first =
            ClockSync::from_rounds(&[round(1_000_000_000, EPOCH_GPU, 1_000_000_000)]).unwrap();
        let t = 9_000_000_000;
        let later = ClockSync::from_rounds(&[round(t, EPOCH_GPU + 8_000_400_000, t)]).unwrap();
        assert_eq!(later.drift_since(&first), 400_000);
        assert_eq!(first.drift_since(&later), -400_000);
    }

    #[test]
    fn a_bracket_gives_its_midpoint_and_half_width() {
        let b = GpuBracket {
            after_ns: EPOCH_GPU,
            before_ns: EPOCH_GPU + 1_001,
        };
        assert!(b.is_valid());
        assert_eq!(b.midpoint_ns(), EPOCH_GPU + 500);
        assert_eq!(b.half_width_ns(), 501);
        assert!(!GpuBracket::default().is_valid());
        assert!(
            !GpuBracket {
                after_ns: 10,
                before_ns: 9
            }
            .is_valid()
        );
    }
}
