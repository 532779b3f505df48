//! Writing a model of random weights in Hugging Face's layout, for tests and benchmarks that
//! need a model of a given shape without downloading one.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use safetensors::View;

use crate::config::LlamaConfig;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{TensorKind, TensorSpec, expected_tensors};
use crate::rng::{SplitMix64, stream_seed};
use crate::weights::{CONFIG_FILE, INDEX_FILE, SINGLE_FILE};

/// The standard deviation of a random projection's (and the embedding's) elements.
pub const MATRIX_STD: f32 = 0.02;
/// The standard deviation of a random norm scale's elements around 1.0.
pub const NORM_STD: f32 = 0.02;

/// A tensor whose bytes are generated when the serializer asks for them, so that writing a
/// model holds at most one tensor in memory.
struct RandomTensor {
    spec: TensorSpec,
    dtype: DType,
    seed: u64,
}

impl RandomTensor {
    fn bytes(&self) -> Vec<u8> {
        let count = self.spec.element_count();
        let mut out = Vec::with_capacity(count * self.dtype.size());
        let mut rng = SplitMix64::new(self.seed);
        let (mean, std) = match self.spec.kind {
            TensorKind::Matrix => (0.0, MATRIX_STD),
            TensorKind::Norm => (1.0, NORM_STD),
        };
        let mut written = 0;
        while written < count {
            let (a, b) = rng.next_normal_pair();
            for z in [a, b].into_iter().take(count - written) {
                self.dtype.encode(mean + std * z as f32, &mut out);
                written += 1;
            }
        }
        out
    }
}

impl View for &RandomTensor {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype.to_safetensors()
    }

    fn shape(&self) -> &[usize] {
        &self.spec.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.bytes())
    }

    fn data_len(&self) -> usize {
        self.spec.element_count() * self.dtype.size()
    }
}

/// Writes `dir/config.json` and `dir/model.safetensors`: a model of `config`'s shape and
/// element type (F16 or BF16) with random weights (projections and embedding normal with mean
/// 0 and deviation [`MATRIX_STD`], norm scales 1.0 plus noise of deviation [`NORM_STD`]),
/// the same bytes for the same `seed`. Creates `dir` if needed.
pub fn write_random_model(dir: &Path, config: &LlamaConfig, seed: u64) -> Result<()> {
    write_random_model_sharded(dir, config, seed, 1)
}

/// [`write_random_model`] in `shards` files: with more than one, the tensors are dealt in file
/// order into `model-0000k-of-0000n.safetensors` and `model.safetensors.index.json` maps each
/// to its shard, as Hugging Face writes large models.
pub fn write_random_model_sharded(
    dir: &Path,
    config: &LlamaConfig,
    seed: u64,
    shards: usize,
) -> Result<()> {
    config.validate()?;
    if !matches!(config.torch_dtype, DType::F16 | DType::BF16) {
        return Err(Error::InvalidConfig {
            field: "torch_dtype",
            reason: format!(
                "random models are written in float16 or bfloat16, not {}",
                config.torch_dtype.torch_name()
            ),
        });
    }
    let specs = expected_tensors(config);
    if shards == 0 || shards > specs.len() {
        return Err(Error::InvalidConfig {
            field: "shards",
            reason: format!("{shards} shards for {} tensors", specs.len()),
        });
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let config_path = dir.join(CONFIG_FILE);
    std::fs::write(&config_path, config.to_json()).map_err(|e| Error::io(&config_path, e))?;

    let tensors: Vec<RandomTensor> = specs
        .into_iter()
        .map(|spec| RandomTensor {
            seed: stream_seed(seed, &spec.name),
            dtype: config.torch_dtype,
            spec,
        })
        .collect();
    if shards == 1 {
        return write_file(&dir.join(SINGLE_FILE), &tensors);
    }
    let per_shard = tensors.len().div_ceil(shards);
    let mut weight_map = BTreeMap::new();
    let mut total_size = 0;
    for (k, chunk) in tensors.chunks(per_shard).enumerate() {
        let name = format!("model-{:05}-of-{shards:05}.safetensors", k + 1);
        write_file(&dir.join(&name), chunk)?;
        for t in chunk {
            weight_map.insert(t.spec.name.clone(), name.clone());
            total_size += (&t).data_len();
        }
    }
    let index = serde_json::json!({
        "metadata": { "total_size": total_size },
        "weight_map": weight_map,
    });
    let index_path = dir.join(INDEX_FILE);
    let text = serde_json::to_string_pretty(&index).unwrap_or_default();
    std::fs::write(&index_path, text).map_err(|e| Error::io(&index_path, e))
}

/// Serializes `tensors` to `path`, generating each one's bytes as it is written.
fn write_file(path: &Path, tensors: &[RandomTensor]) -> Result<()> {
    let metadata = [("format".to_string(), "pt".to_string())]
        .into_iter()
        .collect();
    safetensors::serialize_to_file(
        tensors.iter().map(|t| (t.spec.name.as_str(), t)),
        Some(metadata),
        path,
    )
    .map_err(|e| Error::Write {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    // The serializer writes a temporary file (created private to its owner) and renames it;
    // give the model the permissions of an ordinary new file, those of config.json beside it.
    let config_path = path.with_file_name(CONFIG_FILE);
    let permissions = std::fs::metadata(&config_path)
        .map_err(|e| Error::io(&config_path, e))?
        .permissions();
    std::fs::set_permissions(path, permissions).map_err(|e| Error::io(path, e))
}
