//! One decode step, recorded once into a graph command buffer: the buffers it reads and writes
//! ([`StepBuffers`]) and the recording ([`record`]).
//!
//! Every kernel is its own debug group (a trace zone named after it) followed by a barrier: each
//! reads what the one before wrote. Every kernel's last parameter is its zone stamp
//! (`KernelArgs::push_zone_stamp`, `cuhal_zone_stamp.cuh`): on a queue tracing at FINE the
//! kernel times itself with `%globaltimer`, a stamped zone (named after the kernel) inside its
//! debug group's, and untraced the stamp is null. A layer is five kernels: the element-wise work rides on the
//! GEMVs (RMSNorm on the input of the `qkv`, `gate_up` and `lm_head` projections, SwiGLU on
//! `gate_up`'s output, the residual add on `o_proj`'s and `down_proj`'s) and the rotary
//! embedding and the cache append on `attention`: fewer launches per token (launch-bound on
//! small models) and fewer round trips of the activations through memory.

use std::sync::Arc;

use cuhal::{
    Buffer, BufferRange, CommandBuffer, CommandBufferMode, CommandRecorder, Device, Dispatch,
    FillPattern, Function, KernelArgs,
};

use super::decoder::DecoderOptions;
use super::kernels::{
    ARGMAX_PER_THREAD, ARGMAX_THREADS, ATTENTION_THREADS, GEMV_BATCH, GEMV_SPLIT_BELOW_ROWS,
    GEMV_STREAM_MAX_COLS, GEMV_STREAM_MAX_SPLIT, GEMV_STREAM_ROWS, GEMV_STREAM_WARPS,
    GEMV_WARP_ROWS, GEMV_WARPS, GemvMode, Kernels, ROW_THREADS,
};
use super::weights::DeviceWeights;
use crate::error::{Error, Result};
use crate::{DType, LlamaConfig};

/// The device memory of a step besides the weights.
pub struct StepBuffers {
    /// Tokens, `[capacity][batch]` u32: the prompts, then what each step generates.
    pub history: Arc<Buffer>,
    /// Each sequence's position, `[batch]` u32 (advanced by every step).
    pub pos: Arc<Buffer>,
    /// Each sequence's prompt length, `[batch]` u32.
    pub prompt_len: Arc<Buffer>,
    /// The rotary frequencies, `[head_dim / 2]` f32.
    pub inv_freq: Arc<Buffer>,
    /// The residual stream, `[batch][hidden]` f32.
    pub x: Arc<Buffer>,
    /// q, k and v, `[batch][q_dim + 2 kv_dim]` f32.
    pub qkv: Arc<Buffer>,
    /// The attention's output, `[batch][q_dim]` f32.
    pub attn: Arc<Buffer>,
    /// SwiGLU's output (of the fused gate and up projection), `[batch][intermediate]` f32.
    pub act: Arc<Buffer>,
    /// The logits, `[batch][vocab]` f32.
    pub logits: Arc<Buffer>,
    /// The argmax's state across its blocks: the best key so far, `[batch]` u64, then the
    /// blocks arrived, `[batch]` u32; zero between steps (the last block resets it).
    pub argmax: Arc<Buffer>,
    /// The key/value cache, from the device's allocator (`Device::create_buffer`; a
    /// `Queue::alloca` buffer would cost every submission of the step an allocation, the use
    /// that keeps a stream-ordered allocation alive): per layer, keys then values, each
    /// `[batch][kv_heads][capacity][head_dim]` in the model's dtype.
    pub cache: Arc<Buffer>,
    /// Bytes of one layer's keys (and of its values).
    pub cache_half: usize,
}

impl StepBuffers {
    /// Bytes of the key/value cache (every layer's keys and values).
    pub fn cache_bytes(&self) -> usize {
        self.cache.len()
    }

    /// Bytes of everything else the step reads and writes besides the weights and the cache:
    /// tokens, positions, rotary frequencies and the activations.
    pub fn workspace_bytes(&self) -> usize {
        [
            &self.history,
            &self.pos,
            &self.prompt_len,
            &self.inv_freq,
            &self.x,
            &self.qkv,
            &self.attn,
            &self.act,
            &self.logits,
            &self.argmax,
        ]
        .iter()
        .map(|buffer| buffer.len())
        .sum()
    }

    /// Allocates the buffers for `batch` sequences of `capacity` positions and uploads the
    /// rotary frequencies; returns once the upload has completed.
    pub fn new(
        device: &Device,
        config: &LlamaConfig,
        dtype: DType,
        batch: usize,
        capacity: usize,
        inv_freq: &[f32],
    ) -> Result<Self> {
        let f32s = |n: usize| {
            device
                .create_buffer(n * 4)
                .map_err(Error::gpu("allocating the decoder's activations"))
        };
        let (h, q, kv, i, v) = (
            config.hidden_size,
            config.q_dim(),
            config.kv_dim(),
            config.intermediate_size,
            config.vocab_size,
        );
        let cache_half = batch * kv * capacity * dtype.size();
        let cache_len = 2 * cache_half * config.num_hidden_layers;
        let queue = device.queue(0);
        let ready = device.create_semaphore(0);
        let cache = device
            .create_buffer(cache_len)
            .map_err(Error::gpu("allocating the key/value cache"))?;
        let inv = f32s(inv_freq.len())?;
        let bytes: Vec<u8> = inv_freq.iter().flat_map(|f| f.to_ne_bytes()).collect();
        queue
            .write(&[], &[(&ready, 1)], &inv.whole(), &bytes)
            .map_err(Error::gpu("uploading the rotary frequencies"))?;
        // Two 12-byte words a sequence rounded to whole u32s: best keys, then arrivals.
        let argmax = f32s(3 * batch)?;
        queue
            .fill(&[], &[(&ready, 2)], &argmax.whole(), FillPattern::U32(0))
            .map_err(Error::gpu("clearing the argmax's state"))?;
        ready
            .wait(2, std::time::Duration::from_secs(60))
            .map_err(|e| Error::gpu("waiting for the decoder's buffers")(e.into()))?;
        Ok(StepBuffers {
            history: f32s(capacity * batch)?,
            pos: f32s(batch)?,
            prompt_len: f32s(batch)?,
            inv_freq: inv,
            x: f32s(batch * h)?,
            qkv: f32s(batch * (q + 2 * kv))?,
            attn: f32s(batch * q)?,
            act: f32s(batch * i)?,
            logits: f32s(batch * v)?,
            argmax,
            cache,
            cache_half,
        })
    }

    /// The argmax's best keys (`[batch]` u64) and arrivals (`[batch]` u32).
    fn argmax_state(&self, batch: usize) -> Result<(BufferRange, BufferRange)> {
        let range = |offset, len| {
            self.argmax
                .range(offset, len)
                .map_err(|e| Error::gpu("an argmax state range")(e.into()))
        };
        Ok((range(0, 8 * batch)?, range(8 * batch, 4 * batch)?))
    }

    /// Layer `layer`'s keys and values.
    fn layer_cache(&self, layer: usize) -> Result<(BufferRange, BufferRange)> {
        let at = 2 * self.cache_half * layer;
        let range = |offset| {
            self.cache
                .range(offset, self.cache_half)
                .map_err(|e| Error::gpu("a cache range")(e.into()))
        };
        Ok((range(at)?, range(at + self.cache_half)?))
    }
}

/// A recording in progress and the names of its kernels.
struct Recording<'r> {
    cb: &'r mut dyn CommandRecorder,
    names: Vec<String>,
    /// Whether kernels after the first depend programmatically on the one before.
    programmatic: bool,
}

impl Recording<'_> {
    /// Records one kernel as its own debug group, then a barrier; `args` end with the kernel's
    /// zone stamp.
    fn launch(
        &mut self,
        name: String,
        function: &Function,
        grid: [u32; 3],
        block: u32,
        shared: u32,
        args: &KernelArgs,
    ) -> Result<()> {
        let map = |e: cuhal::Error| Error::Gpu {
            context: "recording the decode step",
            source: e,
        };
        self.cb
            .begin_debug_group(&name)
            .map_err(|e| map(e.into()))?;
        let dispatch =
            Dispatch::new(function, grid, [block, 1, 1], args).with_shared_memory(shared);
        // Every kernel waits for the one before on the device (`griddepcontrol.wait`), so a
        // programmatic dependency is a full one for their data.
        let dispatch = if self.programmatic && !self.names.is_empty() {
            dispatch.programmatic()
        } else {
            dispatch
        };
        self.cb.dispatch(&dispatch).map_err(|e| map(e.into()))?;
        self.cb.end_debug_group().map_err(|e| map(e.into()))?;
        self.cb.barrier().map_err(|e| map(e.into()))?;
        self.names.push(name);
        Ok(())
    }
}

/// How many warps of a GEMV block share its rows, splitting the columns: all of them for a
/// matrix of fewer than [`GEMV_SPLIT_BELOW_ROWS`] rows, else none.
fn gemv_split(rows: u32) -> u32 {
    if rows < GEMV_SPLIT_BELOW_ROWS {
        GEMV_WARPS
    } else {
        1
    }
}

/// `gemv_stream`'s column split and grid for a `rows` x `cols` matrix on `multiprocessors`
/// SMs: a block per SM at most, each walking the row groups strided by the grid (staging its
/// input once); where the row groups are too few to fill that many blocks, up to
/// [`GEMV_STREAM_MAX_SPLIT`] warps share a group's columns (each slice at least 32 words of 8
/// elements), the widest split whose blocks still fit on the SMs at once. On the H200 this came
/// within 3% of the fastest variant on every `1b` shape; `small`'s output projection (512
/// columns) trails the fastest by 24% (`kernels/gemv_bench.cu`; `git show bd2a39e:docs/benchmarks.md`).
pub fn stream_shape(rows: u32, cols: u32, mode: GemvMode, multiprocessors: u32) -> (u32, u32) {
    // SwiGLU: half the rows are outputs, and a warp's rows are a gate row and its up row.
    let (outputs, per_group) = if mode == GemvMode::SwiGlu {
        (rows / 2, GEMV_STREAM_ROWS / 2)
    } else {
        (rows, GEMV_STREAM_ROWS)
    };
    let groups = outputs.div_ceil(per_group).max(1);
    let blocks = |split: u32| groups.div_ceil(GEMV_STREAM_WARPS / split);
    let mut split = 1;
    while split < GEMV_STREAM_MAX_SPLIT
        && cols / 8 / (2 * split) >= 32
        && blocks(2 * split) <= multiprocessors
    {
        split *= 2;
    }
    (split, blocks(split).min(multiprocessors))
}

/// `n` as a kernel's `uint32_t`.
fn u32_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Records the decode step for `options.batch` sequences as a graph command buffer of
/// `device`'s first queue; returns it with its kernels' names.
pub fn record(
    device: &Device,
    config: &LlamaConfig,
    kernels: &Kernels,
    weights: &DeviceWeights,
    buffers: &StepBuffers,
    options: &DecoderOptions,
) -> Result<(Arc<dyn CommandBuffer>, Vec<String>)> {
    let mut cb = device
        .queue(0)
        .create_command_buffer_as(CommandBufferMode::Graph, 0)
        .map_err(Error::gpu("creating the decode step"))?;
    let names = record_into(&mut *cb, config, kernels, weights, buffers, options)?;
    let step = cb
        .end()
        .map_err(|e| Error::gpu("ending the decode step")(e.into()))?;
    Ok((step, names))
}

/// Records the decode step's commands into `cb` (left recording); returns its kernels' names.
pub fn record_into(
    cb: &mut dyn CommandRecorder,
    config: &LlamaConfig,
    kernels: &Kernels,
    weights: &DeviceWeights,
    buffers: &StepBuffers,
    options: &DecoderOptions,
) -> Result<Vec<String>> {
    let mut rec = Recording {
        cb,
        names: Vec::new(),
        programmatic: options.programmatic,
    };
    let batch = u32_of(options.batch);
    let capacity = u32_of(options.capacity);
    let (h, q, kv, inter, vocab) = (
        u32_of(config.hidden_size),
        u32_of(config.q_dim()),
        u32_of(config.kv_dim()),
        u32_of(config.intermediate_size),
        u32_of(config.vocab_size),
    );
    let (heads, kv_heads, head_dim) = (
        u32_of(config.num_attention_heads),
        u32_of(config.num_key_value_heads),
        u32_of(config.head_dim),
    );
    let eps = config.rms_norm_eps as f32;
    let scale = 1.0 / (config.head_dim as f32).sqrt();
    let b = buffers;
    // Records the GEMV `name` of `w` (`rows` x `cols`) over `x` into `y`, its input normalized
    // by `norm` where given: `gemv_stream` for one sequence (see `stream_shape`), else `gemv`,
    // GEMV_WARP_ROWS rows a warp (in SwiGLU mode two gate rows and their two up rows: the same
    // count of weight rows), one warp's rows per block where the warps split the columns.
    let gemv = |rec: &mut Recording<'_>,
                name: String,
                w: &BufferRange,
                x: &Arc<Buffer>,
                y: &Arc<Buffer>,
                norm: Option<&BufferRange>,
                rows: u32,
                cols: u32,
                mode: GemvMode| {
        let args = KernelArgs::new()
            .with_range(w)
            .with_range(&x.whole())
            .with_range(&y.whole());
        let args = match norm {
            Some(norm) => args.with_range(norm),
            // A null `norm`: the input as it is.
            None => args.with(0u64),
        };
        let args = args.with(eps).with(rows).with(cols);
        if batch == 1 && cols <= GEMV_STREAM_MAX_COLS {
            let (ksplit, grid) = stream_shape(rows, cols, mode, kernels.multiprocessors);
            let args = args.with(mode as u32).with(ksplit).with_zone_stamp();
            let threads = 32 * GEMV_STREAM_WARPS;
            rec.launch(
                name,
                &kernels.gemv_stream,
                [grid, 1, 1],
                threads,
                cols * 4,
                &args,
            )
        } else {
            let split = gemv_split(rows);
            let per_block = GEMV_WARP_ROWS * GEMV_WARPS / split;
            let grid = [rows.div_ceil(per_block), batch.div_ceil(GEMV_BATCH), 1];
            let args = args
                .with(batch)
                .with(mode as u32)
                .with(split)
                .with_zone_stamp();
            rec.launch(name, &kernels.gemv, grid, 32 * GEMV_WARPS, 0, &args)
        }
    };

    let args = KernelArgs::new()
        .with_range(&weights.embed)
        .with_range(&b.history.whole())
        .with_range(&b.pos.whole())
        .with_range(&b.x.whole())
        .with(h)
        .with(vocab)
        .with(batch)
        .with(capacity)
        .with_zone_stamp();
    rec.launch(
        "embed".into(),
        &kernels.embed,
        [batch, 1, 1],
        ROW_THREADS,
        0,
        &args,
    )?;

    for (index, layer) in weights.layers.iter().enumerate() {
        let (k_cache, v_cache) = b.layer_cache(index)?;
        let name = |what: &str| format!("layer{index}.{what}");

        // RMSNorm, then q, k and v.
        gemv(
            &mut rec,
            name("qkv"),
            &layer.qkv,
            &b.x,
            &b.qkv,
            Some(&layer.attn_norm),
            q + 2 * kv,
            h,
            GemvMode::Write,
        )?;
        // Rotary embeddings, the cache append, attention.
        let args = KernelArgs::new()
            .with_range(&b.qkv.whole())
            .with_range(&b.inv_freq.whole())
            .with_range(&k_cache)
            .with_range(&v_cache)
            .with_range(&b.pos.whole())
            .with_range(&b.attn.whole())
            .with(heads)
            .with(kv_heads)
            .with(head_dim)
            .with(capacity)
            .with(scale)
            .with_zone_stamp();
        rec.launch(
            name("attention"),
            &kernels.attention,
            [heads, batch, 1],
            ATTENTION_THREADS,
            capacity * 4,
            &args,
        )?;
        // o_proj adds into the residual stream.
        gemv(
            &mut rec,
            name("o_proj"),
            &layer.o,
            &b.attn,
            &b.x,
            None,
            h,
            q,
            GemvMode::Accumulate,
        )?;
        // RMSNorm, the gate and up projections, SwiGLU.
        gemv(
            &mut rec,
            name("gate_up"),
            &layer.gate_up,
            &b.x,
            &b.act,
            Some(&layer.mlp_norm),
            2 * inter,
            h,
            GemvMode::SwiGlu,
        )?;
        // down_proj adds into the residual stream.
        gemv(
            &mut rec,
            name("down_proj"),
            &layer.down,
            &b.act,
            &b.x,
            None,
            h,
            inter,
            GemvMode::Accumulate,
        )?;
    }

    // The final RMSNorm, then the output projection.
    gemv(
        &mut rec,
        "lm_head".into(),
        &weights.lm_head,
        &b.x,
        &b.logits,
        Some(&weights.norm),
        vocab,
        h,
        GemvMode::Write,
    )?;
    let (best, arrived) = b.argmax_state(options.batch)?;
    let args = KernelArgs::new()
        .with_range(&b.logits.whole())
        .with_range(&b.history.whole())
        .with_range(&b.pos.whole())
        .with_range(&b.prompt_len.whole())
        .with_range(&best)
        .with_range(&arrived)
        .with(vocab)
        .with(batch)
        .with(capacity)
        .with_zone_stamp();
    rec.launch(
        "argmax".into(),
        &kernels.argmax,
        [vocab.div_ceil(ARGMAX_THREADS * ARGMAX_PER_THREAD), batch, 1],
        ARGMAX_THREADS,
        0,
        &args,
    )?;

    Ok(rec.names)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shapes the rule gives the `1b` and `small` models' GEMVs on an H100's 132 SMs (their
    /// times beside the fastest variants: `kernels/gemv_bench.cu`; `git show bd2a39e:docs/benchmarks.md`).
    #[test]
    fn stream_shapes_fill_the_sms_once() {
        let sms = 132;
        // 1b: q/k/v, o, gate/up, down, lm_head.
        assert_eq!(stream_shape(3072, 2048, GemvMode::Write, sms), (1, 96));
        assert_eq!(
            stream_shape(2048, 2048, GemvMode::Accumulate, sms),
            (2, 128)
        );
        assert_eq!(stream_shape(16384, 2048, GemvMode::SwiGlu, sms), (1, 132));
        assert_eq!(
            stream_shape(2048, 8192, GemvMode::Accumulate, sms),
            (2, 128)
        );
        assert_eq!(stream_shape(128256, 2048, GemvMode::Write, sms), (1, 132));
        // small: a slice keeps at least 32 words (512 columns split at most two ways).
        assert_eq!(stream_shape(1024, 512, GemvMode::Write, sms), (2, 64));
        assert_eq!(stream_shape(512, 1408, GemvMode::Accumulate, sms), (4, 64));
        assert_eq!(stream_shape(2816, 512, GemvMode::SwiGlu, sms), (1, 88));
        // Degenerate: one row, one SM.
        assert_eq!(stream_shape(1, 8, GemvMode::Write, 1), (1, 1));
    }
}
