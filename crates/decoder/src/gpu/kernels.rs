//! The decoder's kernels (`kernels/kernels.cu`, built by `kernels/build.sh` with nvcc 13.0),
//! embedded in the crate and loaded on a device.

use cuhal::{Device, Executable, Function};

use crate::DType;
use crate::error::{Error, Result};

/// The image a GPU loads: cubins for sm_80 and sm_90 and PTX for compute_90 in one fatbin.
pub const FATBIN: &[u8] = include_bytes!("../../kernels/kernels.fatbin");
/// The kernels as PTX for compute_80 (NUL-terminated on loading): what the fake driver reads,
/// and what the driver compiles where the fatbin holds nothing for the GPU.
pub const PTX: &str = include_str!("../../kernels/kernels.compute_80.ptx");

/// Rows of a `gemv` block (one warp each): `GEMV_ROWS` in kernels.cu.
pub const GEMV_ROWS: u32 = 8;
/// Sequences a `gemv` block computes at once: `GEMV_BATCH` in kernels.cu.
pub const GEMV_BATCH: u32 = 8;
/// Threads of an `attention` block: `ATTENTION_THREADS` in kernels.cu.
pub const ATTENTION_THREADS: u32 = 256;
/// The widest head `attention` takes: `MAX_HEAD_DIM` in kernels.cu.
pub const MAX_HEAD_DIM: usize = 256;
/// Threads of the element-wise and per-row kernels.
pub const ROW_THREADS: u32 = 256;
/// Threads of an `argmax_advance` block.
pub const ARGMAX_THREADS: u32 = 1024;

/// Which image [`Kernels::load`] gives the driver.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum KernelImage {
    /// The fatbin (cubins for sm_80 and sm_90, PTX for later GPUs): what a GPU runs.
    #[default]
    Fatbin,
    /// The compute_80 PTX, compiled by the driver when loaded (the fake driver reads only this).
    Ptx,
}

/// The kernels of one dtype, loaded on a device.
pub struct Kernels {
    /// Keeps the module loaded (each `Function` holds it too).
    _module: Executable,
    /// `embed_{dtype}`.
    pub embed: Function,
    /// `rms_norm_{dtype}`.
    pub rms_norm: Function,
    /// `gemv_{dtype}`.
    pub gemv: Function,
    /// `rope_append_{dtype}`.
    pub rope_append: Function,
    /// `attention_{dtype}`.
    pub attention: Function,
    /// `swiglu` (f32 only).
    pub swiglu: Function,
    /// `residual_add` (f32 only).
    pub residual_add: Function,
    /// `argmax_advance` (f32 logits).
    pub argmax: Function,
}

impl Kernels {
    /// Loads `image` on `device` and looks up the kernels for weights of `dtype`.
    pub fn load(device: &Device, dtype: DType, image: KernelImage) -> Result<Self> {
        let module = match image {
            KernelImage::Fatbin => device.load_cubin(FATBIN),
            KernelImage::Ptx => device.load_ptx(PTX),
        }
        .map_err(Error::gpu("loading the decoder's kernels"))?;
        let suffix = match dtype {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => {
                return Err(Error::Unsupported {
                    field: "dtype",
                    found: "float32 (the GPU path runs float16 and bfloat16)".into(),
                });
            }
        };
        let typed = |name: &str| -> Result<Function> {
            module
                .function(&format!("{name}_{suffix}"))
                .map_err(|e| Error::gpu("looking up a kernel")(e.into()))
        };
        let plain = |name: &str| -> Result<Function> {
            module
                .function(name)
                .map_err(|e| Error::gpu("looking up a kernel")(e.into()))
        };
        Ok(Kernels {
            embed: typed("embed")?,
            rms_norm: typed("rms_norm")?,
            gemv: typed("gemv")?,
            rope_append: typed("rope_append")?,
            attention: typed("attention")?,
            swiglu: plain("swiglu")?,
            residual_add: plain("residual_add")?,
            argmax: plain("argmax_advance")?,
            _module: module,
        })
    }
}
