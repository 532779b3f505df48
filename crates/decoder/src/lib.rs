//! A Llama-architecture decoder on cuhal, its CPU half: Hugging Face's `config.json` and
//! `.safetensors` read and checked ([`LlamaConfig`], [`ModelFiles`], [`Weights`]), a writer of
//! random models of a given shape ([`write_random_model`]), and an f32 reference of the
//! model's math on the CPU ([`reference`](mod@reference)); and its GPU half ([`gpu`]): kernels,
//! weights on the device, and a [`gpu::Decoder`] that replays one recorded decode step per token.
//!
//! ```no_run
//! use cuhal_decoder::{LlamaConfig, reference::Model, write_random_model};
//! # fn main() -> Result<(), cuhal_decoder::Error> {
//! let dir = std::path::Path::new("/tmp/small-llama");
//! write_random_model(dir, &LlamaConfig::small(), 1)?;
//! let model = Model::load(dir)?;
//! let mut cache = model.new_cache();
//! let tokens = model.generate(&[1, 2, 3], 8, &mut cache)?;
//! assert_eq!(tokens.len(), 8);
//! # Ok(())
//! # }
//! ```

mod config;
mod dtype;
mod error;
pub mod gpu;
pub mod layout;
pub mod reference;
mod rng;
mod weights;
mod writer;

pub use config::{LlamaConfig, RopeScaling};
pub use dtype::DType;
pub use error::{Error, Result};
pub use rng::SplitMix64;
pub use weights::{
    CONFIG_FILE, INDEX_FILE, LayerWeights, ModelFiles, SINGLE_FILE, Tensor, Weights,
};
pub use writer::{MATRIX_STD, NORM_STD, write_random_model, write_random_model_sharded};
