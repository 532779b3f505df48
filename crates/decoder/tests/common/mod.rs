//! Helpers shared by the decoder's tests: scratch directories, a tiny configuration, and a
//! writer of arbitrary tensors.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use cuhal_decoder::{DType, LlamaConfig};

/// A fresh scratch directory, removed when dropped.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn new(label: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cuhal-decoder-{label}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        ScratchDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// 2 layers, hidden 64, 4 heads of 16, 2 key/value heads, intermediate 128, 97 tokens.
pub fn tiny_config() -> LlamaConfig {
    LlamaConfig {
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        max_position_embeddings: 64,
        vocab_size: 97,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        ..LlamaConfig::small()
    }
}

/// One tensor to write: name, element type, shape, values.
pub struct RawTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// Writes `dir/config.json` from `config` and `dir/model.safetensors` from `tensors`.
pub fn write_tensors(dir: &Path, config: &LlamaConfig, tensors: &[RawTensor]) {
    std::fs::write(dir.join("config.json"), config.to_json()).unwrap();
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| {
            let mut out = Vec::new();
            for &v in &t.values {
                t.dtype.encode(v, &mut out);
            }
            out
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| {
            let view =
                safetensors::tensor::TensorView::new(t.dtype.to_safetensors(), t.shape.clone(), b)
                    .unwrap();
            (t.name.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

/// Every tensor of the model in `dir`, as f32, in file order.
pub fn read_tensors(dir: &Path) -> Vec<RawTensor> {
    let files = cuhal_decoder::ModelFiles::open(dir).unwrap();
    let weights = files.weights().unwrap();
    weights
        .tensors()
        .map(|t| RawTensor {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            values: t.to_f32(),
        })
        .collect()
}
