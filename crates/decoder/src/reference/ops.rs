//! The element-wise and matrix operations of the reference, in f32.

/// The dot product of two slices (over the shorter one's length), with eight partial sums so
/// that the compiler vectorizes it.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut lanes = [0.0f32; 8];
    let chunks = a.len() / 8;
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for k in 0..8 {
            lanes[k] += ca[k] * cb[k];
        }
    }
    let mut sum = lanes.iter().sum::<f32>();
    for (x, y) in a[chunks * 8..].iter().zip(&b[chunks * 8..]) {
        sum += x * y;
    }
    sum
}

/// `y = x W^T` for `rows` rows of `x` (`[rows, in]`) and a weight `w` stored `[out, in]`
/// (Hugging Face's `nn.Linear` layout); returns `[rows, out]`. `x` must hold `rows` rows of
/// `w.len() / out` elements (panics otherwise).
pub fn matmul(x: &[f32], rows: usize, w: &[f32], out: usize) -> Vec<f32> {
    let inner = w.len() / out.max(1);
    let mut y = vec![0.0; rows * out];
    // Each weight row is read once and used for every input row.
    for (o, w_row) in w.chunks_exact(inner).enumerate() {
        for (r, x_row) in x.chunks_exact(inner).take(rows).enumerate() {
            y[r * out + o] = dot(x_row, w_row);
        }
    }
    y
}

/// RMSNorm of one row: `x * rsqrt(mean(x^2) + eps) * w`, in place.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let mean_square = dot(x, x) / x.len() as f32;
    let scale = 1.0 / (mean_square + eps).sqrt();
    for (v, wi) in x.iter_mut().zip(w) {
        *v = *v * scale * wi;
    }
}

/// The softmax of `x`, in place (the maximum subtracted first, so large scores do not
/// overflow).
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// SiLU: `x * sigmoid(x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// The index of the largest value (the first of equal ones); `None` for an empty slice.
pub fn argmax(x: &[f32]) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in x.iter().enumerate() {
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
    }

    #[test]
    fn rms_norm_by_hand() {
        // mean(x^2) = (9 + 16) / 2 = 12.5; eps 0.5 makes it 13; 1/sqrt(13) = 0.277350.
        let mut x = [3.0, -4.0];
        rms_norm(&mut x, &[1.0, 2.0], 0.5);
        let s = 1.0 / 13f32.sqrt();
        assert!(close(&x, &[3.0 * s, -8.0 * s], 1e-6), "{x:?}");
        // A row of equal values normalizes to the weights (eps 0).
        let mut y = [5.0; 4];
        rms_norm(&mut y, &[1.0, 2.0, 3.0, 4.0], 0.0);
        assert!(close(&y, &[1.0, 2.0, 3.0, 4.0], 1e-6), "{y:?}");
    }

    #[test]
    fn softmax_by_hand() {
        let mut x = [0.0, 2f32.ln(), 0.0];
        softmax(&mut x);
        assert!(close(&x, &[0.25, 0.5, 0.25], 1e-6), "{x:?}");
        // Shifted by a constant whose exponential overflows f32: the same (within the
        // rounding of 1000 + ln 2 to f32, about 3e-5), and no overflow.
        let mut y = [1000.0, 1000.0 + 2f32.ln(), 1000.0];
        softmax(&mut y);
        assert!(close(&y, &[0.25, 0.5, 0.25], 5e-5), "{y:?}");
        let mut one = [-3.0];
        softmax(&mut one);
        assert_eq!(one, [1.0]);
    }

    #[test]
    fn matmul_dot_silu_argmax_by_hand() {
        // x = [[1, 2], [3, 4]], W = [[1, 0], [0, 1], [1, 1]] ([out 3, in 2]).
        let y = matmul(&[1.0, 2.0, 3.0, 4.0], 2, &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], 3);
        assert_eq!(y, vec![1.0, 2.0, 3.0, 3.0, 4.0, 7.0]);
        let a: Vec<f32> = (0..19).map(|i| i as f32).collect();
        let expected: f32 = (0..19).map(|i| (i * i) as f32).sum();
        assert_eq!(dot(&a, &a), expected);
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), Some(1));
        assert_eq!(argmax(&[]), None);
    }
}
