//! From GPU event times to trace-clock nanoseconds: the arithmetic, with no driver in sight.
//!
//! The driver only answers "how many milliseconds between these two events", as an `f32`
//! (`cuEventElapsedTime`). An `f32` carries 24 bits of mantissa, so the step between two
//! representable values grows with the span measured: 1 s has a step of 0.06 us, 8 s of
//! 0.49 us, one hour of 244 us. IREE measured every event from one base taken at start-up, so its
//! timestamps got coarser as the process aged. Here:
//!
//! * a [`Calibration`] ties a base event to the trace clock: through `%globaltimer`
//!   ([`crate::clock_sync`]), or by recording it on an idle stream, waiting, and taking the host
//!   time on both sides (the base lies inside that bracket, and its midpoint is the estimate);
//! * the base is re-taken when it is older than [`DEFAULT_REBASE_AFTER_NS`], so the span between
//!   the base and any event collected stays around 8 s and its step at or below 0.5 us, at any
//!   uptime; the base's own position is kept in `u64` nanoseconds, which never loses precision;
//! * a command buffer's events are measured from its first event (the anchor), which is measured
//!   from the base: durations inside one command buffer only depend on spans as long as the
//!   command buffer itself, whatever the base's age.

/// Re-base when the base is older than this: 8 s, where an `f32` millisecond count has a step of
/// 2^-11 ms (0.49 us), comfortably under the 1 us target.
pub const DEFAULT_REBASE_AFTER_NS: u64 = 8_000_000_000;

/// A base event placed on the trace clock.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Calibration {
    /// When the base event completed, in trace-clock nanoseconds (the bracket's midpoint).
    pub base_ns: u64,
    /// The true time lies within `base_ns` plus or minus this (half the bracket's width).
    pub uncertainty_ns: u64,
    /// When the calibration was taken (the bracket's end); the base's age counts from here.
    pub taken_at_ns: u64,
}

impl Calibration {
    /// The calibration for a base event known to have completed between `before_ns` (host time
    /// just before it was recorded) and `after_ns` (host time just after waiting for it).
    pub fn from_bracket(before_ns: u64, after_ns: u64) -> Self {
        let (lo, hi) = if before_ns <= after_ns {
            (before_ns, after_ns)
        } else {
            (after_ns, before_ns)
        };
        let half = (hi - lo) / 2;
        Self {
            base_ns: lo + half,
            uncertainty_ns: half,
            taken_at_ns: hi,
        }
    }

    /// Whether the base is too old to measure from at `now_ns` with a step of at most
    /// [`f32_step_ns`]`(max_age_ns)`.
    pub fn is_stale(&self, now_ns: u64, max_age_ns: u64) -> bool {
        now_ns.saturating_sub(self.taken_at_ns) > max_age_ns
    }
}

/// An `f32` millisecond count as whole nanoseconds, rounded to nearest (NaN reads as 0; values
/// beyond `i64` saturate: the arithmetic never panics).
#[inline]
pub fn ms_to_ns(ms: f32) -> i64 {
    // f64 holds every f32 exactly, and 1e6 * an f32 exactly enough for nanoseconds.
    (f64::from(ms) * 1e6).round() as i64
}

/// `base_ns` moved by `delta_ns`, clamped to the clock's range.
#[inline]
pub fn offset(base_ns: u64, delta_ns: i64) -> u64 {
    if delta_ns >= 0 {
        base_ns.saturating_add(delta_ns as u64)
    } else {
        base_ns.saturating_sub(delta_ns.unsigned_abs())
    }
}

/// The trace-clock time of an event, from the base's calibrated time, the elapsed milliseconds
/// from the base to the anchor (either sign: a base re-taken after the work ran is later than
/// it), and from the anchor to the event.
#[inline]
pub fn event_ns(base_ns: u64, base_to_anchor_ms: f32, anchor_to_event_ms: f32) -> u64 {
    let anchor = offset(base_ns, ms_to_ns(base_to_anchor_ms));
    offset(anchor, ms_to_ns(anchor_to_event_ms))
}

/// The distance from `span_ms` to the next larger `f32`, in nanoseconds: the quantization step of
/// an event time measured over that span.
pub fn f32_step_ns(span_ms: f32) -> f64 {
    let x = span_ms.abs();
    if !x.is_finite() {
        return f64::INFINITY;
    }
    let next = f32::from_bits(x.to_bits() + 1);
    (f64::from(next) - f64::from(x)) * 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `cuEventElapsedTime` answers for two events at these GPU times (ns): the true span,
    /// rounded to `f32` milliseconds.
    fn driver_elapsed_ms(from_ns: u64, to_ns: u64) -> f32 {
        ((to_ns as f64 - from_ns as f64) / 1e6) as f32
    }

    /// The largest gap between consecutive distinct reconstructed times for events 1 ns apart
    /// around `t_ns`, measured from a base at `base_ns`, plus the worst error seen.
    fn step_and_error(base_ns: u64, t_ns: u64) -> (u64, u64) {
        let mut outputs = Vec::new();
        let mut worst_error = 0;
        // Sweep 4 ms of event times in 97 ns strides and look at the distinct results.
        for i in 0..40_000u64 {
            let t = t_ns + i * 97;
            let got = event_ns(base_ns, driver_elapsed_ms(base_ns, t), 0.0);
            worst_error = worst_error.max(got.abs_diff(t));
            outputs.push(got);
        }
        outputs.dedup();
        let step = outputs.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        (step, worst_error)
    }

    #[test]
    fn bracket_midpoint_and_uncertainty() {
        let c = Calibration::from_bracket(1_000, 1_010);
        assert_eq!(c.base_ns, 1_005);
        assert_eq!(c.uncertainty_ns, 5);
        assert_eq!(c.taken_at_ns, 1_010);
        // Swapped arguments give the same bracket.
        assert_eq!(Calibration::from_bracket(1_010, 1_000), c);
        assert!(!c.is_stale(1_010 + DEFAULT_REBASE_AFTER_NS, DEFAULT_REBASE_AFTER_NS));
        assert!(c.is_stale(1_011 + DEFAULT_REBASE_AFTER_NS, DEFAULT_REBASE_AFTER_NS));
        // A clock reading before the calibration is not stale (no underflow).
        assert!(!c.is_stale(0, DEFAULT_REBASE_AFTER_NS));
    }

    #[test]
    fn conversion_rounds_and_never_panics() {
        assert_eq!(ms_to_ns(1.5), 1_500_000);
        assert_eq!(ms_to_ns(-0.25), -250_000);
        assert_eq!(ms_to_ns(0.000_001), 1);
        assert_eq!(ms_to_ns(f32::NAN), 0);
        assert_eq!(ms_to_ns(f32::INFINITY), i64::MAX);
        assert_eq!(offset(10, -20), 0);
        assert_eq!(offset(u64::MAX - 1, 5), u64::MAX);
        assert_eq!(offset(1_000, -400), 600);
        // A base re-taken after the work: the anchor is 2 ms before the base, the event 0.5 ms
        // after the anchor.
        assert_eq!(event_ns(10_000_000, -2.0, 0.5), 8_500_000);
    }

    #[test]
    fn the_float_step_grows_with_the_span() {
        assert!(f32_step_ns(1.0) < 0.2); // 2^-23 ms
        // 8 s: 2^-11 ms.
        let eight_s = f32_step_ns(8_000.0);
        assert!((eight_s - 488.28125).abs() < 1e-6, "{eight_s}");
        // One hour: 2^-2 ms = 250 us.
        assert_eq!(f32_step_ns(3_600_000.0), 250_000.0);
        assert_eq!(f32_step_ns(-8_000.0), eight_s);
        assert!(f32_step_ns(f32::NAN).is_infinite());
    }

    #[test]
    fn the_default_rebase_age_keeps_the_step_under_half_a_microsecond() {
        let span_ms = DEFAULT_REBASE_AFTER_NS as f32 / 1e6;
        assert!(f32_step_ns(span_ms) <= 500.0);
    }

    /// One hour into the process, measuring from the start-up base (IREE's way) quantizes event
    /// times to hundreds of microseconds; with a base no older than the re-base age, to under one.
    #[test]
    fn an_old_base_is_coarse_and_a_rebased_one_is_fine() {
        let hour_ns = 3_600_000_000_000u64;
        let startup = Calibration::from_bracket(1_000, 3_000);

        let (old_step, old_error) = step_and_error(startup.base_ns, startup.base_ns + hour_ns);
        assert!(
            old_step >= 100_000,
            "an hour-old base stepped only {old_step} ns"
        );
        assert!(old_error >= 50_000, "{old_error}");

        // Re-based per the policy: the base is at most the re-base age old when used.
        let now = startup.taken_at_ns + hour_ns;
        assert!(startup.is_stale(now, DEFAULT_REBASE_AFTER_NS));
        let fresh = Calibration::from_bracket(
            now - DEFAULT_REBASE_AFTER_NS - 2_000,
            now - DEFAULT_REBASE_AFTER_NS,
        );
        assert!(!fresh.is_stale(now, DEFAULT_REBASE_AFTER_NS));
        let (step, error) = step_and_error(fresh.base_ns, now);
        assert!(step <= 1_000, "step {step} ns after re-basing");
        assert!(error <= 500, "error {error} ns after re-basing");
    }

    /// A simulated day of uptime with the policy applied at every collection: every event time is
    /// reconstructed within half a microsecond, wherever the process is in its life.
    #[test]
    fn the_policy_holds_precision_over_a_day() {
        let day_ns = 86_400_000_000_000u64;
        let mut base = Calibration::from_bracket(0, 0);
        let mut rebases = 0;
        // Collections every 3.7 s of GPU time, each with events up to 50 ms before the collection.
        let mut now = 0u64;
        while now < day_ns {
            now += 3_700_000_123;
            if base.is_stale(now, DEFAULT_REBASE_AFTER_NS) {
                base = Calibration::from_bracket(now, now);
                rebases += 1;
            }
            for back in [50_000_000u64, 1_234_567, 999] {
                let event = now - back;
                let anchor = event - 17; // the command buffer's first event
                let got = event_ns(
                    base.base_ns,
                    driver_elapsed_ms(base.base_ns, anchor),
                    driver_elapsed_ms(anchor, event),
                );
                assert!(got.abs_diff(event) <= 500, "at {now} ns: {got} vs {event}");
            }
        }
        // One re-base per three collections (every 11.1 s), for a whole day.
        assert!(rebases > 7_000, "{rebases}");
    }
}
