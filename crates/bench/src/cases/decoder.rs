//! Case 16, the decoder: a Llama model (random fp16 weights of the `small` and `1b` shapes,
//! written to a temporary folder at run time) generating tokens with `cuhal_decoder`, against
//! the same decode step's graph launched with the driver's calls.
//!
//! In one process, for each shape:
//!
//! - **per-token wall time, batch 1**: cuhal's side is [`Decoder::generate`] (the decode step
//!   recorded once as a graph command buffer, [`GenerateOptions::default`]'s steps submitted
//!   ahead through `Queue::execute`, chained on a semaphore, the tokens read back every few
//!   steps), each sample a turn's mean time between two consecutive steps' completions as the
//!   host saw them. The floor records the same step ([`Decoder::record_step`]) into a graph of
//!   its own, instantiates it with `cuGraphInstantiateWithFlags` and launches it with
//!   `cuGraphLaunch` + `cuEventRecord` per token on a raw stream, the same number ahead, each
//!   sample a turn's mean time between two events' completions (spinning
//!   `cuEventSynchronize`). The two take turns of
//!   [`TOKENS`] tokens from a one-token prompt (the same positions, so the same attention
//!   lengths), who goes first alternating. The floor's tokens must equal cuhal's: the same
//!   graph on the same weights. Goal: cuhal within [`GOAL_RAW`] of the floor;
//! - **GPU busy time per step**: timing events around one replay of the floor's graph queued
//!   right behind another (so the GPU never waits for the host), on an otherwise idle GPU.
//!   Goal: cuhal's per-token wall time within [`GOAL_BUSY`] of it;
//! - **the weights-read floor**: the bytes of weights one step reads
//!   ([`Decoder::weight_bytes_per_step`]) at the rate of a large `cuMemcpyDtoDAsync` (bytes read
//!   plus written per second), measured in the same run. Goal on `1b`: cuhal's per-token wall
//!   time within [`GOAL_WEIGHTS`] of it (on `small` the launches, not the bytes, set the pace:
//!   reported only);
//! - **tokens/s at batch 1, 8 and 32** (a decoder per batch, decode step time over the batch),
//!   and **the prefill of a 512-token prompt** (one submission of 512 steps, to the first new
//!   token), beside 512 raw launches of the floor's graph.
//!
//! `--quick` runs the `small` shape only, with fewer turns.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result, bail, ensure};
use cuhal::{Device, DeviceOptions, GraphCommandBuffer, GraphExec};
use cuhal_decoder::gpu::{Decoder, DecoderOptions, GenerateOptions, KernelImage};
use cuhal_decoder::{LlamaConfig, ModelFiles, write_random_model};
use cuhal_sys::{CUgraphExec, Event, PrimaryContext, Stream, cu};

use super::{Env, in_turns, progress, summarize};
use crate::gpu::raw::SyncMode;
use crate::hal::Hal;
use crate::report::{Comparison, Goal, Report};
use crate::stats::Summary;

/// Tokens per turn (after a one-token prompt).
pub const TOKENS: usize = 64;
/// Turns per side (`--quick`: [`QUICK_ROUNDS`]).
pub const ROUNDS: usize = 20;
/// Turns per side with `--quick`.
pub const QUICK_ROUNDS: usize = 3;
/// Tokens of the prefill's prompt.
pub const PREFILL: usize = 512;
/// Cache positions per sequence: the prefill's prompt and its first token, with room.
pub const CAPACITY: usize = 576;
/// The batches whose tokens/s are reported.
pub const BATCHES: [usize; 3] = [1, 8, 32];
/// The goal: cuhal's per-token wall time at most this many times the raw launches'.
pub const GOAL_RAW: f64 = 1.02;
/// The goal: cuhal's per-token wall time at most this many times the GPU's busy time per step.
pub const GOAL_BUSY: f64 = 1.05;
/// The goal on `1b`: cuhal's per-token wall time at most this many times the weights-read floor.
pub const GOAL_WEIGHTS: f64 = 1.3;
/// Bytes of each buffer of the copy that measures the memory rate (`--quick`: a quarter).
const COPY_BYTES: usize = 1 << 30;
/// The model's random seed.
const SEED: u64 = 16;

/// Runs case 16.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let shapes: &[&str] = if env.quick {
        &["small"]
    } else {
        &["small", "1b"]
    };
    if env.quick {
        report
            .notes
            .push("case 16: --quick runs the small shape only (1b needs a 2.5 GB model)".into());
    }
    let hal = Hal::open(DeviceOptions::default())?;
    for &shape in shapes {
        let config =
            LlamaConfig::preset(shape).with_context(|| format!("no decoder preset {shape}"))?;
        let dir = ScratchDir::new(shape)?;
        progress(&format!(
            "case 16 (decoder): writing a random {shape} model to {}",
            dir.0.display()
        ));
        write_random_model(&dir.0, &config, SEED)
            .with_context(|| format!("writing the random {shape} model"))?;
        let files = ModelFiles::open(&dir.0).context("opening the random model")?;
        shape_case(env, &hal.device, shape, &config, &files, report)
            .with_context(|| format!("the {shape} model"))?;
    }
    Ok(())
}

/// Every measurement of one shape.
fn shape_case(
    env: &Env<'_>,
    device: &Device,
    shape: &'static str,
    config: &LlamaConfig,
    files: &ModelFiles,
    report: &mut Report,
) -> Result<()> {
    let ctx = device.context();
    ctx.bind()?;
    let rounds = if env.quick { QUICK_ROUNDS } else { ROUNDS };
    let weights = files.weights()?;
    let mut decoder = Decoder::new(device, config, &weights, &decoder_options(1))
        .context("building the batch-1 decoder")?;
    let raw = RawStep::new(ctx, &decoder)?;
    let stream = Stream::new(ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?;
    let ahead = GenerateOptions::default().ahead;
    let events = (0..ahead)
        .map(|_| Event::new(ctx, SyncMode::Spin.flags()))
        .collect::<Result<Vec<_>, _>>()?;
    let prompt: &[u32] = &[1];
    let prompts = [prompt];

    // Warm both sides up (module loads, the graphs' first launches), and take the tokens the
    // floor must reproduce.
    let expected = decoder
        .generate(&prompts, TOKENS, &GenerateOptions::default())?
        .tokens
        .remove(0);
    raw_tokens(
        &mut decoder,
        &raw,
        &stream,
        &events,
        prompt,
        &mut Vec::new(),
    )?;

    progress(&format!(
        "case 16 (decoder): {shape} batch 1, cuhal and raw launches, {rounds} turns of \
         {TOKENS} tokens each"
    ));
    let mut submit_samples = Vec::with_capacity(rounds * TOKENS);
    let [mut cuhal_samples, mut raw_samples] =
        in_turns::<2>(rounds, rounds * TOKENS, |_, side, samples| {
            if side == 0 {
                let generation = decoder.generate(&prompts, TOKENS, &GenerateOptions::default())?;
                submit_samples.extend(generation.submit_times.iter().map(|t| t.as_nanos() as f64));
                ensure!(
                    generation.tokens[0] == expected,
                    "cuhal's tokens changed between turns"
                );
                samples.push(mean_ns(
                    generation.step_times.iter().map(|t| t.as_nanos() as f64),
                ));
            } else {
                let mut steps = Vec::with_capacity(TOKENS);
                let tokens = raw_tokens(&mut decoder, &raw, &stream, &events, prompt, &mut steps)?;
                samples.push(mean_ns(steps.iter().copied()));
                ensure!(
                    tokens == expected,
                    "the raw launches' tokens differ from cuhal's: {:?} against {:?}",
                    &tokens[..8.min(tokens.len())],
                    &expected[..8.min(expected.len())]
                );
            }
            Ok(())
        })?;
    let cuhal = summarize("case 16 cuhal per token", &mut cuhal_samples)?;
    let submit = summarize("case 16 cuhal submission", &mut submit_samples)?;
    let floor = summarize("case 16 raw per token", &mut raw_samples)?;

    let mut busy = busy_per_step(&mut decoder, &raw, &stream, prompt, rounds * 2)?;
    let busy = summarize("case 16 GPU busy per step", &mut busy)?;
    let copy = copy_rate(device, &stream, env.quick)?;
    let weight_bytes = decoder.weight_bytes_per_step();
    let weights_floor = copy.per_item(copy.bytes / weight_bytes as f64);

    let case = "16";
    report.measured(
        case,
        format!("{shape} host time of one decode step's submission (Queue::execute), cuhal"),
        submit,
    );
    report.measured(
        case,
        format!("floor: {shape} decode step replayed with cuGraphLaunch + cuEventRecord, {ahead} ahead, per token"),
        floor,
    );
    report.measured(
        case,
        format!("{shape} GPU busy per decode step (timing events, back-to-back replays)"),
        busy,
    );
    report.measured(
        case,
        format!(
            "floor: {} of {} MiB, scaled to {:.0} MB read + written",
            cuhal_sys::cu_name!(cuMemcpyDtoDAsync),
            copy.buffer >> 20,
            weight_bytes as f64 / 1e6
        ),
        weights_floor,
    );
    let per_second = |ns: f64| if ns > 0.0 { 1e9 / ns } else { 0.0 };
    report.comparisons.push(Comparison::new(
        case,
        format!(
            "decoder {shape} fp16 batch 1: per-token wall, Decoder::generate against the same graph with cuGraphLaunch + cuEventRecord (turns interleaved)"
        ),
        Some(cuhal),
        Some(floor),
        Goal::RatioAtMost(GOAL_RAW),
    ));
    report.comparisons.push(Comparison::new(
        case,
        format!("decoder {shape} batch 1: per-token wall against the GPU's busy time per step"),
        Some(cuhal),
        Some(busy),
        Goal::RatioAtMost(GOAL_BUSY),
    ));
    report.comparisons.push(
        Comparison::new(
            case,
            format!(
                "decoder {shape} batch 1: per-token wall against the weights-read floor ({:.0} MB per step at the device-to-device copy rate)",
                weight_bytes as f64 / 1e6
            ),
            Some(cuhal),
            Some(weights_floor),
            if shape == "1b" {
                Goal::RatioAtMost(GOAL_WEIGHTS)
            } else {
                Goal::Report
            },
        )
        .note(format!(
            "case 16 {shape}: copy rate {:.0} GB/s (read + written); {:.0} tokens/s at batch 1",
            copy.bytes / copy.summary.median,
            per_second(cuhal.median)
        )),
    );

    // The prefill: cuhal's one submission of 512 steps, and 512 raw launches.
    let long: Vec<u32> = (0..PREFILL as u32).map(|i| 1 + i % 1000).collect();
    let prefill_rounds = if env.quick { 2 } else { 5 };
    let [mut cuhal_prefill, mut raw_prefill] =
        in_turns::<2>(prefill_rounds, prefill_rounds, |_, side, samples| {
            if side == 0 {
                let generation = decoder.generate(&[&long[..]], 1, &GenerateOptions::default())?;
                samples.push(generation.prefill.as_nanos() as f64);
            } else {
                samples.push(raw_prefill_ns(
                    &mut decoder,
                    &raw,
                    &stream,
                    &events[0],
                    &long,
                )?);
            }
            Ok(())
        })?;
    report.comparisons.push(Comparison::new(
        case,
        format!(
            "decoder {shape} batch 1: prefill of a {PREFILL}-token prompt (one submission of {PREFILL} steps, to the first token; floor: {PREFILL} cuGraphLaunch + sync)"
        ),
        Some(summarize("case 16 cuhal prefill", &mut cuhal_prefill)?),
        Some(summarize("case 16 raw prefill", &mut raw_prefill)?),
        Goal::Report,
    ));
    drop(raw);
    drop(decoder);

    // Tokens/s at each batch (batch 1 from the turns above).
    for batch in BATCHES {
        let per_token = if batch == 1 {
            cuhal
        } else {
            let mut decoder = Decoder::new(device, config, &weights, &decoder_options(batch))
                .with_context(|| format!("building the batch-{batch} decoder"))?;
            let prompts = vec![prompt; batch];
            decoder.generate(&prompts, TOKENS, &GenerateOptions::default())?;
            let mut samples = Vec::with_capacity(rounds * TOKENS);
            for _ in 0..rounds.div_ceil(2) {
                let generation = decoder.generate(&prompts, TOKENS, &GenerateOptions::default())?;
                samples.extend(generation.step_times.iter().map(|t| t.as_nanos() as f64));
            }
            summarize(&format!("case 16 batch {batch}"), &mut samples)?.per_item(batch as f64)
        };
        report.comparisons.push(
            Comparison::new(
                case,
                format!(
                    "decoder {shape} batch {batch}: wall per token (decode step / {batch}), {:.0} tokens/s",
                    per_second(per_token.median)
                ),
                Some(per_token),
                None,
                Goal::Report,
            ),
        );
    }
    Ok(())
}

fn decoder_options(batch: usize) -> DecoderOptions {
    DecoderOptions {
        batch,
        capacity: CAPACITY,
        image: KernelImage::Fatbin,
        ..DecoderOptions::default()
    }
}

/// The mean of a turn's step times: its per-token time. (A median of single steps would
/// understate a side that sees completions in bursts: two steps seen at once give one long and
/// one short sample.)
fn mean_ns(samples: impl ExactSizeIterator<Item = f64>) -> f64 {
    let n = samples.len().max(1) as f64;
    samples.sum::<f64>() / n
}

/// The decode step recorded again into a graph of its own, and that graph instantiated with
/// the driver's call: what a program on the raw driver would launch.
struct RawStep {
    ctx: Arc<PrimaryContext>,
    exec: CUgraphExec,
    /// Owns the graph and the kernels' arguments; outlives `exec`.
    _recorded: GraphExec,
}

impl RawStep {
    fn new(ctx: &Arc<PrimaryContext>, decoder: &Decoder<'_>) -> Result<Self> {
        let mut cb = GraphCommandBuffer::new(ctx, None)?;
        decoder.record_step(&mut cb)?;
        let recorded = cb.end()?;
        let mut exec: CUgraphExec = std::ptr::null_mut();
        // SAFETY: a complete graph (ended), kept alive with `recorded` for as long as the
        // executable; `exec` is a valid out-pointer.
        unsafe {
            cu!(
                ctx.api(),
                cuGraphInstantiateWithFlags(&mut exec, recorded.raw_graph(), 0)
            )
        }?;
        Ok(RawStep {
            ctx: Arc::clone(ctx),
            exec,
            _recorded: recorded,
        })
    }

    /// `cuGraphLaunch` on `stream`.
    fn launch(&self, stream: &Stream) -> Result<()> {
        // SAFETY: a live executable and stream of this context; the buffers the graph uses
        // belong to the decoder, which outlives this (and every launch is waited for).
        unsafe { cu!(self.ctx.api(), cuGraphLaunch(self.exec, stream.raw())) }?;
        Ok(())
    }
}

impl Drop for RawStep {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: a live executable whose launches were all waited for, destroyed once.
        let _ = unsafe { cu!(self.ctx.api(), cuGraphExecDestroy(self.exec)) };
    }
}

/// Starts the sequence again at `prompt` through the decoder and waits for it.
fn restart(decoder: &mut Decoder<'_>, prompt: &[u32]) -> Result<()> {
    decoder.start(&[prompt])?;
    decoder.wait()?;
    Ok(())
}

/// The floor's turn: the one-token prompt's step, then `TOKENS - 1` steps launched
/// `events.len()` ahead, each followed by an event; appends the times between consecutive
/// events' completions to `samples` and returns the tokens generated.
fn raw_tokens(
    decoder: &mut Decoder<'_>,
    raw: &RawStep,
    stream: &Stream,
    events: &[Event],
    prompt: &[u32],
    samples: &mut Vec<f64>,
) -> Result<Vec<u32>> {
    restart(decoder, prompt)?;
    let ahead = events.len();
    // The prompt's step, waited for, as `generate` waits for its prefill.
    raw.launch(stream)?;
    events[0].record_and_synchronize(stream)?;
    let (mut launched, mut seen) = (0usize, 0usize);
    let mut last = Instant::now();
    let mut take = |seen: &mut usize, last: &mut Instant| -> Result<()> {
        events[*seen % ahead].synchronize()?;
        *seen += 1;
        let now = Instant::now();
        samples.push((now - *last).as_nanos() as f64);
        *last = now;
        Ok(())
    };
    for _ in 1..TOKENS {
        while launched - seen >= ahead {
            take(&mut seen, &mut last)?;
        }
        raw.launch(stream)?;
        events[launched % ahead].record(stream)?;
        launched += 1;
    }
    while seen < launched {
        take(&mut seen, &mut last)?;
    }
    let history = decoder.read_history(prompt.len(), prompt.len() + TOKENS)?;
    Ok(history)
}

/// GPU time of one replay of the floor's graph queued right behind another (so the GPU never
/// waits for the host), `n` samples, positions restarting every [`TOKENS`] / 2 samples.
fn busy_per_step(
    decoder: &mut Decoder<'_>,
    raw: &RawStep,
    stream: &Stream,
    prompt: &[u32],
    n: usize,
) -> Result<Vec<f64>> {
    let ctx = &raw.ctx;
    let (start, end) = (Event::new(ctx, 0)?, Event::new(ctx, 0)?);
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        if i % (TOKENS / 2) == 0 {
            restart(decoder, prompt)?;
        }
        raw.launch(stream)?;
        start.record(stream)?;
        raw.launch(stream)?;
        end.record(stream)?;
        end.synchronize()?;
        let ms = start
            .elapsed_ms(&end)?
            .context("case 16: timing events not complete after a wait")?;
        samples.push(f64::from(ms) * 1e6);
    }
    Ok(samples)
}

/// `PREFILL` raw launches of the step after `restart(prompt)`, then a spinning sync.
fn raw_prefill_ns(
    decoder: &mut Decoder<'_>,
    raw: &RawStep,
    stream: &Stream,
    event: &Event,
    prompt: &[u32],
) -> Result<f64> {
    restart(decoder, prompt)?;
    let t0 = Instant::now();
    for _ in 0..prompt.len() {
        raw.launch(stream)?;
    }
    event.record_and_synchronize(stream)?;
    Ok(t0.elapsed().as_nanos() as f64)
}

/// The device-to-device copy rate.
struct CopyRate {
    /// Time per copy (ns).
    summary: Summary,
    /// Bytes each copy reads plus writes.
    bytes: f64,
    /// Bytes of each buffer.
    buffer: usize,
}

impl CopyRate {
    /// The copy's summary scaled to the time of moving `bytes / k` bytes.
    fn per_item(&self, k: f64) -> Summary {
        self.summary.per_item(k)
    }
}

/// Times a `cuMemcpyDtoDAsync` between two buffers of [`COPY_BYTES`] (a quarter with
/// `quick`), between timing events, after one warm-up copy.
fn copy_rate(device: &Device, stream: &Stream, quick: bool) -> Result<CopyRate> {
    let buffer = if quick { COPY_BYTES / 4 } else { COPY_BYTES };
    let (src, dst) = (device.create_buffer(buffer)?, device.create_buffer(buffer)?);
    let ctx = device.context();
    let (start, end) = (Event::new(ctx, 0)?, Event::new(ctx, 0)?);
    let n = if quick { 3 } else { 10 };
    let mut samples = Vec::with_capacity(n);
    for i in 0..=n {
        start.record(stream)?;
        // SAFETY: two live buffers of `buffer` bytes of this context; waited for below.
        unsafe {
            cu!(
                ctx.api(),
                cuMemcpyDtoDAsync(dst.device_ptr(), src.device_ptr(), buffer, stream.raw())
            )
        }?;
        end.record(stream)?;
        end.synchronize()?;
        let ms = start
            .elapsed_ms(&end)?
            .context("case 16: timing events not complete after a wait")?;
        if i > 0 {
            samples.push(f64::from(ms) * 1e6);
        }
    }
    if samples.iter().any(|&t| t <= 0.0) {
        bail!("case 16: a {buffer}-byte copy timed at 0");
    }
    Ok(CopyRate {
        summary: summarize("case 16 copy", &mut samples)?,
        bytes: 2.0 * buffer as f64,
        buffer,
    })
}

/// A folder of the temporary directory for the random model, removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(shape: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "cuhal-bench-decoder-{shape}-{}",
            std::process::id()
        ));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("removing an old {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(ScratchDir(dir))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(Path::new(&self.0));
    }
}
