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

/// Rows one `gemv` warp computes: `GEMV_WARP_ROWS` in kernels.cu.
pub const GEMV_WARP_ROWS: u32 = 4;
/// Warps of a `gemv` block: `GEMV_WARPS` in kernels.cu.
pub const GEMV_WARPS: u32 = 4;
/// A matrix of fewer rows is computed with a block's warps sharing its rows and splitting the
/// columns (`ksplit`): below 4,096 rows (256 blocks of 16 rows, about two per SM of an
/// H100/H200) a warp per row group leaves the memory system idle. On the H100 the 1b shape's
/// down projection (2,048 rows) took 33.3 us unsplit, the q/k/v one (3,072 rows) 16.3 us.
pub const GEMV_SPLIT_BELOW_ROWS: u32 = 4096;
/// Sequences a `gemv` block computes at once: `GEMV_BATCH` in kernels.cu.
pub const GEMV_BATCH: u32 = 8;
/// Rows one `gemv_stream` warp computes: `GEMV_STREAM_ROWS` in kernels.cu (SwiGLU: one gate
/// row and its up row).
pub const GEMV_STREAM_ROWS: u32 = 2;
/// Warps of a `gemv_stream` block: `GEMV_STREAM_WARPS` in kernels.cu (one block per SM: 111
/// registers a thread on sm_90).
pub const GEMV_STREAM_WARPS: u32 = 16;
/// The most warps of a `gemv_stream` block that split one row group's columns.
pub const GEMV_STREAM_MAX_SPLIT: u32 = 4;
/// The widest input `gemv_stream` takes for one sequence: its shared memory holds the input as
/// f32, within the 48 KiB a launch gets without raising the function's limit. Wider inputs go
/// to `gemv`.
pub const GEMV_STREAM_MAX_COLS: u32 = 12 * 1024;
/// Threads of an `attention` block: `ATTENTION_THREADS` in kernels.cu.
pub const ATTENTION_THREADS: u32 = 256;
/// The widest head `attention` takes: `MAX_HEAD_DIM` in kernels.cu.
pub const MAX_HEAD_DIM: usize = 256;
/// Threads of an `embed` block.
pub const ROW_THREADS: u32 = 256;
/// Threads of an `argmax_advance` block: `ARGMAX_THREADS` in kernels.cu.
pub const ARGMAX_THREADS: u32 = 256;
/// Logits each `argmax_advance` thread reads (`ARGMAX_PER_THREAD` in kernels.cu): a row is
/// split over `vocab / (ARGMAX_THREADS * ARGMAX_PER_THREAD)` blocks. One block of 1,024 threads
/// took 51 us on the 1b shape's 128,256 logits (H200).
pub const ARGMAX_PER_THREAD: u32 = 8;

/// What a `gemv` launch does with its sums (`GEMV_*` in kernels.cu).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum GemvMode {
    /// `y = W x`.
    Write = 0,
    /// `y += W x` (the residual add).
    Accumulate = 1,
    /// `W` is the fused gate and up projection (gate rows first) and `y = silu(gate) * up`,
    /// half as many outputs as rows.
    SwiGlu = 2,
}

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
    /// `gemv_{dtype}` (with RMSNorm of its input, the residual add or SwiGLU folded in).
    pub gemv: Function,
    /// `gemv_stream_{dtype}`: the same for one sequence, its input staged in shared memory
    /// once per block, a block per SM streaming the rows.
    pub gemv_stream: Function,
    /// `attention_{dtype}` (with the rotary embedding and the cache append folded in).
    pub attention: Function,
    /// `argmax_advance` (f32 logits).
    pub argmax: Function,
    /// The device's multiprocessors: `gemv_stream` launches at most one block on each.
    pub multiprocessors: u32,
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
            gemv: typed("gemv")?,
            gemv_stream: typed("gemv_stream")?,
            attention: typed("attention")?,
            argmax: plain("argmax_advance")?,
            multiprocessors: u32::try_from(device.info().multiprocessors)
                .unwrap_or(1)
                .max(1),
            _module: module,
        })
    }
}
