//! Order statistics of a set of timings: what every row of the report is made of.
//!
//! Samples are nanoseconds as `f64` (a difference of two clocks can be slightly negative, and
//! per-item costs are fractions of a sample). The median is the classic one (the mean of the two
//! middle values for an even count); p99 is the nearest-rank percentile, so it is always a value
//! that was actually observed.

/// Summary of one set of samples, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Smallest sample.
    pub min: f64,
    /// Median.
    pub median: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

impl Summary {
    /// Summarizes `samples` (reordered in place). `None` when empty or when any sample is not a
    /// finite number, so a broken measurement can never pass for a figure.
    pub fn of(samples: &mut [f64]) -> Option<Self> {
        if samples.is_empty() || samples.iter().any(|s| !s.is_finite()) {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let median = if n % 2 == 1 {
            samples[n / 2]
        } else {
            (samples[n / 2 - 1] + samples[n / 2]) / 2.0
        };
        Some(Self {
            n,
            min: samples[0],
            median,
            p99: percentile_sorted(samples, 99.0),
            max: samples[n - 1],
            mean: samples.iter().sum::<f64>() / n as f64,
        })
    }

    /// Every figure divided by `k`: for samples that each timed `k` items.
    pub fn per_item(self, k: f64) -> Self {
        Self {
            n: self.n,
            min: self.min / k,
            median: self.median / k,
            p99: self.p99 / k,
            max: self.max / k,
            mean: self.mean / k,
        }
    }
}

/// The nearest-rank `p`th percentile (0 < p <= 100) of sorted, non-empty samples: the smallest
/// sample with at least `p`% of the samples at or below it.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    debug_assert!(!sorted.is_empty());
    let n = sorted.len();
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_count_median_is_the_middle_value() {
        let mut s = [5.0, 1.0, 3.0];
        let sum = Summary::of(&mut s).unwrap();
        assert_eq!(sum.median, 3.0);
        assert_eq!(sum.min, 1.0);
        assert_eq!(sum.max, 5.0);
        assert_eq!(sum.mean, 3.0);
        assert_eq!(sum.n, 3);
    }

    #[test]
    fn even_count_median_averages_the_middle_pair() {
        let mut s = [4.0, 1.0, 2.0, 3.0];
        assert_eq!(Summary::of(&mut s).unwrap().median, 2.5);
    }

    #[test]
    fn p99_is_nearest_rank() {
        // 1..=100: the 99th value is 99; 1..=1000: the 990th value.
        let mut s: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(Summary::of(&mut s).unwrap().p99, 99.0);
        let mut s: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(Summary::of(&mut s).unwrap().p99, 990.0);
        // Few samples: p99 is the largest.
        let mut s = [3.0, 1.0, 2.0];
        assert_eq!(Summary::of(&mut s).unwrap().p99, 3.0);
        // One outlier in 200 stays out of p99; three are in it.
        let mut s = vec![10.0; 200];
        s[7] = 1e6;
        assert_eq!(Summary::of(&mut s).unwrap().p99, 10.0);
        s[8] = 1e6;
        s[9] = 1e6;
        assert_eq!(Summary::of(&mut s).unwrap().p99, 1e6);
    }

    #[test]
    fn percentile_bounds() {
        let s = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile_sorted(&s, 100.0), 4.0);
        assert_eq!(percentile_sorted(&s, 50.0), 2.0);
        assert_eq!(percentile_sorted(&s, 0.0), 1.0);
    }

    #[test]
    fn negative_samples_are_kept() {
        let mut s = [-2.0, 1.0, -1.0];
        let sum = Summary::of(&mut s).unwrap();
        assert_eq!(sum.min, -2.0);
        assert_eq!(sum.median, -1.0);
    }

    #[test]
    fn empty_or_non_finite_has_no_summary() {
        assert!(Summary::of(&mut []).is_none());
        assert!(Summary::of(&mut [1.0, f64::NAN]).is_none());
        assert!(Summary::of(&mut [f64::INFINITY]).is_none());
    }

    #[test]
    fn per_item_divides_every_figure() {
        let mut s = [100.0, 200.0, 300.0];
        let sum = Summary::of(&mut s).unwrap().per_item(100.0);
        assert_eq!((sum.min, sum.median, sum.max), (1.0, 2.0, 3.0));
        assert_eq!(sum.n, 3);
    }
}
