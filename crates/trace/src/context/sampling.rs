//! [`FineSampling`]: which replays of an executable get FINE command zones from CUPTI, and the
//! per-executable state that decides it ([`Sampler`]), with the cost figures the budget form
//! chooses its rate from. A command buffer's zone list holds its sampler; the queue's issue
//! asks it about each replay, collection tells it what each replay cost.
//!
//! An executable is a command buffer that ended (a graph's executable, a deferred buffer's
//! arena): the one zone list all its replays share. Replays are counted per executable, from 0,
//! in issue order, so two command buffers of a queue are sampled independently.

/// How often a FINE context's command zones come from CUPTI activity records (only when FINE
/// times commands by CUPTI: [`FineSource::Cupti`](crate::FineSource::Cupti)).
///
/// CUPTI's kernel activity slows every launch made while it is enabled (1.9-2.4x on a
/// 100-dispatch graph replay on an H200), so apart from [`FineSampling::Every`] the session's
/// activity kinds are enabled only around the issue of a sampled replay; the other replays are
/// traced as COARSE is (the submission's and the command buffer's zones from the completion
/// event) with no CUPTI call, no capture and no flush. Each submission says whether it was
/// sampled ([`SubmissionDetails::fine_sample`](crate::SubmissionDetails::fine_sample)), and
/// [`TraceStats`](crate::TraceStats) counts both kinds of replay.
///
/// Sampling applies to the replays a queue issues ([`TraceContext::submit`](crate::TraceContext::submit));
/// a list submitted on its own ([`ZoneList::on_submit`](crate::ZoneList::on_submit)) is traced
/// FINE every time. FINE from timing events is unaffected: its events are part of the recorded
/// work and run on every replay.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub enum FineSampling {
    /// Every replay (the default): CUPTI's activity kinds are enabled for the context's life.
    #[default]
    Every,
    /// Replay `k` (from 0) of each executable is sampled when `k % n == 0`: replays 0, n,
    /// 2n, ... `OneIn(0)` is taken as `OneIn(1)` (every replay, with the kinds enabled around
    /// each issue).
    OneIn(u32),
    /// Chooses `n` per executable from what its replays cost: the mean GPU time of its sampled
    /// replays over that of its others, less one, is what a sampled replay adds; `n` is that
    /// over `max_overhead` (rounded up, from 1 to [`MAX_ONE_IN`]), so the amortized cost stays
    /// within `max_overhead` (0.05: 5%). Starts at [`BUDGET_FIRST_ONE_IN`] until both means
    /// are known. A budget that is not a positive number samples at [`MAX_ONE_IN`].
    Budget {
        /// The overhead allowed over the untraced replay, amortized (0.05: 5%).
        max_overhead: f64,
    },
}

/// The sparsest rate [`FineSampling::Budget`] chooses: one replay in this many.
pub const MAX_ONE_IN: u32 = 4096;
/// The rate [`FineSampling::Budget`] starts at, before it has measured both kinds of replay.
pub const BUDGET_FIRST_ONE_IN: u32 = 16;
/// The weight of a new cost in the budget's running means (1/8).
const COST_WEIGHT_SHIFT: u32 = 3;

impl FineSampling {
    /// Whether this samples (anything but [`FineSampling::Every`]).
    pub fn samples(&self) -> bool {
        !matches!(self, FineSampling::Every)
    }

    /// The rate to start at.
    fn first_one_in(&self) -> u32 {
        match *self {
            FineSampling::Every => 1,
            FineSampling::OneIn(n) => n.max(1),
            FineSampling::Budget { .. } => BUDGET_FIRST_ONE_IN,
        }
    }
}

/// What a sampler decided for one replay of its executable.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Sample {
    /// The replay's index among its executable's replays, from 0.
    pub(crate) replay: u64,
    /// Whether its commands are timed from CUPTI records.
    pub(crate) sampled: bool,
    /// The rate it was decided at: one replay in this many.
    pub(crate) one_in: u32,
}

/// A running mean of nanoseconds (exponentially weighted); 0 until the first value.
#[derive(Copy, Clone, Debug, Default)]
struct Mean {
    ns: u64,
    count: u64,
}

impl Mean {
    fn add(&mut self, ns: u64) {
        self.ns = if self.count == 0 {
            ns
        } else {
            // ns * w + mean * (1 - w), w = 1/8, in integers.
            let mean = i128::from(self.ns);
            let delta = i128::from(ns) - mean;
            u64::try_from(mean + (delta >> COST_WEIGHT_SHIFT)).unwrap_or(self.ns)
        };
        self.count += 1;
    }
}

/// One executable's sampling state (in its zone list).
#[derive(Debug, Default)]
pub(crate) struct Sampler {
    /// Replays decided so far.
    replays: u64,
    /// The index of the last sampled replay.
    last_sampled: Option<u64>,
    /// The current rate (0 until the first decision).
    one_in: u32,
    /// GPU time of sampled replays, and of the others ([`FineSampling::Budget`]).
    sampled_cost: Mean,
    plain_cost: Mean,
}

impl Sampler {
    /// Decides the next replay: sampled when it is the first, or `one_in` replays after the
    /// last sampled one.
    pub(crate) fn decide(&mut self, mode: &FineSampling) -> Sample {
        if self.one_in == 0 {
            self.one_in = mode.first_one_in();
        }
        let replay = self.replays;
        self.replays += 1;
        let sampled = self
            .last_sampled
            .is_none_or(|last| replay >= last + u64::from(self.one_in));
        if sampled {
            self.last_sampled = Some(replay);
        }
        Sample {
            replay,
            sampled,
            one_in: self.one_in,
        }
    }

    /// A replay's command buffer ran `gpu_ns` on the GPU; under a budget, the rate is chosen
    /// again from the running means.
    pub(crate) fn observe(&mut self, mode: &FineSampling, sampled: bool, gpu_ns: u64) {
        let FineSampling::Budget { max_overhead } = *mode else {
            return;
        };
        if sampled {
            self.sampled_cost.add(gpu_ns);
        } else {
            self.plain_cost.add(gpu_ns);
        }
        if self.sampled_cost.count == 0 || self.plain_cost.count == 0 {
            return;
        }
        self.one_in = budget_one_in(self.sampled_cost.ns, self.plain_cost.ns, max_overhead);
    }

    /// The current rate (0 before the first decision).
    #[cfg(test)]
    pub(crate) fn one_in(&self) -> u32 {
        self.one_in
    }
}

/// The rate that keeps the amortized overhead of sampled replays costing `sampled_ns` (where
/// the others cost `plain_ns`) within `max_overhead`.
pub(crate) fn budget_one_in(sampled_ns: u64, plain_ns: u64, max_overhead: f64) -> u32 {
    if !(max_overhead > 0.0 && max_overhead.is_finite()) {
        return MAX_ONE_IN;
    }
    if plain_ns == 0 {
        return if sampled_ns == 0 { 1 } else { MAX_ONE_IN };
    }
    let extra = sampled_ns.saturating_sub(plain_ns) as f64 / plain_ns as f64;
    let n = (extra / max_overhead).ceil();
    if n >= f64::from(MAX_ONE_IN) {
        MAX_ONE_IN
    } else if n >= 1.0 {
        n as u32
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_in_n_samples_the_first_replay_and_every_nth_after() {
        let mut s = Sampler::default();
        let mode = FineSampling::OneIn(4);
        let sampled: Vec<u64> = (0..12)
            .map(|_| s.decide(&mode))
            .filter(|d| d.sampled)
            .map(|d| d.replay)
            .collect();
        assert_eq!(sampled, [0, 4, 8]);
        let mut s = Sampler::default();
        assert!((0..5).all(|_| s.decide(&FineSampling::OneIn(0)).sampled));
    }

    #[test]
    fn a_budget_picks_the_rate_that_amortizes_the_measured_cost() {
        // A sampled replay costs 2.2x: 1.2 extra over 0.05 is 24.
        assert_eq!(budget_one_in(2_200, 1_000, 0.05), 24);
        assert_eq!(budget_one_in(1_000, 1_000, 0.05), 1, "free: every replay");
        assert_eq!(budget_one_in(900, 1_000, 0.05), 1);
        assert_eq!(budget_one_in(u64::MAX, 1, 0.05), MAX_ONE_IN);
        assert_eq!(budget_one_in(2_000, 1_000, 0.0), MAX_ONE_IN);
        assert_eq!(budget_one_in(2_000, 1_000, f64::NAN), MAX_ONE_IN);

        let mode = FineSampling::Budget { max_overhead: 0.05 };
        let mut s = Sampler::default();
        let first = s.decide(&mode);
        assert!(first.sampled);
        assert_eq!(first.one_in, BUDGET_FIRST_ONE_IN);
        s.observe(&mode, true, 2_000);
        assert_eq!(s.one_in(), BUDGET_FIRST_ONE_IN, "one kind measured only");
        for _ in 1..4 {
            assert!(!s.decide(&mode).sampled);
            s.observe(&mode, false, 1_000);
        }
        // Sampled 2x: one extra over 0.05 is 20, and the next sample is 20 after replay 0.
        assert_eq!(s.one_in(), 20);
        let next: Vec<u64> = (4..45)
            .map(|_| s.decide(&mode))
            .filter(|d| d.sampled)
            .map(|d| d.replay)
            .collect();
        assert_eq!(next, [20, 40]);
    }
}
