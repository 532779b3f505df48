//! Grouped-query attention with a causal mask over the key/value cache.

/// The shape of one attention: query heads, key/value heads and the width of a head.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (each serves `heads / kv_heads` query heads).
    pub kv_heads: usize,
    /// The width of a head.
    pub head_dim: usize,
}

/// Attention of `rows` query rows (`[rows, heads * head_dim]`, already rotated) at positions
/// `start..start + rows` over the cached `keys` and `values` (`[positions, kv_heads *
/// head_dim]`, at least `start + rows` positions): query head `h` reads key/value head
/// `h / (heads / kv_heads)`, position `p` sees positions `0..=p`, scores scaled by
/// `1/sqrt(head_dim)`. Returns `[rows, heads * head_dim]`.
///
/// Panics if the slices are shorter than the shape says, or `kv_heads` does not divide
/// `heads` (the model checks both before calling).
pub fn attention(
    queries: &[f32],
    rows: usize,
    start: usize,
    keys: &[f32],
    values: &[f32],
    shape: AttentionShape,
) -> Vec<f32> {
    let AttentionShape {
        heads,
        kv_heads,
        head_dim,
    } = shape;
    let q_dim = heads * head_dim;
    let kv_dim = kv_heads * head_dim;
    let group = heads / kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut out = vec![0.0; rows * q_dim];
    let mut scores = Vec::with_capacity(start + rows);
    for r in 0..rows {
        let seen = start + r + 1;
        for h in 0..heads {
            let kv = h / group;
            let q = &queries[r * q_dim + h * head_dim..][..head_dim];
            scores.clear();
            scores.extend((0..seen).map(|p| {
                super::ops::dot(q, &keys[p * kv_dim + kv * head_dim..][..head_dim]) * scale
            }));
            super::ops::softmax(&mut scores);
            let o = &mut out[r * q_dim + h * head_dim..][..head_dim];
            for (p, &weight) in scores.iter().enumerate() {
                let v = &values[p * kv_dim + kv * head_dim..][..head_dim];
                for (oi, vi) in o.iter_mut().zip(v) {
                    *oi += weight * vi;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_position_returns_its_value_and_the_mask_is_causal() {
        let shape = AttentionShape {
            heads: 1,
            kv_heads: 1,
            head_dim: 2,
        };
        // Position 0 sees only itself, whatever its score.
        let out = attention(&[1.0, 0.0], 1, 0, &[5.0, 5.0], &[2.0, 3.0], shape);
        assert_eq!(out, vec![2.0, 3.0]);
        // Two positions, equal keys: the second row averages both values; the first row is
        // unchanged by the second position.
        let keys = [1.0, 0.0, 1.0, 0.0];
        let values = [2.0, 0.0, 4.0, 2.0];
        let out = attention(&[1.0, 0.0, 1.0, 0.0], 2, 0, &keys, &values, shape);
        assert_eq!(out, vec![2.0, 0.0, 3.0, 1.0]);
    }

    #[test]
    fn grouped_heads_share_their_key_value_head() {
        // Four query heads, two key/value heads: heads 0 and 1 read kv head 0, heads 2 and 3
        // read kv head 1. One position: each head returns its kv head's value.
        let shape = AttentionShape {
            heads: 4,
            kv_heads: 2,
            head_dim: 1,
        };
        let out = attention(&[1.0; 4], 1, 0, &[0.0, 0.0], &[7.0, 9.0], shape);
        assert_eq!(out, vec![7.0, 7.0, 9.0, 9.0]);
    }
}
