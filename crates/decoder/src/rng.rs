//! A small deterministic pseudo-random generator for writing random models.

/// SplitMix64 (Steele, Lea and Flood): one 64-bit state, statistically sound for filling
/// weights, and the same numbers on every platform for a given seed.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform number in (0, 1]: never zero, so its logarithm is finite.
    pub fn next_open01(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// A pair of independent standard normal numbers (Box-Muller).
    pub fn next_normal_pair(&mut self) -> (f64, f64) {
        let r = (-2.0 * self.next_open01().ln()).sqrt();
        let theta = std::f64::consts::TAU * self.next_open01();
        (r * theta.cos(), r * theta.sin())
    }
}

/// A seed for one named stream derived from a model's seed (FNV-1a of the name, mixed).
pub fn stream_seed(seed: u64, name: &str) -> u64 {
    let mut hash = 0xCBF2_9CE4_8422_2325u64;
    for byte in name.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01B3);
    }
    SplitMix64::new(seed ^ hash).next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_numbers_and_normal_moments() {
        let a: Vec<u64> = {
            let mut r = SplitMix64::new(7);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let mut r = SplitMix64::new(7);
        assert_eq!(a, (0..4).map(|_| r.next_u64()).collect::<Vec<_>>());
        assert_ne!(SplitMix64::new(8).next_u64(), a[0]);
        assert_ne!(stream_seed(1, "a"), stream_seed(1, "b"));

        let mut r = SplitMix64::new(42);
        let n = 20_000;
        let (mut sum, mut sq) = (0.0, 0.0);
        for _ in 0..n / 2 {
            let (x, y) = r.next_normal_pair();
            sum += x + y;
            sq += x * x + y * y;
        }
        let mean = sum / n as f64;
        let var = sq / n as f64 - mean * mean;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "variance {var}");
    }
}
