//! [`Decoder`]: a Llama model on one cuhal device, generating tokens for a batch of sequences
//! with one decode step recorded once as a graph and replayed per token.
//!
//! The device holds everything a step reads and writes: the weights, the key/value cache, the
//! activations, each sequence's position (`pos`) and its tokens (`history[position][sequence]`).
//! A step embeds the token at each sequence's position, runs every layer, computes the logits,
//! and its last kernel (`argmax_advance`) writes the most likely next token into `history` at
//! the next position and advances `pos`; so the next replay reads both from device memory, and
//! tokens flow with no host round trip. The host submits steps ahead, chained on one semaphore,
//! and reads the generated tokens back every few steps.
//!
//! A prompt is prefilled by the same step, once per prompt position, all in one submission:
//! `argmax_advance` leaves `history` alone while the next position still holds the prompt
//! (`prompt_len`), so the step at the last prompt position produces the first new token.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cuhal::{Buffer, BufferRange, CommandBuffer, CommandRecorder, Device, HostBuffer, Semaphore};

use super::kernels::{KernelImage, Kernels, MAX_HEAD_DIM};
use super::step::{self, StepBuffers};
use super::weights::DeviceWeights;
use crate::error::{Error, Result};
use crate::reference::Rope;
use crate::weights::Weights;
use crate::{DType, LlamaConfig};

/// The largest batch a [`Decoder`] takes.
pub const MAX_BATCH: usize = 64;
/// How long the host waits for any one piece of GPU work before calling it a hang.
const WAIT: Duration = Duration::from_secs(120);

/// How a [`Decoder`] is built.
#[derive(Clone, Debug)]
pub struct DecoderOptions {
    /// Sequences decoded together (1 to [`MAX_BATCH`]); every step advances each by one token.
    pub batch: usize,
    /// Positions of the key/value cache per sequence: the prompt plus the generated tokens must
    /// fit (at most the model's `max_position_embeddings`).
    pub capacity: usize,
    /// The kernel image to load ([`KernelImage::Fatbin`] on a GPU).
    pub image: KernelImage,
    /// Launch every kernel of the step after the first with a programmatic dependency on the
    /// one before (programmatic dependent launch): its launch overlaps the previous kernel's
    /// run, and it waits for that kernel's results on the device. Taken only where it can be:
    /// compute capability 9.0 and later, and a queue that does not trace (a trace's zone edges
    /// sit between two kernels); [`Decoder::programmatic`] says whether it was.
    pub programmatic: bool,
}

impl Default for DecoderOptions {
    fn default() -> Self {
        DecoderOptions {
            batch: 1,
            capacity: 512,
            image: KernelImage::Fatbin,
            programmatic: true,
        }
    }
}

/// How [`Decoder::generate`] paces the host.
#[derive(Copy, Clone, Debug)]
pub struct GenerateOptions {
    /// Steps submitted ahead of the last one seen complete.
    pub ahead: usize,
    /// Steps between two reads of the generated tokens.
    pub read_every: usize,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            ahead: 8,
            read_every: 32,
        }
    }
}

/// What [`Decoder::generate`] returns.
#[derive(Clone, Debug)]
pub struct Generation {
    /// Each sequence's generated tokens (the prompt not included).
    pub tokens: Vec<Vec<u32>>,
    /// The prefill's time: the prompt's steps, up to the first new token.
    pub prefill: Duration,
    /// The time between the completions of consecutive decode steps, as the host saw them
    /// (one per generated token after the first).
    pub step_times: Vec<Duration>,
    /// The host time of each decode step's submission (`Queue::execute`), one per step: what
    /// the submitting thread pays per token.
    pub submit_times: Vec<Duration>,
    /// From the first decode step's submission to the last token read.
    pub decode: Duration,
}

/// The device memory a [`Decoder`] holds: the weights, the key/value cache, and a workspace
/// (tokens, positions, rotary frequencies, activations), each allocated once when it is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryUse {
    /// The weights' bytes as uploaded (q/k/v and gate/up laid out back to back).
    pub weights: usize,
    /// The key/value cache: layers x 2 x batch x key/value heads x capacity x head size x the
    /// dtype's size.
    pub cache: usize,
    /// Everything else: `[capacity][batch]` tokens, per-sequence positions and prompt lengths,
    /// the rotary frequencies and the step's f32 activations (the logits the largest).
    pub workspace: usize,
}

impl MemoryUse {
    /// All of it.
    pub fn total(&self) -> usize {
        self.weights + self.cache + self.workspace
    }
}

/// A Llama model on a device, ready to generate.
pub struct Decoder<'d> {
    device: &'d Device,
    config: LlamaConfig,
    batch: usize,
    capacity: usize,
    weights: DeviceWeights,
    buffers: StepBuffers,
    /// The step's kernels (kept for [`Decoder::record_step`]).
    kernels: Kernels,
    /// What the step was recorded for.
    options: DecoderOptions,
    /// The decode step, recorded once.
    step: Arc<dyn CommandBuffer>,
    /// The names of the step's kernels, in order (its trace zones).
    kernel_names: Vec<String>,
    /// Signalled by every submission of the chain (steps, prefills, state writes).
    done: Semaphore,
    /// The last value a submission of the chain signals.
    submitted: u64,
    /// Signalled by every token read.
    read_done: Semaphore,
    /// The last value a token read signals.
    reads: u64,
    /// The current prompt's length (0: no prompt started).
    prompt_len: usize,
    /// Steps run since the prompt started (= every sequence's position).
    position: usize,
}

impl<'d> Decoder<'d> {
    /// Checks that the decoder computes `config`'s model, uploads `weights` to `device`,
    /// allocates the cache and activations and records the decode step.
    pub fn new(
        device: &'d Device,
        config: &LlamaConfig,
        weights: &Weights<'_>,
        options: &DecoderOptions,
    ) -> Result<Self> {
        check_shape(config, weights.dtype, options)?;
        let kernels = Kernels::load(device, weights.dtype, options.image)?;
        let attention_smem = options.capacity * 4;
        let limit = kernels.attention.max_dynamic_shared_memory_optin() as usize;
        if attention_smem > limit {
            return Err(Error::InvalidConfig {
                field: "capacity",
                reason: format!(
                    "{} positions need {attention_smem} bytes of attention scores in shared \
                     memory; the device allows {limit}",
                    options.capacity
                ),
            });
        }
        let dtype = weights.dtype;
        let weights = DeviceWeights::upload(device, weights)?;
        let inv_freq = Rope::new(config).inv_freq().to_vec();
        let buffers = StepBuffers::new(
            device,
            config,
            dtype,
            options.batch,
            options.capacity,
            &inv_freq,
        )?;
        let mut options = options.clone();
        options.programmatic &=
            device.info().compute_capability >= (9, 0) && device.queue(0).trace().is_none();
        let (step, kernel_names) =
            step::record(device, config, &kernels, &weights, &buffers, &options)?;
        Ok(Decoder {
            device,
            config: config.clone(),
            batch: options.batch,
            capacity: options.capacity,
            weights,
            buffers,
            kernels,
            options,
            step,
            kernel_names,
            done: device.create_semaphore(0),
            submitted: 0,
            read_done: device.create_semaphore(0),
            reads: 0,
            prompt_len: 0,
            position: 0,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// Sequences per step.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Positions of the cache per sequence.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The decode step's command buffer (one graph; replayed by every step).
    pub fn step_command_buffer(&self) -> &Arc<dyn CommandBuffer> {
        &self.step
    }

    /// Records the decode step's commands (the same kernels, arguments and buffers as
    /// [`step_command_buffer`](Self::step_command_buffer)'s) into `cb`, which is left
    /// recording: for a caller that replays the step its own way, e.g. a benchmark launching
    /// the graph with the driver's calls. Replays of it and of the decoder's step share the
    /// decoder's state on the device (positions, tokens, cache), so they must not overlap, and
    /// [`position`](Self::position) does not count them.
    pub fn record_step(&self, cb: &mut dyn CommandRecorder) -> Result<()> {
        step::record_into(
            cb,
            &self.config,
            &self.kernels,
            &self.weights,
            &self.buffers,
            &self.options,
        )
        .map(drop)
    }

    /// Whether the step's kernels launch with programmatic dependencies (see
    /// [`DecoderOptions::programmatic`]).
    pub fn programmatic(&self) -> bool {
        self.options.programmatic
    }

    /// The names of the step's kernels, in launch order: each is a debug group, so a trace
    /// shows one zone per kernel; traced at FINE, each holds the kernel's stamped zone (timed
    /// by its own `%globaltimer` stamps, `cuhal_zone_stamp.cuh`).
    pub fn kernel_names(&self) -> &[String] {
        &self.kernel_names
    }

    /// Bytes of weights a decode step reads (see [`DeviceWeights::bytes_per_step`]).
    pub fn weight_bytes_per_step(&self) -> usize {
        self.weights.bytes_per_step()
    }

    /// The device memory this decoder holds (see [`MemoryUse`]).
    pub fn memory(&self) -> MemoryUse {
        MemoryUse {
            weights: self.weights.buffer.len(),
            cache: self.buffers.cache_bytes(),
            workspace: self.buffers.workspace_bytes(),
        }
    }

    /// The buffer holding every weight.
    pub fn weights_buffer(&self) -> &Arc<Buffer> {
        &self.weights.buffer
    }

    /// Steps run since the prompt started: the position every sequence is at.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Starts new sequences: `prompts` (one per sequence of the batch, all of one length, at
    /// least one token each, every token in the vocabulary) are written as the first
    /// positions of `history`, and every position goes back to 0. The cache's old contents are
    /// overwritten as the steps advance.
    pub fn start(&mut self, prompts: &[&[u32]]) -> Result<()> {
        if prompts.len() != self.batch {
            return Err(Error::Prompt {
                reason: format!(
                    "{} prompts for a batch of {} sequences",
                    prompts.len(),
                    self.batch
                ),
            });
        }
        let len = prompts[0].len();
        if len == 0 {
            return Err(Error::EmptyPrompt);
        }
        if prompts.iter().any(|p| p.len() != len) {
            return Err(Error::Prompt {
                reason: "the batch's prompts differ in length".into(),
            });
        }
        if len >= self.capacity {
            return Err(Error::ContextFull {
                cached: 0,
                asked: len + 1,
                max: self.capacity,
            });
        }
        let vocab = self.config.vocab_size;
        if let Some(&token) = prompts
            .iter()
            .flat_map(|p| p.iter())
            .find(|&&t| t as usize >= vocab)
        {
            return Err(Error::TokenOutOfRange {
                token,
                vocab_size: vocab,
            });
        }
        // history[position][sequence] for the prompt's positions.
        let mut rows = Vec::with_capacity(len * self.batch * 4);
        for position in 0..len {
            for prompt in prompts {
                rows.extend_from_slice(&prompt[position].to_ne_bytes());
            }
        }
        let history = self.rows(0, len)?;
        self.write(&history, &rows)?;
        let zeros = vec![0u8; self.batch * 4];
        self.write(&self.buffers.pos.whole(), &zeros)?;
        let lens: Vec<u8> = (0..self.batch)
            .flat_map(|_| (len as u32).to_ne_bytes())
            .collect();
        self.write(&self.buffers.prompt_len.whole(), &lens)?;
        self.prompt_len = len;
        self.position = 0;
        Ok(())
    }

    /// Runs the whole prompt (every prompt position's step) in one submission, producing the
    /// first new token of each sequence; returns without waiting.
    pub fn prefill(&mut self) -> Result<()> {
        let steps = self.prompt_len.saturating_sub(self.position);
        if self.prompt_len == 0 || steps == 0 {
            return Err(Error::Prompt {
                reason: "no prompt to prefill: start() one first".into(),
            });
        }
        let list: Vec<&Arc<dyn CommandBuffer>> = vec![&self.step; steps];
        self.device
            .queue(0)
            .execute(
                &[(&self.done, self.submitted)],
                &[(&self.done, self.submitted + 1)],
                &list,
            )
            .map_err(Error::gpu("submitting the prefill"))?;
        self.submitted += 1;
        self.position += steps;
        Ok(())
    }

    /// Submits one decode step after the last submission; returns without waiting. Allocates
    /// nothing once the queue is warm.
    pub fn submit_step(&mut self) -> Result<()> {
        if self.prompt_len == 0 {
            return Err(Error::Prompt {
                reason: "no sequence started: start() one first".into(),
            });
        }
        if self.position + 1 >= self.capacity {
            return Err(Error::ContextFull {
                cached: self.position + 1,
                asked: 1,
                max: self.capacity,
            });
        }
        self.submit_step_unchecked()
    }

    /// Waits until everything submitted has run.
    pub fn wait(&self) -> Result<()> {
        self.wait_for(self.submitted)
    }

    fn wait_for(&self, value: u64) -> Result<()> {
        self.done
            .wait(value, WAIT)
            .map_err(|e| Error::gpu("waiting for the decoder")(e.into()))
    }

    /// The tokens at positions `from..to` of every sequence, `[position][sequence]`, once the
    /// steps submitted so far have run.
    pub fn read_history(&mut self, from: usize, to: usize) -> Result<Vec<u32>> {
        let host = self
            .device
            .create_host_buffer((to - from).max(1) * self.batch * 4)
            .map_err(Error::gpu("allocating a read buffer"))?;
        let mut out = vec![0u32; (to - from) * self.batch];
        if to > from {
            self.read_rows(&host, from, to)?;
            self.collect(&host, self.reads, to - from, &mut out)?;
        }
        Ok(out)
    }

    /// Issues a read of history rows `from..to` into `host` after the last submission.
    fn read_rows(&mut self, host: &Arc<HostBuffer>, from: usize, to: usize) -> Result<()> {
        let rows = self.rows(from, to)?;
        self.device
            .queue(0)
            .read(
                &[(&self.done, self.submitted)],
                &[(&self.read_done, self.reads + 1)],
                &rows,
                host,
                0,
            )
            .map_err(Error::gpu("reading the generated tokens"))?;
        self.reads += 1;
        Ok(())
    }

    /// Waits for read `value` and copies its `rows` rows out of `host` into `out`.
    fn collect(&self, host: &HostBuffer, value: u64, rows: usize, out: &mut [u32]) -> Result<()> {
        self.read_done
            .wait(value, WAIT)
            .map_err(|e| Error::gpu("waiting for a read")(e.into()))?;
        let n = rows * self.batch;
        let mut bytes = [0u8; 4];
        for (i, slot) in out[..n].iter_mut().enumerate() {
            host.read(i * 4, &mut bytes)
                .map_err(|e| Error::gpu("reading the host buffer")(e.into()))?;
            *slot = u32::from_ne_bytes(bytes);
        }
        Ok(())
    }

    /// The logits of the last step run, `[sequence][vocab]`, once it has run.
    pub fn logits(&mut self) -> Result<Vec<f32>> {
        let source = self.buffers.logits.whole();
        let host = self
            .device
            .create_host_buffer(source.len())
            .map_err(Error::gpu("allocating a read buffer"))?;
        self.device
            .queue(0)
            .read(
                &[(&self.done, self.submitted)],
                &[(&self.read_done, self.reads + 1)],
                &source,
                &host,
                0,
            )
            .map_err(Error::gpu("reading the logits"))?;
        self.reads += 1;
        self.read_done
            .wait(self.reads, WAIT)
            .map_err(|e| Error::gpu("waiting for a read")(e.into()))?;
        let mut bytes = vec![0u8; source.len()];
        host.read(0, &mut bytes)
            .map_err(|e| Error::gpu("reading the host buffer")(e.into()))?;
        Ok(bytes
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// Teacher forcing: runs `tokens` one position at a time (every sequence of the batch the
    /// same tokens) and returns the first sequence's logits at each position,
    /// `[position][vocab]`: what the model predicts after each prefix.
    pub fn teacher_force(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let prompts = vec![tokens; self.batch];
        self.start(&prompts)?;
        let vocab = self.config.vocab_size;
        let mut out = Vec::with_capacity(tokens.len() * vocab);
        for _ in 0..tokens.len() {
            self.submit_step_unchecked()?;
            let logits = self.logits()?;
            out.extend_from_slice(&logits[..vocab]);
        }
        Ok(out)
    }

    /// [`submit_step`](Self::submit_step) without its checks (teacher forcing replays steps
    /// inside the prompt).
    fn submit_step_unchecked(&mut self) -> Result<()> {
        self.device
            .queue(0)
            .execute(
                &[(&self.done, self.submitted)],
                &[(&self.done, self.submitted + 1)],
                &[&self.step],
            )
            .map_err(Error::gpu("submitting a decode step"))?;
        self.submitted += 1;
        self.position += 1;
        Ok(())
    }

    /// Greedy generation of `count` tokens after each sequence's prompt: the prefill in one
    /// submission, then `count - 1` decode steps, `options.ahead` of them in flight, the tokens
    /// read back every `options.read_every` steps.
    pub fn generate(
        &mut self,
        prompts: &[&[u32]],
        count: usize,
        options: &GenerateOptions,
    ) -> Result<Generation> {
        let ahead = options.ahead.max(1);
        let read_every = options.read_every.max(1);
        self.start(prompts)?;
        let n = self.prompt_len;
        if n + count > self.capacity {
            return Err(Error::ContextFull {
                cached: n,
                asked: count,
                max: self.capacity,
            });
        }
        let tokens: Vec<Vec<u32>> = (0..self.batch).map(|_| Vec::with_capacity(count)).collect();
        let step_times = Vec::with_capacity(count);
        if count == 0 {
            return Ok(Generation {
                tokens,
                prefill: Duration::ZERO,
                step_times,
                submit_times: Vec::new(),
                decode: Duration::ZERO,
            });
        }
        let started = Instant::now();
        self.prefill()?;
        self.wait()?;
        let prefill = started.elapsed();

        // Two host buffers, alternating: a read is issued into one while the other's is
        // collected.
        let hosts = [(); 2].map(|()| {
            self.device
                .create_host_buffer(read_every * self.batch * 4)
                .map_err(Error::gpu("allocating a read buffer"))
        });
        let [a, b] = hosts;
        let mut reads = TokenReads {
            hosts: [a?, b?],
            pending: [None, None],
            next_host: 0,
            rows_read: n,
            tokens,
            scratch: vec![0u32; read_every * self.batch],
        };
        let decode_started = Instant::now();
        let mut steps = StepTimes {
            seen: self.submitted,
            last_seen: decode_started,
            times: step_times,
        };
        let mut submit_times = Vec::with_capacity(count);
        for _ in 1..count {
            self.wait_steps(&mut steps, ahead as u64 - 1)?;
            let submitting = Instant::now();
            self.submit_step()?;
            submit_times.push(submitting.elapsed());
            if self.position + 1 - reads.rows_read >= read_every {
                self.read_chunk(&mut reads)?;
            }
        }
        self.wait_steps(&mut steps, 0)?;
        while reads.rows_read < n + count {
            self.read_chunk(&mut reads)?;
        }
        for slot in 0..2 {
            let index = (reads.next_host + slot) % 2;
            self.take(&mut reads, index)?;
        }
        Ok(Generation {
            tokens: reads.tokens,
            prefill,
            step_times: steps.times,
            submit_times,
            decode: decode_started.elapsed(),
        })
    }

    /// Waits for submitted steps in order until at most `behind` are not seen done, timing
    /// each.
    fn wait_steps(&self, steps: &mut StepTimes, behind: u64) -> Result<()> {
        while self.submitted - steps.seen > behind {
            steps.seen += 1;
            self.wait_for(steps.seen)?;
            let now = Instant::now();
            steps.times.push(now - steps.last_seen);
            steps.last_seen = now;
        }
        Ok(())
    }

    /// Issues the read of the produced rows not yet read (at most one host buffer's worth)
    /// into the next host buffer, first collecting what that buffer holds.
    fn read_chunk(&mut self, reads: &mut TokenReads) -> Result<()> {
        let index = reads.next_host;
        self.take(reads, index)?;
        let capacity = reads.hosts[index].len() / (self.batch * 4);
        let from = reads.rows_read;
        let to = (self.position + 1).min(from + capacity);
        if to <= from {
            return Ok(());
        }
        self.read_rows(&reads.hosts[index], from, to)?;
        reads.pending[index] = Some((self.reads, to - from));
        reads.rows_read = to;
        reads.next_host = 1 - index;
        Ok(())
    }

    /// Collects the read pending in host buffer `index`, if any, into each sequence's tokens.
    fn take(&self, reads: &mut TokenReads, index: usize) -> Result<()> {
        let Some((value, rows)) = reads.pending[index].take() else {
            return Ok(());
        };
        let scratch = &mut reads.scratch;
        self.collect(&reads.hosts[index], value, rows, scratch)?;
        for row in scratch[..rows * self.batch].chunks_exact(self.batch) {
            for (sequence, &token) in reads.tokens.iter_mut().zip(row) {
                sequence.push(token);
            }
        }
        Ok(())
    }

    /// History rows `from..to` (every sequence's tokens at those positions).
    fn rows(&self, from: usize, to: usize) -> Result<BufferRange> {
        let row = self.batch * 4;
        self.buffers
            .history
            .range(from * row, (to - from) * row)
            .map_err(|e| Error::gpu("a history range")(e.into()))
    }

    /// Writes `data` to `target` after the last submission of the chain.
    fn write(&mut self, target: &BufferRange, data: &[u8]) -> Result<()> {
        self.device
            .queue(0)
            .write(
                &[(&self.done, self.submitted)],
                &[(&self.done, self.submitted + 1)],
                target,
                data,
            )
            .map_err(Error::gpu("writing the decoder's state"))?;
        self.submitted += 1;
        Ok(())
    }
}

/// The reads of the tokens a decode produces: two host buffers, alternating (a read is issued
/// into one while the other's is collected), and the tokens collected so far.
struct TokenReads {
    hosts: [Arc<HostBuffer>; 2],
    /// The read issued into each host buffer and not collected: (read value, rows).
    pending: [Option<(u64, usize)>; 2],
    /// The host buffer the next read goes into.
    next_host: usize,
    /// Rows up to this one are read (or being read); rows up to `position` are produced.
    rows_read: usize,
    /// Each sequence's tokens.
    tokens: Vec<Vec<u32>>,
    scratch: Vec<u32>,
}

/// The decode steps seen done, and how long each took.
struct StepTimes {
    /// The last step value seen done.
    seen: u64,
    /// When it was seen.
    last_seen: Instant,
    times: Vec<Duration>,
}

/// Refuses a model or options the kernels do not compute.
fn check_shape(config: &LlamaConfig, dtype: DType, options: &DecoderOptions) -> Result<()> {
    let refuse = |field: &'static str, found: String| Err(Error::Unsupported { field, found });
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return refuse(
            "dtype",
            format!(
                "{} (the GPU path runs float16 and bfloat16)",
                dtype.torch_name()
            ),
        );
    }
    for (field, value) in [
        ("hidden_size", config.hidden_size),
        ("intermediate_size", config.intermediate_size),
    ] {
        if !value.is_multiple_of(8) {
            return refuse(
                field,
                format!("{value} (the GEMV reads rows 8 elements at a time: a multiple of 8)"),
            );
        }
    }
    if !config.q_dim().is_multiple_of(8) {
        return refuse(
            "num_attention_heads * head_dim",
            format!("{} (a multiple of 8 for the GEMV)", config.q_dim()),
        );
    }
    if !config.head_dim.is_multiple_of(8) || config.head_dim > MAX_HEAD_DIM {
        return refuse(
            "head_dim",
            format!(
                "{} (attention reads keys and values 8 elements at a time: a multiple of 8, \
                 at most {MAX_HEAD_DIM})",
                config.head_dim
            ),
        );
    }
    if config.num_key_value_heads == 0
        || !config
            .num_attention_heads
            .is_multiple_of(config.num_key_value_heads)
    {
        return refuse(
            "num_key_value_heads",
            format!(
                "{} (must divide num_attention_heads {})",
                config.num_key_value_heads, config.num_attention_heads
            ),
        );
    }
    if options.batch == 0 || options.batch > MAX_BATCH {
        return Err(Error::InvalidConfig {
            field: "batch",
            reason: format!("{} (1 to {MAX_BATCH})", options.batch),
        });
    }
    if options.capacity < 2 || options.capacity > config.max_position_embeddings {
        return Err(Error::InvalidConfig {
            field: "capacity",
            reason: format!(
                "{} (2 to max_position_embeddings {})",
                options.capacity, config.max_position_embeddings
            ),
        });
    }
    Ok(())
}
