//! The reference's key/value cache.

use crate::config::LlamaConfig;

/// Keys (after rotary) and values of every position computed so far, per layer, each
/// position `num_key_value_heads * head_dim` wide.
#[derive(Clone, Debug)]
pub struct KvCache {
    layers: Vec<LayerCache>,
    kv_dim: usize,
    len: usize,
}

#[derive(Clone, Debug, Default)]
struct LayerCache {
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl KvCache {
    /// An empty cache for `config`'s layers and key/value width.
    pub fn new(config: &LlamaConfig) -> Self {
        KvCache {
            layers: vec![LayerCache::default(); config.num_hidden_layers],
            kv_dim: config.kv_dim(),
            len: 0,
        }
    }

    /// The number of positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every position (the memory is kept).
    pub fn clear(&mut self) {
        for layer in &mut self.layers {
            layer.keys.clear();
            layer.values.clear();
        }
        self.len = 0;
    }

    /// The number of layers.
    pub fn layer_count(&self) -> usize {
        self.layers.len()
    }

    /// The width of one position's keys (or values).
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Layer `layer`'s keys, `[positions, kv_dim]` (positions appended but not yet committed
    /// included).
    pub fn keys(&self, layer: usize) -> &[f32] {
        &self.layers[layer].keys
    }

    /// Layer `layer`'s values, `[positions, kv_dim]`.
    pub fn values(&self, layer: usize) -> &[f32] {
        &self.layers[layer].values
    }

    /// Appends keys and values (whole positions) to layer `layer`.
    pub(crate) fn append(&mut self, layer: usize, keys: &[f32], values: &[f32]) {
        let cache = &mut self.layers[layer];
        cache.keys.extend_from_slice(keys);
        cache.values.extend_from_slice(values);
    }

    /// Counts `positions` more as cached, once every layer holds them.
    pub(crate) fn commit(&mut self, positions: usize) {
        self.len += positions;
    }
}
