//! The GPU path: the model's kernels ([`kernels`]), its weights on the device
//! ([`DeviceWeights`]), and the [`Decoder`] that records one decode step as a graph and replays
//! it per token, all through cuhal's public API.

mod decoder;
pub mod kernels;
mod step;
mod weights;

pub use decoder::{Decoder, DecoderOptions, GenerateOptions, Generation, MAX_BATCH, MemoryUse};
pub use kernels::{KernelImage, Kernels};
pub use step::StepBuffers;
pub use weights::{DeviceWeights, LayerRanges};
