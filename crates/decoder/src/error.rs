//! The crate's one error type.

use std::fmt;
use std::path::PathBuf;

/// Everything that can go wrong reading, checking, writing or running a model.
///
/// Each variant names the file, the field or the tensor it concerns and, where there is one,
/// what was expected against what was found.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be opened, mapped, read or written.
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// `config.json` or `model.safetensors.index.json` is not the JSON it should be.
    Json {
        /// The file.
        path: PathBuf,
        /// What serde_json said (it names the field, line and column).
        message: String,
    },
    /// The configuration describes another architecture than Llama.
    UnsupportedArchitecture {
        /// The `architectures` / `model_type` values found.
        found: String,
    },
    /// A configuration value is out of range or inconsistent with another.
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Why it is refused.
        reason: String,
    },
    /// A Llama variant this crate does not compute (biases, another activation, a rope scaling
    /// it does not know).
    Unsupported {
        /// The field.
        field: &'static str,
        /// The value found.
        found: String,
    },
    /// The directory holds neither `model.safetensors` nor `model.safetensors.index.json`.
    NoWeights {
        /// The directory.
        dir: PathBuf,
    },
    /// A shard named by the index is not a plain file name inside the model's directory.
    BadShardName {
        /// The name the index gives.
        name: String,
    },
    /// A safetensors file is shorter than its header says.
    Truncated {
        /// The file.
        path: PathBuf,
        /// The file's length in bytes.
        len: usize,
        /// What the safetensors reader found.
        reason: String,
    },
    /// A safetensors file's header cannot be read (not UTF-8, not JSON, inconsistent offsets).
    MalformedHeader {
        /// The file.
        path: PathBuf,
        /// What the safetensors reader found.
        reason: String,
    },
    /// A tensor the configuration requires is in none of the files.
    MissingTensor {
        /// The tensor's name.
        name: String,
    },
    /// A tensor's shape differs from the one the configuration implies.
    WrongShape {
        /// The tensor's name.
        name: String,
        /// The shape the configuration implies.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// A tensor's element type differs from the model's (all tensors share one: F16 or BF16).
    WrongDtype {
        /// The tensor's name.
        name: String,
        /// The model's element type.
        expected: String,
        /// The tensor's element type in the file.
        found: String,
    },
    /// A token id is not below the vocabulary size.
    TokenOutOfRange {
        /// The token.
        token: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// Generation was asked to continue an empty prompt.
    EmptyPrompt,
    /// The key/value cache would grow past `max_position_embeddings`.
    ContextFull {
        /// Positions already in the cache.
        cached: usize,
        /// Positions asked for.
        asked: usize,
        /// The model's `max_position_embeddings`.
        max: usize,
    },
    /// A key/value cache made for another configuration was passed.
    CacheMismatch {
        /// What differs.
        reason: String,
    },
    /// A cuhal call of the GPU path failed (the device, a queue, a buffer, a kernel).
    Gpu {
        /// What the decoder was doing.
        context: &'static str,
        /// What cuhal said.
        source: cuhal::Error,
    },
    /// The prompts given to the GPU decoder do not fit its batch (a count other than the batch
    /// size, an empty prompt, prompts of different lengths).
    Prompt {
        /// Why they are refused.
        reason: String,
    },
    /// The safetensors writer refused the tensors.
    Write {
        /// The file.
        path: PathBuf,
        /// What the safetensors writer said.
        reason: String,
    },
}

impl Error {
    /// A cuhal error met while doing `context`.
    pub(crate) fn gpu(context: &'static str) -> impl FnOnce(cuhal::Error) -> Self {
        move |source| Error::Gpu { context, source }
    }

    /// An I/O error on `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Json { path, message } => write!(f, "{}: {message}", path.display()),
            Error::UnsupportedArchitecture { found } => write!(
                f,
                "unsupported architecture: expected LlamaForCausalLM (model_type \"llama\"), found {found}"
            ),
            Error::InvalidConfig { field, reason } => {
                write!(f, "invalid configuration: {field}: {reason}")
            }
            Error::Unsupported { field, found } => {
                write!(f, "unsupported Llama variant: {field} = {found}")
            }
            Error::NoWeights { dir } => write!(
                f,
                "{}: neither model.safetensors nor model.safetensors.index.json",
                dir.display()
            ),
            Error::BadShardName { name } => write!(
                f,
                "the index names shard {name:?}, which is not a file name inside the model's directory"
            ),
            Error::Truncated { path, len, reason } => write!(
                f,
                "{}: truncated ({len} bytes, shorter than its header says): {reason}",
                path.display()
            ),
            Error::MalformedHeader { path, reason } => {
                write!(
                    f,
                    "{}: malformed safetensors header: {reason}",
                    path.display()
                )
            }
            Error::MissingTensor { name } => write!(f, "missing tensor {name}"),
            Error::WrongShape {
                name,
                expected,
                found,
            } => write!(
                f,
                "tensor {name}: expected shape {expected:?}, found {found:?}"
            ),
            Error::WrongDtype {
                name,
                expected,
                found,
            } => write!(
                f,
                "tensor {name}: expected dtype {expected} (all tensors share the model's dtype, F16 or BF16), found {found}"
            ),
            Error::TokenOutOfRange { token, vocab_size } => {
                write!(
                    f,
                    "token {token} is out of range (vocabulary size {vocab_size})"
                )
            }
            Error::EmptyPrompt => write!(f, "an empty prompt has no next token"),
            Error::ContextFull { cached, asked, max } => write!(
                f,
                "context full: {cached} positions cached + {asked} asked exceed max_position_embeddings {max}"
            ),
            Error::CacheMismatch { reason } => {
                write!(f, "the key/value cache does not fit the model: {reason}")
            }
            Error::Gpu { context, source } => write!(f, "GPU: {context}: {source}"),
            Error::Prompt { reason } => write!(f, "prompts refused: {reason}"),
            Error::Write { path, reason } => {
                write!(f, "{}: writing safetensors: {reason}", path.display())
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::Gpu { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
