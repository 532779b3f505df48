//! The model's hyper-parameters, read from Hugging Face's `config.json`.

use std::path::Path;

use serde::Deserialize;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// How rotary frequencies are rescaled for long contexts (`rope_scaling` in `config.json`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// Every frequency divided by `factor` (Hugging Face's `"linear"`).
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3.1's rescaling (Hugging Face's `"llama3"`): long wavelengths divided by `factor`,
    /// short ones kept, those between blended.
    Llama3 {
        /// The divisor of the long wavelengths' frequencies.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length the model was first trained for.
        original_max_position_embeddings: f64,
    },
}

/// A Llama-architecture model's configuration (`LlamaForCausalLM`).
///
/// Read with [`LlamaConfig::from_file`] / [`LlamaConfig::from_json`], which check it with
/// [`LlamaConfig::validate`]; [`LlamaConfig::small`] and [`LlamaConfig::llama_1b`] are the
/// shapes used to write random models.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// The width of the residual stream.
    pub hidden_size: usize,
    /// The width of the MLP's gate and up projections.
    pub intermediate_size: usize,
    /// The number of decoder layers.
    pub num_hidden_layers: usize,
    /// The number of query heads.
    pub num_attention_heads: usize,
    /// The number of key/value heads (grouped-query attention when below the query heads).
    pub num_key_value_heads: usize,
    /// The width of one head.
    pub head_dim: usize,
    /// RMSNorm's epsilon.
    pub rms_norm_eps: f64,
    /// The rotary embedding's base.
    pub rope_theta: f64,
    /// The rotary frequencies' rescaling, if any.
    pub rope_scaling: Option<RopeScaling>,
    /// The longest context the model accepts.
    pub max_position_embeddings: usize,
    /// The number of tokens in the vocabulary.
    pub vocab_size: usize,
    /// Whether the output projection is the token embedding (no `lm_head.weight`).
    pub tie_word_embeddings: bool,
    /// The element type the weights are stored in.
    pub torch_dtype: DType,
    /// The beginning-of-sequence token, if the configuration names one.
    pub bos_token_id: Option<u32>,
    /// The end-of-sequence tokens (Llama 3 names several).
    pub eos_token_ids: Vec<u32>,
}

/// `config.json` as written, before defaults and checks.
#[derive(Deserialize)]
struct RawConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<serde_json::Value>,
    /// `transformers` 5 writes the rotary base and its rescaling here, in place of
    /// `rope_theta` and `rope_scaling`.
    rope_parameters: Option<serde_json::Value>,
    max_position_embeddings: Option<usize>,
    vocab_size: usize,
    tie_word_embeddings: Option<bool>,
    torch_dtype: Option<String>,
    /// Newer `transformers` releases write `dtype` instead of `torch_dtype`.
    dtype: Option<String>,
    bos_token_id: Option<TokenIds>,
    eos_token_id: Option<TokenIds>,
    hidden_act: Option<String>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
}

/// A token id field written as one number or a list.
#[derive(Deserialize)]
#[serde(untagged)]
enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    fn into_vec(self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![id],
            TokenIds::Many(ids) => ids,
        }
    }
}

impl LlamaConfig {
    /// Reads and checks `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json(&text).map_err(|e| match e {
            Error::Json { message, .. } => Error::Json {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    /// Parses and checks the text of a `config.json`.
    pub fn from_json(text: &str) -> Result<Self> {
        let raw: RawConfig = serde_json::from_str(text).map_err(|e| Error::Json {
            path: "config.json".into(),
            message: e.to_string(),
        })?;
        check_architecture(raw.architectures.as_deref(), raw.model_type.as_deref())?;
        if let Some(act) = &raw.hidden_act
            && act != "silu"
        {
            return Err(Error::Unsupported {
                field: "hidden_act",
                found: act.clone(),
            });
        }
        for (field, value) in [
            ("attention_bias", raw.attention_bias),
            ("mlp_bias", raw.mlp_bias),
        ] {
            if value == Some(true) {
                return Err(Error::Unsupported {
                    field,
                    found: "true".into(),
                });
            }
        }
        let heads = raw.num_attention_heads;
        if raw.head_dim.is_none() && (heads == 0 || !raw.hidden_size.is_multiple_of(heads)) {
            return Err(Error::InvalidConfig {
                field: "num_attention_heads",
                reason: format!(
                    "{heads} heads do not divide hidden_size {}",
                    raw.hidden_size
                ),
            });
        }
        let dtype_name = raw.torch_dtype.or(raw.dtype);
        let torch_dtype = match dtype_name.as_deref() {
            // Hugging Face's default when the field is absent.
            None => DType::F32,
            Some(name) => DType::from_torch_name(name).ok_or_else(|| Error::Unsupported {
                field: "torch_dtype",
                found: name.to_string(),
            })?,
        };
        let (rope_theta, rope_scaling) = match raw.rope_parameters.filter(|v| !v.is_null()) {
            Some(parameters) => parse_rope_parameters(&parameters, raw.rope_theta)?,
            None => (
                raw.rope_theta.unwrap_or(10000.0),
                parse_rope_scaling(raw.rope_scaling.as_ref(), "rope_scaling")?,
            ),
        };
        let config = LlamaConfig {
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: raw.num_key_value_heads.unwrap_or(heads),
            head_dim: raw.head_dim.unwrap_or(raw.hidden_size / heads.max(1)),
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(2048),
            vocab_size: raw.vocab_size,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            torch_dtype,
            bos_token_id: raw
                .bos_token_id
                .and_then(|ids| ids.into_vec().first().copied()),
            eos_token_ids: raw.eos_token_id.map(TokenIds::into_vec).unwrap_or_default(),
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks that the sizes are nonzero and fit together: the key/value heads divide the
    /// query heads, a head's width is even (rotary turns pairs), and the numbers are finite.
    pub fn validate(&self) -> Result<()> {
        for (field, value) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
            ("vocab_size", self.vocab_size),
        ] {
            if value == 0 {
                return Err(Error::InvalidConfig {
                    field,
                    reason: "must be nonzero".into(),
                });
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(Error::InvalidConfig {
                field: "num_key_value_heads",
                reason: format!(
                    "{} key/value heads do not divide {} attention heads",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            });
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(Error::InvalidConfig {
                field: "head_dim",
                reason: format!(
                    "{} is odd; rotary embeddings need an even width",
                    self.head_dim
                ),
            });
        }
        if u32::try_from(self.max_position_embeddings).is_err() {
            return Err(Error::InvalidConfig {
                field: "max_position_embeddings",
                reason: format!(
                    "{} does not fit the kernels' 32-bit positions",
                    self.max_position_embeddings
                ),
            });
        }
        if u32::try_from(self.vocab_size - 1).is_err() {
            return Err(Error::InvalidConfig {
                field: "vocab_size",
                reason: format!("{} does not fit 32-bit token ids", self.vocab_size),
            });
        }
        for (field, value) in [
            ("rms_norm_eps", self.rms_norm_eps),
            ("rope_theta", self.rope_theta),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(Error::InvalidConfig {
                    field,
                    reason: format!("{value} is not a positive finite number"),
                });
            }
        }
        // Every weight matrix's element count must fit in memory's address space.
        let widest = self
            .intermediate_size
            .max(self.vocab_size)
            .max(self.q_dim());
        if widest
            .checked_mul(self.hidden_size.max(self.q_dim()))
            .is_none()
        {
            return Err(Error::InvalidConfig {
                field: "hidden_size",
                reason: "a weight matrix's size overflows".into(),
            });
        }
        Ok(())
    }

    /// The width of all query heads together (`num_attention_heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads.saturating_mul(self.head_dim)
    }

    /// The width of all key (or value) heads together (`num_key_value_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads.saturating_mul(self.head_dim)
    }

    /// A small model for tests and examples: 8 layers, hidden 512, intermediate 1408, 8 heads,
    /// 4 key/value heads, a 32000-token vocabulary, fp16.
    pub fn small() -> Self {
        LlamaConfig {
            hidden_size: 512,
            intermediate_size: 1408,
            num_hidden_layers: 8,
            num_attention_heads: 8,
            num_key_value_heads: 4,
            head_dim: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: None,
            max_position_embeddings: 2048,
            vocab_size: 32000,
            tie_word_embeddings: false,
            torch_dtype: DType::F16,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
        }
    }

    /// The shape of a 1B-parameter Llama 3.2: hidden 2048, 16 layers, 32 heads, 8 key/value
    /// heads, intermediate 8192, a 128256-token vocabulary, tied embeddings, fp16.
    pub fn llama_1b() -> Self {
        LlamaConfig {
            hidden_size: 2048,
            intermediate_size: 8192,
            num_hidden_layers: 16,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            head_dim: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 500000.0,
            rope_scaling: None,
            max_position_embeddings: 8192,
            vocab_size: 128256,
            tie_word_embeddings: true,
            torch_dtype: DType::F16,
            bos_token_id: Some(128000),
            eos_token_ids: vec![128001],
        }
    }

    /// The preset named `small` or `1b`, if `name` is one of them.
    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "small" => Some(Self::small()),
            "1b" => Some(Self::llama_1b()),
            _ => None,
        }
    }

    /// The configuration as Hugging Face writes `config.json`.
    pub fn to_json(&self) -> String {
        let rope_scaling = match self.rope_scaling {
            None => serde_json::Value::Null,
            Some(RopeScaling::Linear { factor }) => {
                serde_json::json!({ "rope_type": "linear", "factor": factor })
            }
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => serde_json::json!({
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low_freq_factor,
                "high_freq_factor": high_freq_factor,
                "original_max_position_embeddings": original_max_position_embeddings,
            }),
        };
        let eos = match self.eos_token_ids.as_slice() {
            [] => serde_json::Value::Null,
            [one] => serde_json::json!(one),
            many => serde_json::json!(many),
        };
        let value = serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "attention_bias": false,
            "mlp_bias": false,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": self.torch_dtype.torch_name(),
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
        });
        // A `Value` always serializes.
        serde_json::to_string_pretty(&value).unwrap_or_default()
    }
}

/// Accepts `LlamaForCausalLM` / `llama`; anything else names what it found.
fn check_architecture(architectures: Option<&[String]>, model_type: Option<&str>) -> Result<()> {
    let arch_ok = architectures.is_none_or(|a| a.iter().any(|a| a == "LlamaForCausalLM"));
    let type_ok = model_type.is_none_or(|t| t == "llama");
    if arch_ok && type_ok && (architectures.is_some() || model_type.is_some()) {
        return Ok(());
    }
    Err(Error::UnsupportedArchitecture {
        found: format!(
            "architectures {}, model_type {}",
            architectures.map_or("absent".to_string(), |a| format!("{a:?}")),
            model_type.map_or("absent".to_string(), |t| format!("{t:?}")),
        ),
    })
}

/// Reads `rope_parameters` (`transformers` 5): the rotary base from its `rope_theta` (else the
/// top-level `rope_theta`, else 10000) and the rescaling from its `rope_type` and factors, as
/// [`parse_rope_scaling`] reads them (no `rope_type`: none). It takes precedence over the
/// top-level fields, as in `transformers`. Parameters per layer type and a partial rotary
/// factor other than 1 are refused: a Llama model has neither.
fn parse_rope_parameters(
    parameters: &serde_json::Value,
    top_level_theta: Option<f64>,
) -> Result<(f64, Option<RopeScaling>)> {
    let Some(fields) = parameters.as_object() else {
        return Err(Error::InvalidConfig {
            field: "rope_parameters",
            reason: format!("expected an object, found {parameters}"),
        });
    };
    if fields.values().any(|v| v.is_object()) {
        return Err(Error::Unsupported {
            field: "rope_parameters",
            found: "parameters per layer type".into(),
        });
    }
    if let Some(factor) = fields.get("partial_rotary_factor")
        && factor.as_f64() != Some(1.0)
    {
        return Err(Error::Unsupported {
            field: "rope_parameters.partial_rotary_factor",
            found: factor.to_string(),
        });
    }
    let theta = match fields.get("rope_theta") {
        None => top_level_theta.unwrap_or(10000.0),
        Some(v) => v
            .as_f64()
            .filter(|t| t.is_finite() && *t > 0.0)
            .ok_or_else(|| Error::InvalidConfig {
                field: "rope_parameters",
                reason: format!("rope_theta {v} is not a positive number"),
            })?,
    };
    let scaling = if fields.contains_key("rope_type") || fields.contains_key("type") {
        parse_rope_scaling(Some(parameters), "rope_parameters")?
    } else {
        None
    };
    Ok((theta, scaling))
}

/// Reads `rope_scaling` (or the rescaling in `rope_parameters`, named by `field` in errors):
/// absent, null or `"default"` is none; `"linear"` and `"llama3"` are computed; any other kind
/// is refused rather than computed wrongly.
fn parse_rope_scaling(
    value: Option<&serde_json::Value>,
    field: &'static str,
) -> Result<Option<RopeScaling>> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = value
        .get("rope_type")
        .or_else(|| value.get("type"))
        .and_then(|k| k.as_str())
        .unwrap_or("absent");
    let number = |key: &'static str| -> Result<f64> {
        value
            .get(key)
            .and_then(|v| v.as_f64())
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| Error::InvalidConfig {
                field,
                reason: format!("{key} is missing or not a positive number"),
            })
    };
    match kind {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear {
            factor: number("factor")?,
        })),
        "llama3" => {
            let scaling = RopeScaling::Llama3 {
                factor: number("factor")?,
                low_freq_factor: number("low_freq_factor")?,
                high_freq_factor: number("high_freq_factor")?,
                original_max_position_embeddings: number("original_max_position_embeddings")?,
            };
            if let RopeScaling::Llama3 {
                low_freq_factor,
                high_freq_factor,
                ..
            } = scaling
                && high_freq_factor <= low_freq_factor
            {
                return Err(Error::InvalidConfig {
                    field,
                    reason: "high_freq_factor must exceed low_freq_factor".into(),
                });
            }
            Ok(Some(scaling))
        }
        other => Err(Error::Unsupported {
            field,
            found: other.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(overrides: &[(&str, serde_json::Value)]) -> String {
        let mut v: serde_json::Value =
            serde_json::from_str(&LlamaConfig::small().to_json()).unwrap();
        for (k, val) in overrides {
            if val.is_null() {
                v.as_object_mut().unwrap().remove(*k);
            } else {
                v[*k] = val.clone();
            }
        }
        v.to_string()
    }

    #[test]
    fn presets_round_trip_through_json() {
        for config in [LlamaConfig::small(), LlamaConfig::llama_1b()] {
            config.validate().unwrap();
            assert_eq!(LlamaConfig::from_json(&config.to_json()).unwrap(), config);
        }
        let b = LlamaConfig::llama_1b();
        assert_eq!((b.q_dim(), b.kv_dim()), (2048, 512));
        assert!(b.tie_word_embeddings);
        assert_eq!(LlamaConfig::preset("small"), Some(LlamaConfig::small()));
        assert_eq!(LlamaConfig::preset("7b"), None);
    }

    #[test]
    fn defaults_follow_hugging_face() {
        let null = serde_json::Value::Null;
        let text = json(&[
            ("num_key_value_heads", null.clone()),
            ("head_dim", null.clone()),
            ("rope_theta", null.clone()),
            ("tie_word_embeddings", null.clone()),
            ("eos_token_id", null.clone()),
            ("bos_token_id", null.clone()),
        ]);
        let c = LlamaConfig::from_json(&text).unwrap();
        assert_eq!(c.num_key_value_heads, 8);
        assert_eq!(c.head_dim, 512 / 8);
        assert_eq!(c.rope_theta, 10000.0);
        assert!(!c.tie_word_embeddings);
        assert_eq!(c.bos_token_id, None);
        assert!(c.eos_token_ids.is_empty());
    }

    #[test]
    fn token_ids_may_be_lists_and_dtype_may_be_named_dtype() {
        let text = json(&[
            ("eos_token_id", serde_json::json!([128001, 128009])),
            ("torch_dtype", serde_json::Value::Null),
            ("dtype", serde_json::json!("bfloat16")),
        ]);
        let c = LlamaConfig::from_json(&text).unwrap();
        assert_eq!(c.eos_token_ids, vec![128001, 128009]);
        assert_eq!(c.torch_dtype, DType::BF16);
    }

    #[test]
    fn other_architectures_are_named() {
        let text = json(&[
            ("architectures", serde_json::json!(["MistralForCausalLM"])),
            ("model_type", serde_json::json!("mistral")),
        ]);
        let err = LlamaConfig::from_json(&text).unwrap_err();
        assert!(matches!(err, Error::UnsupportedArchitecture { .. }));
        assert!(err.to_string().contains("MistralForCausalLM"), "{err}");
        let none = json(&[
            ("architectures", serde_json::Value::Null),
            ("model_type", serde_json::Value::Null),
        ]);
        assert!(matches!(
            LlamaConfig::from_json(&none),
            Err(Error::UnsupportedArchitecture { .. })
        ));
    }

    #[test]
    fn inconsistent_sizes_are_refused() {
        let cases: [(&[(&str, serde_json::Value)], &str); 7] = [
            (
                &[
                    ("num_attention_heads", serde_json::json!(7)),
                    ("head_dim", serde_json::Value::Null),
                ],
                "num_attention_heads",
            ),
            (
                &[("num_key_value_heads", serde_json::json!(3))],
                "num_key_value_heads",
            ),
            (&[("hidden_size", serde_json::json!(0))], "hidden_size"),
            (&[("vocab_size", serde_json::json!(0))], "vocab_size"),
            (&[("head_dim", serde_json::json!(63))], "head_dim"),
            (&[("rms_norm_eps", serde_json::json!(-1.0))], "rms_norm_eps"),
            (
                &[("max_position_embeddings", serde_json::json!(u64::MAX))],
                "max_position_embeddings",
            ),
        ];
        for (overrides, field) in cases {
            match LlamaConfig::from_json(&json(overrides)) {
                Err(Error::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{overrides:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn unsupported_variants_and_bad_json_are_typed() {
        let cases = [
            json(&[("hidden_act", serde_json::json!("gelu"))]),
            json(&[("attention_bias", serde_json::json!(true))]),
            json(&[("torch_dtype", serde_json::json!("float8"))]),
            json(&[(
                "rope_scaling",
                serde_json::json!({"rope_type": "yarn", "factor": 4.0}),
            )]),
        ];
        for text in cases {
            assert!(
                matches!(
                    LlamaConfig::from_json(&text),
                    Err(Error::Unsupported { .. })
                ),
                "{text}"
            );
        }
        for text in [
            "",
            "{",
            "[]",
            &json(&[("hidden_size", serde_json::json!("wide"))]),
        ] {
            assert!(matches!(
                LlamaConfig::from_json(text),
                Err(Error::Json { .. })
            ));
        }
        let missing = json(&[("vocab_size", serde_json::Value::Null)]);
        let err = LlamaConfig::from_json(&missing).unwrap_err();
        assert!(err.to_string().contains("vocab_size"), "{err}");
    }

    #[test]
    fn llama3_rope_scaling_is_read() {
        let text = json(&[(
            "rope_scaling",
            serde_json::json!({
                "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192
            }),
        )]);
        let c = LlamaConfig::from_json(&text).unwrap();
        assert_eq!(
            c.rope_scaling,
            Some(RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0
            })
        );
        assert_eq!(LlamaConfig::from_json(&c.to_json()).unwrap(), c);
    }

    /// A configuration as `transformers` 5 writes it: the rotary base and rescaling in
    /// `rope_parameters`, no top-level `rope_theta` or `rope_scaling`.
    fn v5_json(parameters: serde_json::Value) -> String {
        json(&[
            ("rope_theta", serde_json::Value::Null),
            ("rope_scaling", serde_json::Value::Null),
            ("rope_parameters", parameters),
        ])
    }

    #[test]
    fn rope_parameters_of_transformers_5_are_read() {
        let c = LlamaConfig::from_json(&v5_json(
            serde_json::json!({"rope_theta": 500000.0, "rope_type": "default"}),
        ))
        .unwrap();
        assert_eq!((c.rope_theta, c.rope_scaling), (500000.0, None));

        let c = LlamaConfig::from_json(&v5_json(serde_json::json!({
            "rope_theta": 500000, "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192
        })))
        .unwrap();
        assert_eq!(c.rope_theta, 500000.0);
        assert!(matches!(
            c.rope_scaling,
            Some(RopeScaling::Llama3 { factor: 32.0, .. })
        ));

        // They win over top-level fields, as in transformers; a missing base falls back to the
        // top-level one.
        let both = json(&[
            ("rope_theta", serde_json::json!(10000.0)),
            (
                "rope_parameters",
                serde_json::json!({"rope_theta": 250000.0, "rope_type": "default"}),
            ),
        ]);
        assert_eq!(LlamaConfig::from_json(&both).unwrap().rope_theta, 250000.0);
        let base_only_above = json(&[
            ("rope_theta", serde_json::json!(40000.0)),
            (
                "rope_parameters",
                serde_json::json!({"rope_type": "default"}),
            ),
        ]);
        assert_eq!(
            LlamaConfig::from_json(&base_only_above).unwrap().rope_theta,
            40000.0
        );
    }

    #[test]
    fn rope_parameters_a_llama_cannot_have_are_refused() {
        let unsupported = [
            serde_json::json!({"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0}),
            serde_json::json!({"full_attention": {"rope_theta": 10000.0, "rope_type": "default"}}),
            serde_json::json!({"rope_theta": 10000.0, "rope_type": "default",
                               "partial_rotary_factor": 0.5}),
        ];
        for parameters in unsupported {
            let err = LlamaConfig::from_json(&v5_json(parameters.clone())).unwrap_err();
            assert!(
                matches!(&err, Error::Unsupported { field, .. } if field.starts_with("rope_parameters")),
                "{parameters}: {err:?}"
            );
        }
        for parameters in [
            serde_json::json!([10000.0]),
            serde_json::json!({"rope_theta": -1.0, "rope_type": "default"}),
            serde_json::json!({"rope_theta": 10000.0, "rope_type": "linear"}),
        ] {
            let err = LlamaConfig::from_json(&v5_json(parameters.clone())).unwrap_err();
            assert!(
                matches!(
                    &err,
                    Error::InvalidConfig {
                        field: "rope_parameters",
                        ..
                    }
                ),
                "{parameters}: {err:?}"
            );
        }
    }
}
