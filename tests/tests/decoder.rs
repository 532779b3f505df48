//! GPU suite: the decoder (`cuhal-decoder`'s GPU path) against its f32 CPU reference on random
//! models written for the test: teacher-forced logits within a tolerance derived from the
//! dtype, argmax agreement on at least 99% of positions, and greedy generation that follows the
//! reference until (at most) a near tie, for a batch of one, a batch of several prompts, a long
//! prefill, and bfloat16.
//!
//! The tolerance. Both sides read the same fp16 (bf16) weights exactly, and the GPU keeps every
//! activation and sum in f32; what it rounds is the key/value cache, stored in the model's
//! dtype (a relative error of at most 2^-11 per element for fp16, 2^-8 for bf16), and its
//! `__expf` (2 ulp). Attention mixes values convexly and a score's error is bounded by the
//! key's relative error times |q||k|, so each layer adds an error of the order of `u` (the
//! unit roundoff) times the size of its output, and the residual stream carries the sum over
//! the layers to the logits. The bound used is `16 u * L * max(1, max |logit|)` per position
//! (L layers): a factor 16 of headroom over that first-order estimate for the summation-order
//! differences of f32 sums (a relative 2^-24 per add, negligible next to u). Two logits closer
//! than that bound are a near tie: either may win the argmax on either side.

use std::path::PathBuf;

use cuhal::DeviceOptions;
use cuhal_decoder::gpu::{Decoder, DecoderOptions, GenerateOptions, KernelImage};
use cuhal_decoder::reference::Model;
use cuhal_decoder::{DType, LlamaConfig, ModelFiles, write_random_model};
use cuhal_gpu_tests::device_support::{driver, ordinal};

/// 4 layers, hidden 256, 8 heads of 32 over 2 key/value heads (grouped 4 to 1), intermediate
/// 704, a 2048-token vocabulary.
fn config(dtype: DType) -> LlamaConfig {
    LlamaConfig {
        hidden_size: 256,
        intermediate_size: 704,
        num_hidden_layers: 4,
        num_attention_heads: 8,
        num_key_value_heads: 2,
        head_dim: 32,
        max_position_embeddings: 1024,
        vocab_size: 2048,
        torch_dtype: dtype,
        rope_theta: 10000.0,
        ..LlamaConfig::small()
    }
}

/// A scratch directory holding a random model, removed when dropped.
struct ModelDir(PathBuf);

impl ModelDir {
    fn new(config: &LlamaConfig, seed: u64) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "cuhal-gpu-decoder-{}-{seed}-{:?}",
            std::process::id(),
            config.torch_dtype
        ));
        let _ = std::fs::remove_dir_all(&dir);
        write_random_model(&dir, config, seed).expect("writing the random model");
        ModelDir(dir)
    }
}

impl Drop for ModelDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The unit roundoff of the key/value cache's dtype.
fn unit_roundoff(dtype: DType) -> f32 {
    match dtype {
        DType::BF16 => 2f32.powi(-8),
        _ => 2f32.powi(-11),
    }
}

/// The per-position logit tolerance (see the module's comment).
fn tolerance(config: &LlamaConfig, reference_row: &[f32]) -> f32 {
    let scale = reference_row.iter().fold(1f32, |m, x| m.max(x.abs()));
    16.0 * unit_roundoff(config.torch_dtype) * config.num_hidden_layers as f32 * scale
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best
}

/// Whether `gpu`'s pick is the reference's, or a near tie with it in the reference's logits.
fn agrees(reference_row: &[f32], gpu_pick: usize, tol: f32) -> bool {
    let best = argmax(reference_row);
    gpu_pick == best || reference_row[best] - reference_row[gpu_pick] <= tol
}

/// Teacher forcing over `tokens` on the GPU and the CPU: every logit within tolerance, and the
/// argmax agreeing (near ties allowed) on at least 99% of positions.
fn check_teacher_forced(decoder: &mut Decoder<'_>, model: &Model, tokens: &[u32]) {
    let config = model.config().clone();
    let vocab = config.vocab_size;
    let gpu = decoder
        .teacher_force(tokens)
        .expect("teacher forcing on the GPU");
    let cpu = model
        .forward(tokens, &mut model.new_cache())
        .expect("teacher forcing on the CPU");
    assert_eq!(gpu.len(), tokens.len() * vocab);
    let mut agreeing = 0;
    let mut worst = (0f32, 0usize);
    for position in 0..tokens.len() {
        let reference = cpu.row(position).unwrap();
        let ours = &gpu[position * vocab..][..vocab];
        let tol = tolerance(&config, reference);
        let diff = reference
            .iter()
            .zip(ours)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            diff.is_finite() && diff <= tol,
            "position {position}: logits differ by {diff} (tolerance {tol})"
        );
        if diff / tol > worst.0 {
            worst = (diff / tol, position);
        }
        if agrees(reference, argmax(ours), tol) {
            agreeing += 1;
        }
    }
    assert!(
        agreeing * 100 >= tokens.len() * 99,
        "argmax agrees on {agreeing} of {} positions",
        tokens.len()
    );
    eprintln!(
        "teacher forcing over {} positions: argmax agrees on {agreeing}; worst logit error {:.3} \
         of the tolerance at position {}",
        tokens.len(),
        worst.0,
        worst.1
    );
}

/// Greedy tokens on the GPU against the reference's: equal, or diverging first at a position
/// where the reference's logits make the GPU's token a near tie.
fn check_generation(model: &Model, prompt: &[u32], ours: &[u32]) {
    let config = model.config();
    let expected = model
        .generate(prompt, ours.len(), &mut model.new_cache())
        .unwrap();
    let Some(first) = (0..ours.len()).find(|&i| ours[i] != expected[i]) else {
        return;
    };
    // The reference's logits at the divergence, after the common prefix.
    let mut prefix = prompt.to_vec();
    prefix.extend_from_slice(&expected[..first]);
    let logits = model.forward(&prefix, &mut model.new_cache()).unwrap();
    let row = logits.last().unwrap();
    let tol = tolerance(config, row);
    assert!(
        agrees(row, ours[first] as usize, tol),
        "generation diverges at token {first} of {}: the GPU chose {}, the reference {} \
         (logits {} and {}, tolerance {tol})\n  gpu: {ours:?}\n  cpu: {expected:?}",
        ours.len(),
        ours[first],
        expected[first],
        row[ours[first] as usize],
        row[expected[first] as usize]
    );
    eprintln!(
        "generation diverges at token {first} of {} at a near tie",
        ours.len()
    );
}

fn run(dtype: DType, batch: usize, prompt_len: usize, count: usize, seed: u64) {
    run_with(&config(dtype), batch, prompt_len, count, seed, true);
}

fn run_with(
    config: &LlamaConfig,
    batch: usize,
    prompt_len: usize,
    count: usize,
    seed: u64,
    programmatic: bool,
) {
    let dir = ModelDir::new(config, seed);
    let files = ModelFiles::open(&dir.0).unwrap();
    let weights = files.weights().unwrap();
    let model = Model::from_weights(config, &weights);
    let device = driver()
        .open(ordinal(), DeviceOptions::default())
        .expect("opening the device");
    let options = DecoderOptions {
        batch,
        capacity: prompt_len + count + 1,
        image: KernelImage::Fatbin,
        programmatic,
    };
    let mut decoder = Decoder::new(&device, config, &weights, &options).expect("the decoder");
    let hopper = device.info().compute_capability >= (9, 0);
    assert_eq!(decoder.programmatic(), programmatic && hopper);
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|b| {
            (0..prompt_len)
                .map(|i| ((7 + 31 * b + 13 * i) % config.vocab_size) as u32)
                .collect()
        })
        .collect();
    let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let generation = decoder
        .generate(
            &refs,
            count,
            &GenerateOptions {
                ahead: 4,
                read_every: 16,
            },
        )
        .expect("generating on the GPU");
    assert_eq!(generation.tokens.len(), batch);
    for (prompt, tokens) in prompts.iter().zip(&generation.tokens) {
        assert_eq!(tokens.len(), count);
        check_generation(&model, prompt, tokens);
    }
    // Teacher forcing over the first prompt and its reference continuation.
    let mut sequence = prompts[0].clone();
    sequence.extend(
        model
            .generate(&prompts[0], count, &mut model.new_cache())
            .unwrap(),
    );
    sequence.truncate(options.capacity - 1);
    check_teacher_forced(&mut decoder, &model, &sequence);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn decoder_fp16_follows_the_cpu_reference() {
    run(DType::F16, 1, 5, 128, 11);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn decoder_fp16_batch_of_prompts_follows_the_cpu_reference() {
    run(DType::F16, 5, 4, 48, 12);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn decoder_fp16_batch_past_one_gemv_block_follows_the_cpu_reference() {
    // 12 sequences: two blocks along the GEMV's batch axis, the second with 4.
    run(DType::F16, 12, 3, 24, 15);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn decoder_fp16_without_programmatic_launches_follows_the_cpu_reference() {
    run_with(&config(DType::F16), 2, 5, 64, 16, false);
}

/// Wide enough that every path of `gemv_stream` runs on a GPU of up to 176 SMs: columns
/// split two ways (q/k/v, o) and four ways (down, a last chunk part full), and blocks that walk
/// several row groups, in SwiGLU mode too (gate/up: 2,816 groups) and with a last pass part
/// full (the output projection: 16,000 groups).
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn decoder_fp16_wide_model_follows_the_cpu_reference() {
    let wide = LlamaConfig {
        hidden_size: 1024,
        intermediate_size: 2816,
        num_hidden_layers: 2,
        num_attention_heads: 16,
        num_key_value_heads: 4,
        head_dim: 64,
        vocab_size: 32000,
        ..config(DType::F16)
    };
    run_with(&wide, 1, 4, 16, 17, true);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn decoder_fp16_long_prefill_follows_the_cpu_reference() {
    run(DType::F16, 1, 300, 32, 13);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn decoder_bf16_follows_the_cpu_reference() {
    run(DType::BF16, 2, 5, 64, 14);
}

/// Traced at FINE, every kernel of every step times itself (the zone-stamp ABI): one stamped
/// zone per kernel of every step, never empty and not longer than its debug group's zone where
/// that was kept, and the tokens are those the untraced decoder generates.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn decoder_traced_at_fine_stamps_every_kernel() {
    use std::sync::Arc;

    use cuhal::{CuptiChoice, MemorySink, Sink, Verbosity};
    use cuhal_trace::DropReason;

    const PROMPT: [u32; 3] = [5, 17, 29];
    const TOKENS: usize = 12;
    let config = config(DType::F16);
    let dir = ModelDir::new(&config, 21);
    let files = ModelFiles::open(&dir.0).unwrap();
    let weights = files.weights().unwrap();
    let options = DecoderOptions {
        batch: 1,
        capacity: PROMPT.len() + TOKENS + 1,
        image: KernelImage::Fatbin,
        programmatic: true,
    };
    let generate = |device_options: DeviceOptions| {
        let device = driver()
            .open(ordinal(), device_options)
            .expect("opening the device");
        let mut decoder = Decoder::new(&device, &config, &weights, &options).unwrap();
        let kernels = decoder.step_command_buffer().bindings().stamp_count();
        let names = decoder.kernel_names().to_vec();
        let tokens = decoder
            .generate(&[&PROMPT], TOKENS, &GenerateOptions::default())
            .unwrap()
            .tokens;
        drop(decoder);
        // Dropping the device joins its completion threads: everything is collected by then.
        drop(device);
        (tokens, kernels, names)
    };
    let (untraced, _, _) = generate(DeviceOptions::default());
    let sink = Arc::new(MemorySink::new());
    let (traced, kernels, names) = generate(DeviceOptions {
        tracing: Verbosity::Fine,
        trace_sink: Some(sink.clone() as Arc<dyn Sink>),
        cupti: CuptiChoice::Off,
        ..DeviceOptions::default()
    });
    assert_eq!(traced, untraced, "tracing changed the tokens");
    assert_eq!(
        kernels as usize,
        names.len(),
        "a stamp per kernel of the step"
    );
    let zones = sink.zones();
    let stamped: Vec<_> = zones.iter().filter(|z| z.stamped).collect();
    // A step is an `embed_f16` and the rest of its kernels.
    let steps = stamped.iter().filter(|z| z.name == "embed_f16").count();
    // Steps run 8 ahead: a step's debug-group zones are lost when the step command buffer is
    // issued again before that step is collected (its events recorded again), its stamps never.
    assert!(
        steps > TOKENS,
        "{steps} steps stamped ({} superseded zones)",
        sink.dropped(DropReason::Superseded)
    );
    assert_eq!(
        stamped.len(),
        steps * names.len(),
        "a stamped zone per kernel of every step ({} empty, {} past the ring)",
        sink.dropped(DropReason::StampEmpty),
        sink.dropped(DropReason::StampsExhausted)
    );
    assert!(stamped.iter().all(|z| z.duration_ns() > 0));
    // Where a step kept its debug groups, each kernel's stamped zone follows its group's zone
    // (the sink receives a group's inner zones after the group opens) and fits in it.
    for (i, group) in zones.iter().enumerate() {
        if !names.contains(&group.name) {
            continue;
        }
        let stamp = zones[i + 1..]
            .iter()
            .find(|z| z.stamped)
            .unwrap_or_else(|| panic!("no stamped zone after {group:?}"));
        // The group's edges are events, whose times step by up to half a microsecond.
        assert!(
            stamp.duration_ns() <= group.duration_ns() + 1_000,
            "the kernel's own span {stamp:?} is longer than its group's {group:?}"
        );
    }
}
