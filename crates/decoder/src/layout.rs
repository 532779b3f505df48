//! Hugging Face's tensor names and the shapes a configuration implies for them.

use crate::config::LlamaConfig;

/// What a tensor is, which decides how a random model fills it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorKind {
    /// A matrix: the token embedding, a projection or the output head.
    Matrix,
    /// An RMSNorm scale (one value per channel).
    Norm,
}

/// One tensor a model needs: its name in the files, its shape and its kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// The name, as Hugging Face writes it (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// The shape (row-major; a projection is `[out, in]`).
    pub shape: Vec<usize>,
    /// What it is.
    pub kind: TensorKind,
}

impl TensorSpec {
    fn new(name: String, shape: Vec<usize>, kind: TensorKind) -> Self {
        TensorSpec { name, shape, kind }
    }

    /// The number of elements.
    pub fn element_count(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The token embedding's name.
pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";
/// The final norm's name.
pub const FINAL_NORM: &str = "model.norm.weight";
/// The output head's name (absent when the embeddings are tied).
pub const LM_HEAD: &str = "lm_head.weight";

/// The per-layer tensors, by their name after `model.layers.{i}.`, in the order
/// [`crate::LayerWeights`] holds them.
pub const LAYER_TENSORS: [&str; 9] = [
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
];

/// The full name of layer `layer`'s tensor `suffix` (one of [`LAYER_TENSORS`]).
pub fn layer_tensor_name(layer: usize, suffix: &str) -> String {
    format!("model.layers.{layer}.{suffix}")
}

/// The shape `config` implies for the per-layer tensor `suffix`, and its kind.
fn layer_tensor_shape(config: &LlamaConfig, suffix: &str) -> (Vec<usize>, TensorKind) {
    let h = config.hidden_size;
    let i = config.intermediate_size;
    match suffix {
        "input_layernorm.weight" | "post_attention_layernorm.weight" => (vec![h], TensorKind::Norm),
        "self_attn.q_proj.weight" => (vec![config.q_dim(), h], TensorKind::Matrix),
        "self_attn.k_proj.weight" | "self_attn.v_proj.weight" => {
            (vec![config.kv_dim(), h], TensorKind::Matrix)
        }
        "self_attn.o_proj.weight" => (vec![h, config.q_dim()], TensorKind::Matrix),
        "mlp.gate_proj.weight" | "mlp.up_proj.weight" => (vec![i, h], TensorKind::Matrix),
        // "mlp.down_proj.weight", the last of LAYER_TENSORS.
        _ => (vec![h, i], TensorKind::Matrix),
    }
}

/// Every tensor `config` requires, in file order: the embedding, each layer's nine, the final
/// norm, and the output head unless the embeddings are tied.
pub fn expected_tensors(config: &LlamaConfig) -> Vec<TensorSpec> {
    let h = config.hidden_size;
    let mut specs = vec![TensorSpec::new(
        EMBED_TOKENS.into(),
        vec![config.vocab_size, h],
        TensorKind::Matrix,
    )];
    for layer in 0..config.num_hidden_layers {
        for suffix in LAYER_TENSORS {
            let (shape, kind) = layer_tensor_shape(config, suffix);
            specs.push(TensorSpec::new(
                layer_tensor_name(layer, suffix),
                shape,
                kind,
            ));
        }
    }
    specs.push(TensorSpec::new(
        FINAL_NORM.into(),
        vec![h],
        TensorKind::Norm,
    ));
    if !config.tie_word_embeddings {
        specs.push(TensorSpec::new(
            LM_HEAD.into(),
            vec![config.vocab_size, h],
            TensorKind::Matrix,
        ));
    }
    specs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_follow_the_config() {
        let c = LlamaConfig::small();
        let specs = expected_tensors(&c);
        assert_eq!(specs.len(), 1 + 8 * 9 + 2);
        let find = |name: &str| specs.iter().find(|s| s.name == name).unwrap();
        assert_eq!(
            find("model.layers.7.self_attn.q_proj.weight").shape,
            [512, 512]
        );
        assert_eq!(
            find("model.layers.0.self_attn.k_proj.weight").shape,
            [256, 512]
        );
        assert_eq!(
            find("model.layers.0.self_attn.o_proj.weight").shape,
            [512, 512]
        );
        assert_eq!(
            find("model.layers.3.mlp.gate_proj.weight").shape,
            [1408, 512]
        );
        assert_eq!(
            find("model.layers.3.mlp.down_proj.weight").shape,
            [512, 1408]
        );
        assert_eq!(
            find("model.layers.3.input_layernorm.weight").kind,
            TensorKind::Norm
        );
        assert_eq!(find(LM_HEAD).shape, [32000, 512]);
        let tied = expected_tensors(&LlamaConfig::llama_1b());
        assert!(tied.iter().all(|s| s.name != LM_HEAD));
        // About 1.24 billion parameters.
        let params: usize = tied.iter().map(TensorSpec::element_count).sum();
        assert_eq!(params / 10_000_000, 123);
    }
}
