//! Rotary position embeddings in Hugging Face's Llama convention.

use crate::config::{LlamaConfig, RopeScaling};

/// The rotary frequencies of one head width: `inv_freq[i] = theta^(-2i/d)` for `i < d/2`
/// (rescaled when the configuration says so), applied as Hugging Face's `rotate_half` does:
/// element `i` of the first half turns with element `i` of the second half.
#[derive(Clone, Debug)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    /// The frequencies for `config`'s head width, base and scaling.
    pub fn new(config: &LlamaConfig) -> Self {
        let d = config.head_dim;
        let inv_freq = (0..d / 2)
            .map(|i| {
                let f = 1.0 / config.rope_theta.powf((2 * i) as f64 / d as f64);
                scale(f, config.rope_scaling) as f32
            })
            .collect();
        Rope { inv_freq }
    }

    /// The frequencies (`head_dim / 2` of them).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// Rotates one head's vector (`head_dim` long) for position `position`, in place:
    /// `x * cos + rotate_half(x) * sin` with `rotate_half(x) = [-x2, x1]`.
    pub fn apply(&self, x: &mut [f32], position: usize) {
        let half = self.inv_freq.len();
        let (x1, x2) = x.split_at_mut(half);
        for ((a, b), f) in x1.iter_mut().zip(x2.iter_mut()).zip(&self.inv_freq) {
            // Hugging Face computes the angle in f32: position * inv_freq.
            let angle = position as f32 * f;
            let (sin, cos) = angle.sin_cos();
            let (u, v) = (*a, *b);
            *a = u * cos - v * sin;
            *b = v * cos + u * sin;
        }
    }
}

/// One frequency under the configuration's rescaling.
fn scale(freq: f64, scaling: Option<RopeScaling>) -> f64 {
    match scaling {
        None => freq,
        Some(RopeScaling::Linear { factor }) => freq / factor,
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: original,
        }) => {
            let wavelen = std::f64::consts::TAU / freq;
            let low_freq_wavelen = original / low_freq_factor;
            let high_freq_wavelen = original / high_freq_factor;
            if wavelen < high_freq_wavelen {
                freq
            } else if wavelen > low_freq_wavelen {
                freq / factor
            } else {
                let smooth =
                    (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                (1.0 - smooth) * freq / factor + smooth * freq
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(head_dim: usize) -> LlamaConfig {
        LlamaConfig {
            head_dim,
            ..LlamaConfig::small()
        }
    }

    #[test]
    fn position_zero_is_identity() {
        let rope = Rope::new(&config(8));
        let original: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let mut x = original.clone();
        rope.apply(&mut x, 0);
        assert_eq!(x, original);
    }

    #[test]
    fn pairs_are_first_and_second_half() {
        // head_dim 4, theta 10000: inv_freq = [1, 0.01]. Position 1 turns the pair (x0, x2)
        // by 1 radian and (x1, x3) by 0.01.
        let rope = Rope::new(&config(4));
        assert_eq!(rope.inv_freq(), [1.0, 0.01]);
        let mut x = [1.0, 1.0, 0.0, 0.0];
        rope.apply(&mut x, 1);
        let expected = [1f32.cos(), 0.01f32.cos(), 1f32.sin(), 0.01f32.sin()];
        for (a, b) in x.iter().zip(expected) {
            assert!((a - b).abs() < 1e-6, "{x:?} vs {expected:?}");
        }
        // A rotation keeps the norm, and turning by p then q equals turning by p + q.
        let mut y = [0.3, -1.2, 0.7, 2.0];
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        let before = norm(&y);
        rope.apply(&mut y, 5);
        assert!((norm(&y) - before).abs() < 1e-5);
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let scaling = Some(RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        });
        // Wavelength 2*pi < 2048: kept.
        assert_eq!(scale(1.0, scaling), 1.0);
        // Wavelength 2*pi*10000 > 8192: divided by 32.
        assert_eq!(scale(1e-4, scaling), 1e-4 / 32.0);
        // Between: a blend strictly between the two.
        let f = std::f64::consts::TAU / 4096.0;
        let s = scale(f, scaling);
        assert!(s < f && s > f / 32.0, "{s}");
        assert_eq!(scale(0.5, Some(RopeScaling::Linear { factor: 2.0 })), 0.25);
    }
}
