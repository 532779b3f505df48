//! A model's files on disk: `config.json` and its safetensors, memory-mapped and checked
//! against the configuration.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use memmap2::Mmap;
use safetensors::{SafeTensorError, SafeTensors};
use serde::Deserialize;

use crate::config::LlamaConfig;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{EMBED_TOKENS, FINAL_NORM, LAYER_TENSORS, LM_HEAD, layer_tensor_name};

/// The single-file form's name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The sharded form's index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The configuration's name.
pub const CONFIG_FILE: &str = "config.json";

/// One tensor, borrowed from a mapped file: its bytes as stored (little-endian, row-major),
/// ready to upload.
#[derive(Clone, Debug)]
pub struct Tensor<'a> {
    /// The name in the files.
    pub name: String,
    /// The shape (a projection is `[out, in]`).
    pub shape: Vec<usize>,
    /// The element type.
    pub dtype: DType,
    /// The bytes, inside the memory map (`element_count() * dtype.size()` of them).
    pub data: &'a [u8],
}

impl Tensor<'_> {
    /// The number of elements.
    pub fn element_count(&self) -> usize {
        self.shape.iter().product()
    }

    /// The elements converted to f32.
    pub fn to_f32(&self) -> Vec<f32> {
        self.dtype.decode(self.data)
    }
}

/// One decoder layer's tensors.
#[derive(Clone, Debug)]
pub struct LayerWeights<'a> {
    /// RMSNorm before attention, `[hidden]`.
    pub input_layernorm: Tensor<'a>,
    /// Query projection, `[heads * head_dim, hidden]`.
    pub q_proj: Tensor<'a>,
    /// Key projection, `[kv_heads * head_dim, hidden]`.
    pub k_proj: Tensor<'a>,
    /// Value projection, `[kv_heads * head_dim, hidden]`.
    pub v_proj: Tensor<'a>,
    /// Attention output projection, `[hidden, heads * head_dim]`.
    pub o_proj: Tensor<'a>,
    /// RMSNorm before the MLP, `[hidden]`.
    pub post_attention_layernorm: Tensor<'a>,
    /// MLP gate projection, `[intermediate, hidden]`.
    pub gate_proj: Tensor<'a>,
    /// MLP up projection, `[intermediate, hidden]`.
    pub up_proj: Tensor<'a>,
    /// MLP down projection, `[hidden, intermediate]`.
    pub down_proj: Tensor<'a>,
}

/// Every tensor of a model, checked against its configuration, borrowed from the maps of a
/// [`ModelFiles`].
#[derive(Clone, Debug)]
pub struct Weights<'a> {
    /// The element type all tensors share (F16 or BF16).
    pub dtype: DType,
    /// Token embedding, `[vocab, hidden]`.
    pub embed_tokens: Tensor<'a>,
    /// The decoder layers, in order.
    pub layers: Vec<LayerWeights<'a>>,
    /// The final RMSNorm, `[hidden]`.
    pub norm: Tensor<'a>,
    /// The output head, `[vocab, hidden]`; `None` when the embeddings are tied.
    pub lm_head: Option<Tensor<'a>>,
}

impl<'a> Weights<'a> {
    /// The matrix that turns the final hidden state into logits: `lm_head`, or the embedding
    /// when tied.
    pub fn output(&self) -> &Tensor<'a> {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = &Tensor<'a>> {
        std::iter::once(&self.embed_tokens)
            .chain(self.layers.iter().flat_map(|l| {
                [
                    &l.input_layernorm,
                    &l.q_proj,
                    &l.k_proj,
                    &l.v_proj,
                    &l.o_proj,
                    &l.post_attention_layernorm,
                    &l.gate_proj,
                    &l.up_proj,
                    &l.down_proj,
                ]
            }))
            .chain(std::iter::once(&self.norm))
            .chain(self.lm_head.as_ref())
    }
}

/// One mapped safetensors file.
struct Shard {
    path: PathBuf,
    map: Mmap,
}

/// `model.safetensors.index.json`: which shard holds each tensor.
#[derive(Deserialize)]
struct Index {
    weight_map: HashMap<String, String>,
}

/// A model directory opened: its configuration and its safetensors files memory-mapped
/// (never copied whole into host memory). [`ModelFiles::weights`] borrows the tensors.
///
/// The files must not be modified while they are open: the maps would change under the
/// borrowed slices.
pub struct ModelFiles {
    dir: PathBuf,
    config: LlamaConfig,
    shards: Vec<Shard>,
    /// For the sharded form: tensor name to index in `shards`.
    weight_map: Option<HashMap<String, usize>>,
}

impl std::fmt::Debug for ModelFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelFiles")
            .field("dir", &self.dir)
            .field(
                "shards",
                &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl ModelFiles {
    /// Reads `dir/config.json` and maps `dir/model.safetensors`, or the shards
    /// `dir/model.safetensors.index.json` names, and checks every tensor
    /// ([`ModelFiles::weights`] succeeds afterwards).
    pub fn open(dir: &Path) -> Result<Self> {
        let config = LlamaConfig::from_file(&dir.join(CONFIG_FILE))?;
        let single = dir.join(SINGLE_FILE);
        let index_path = dir.join(INDEX_FILE);
        let files = if single.is_file() {
            Self {
                dir: dir.to_path_buf(),
                config,
                shards: vec![map_file(&single)?],
                weight_map: None,
            }
        } else if index_path.is_file() {
            let text =
                std::fs::read_to_string(&index_path).map_err(|e| Error::io(&index_path, e))?;
            let index: Index = serde_json::from_str(&text).map_err(|e| Error::Json {
                path: index_path.clone(),
                message: e.to_string(),
            })?;
            let names: BTreeSet<&String> = index.weight_map.values().collect();
            let mut shards = Vec::with_capacity(names.len());
            let mut position = HashMap::with_capacity(names.len());
            for name in names {
                let mut components = Path::new(name).components();
                if !matches!(
                    (components.next(), components.next()),
                    (Some(Component::Normal(_)), None)
                ) {
                    return Err(Error::BadShardName { name: name.clone() });
                }
                position.insert(name.clone(), shards.len());
                shards.push(map_file(&dir.join(name))?);
            }
            let weight_map = index
                .weight_map
                .into_iter()
                .map(|(tensor, shard)| {
                    let at = position[&shard];
                    (tensor, at)
                })
                .collect();
            Self {
                dir: dir.to_path_buf(),
                config,
                shards,
                weight_map: Some(weight_map),
            }
        } else {
            return Err(Error::NoWeights {
                dir: dir.to_path_buf(),
            });
        };
        files.weights()?;
        Ok(files)
    }

    /// The model's configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The directory the model was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The total size of the mapped files in bytes.
    pub fn mapped_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.map.len()).sum()
    }

    /// Every tensor the configuration requires, borrowed from the maps, after checking each
    /// one's presence, shape and element type (tensors the configuration does not name are
    /// ignored, as is `lm_head.weight` when the embeddings are tied).
    pub fn weights(&self) -> Result<Weights<'_>> {
        let parsed = self
            .shards
            .iter()
            .map(|shard| SafeTensors::deserialize(&shard.map).map_err(|e| header_error(shard, e)))
            .collect::<Result<Vec<_>>>()?;
        let c = &self.config;
        let find = |name: &str| -> Result<(safetensors::tensor::TensorView<'_>, usize)> {
            let at = match &self.weight_map {
                None => 0,
                Some(map) => *map.get(name).ok_or_else(|| Error::MissingTensor {
                    name: name.to_string(),
                })?,
            };
            let view = parsed[at].tensor(name).map_err(|_| Error::MissingTensor {
                name: name.to_string(),
            })?;
            Ok((view, at))
        };
        // The model's element type: the configuration's when it names F16 or BF16, else the
        // embedding's.
        let dtype = match c.torch_dtype {
            DType::F16 | DType::BF16 => c.torch_dtype,
            DType::F32 => {
                let (embed, _) = find(EMBED_TOKENS)?;
                match DType::from_safetensors(embed.dtype()) {
                    Some(d @ (DType::F16 | DType::BF16)) => d,
                    _ => {
                        return Err(Error::WrongDtype {
                            name: EMBED_TOKENS.into(),
                            expected: "F16 or BF16".into(),
                            found: format!("{:?}", embed.dtype()),
                        });
                    }
                }
            }
        };
        let tensor = |name: String, shape: Vec<usize>| -> Result<Tensor<'_>> {
            let (view, _) = find(&name)?;
            if view.shape() != shape.as_slice() {
                return Err(Error::WrongShape {
                    name,
                    expected: shape,
                    found: view.shape().to_vec(),
                });
            }
            if DType::from_safetensors(view.dtype()) != Some(dtype) {
                return Err(Error::WrongDtype {
                    name,
                    expected: dtype.to_string(),
                    found: format!("{:?}", view.dtype()),
                });
            }
            Ok(Tensor {
                name,
                shape,
                dtype,
                data: view.data(),
            })
        };
        let (h, i, q, kv) = (c.hidden_size, c.intermediate_size, c.q_dim(), c.kv_dim());
        let embed_tokens = tensor(EMBED_TOKENS.into(), vec![c.vocab_size, h])?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for layer in 0..c.num_hidden_layers {
            let [norm_in, wq, wk, wv, wo, norm_post, gate, up, down] = LAYER_TENSORS;
            let name = |suffix| layer_tensor_name(layer, suffix);
            layers.push(LayerWeights {
                input_layernorm: tensor(name(norm_in), vec![h])?,
                q_proj: tensor(name(wq), vec![q, h])?,
                k_proj: tensor(name(wk), vec![kv, h])?,
                v_proj: tensor(name(wv), vec![kv, h])?,
                o_proj: tensor(name(wo), vec![h, q])?,
                post_attention_layernorm: tensor(name(norm_post), vec![h])?,
                gate_proj: tensor(name(gate), vec![i, h])?,
                up_proj: tensor(name(up), vec![i, h])?,
                down_proj: tensor(name(down), vec![h, i])?,
            });
        }
        let norm = tensor(FINAL_NORM.into(), vec![h])?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(tensor(LM_HEAD.into(), vec![c.vocab_size, h])?)
        };
        Ok(Weights {
            dtype,
            embed_tokens,
            layers,
            norm,
            lm_head,
        })
    }
}

/// Maps `path` read-only.
fn map_file(path: &Path) -> Result<Shard> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: the map is read-only and private to this process; the only hazard is another
    // process truncating or rewriting the file while it is mapped, which `ModelFiles`
    // documents as forbidden (the same contract every memory-mapped model loader has). The
    // safetensors writer never rewrites a file in place (it renames a new one over it).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    Ok(Shard {
        path: path.to_path_buf(),
        map,
    })
}

/// A safetensors reader error as this crate's: a file shorter than its header says is
/// truncated, anything else a malformed header.
fn header_error(shard: &Shard, error: SafeTensorError) -> Error {
    match error {
        SafeTensorError::HeaderTooSmall
        | SafeTensorError::InvalidHeaderLength
        | SafeTensorError::MetadataIncompleteBuffer => Error::Truncated {
            path: shard.path.clone(),
            len: shard.map.len(),
            reason: error.to_string(),
        },
        other => Error::MalformedHeader {
            path: shard.path.clone(),
            reason: other.to_string(),
        },
    }
}
