//! The model's math on the CPU in f32: the reference the GPU path is checked against.
//!
//! Weights are converted to f32 once ([`Model::from_weights`]: four bytes per parameter); every
//! activation is f32. The computation follows Hugging Face's `LlamaForCausalLM`: embedding,
//! then per layer RMSNorm, rotary attention with grouped key/value heads and a causal mask
//! over the [`KvCache`], a residual, RMSNorm, the SwiGLU MLP and a residual; then the final
//! norm and the output head (or the tied embedding).

mod attention;
mod cache;
pub mod ops;
mod rope;

use std::path::Path;

pub use attention::{AttentionShape, attention};
pub use cache::KvCache;
pub use rope::Rope;

use crate::config::LlamaConfig;
use crate::error::{Error, Result};
use crate::weights::{ModelFiles, Weights};

/// One layer's weights in f32.
#[derive(Clone, Debug)]
struct Layer {
    input_norm: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    post_norm: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

/// A model held in f32 on the host, computed by [`Model::forward`].
#[derive(Clone, Debug)]
pub struct Model {
    config: LlamaConfig,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// `None` when tied to `embed`.
    lm_head: Option<Vec<f32>>,
    rope: Rope,
}

/// Logits of several positions, `[positions, vocab]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Logits {
    vocab: usize,
    data: Vec<f32>,
}

impl Logits {
    /// The number of positions.
    pub fn positions(&self) -> usize {
        self.data.len() / self.vocab
    }

    /// Position `i`'s logits (`vocab` of them), if there is such a position.
    pub fn row(&self, i: usize) -> Option<&[f32]> {
        self.data.get(i * self.vocab..(i + 1) * self.vocab)
    }

    /// The last position's logits, if any.
    pub fn last(&self) -> Option<&[f32]> {
        self.positions().checked_sub(1).and_then(|i| self.row(i))
    }

    /// The greedy choice after the last position: the index of its largest logit.
    pub fn argmax_last(&self) -> Option<u32> {
        self.last()
            .and_then(ops::argmax)
            .and_then(|i| u32::try_from(i).ok())
    }

    /// All logits, row after row.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }
}

impl Model {
    /// Converts checked weights to f32.
    pub fn from_weights(config: &LlamaConfig, weights: &Weights<'_>) -> Self {
        let layers = weights
            .layers
            .iter()
            .map(|l| Layer {
                input_norm: l.input_layernorm.to_f32(),
                wq: l.q_proj.to_f32(),
                wk: l.k_proj.to_f32(),
                wv: l.v_proj.to_f32(),
                wo: l.o_proj.to_f32(),
                post_norm: l.post_attention_layernorm.to_f32(),
                gate: l.gate_proj.to_f32(),
                up: l.up_proj.to_f32(),
                down: l.down_proj.to_f32(),
            })
            .collect();
        Model {
            config: config.clone(),
            embed: weights.embed_tokens.to_f32(),
            layers,
            norm: weights.norm.to_f32(),
            lm_head: weights.lm_head.as_ref().map(|t| t.to_f32()),
            rope: Rope::new(config),
        }
    }

    /// Opens the model in `dir` ([`ModelFiles::open`]) and converts it to f32.
    pub fn load(dir: &Path) -> Result<Self> {
        let files = ModelFiles::open(dir)?;
        let weights = files.weights()?;
        Ok(Self::from_weights(files.config(), &weights))
    }

    /// The model's configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// An empty key/value cache for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(&self.config)
    }

    /// Runs `tokens` at the positions after those in `cache` (a prefill when the cache is
    /// empty, a decode step for one token), appends their keys and values to `cache`, and
    /// returns every one of these positions' logits.
    ///
    /// Refuses (leaving the cache as it was) a token outside the vocabulary, a cache made for
    /// another shape, or a context longer than `max_position_embeddings`.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Logits> {
        let c = &self.config;
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(Error::TokenOutOfRange {
                token,
                vocab_size: c.vocab_size,
            });
        }
        if cache.layer_count() != c.num_hidden_layers || cache.kv_dim() != c.kv_dim() {
            return Err(Error::CacheMismatch {
                reason: format!(
                    "cache has {} layers of width {}, the model {} of width {}",
                    cache.layer_count(),
                    cache.kv_dim(),
                    c.num_hidden_layers,
                    c.kv_dim()
                ),
            });
        }
        let start = cache.len();
        if start + tokens.len() > c.max_position_embeddings {
            return Err(Error::ContextFull {
                cached: start,
                asked: tokens.len(),
                max: c.max_position_embeddings,
            });
        }
        let rows = tokens.len();
        let (h, q_dim, kv_dim) = (c.hidden_size, c.q_dim(), c.kv_dim());
        let eps = c.rms_norm_eps as f32;
        let shape = AttentionShape {
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
        };

        let mut x: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| &self.embed[t as usize * h..][..h])
            .copied()
            .collect();
        for (index, layer) in self.layers.iter().enumerate() {
            let normed = norm_rows(&x, h, &layer.input_norm, eps);
            let mut q = ops::matmul(&normed, rows, &layer.wq, q_dim);
            let mut k = ops::matmul(&normed, rows, &layer.wk, kv_dim);
            let v = ops::matmul(&normed, rows, &layer.wv, kv_dim);
            for r in 0..rows {
                let position = start + r;
                for head in q[r * q_dim..][..q_dim].chunks_exact_mut(c.head_dim) {
                    self.rope.apply(head, position);
                }
                for head in k[r * kv_dim..][..kv_dim].chunks_exact_mut(c.head_dim) {
                    self.rope.apply(head, position);
                }
            }
            cache.append(index, &k, &v);
            let attended = attention(
                &q,
                rows,
                start,
                cache.keys(index),
                cache.values(index),
                shape,
            );
            add(&mut x, &ops::matmul(&attended, rows, &layer.wo, h));

            let normed = norm_rows(&x, h, &layer.post_norm, eps);
            let gate = ops::matmul(&normed, rows, &layer.gate, c.intermediate_size);
            let mut up = ops::matmul(&normed, rows, &layer.up, c.intermediate_size);
            for (u, g) in up.iter_mut().zip(&gate) {
                *u *= ops::silu(*g);
            }
            add(&mut x, &ops::matmul(&up, rows, &layer.down, h));
        }
        cache.commit(rows);
        let normed = norm_rows(&x, h, &self.norm, eps);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        Ok(Logits {
            vocab: c.vocab_size,
            data: ops::matmul(&normed, rows, head, c.vocab_size),
        })
    }

    /// Greedy decoding: runs `prompt` (which must not be empty) after what `cache` holds, then
    /// feeds back the most likely token one step at a time; returns `count` new tokens.
    pub fn generate(&self, prompt: &[u32], count: usize, cache: &mut KvCache) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(count);
        if count == 0 {
            return Ok(out);
        }
        let mut logits = self.forward(prompt, cache)?;
        loop {
            let Some(next) = logits.argmax_last() else {
                return Err(Error::EmptyPrompt);
            };
            out.push(next);
            if out.len() == count {
                return Ok(out);
            }
            logits = self.forward(&[next], cache)?;
        }
    }
}

/// RMSNorm of each `width`-wide row of `x`, into a new buffer.
fn norm_rows(x: &[f32], width: usize, w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = x.to_vec();
    for row in out.chunks_exact_mut(width) {
        ops::rms_norm(row, w, eps);
    }
    out
}

/// `x += y`, element-wise (the residual).
fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
