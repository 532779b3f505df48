//! The GPU path on the fake driver (a CPU stand-in that records and replays graphs but runs no
//! kernel): the upload, the recorded decode step and its replays, and the typed errors for
//! models and prompts the decoder does not take.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{ScratchDir, tiny_config};
use cuhal::{Device, DeviceOptions, Driver};
use cuhal_decoder::gpu::{Decoder, DecoderOptions, GenerateOptions, KernelImage};
use cuhal_decoder::{Error, LlamaConfig, ModelFiles, write_random_model};
use cuhal_fake_driver::harness::FakeDriver;
use cuhal_trace::DropReason;

/// A private fake driver and device 0 of it.
fn open(tag: &str) -> (FakeDriver, Driver, Device) {
    open_with(tag, DeviceOptions::default())
}

/// A private fake driver and device 0 of it, opened with `options`.
fn open_with(tag: &str, options: DeviceOptions) -> (FakeDriver, Driver, Device) {
    static ENV: Mutex<()> = Mutex::new(());
    let fake = FakeDriver::private(tag).unwrap();
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the environment is written only here, under `ENV`, and read by `Driver::load`
    // under the same lock through std; nothing in this test binary reads it through libc.
    unsafe { std::env::set_var("CUHAL_CUDA_LIBRARY", fake.path()) };
    let driver = Driver::load().unwrap();
    let device = driver.open(0, options).unwrap();
    (fake, driver, device)
}

fn options(batch: usize, capacity: usize) -> DecoderOptions {
    DecoderOptions {
        batch,
        capacity,
        image: KernelImage::Ptx,
        ..DecoderOptions::default()
    }
}

/// Kernels of one decode step: the embedding, five per layer (qkv, attention, o_proj, gate_up,
/// down_proj), the output projection and the argmax.
fn kernels_per_step(config: &LlamaConfig) -> usize {
    1 + 5 * config.num_hidden_layers + 2
}

#[test]
fn the_decode_step_is_recorded_once_and_replayed_per_token() {
    let dir = ScratchDir::new("fake-step");
    let config = tiny_config();
    write_random_model(dir.path(), &config, 3).unwrap();
    let files = ModelFiles::open(dir.path()).unwrap();
    let weights = files.weights().unwrap();
    let (fake, _driver, device) = open("decoder-step");
    let mut decoder = Decoder::new(&device, &config, &weights, &options(2, 16)).unwrap();

    let names = decoder.kernel_names();
    assert_eq!(names.len(), kernels_per_step(&config));
    assert_eq!(names[0], "embed");
    assert_eq!(names[1], "layer0.qkv");
    assert_eq!(names[2], "layer0.attention");
    assert_eq!(names[5], "layer0.down_proj");
    assert_eq!(names.last().unwrap(), "argmax");
    // Recording launches nothing.
    assert_eq!(fake.launches("gemv_f16"), 0);
    // On the fake device (compute capability 9.0, not tracing) each kernel after the first
    // depends programmatically on the one before.
    assert!(decoder.programmatic());
    assert_eq!(
        fake.counts().programmatic_edges as usize,
        kernels_per_step(&config) - 1
    );

    // A prompt of 3 (one submission of 3 steps), then 4 decode steps: 7 replays.
    let prompts: [&[u32]; 2] = [&[1, 2, 3], &[4, 5, 6]];
    let generation = decoder
        .generate(
            &prompts,
            5,
            &GenerateOptions {
                ahead: 2,
                read_every: 2,
            },
        )
        .unwrap();
    let layers = config.num_hidden_layers as u64;
    // Four GEMVs per layer plus the output projection, per replay.
    assert_eq!(fake.launches("gemv_f16"), 7 * (4 * layers + 1));
    // Two sequences: no GEMV stages its input.
    assert_eq!(fake.launches("gemv_stream_f16"), 0);
    assert_eq!(fake.launches("argmax_advance"), 7);
    assert_eq!(fake.launches("attention_f16"), 7 * layers);
    assert_eq!(generation.tokens.len(), 2);
    assert!(generation.tokens.iter().all(|t| t.len() == 5));
    assert_eq!(generation.step_times.len(), 4);
    assert_eq!(decoder.position(), 7);

    // The prompts were written to the history, position-major.
    let history = decoder.read_history(0, 3).unwrap();
    assert_eq!(history, vec![1, 4, 2, 5, 3, 6]);
}

/// The step recorded into a caller's command buffer is the decoder's own: the same kernels,
/// one launch each per replay, replayed outside the decoder's queue.
#[test]
fn the_step_records_into_a_callers_command_buffer() {
    let dir = ScratchDir::new("fake-record-step");
    let config = tiny_config();
    write_random_model(dir.path(), &config, 4).unwrap();
    let files = ModelFiles::open(dir.path()).unwrap();
    let weights = files.weights().unwrap();
    let (fake, _driver, device) = open("decoder-record-step");
    let decoder = Decoder::new(&device, &config, &weights, &options(1, 16)).unwrap();

    let mut cb = device
        .queue(0)
        .create_command_buffer_as(cuhal::CommandBufferMode::Graph, 0)
        .unwrap();
    decoder.record_step(&mut *cb).unwrap();
    let copy = cb.end().unwrap();
    assert_eq!(fake.launches("gemv_stream_f16"), 0);
    let semaphore = device.create_semaphore(0);
    device
        .queue(0)
        .execute(&[], &[(&semaphore, 1)], &[&copy, &copy])
        .unwrap();
    semaphore
        .wait(1, std::time::Duration::from_secs(10))
        .unwrap();
    let layers = config.num_hidden_layers as u64;
    // One sequence with a narrow input: every GEMV stages its input.
    assert_eq!(fake.launches("gemv_stream_f16"), 2 * (4 * layers + 1));
    assert_eq!(fake.launches("gemv_f16"), 0);
    assert_eq!(fake.launches("attention_f16"), 2 * layers);
    assert_eq!(fake.launches("argmax_advance"), 2);
    // The decoder's own count of positions is left alone.
    assert_eq!(decoder.position(), 0);
}

/// One sequence streams a GEMV only up to `GEMV_STREAM_MAX_COLS` columns: a wider down
/// projection runs the split GEMV, every other GEMV `gemv_stream`.
#[test]
fn a_gemv_wider_than_the_staging_limit_runs_split() {
    let dir = ScratchDir::new("fake-wide-down");
    let config = LlamaConfig {
        intermediate_size: cuhal_decoder::gpu::kernels::GEMV_STREAM_MAX_COLS as usize + 8,
        ..tiny_config()
    };
    write_random_model(dir.path(), &config, 5).unwrap();
    let files = ModelFiles::open(dir.path()).unwrap();
    let weights = files.weights().unwrap();
    let (fake, _driver, device) = open("decoder-wide-down");
    let decoder = Decoder::new(&device, &config, &weights, &options(1, 16)).unwrap();
    let mut cb = device
        .queue(0)
        .create_command_buffer_as(cuhal::CommandBufferMode::Graph, 0)
        .unwrap();
    decoder.record_step(&mut *cb).unwrap();
    let step = cb.end().unwrap();
    let semaphore = device.create_semaphore(0);
    device
        .queue(0)
        .execute(&[], &[(&semaphore, 1)], &[&step])
        .unwrap();
    semaphore
        .wait(1, std::time::Duration::from_secs(10))
        .unwrap();
    let layers = config.num_hidden_layers as u64;
    assert_eq!(fake.launches("gemv_f16"), layers);
    assert_eq!(fake.launches("gemv_stream_f16"), 3 * layers + 1);
}

#[test]
fn the_weights_are_uploaded_with_q_k_v_and_gate_up_fused() {
    let dir = ScratchDir::new("fake-upload");
    let config = LlamaConfig {
        tie_word_embeddings: true,
        ..tiny_config()
    };
    write_random_model(dir.path(), &config, 4).unwrap();
    let files = ModelFiles::open(dir.path()).unwrap();
    let weights = files.weights().unwrap();
    let (_fake, _driver, device) = open("decoder-upload");
    let decoder = Decoder::new(&device, &config, &weights, &options(1, 8)).unwrap();
    let _ = decoder.step_command_buffer();
    let on_device = cuhal_decoder::gpu::DeviceWeights::upload(&device, &weights).unwrap();
    let read = |range: &cuhal::BufferRange| {
        let mut out = vec![0u8; range.len()];
        on_device.buffer.read(range.offset(), &mut out).unwrap();
        out
    };
    let layer = &weights.layers[1];
    let qkv = [layer.q_proj.data, layer.k_proj.data, layer.v_proj.data].concat();
    assert_eq!(read(&on_device.layers[1].qkv), qkv);
    let gate_up = [layer.gate_proj.data, layer.up_proj.data].concat();
    assert_eq!(read(&on_device.layers[1].gate_up), gate_up);
    assert_eq!(read(&on_device.layers[1].down), layer.down_proj.data);
    assert_eq!(read(&on_device.norm), weights.norm.data);
    assert_eq!(read(&on_device.embed), weights.embed_tokens.data);
    // Tied: the output projection is the embedding.
    assert_eq!(on_device.lm_head.offset(), on_device.embed.offset());
    for range in [
        &on_device.layers[0].qkv,
        &on_device.layers[0].o,
        &on_device.norm,
    ] {
        assert_eq!(range.offset() % 256, 0);
    }
    // Every matrix once, the embedding not at all (it is gathered), the tied head once.
    let h = config.hidden_size;
    let per_layer = (config.q_dim() + 2 * config.kv_dim()) * h
        + h * config.q_dim()
        + 3 * config.intermediate_size * h;
    let expected = 2 * (config.num_hidden_layers * per_layer + config.vocab_size * h);
    assert_eq!(on_device.bytes_per_step(), expected);
}

#[test]
fn models_and_prompts_it_does_not_take_are_typed_errors() {
    let (_fake, _driver, device) = open("decoder-errors");
    let refused = |config: LlamaConfig, opts: DecoderOptions| -> Error {
        let dir = ScratchDir::new("fake-errors");
        write_random_model(dir.path(), &config, 1).unwrap();
        let files = ModelFiles::open(dir.path()).unwrap();
        let weights = files.weights().unwrap();
        match Decoder::new(&device, &config, &weights, &opts) {
            Ok(_) => panic!("{config:?} with {opts:?} was accepted"),
            Err(e) => e,
        }
    };
    // Rows the GEMV cannot read 8 at a time.
    let odd_hidden = LlamaConfig {
        hidden_size: 60,
        num_attention_heads: 4,
        head_dim: 16,
        ..tiny_config()
    };
    let e = refused(odd_hidden, options(1, 8));
    assert!(
        matches!(
            e,
            Error::Unsupported {
                field: "hidden_size",
                ..
            }
        ),
        "{e}"
    );
    let wide_head = LlamaConfig {
        head_dim: 512,
        ..tiny_config()
    };
    let e = refused(wide_head, options(1, 8));
    assert!(
        matches!(
            e,
            Error::Unsupported {
                field: "head_dim",
                ..
            }
        ),
        "{e}"
    );
    let e = refused(tiny_config(), options(65, 8));
    assert!(
        matches!(e, Error::InvalidConfig { field: "batch", .. }),
        "{e}"
    );
    let e = refused(tiny_config(), options(1, 65));
    assert!(
        matches!(
            e,
            Error::InvalidConfig {
                field: "capacity",
                ..
            }
        ),
        "{e}"
    );

    let dir = ScratchDir::new("fake-prompts");
    let config = tiny_config();
    write_random_model(dir.path(), &config, 2).unwrap();
    let files = ModelFiles::open(dir.path()).unwrap();
    let weights = files.weights().unwrap();
    let mut decoder = Decoder::new(&device, &config, &weights, &options(2, 8)).unwrap();
    let e = decoder.start(&[&[1, 2]]).unwrap_err();
    assert!(matches!(e, Error::Prompt { .. }), "{e}");
    let e = decoder.start(&[&[1, 2], &[3]]).unwrap_err();
    assert!(matches!(e, Error::Prompt { .. }), "{e}");
    let e = decoder.start(&[&[], &[]]).unwrap_err();
    assert!(matches!(e, Error::EmptyPrompt), "{e}");
    let e = decoder.start(&[&[1, 97], &[1, 2]]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::TokenOutOfRange {
                token: 97,
                vocab_size: 97
            }
        ),
        "{e}"
    );
    let e = decoder.submit_step().unwrap_err();
    assert!(matches!(e, Error::Prompt { .. }), "{e}");
    // 3 prompt tokens and 6 new ones need 9 positions; the cache has 8.
    let e = decoder
        .generate(&[&[1, 2, 3], &[1, 2, 3]], 6, &GenerateOptions::default())
        .unwrap_err();
    assert!(matches!(e, Error::ContextFull { .. }), "{e}");
    // The decoder stays usable: 5 new tokens fit.
    let generation = decoder
        .generate(&[&[1, 2, 3], &[1, 2, 3]], 5, &GenerateOptions::default())
        .unwrap();
    assert_eq!(generation.tokens[1].len(), 5);
    // And stepping past the cache is refused, not written out of bounds.
    let e = decoder.submit_step().unwrap_err();
    assert!(matches!(e, Error::ContextFull { .. }), "{e}");
}

#[test]
fn the_memory_it_holds_is_the_weights_the_cache_and_a_stated_workspace() {
    let dir = ScratchDir::new("fake-memory");
    let config = tiny_config();
    write_random_model(dir.path(), &config, 5).unwrap();
    let files = ModelFiles::open(dir.path()).unwrap();
    let weights = files.weights().unwrap();
    let (_fake, _driver, device) = open("decoder-memory");
    let (batch, capacity) = (3, 16);
    let decoder = Decoder::new(&device, &config, &weights, &options(batch, capacity)).unwrap();
    let memory = decoder.memory();

    // The weights as uploaded (alignment padding between tensors at most).
    let tensors: usize = weights.tensors().map(|t| t.data.len()).sum();
    assert!(
        memory.weights >= tensors,
        "{memory:?} against {tensors} bytes of tensors"
    );
    assert_eq!(memory.weights, decoder.weights_buffer().len());
    // Keys and values of every layer, sequence, key/value head and position, in fp16.
    let head_dim = config.head_dim;
    let cache =
        config.num_hidden_layers * 2 * batch * config.num_key_value_heads * capacity * head_dim * 2;
    assert_eq!(memory.cache, cache);
    // Tokens and three per-sequence words, the rotary frequencies, the f32 activations (the
    // residual stream, q/k/v, the attention's output, SwiGLU's output and the logits), and the
    // argmax's state (a u64 and a u32 per sequence: three words).
    let h = config.hidden_size;
    let activations = batch
        * (h + config.q_dim()
            + 2 * config.kv_dim()
            + config.q_dim()
            + config.intermediate_size
            + config.vocab_size);
    let workspace = 4 * (capacity * batch + 2 * batch + head_dim / 2 + activations + 3 * batch);
    assert_eq!(memory.workspace, workspace);
    assert_eq!(memory.total(), memory.weights + cache + workspace);
}

/// On a queue that traces at FINE, the kernels launch without programmatic dependencies (a zone
/// per kernel puts its edges between two kernels), and every kernel of the step is stamped: its
/// zone-stamp argument is bound to a slot of the tracer's ring, so it gets no timing events and
/// its zone is the one it stamps. The fake runs no decoder kernel, so every slot is read back
/// empty (`StampEmpty`) and no kernel zone is timed any other way.
#[test]
fn a_traced_decoder_stamps_its_kernels_and_launches_without_programmatic_dependencies() {
    let dir = ScratchDir::new("fake-traced");
    let config = tiny_config();
    write_random_model(dir.path(), &config, 4).unwrap();
    let files = ModelFiles::open(dir.path()).unwrap();
    let weights = files.weights().unwrap();
    let sink = Arc::new(cuhal::MemorySink::new());
    let traced = DeviceOptions {
        tracing: cuhal::Verbosity::Fine,
        trace_sink: Some(sink.clone() as Arc<dyn cuhal::Sink>),
        ..DeviceOptions::default()
    };
    let (fake, _driver, device) = open_with("decoder-traced", traced);
    let mut decoder = Decoder::new(&device, &config, &weights, &options(1, 8)).unwrap();
    assert!(!decoder.programmatic());
    assert_eq!(fake.counts().programmatic_edges, 0);
    let kernels = kernels_per_step(&config);
    let layout = decoder.step_command_buffer().bindings();
    assert_eq!(layout.stamp_count() as usize, kernels, "a stamp per kernel");
    assert_eq!(layout.stamp_slot(), Some(layout.slots_used() as u32));
    let generation = decoder
        .generate(&[&[1, 2]], 3, &GenerateOptions::default())
        .unwrap();
    assert_eq!(generation.tokens[0].len(), 3);
    // Every submission collected.
    let queue = device.queue(0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while queue.stats().retired() != queue.stats().submitted {
        assert!(Instant::now() < deadline, "{:?}", queue.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    let zones = sink.zones();
    // A debug-group zone per kernel of every step run (prefill and decode steps alike).
    let steps = zones.iter().filter(|z| z.name == "embed").count();
    assert!(steps >= 3, "{steps} steps");
    for name in decoder.kernel_names() {
        let groups = zones.iter().filter(|z| &z.name == name).count();
        assert_eq!(groups, steps, "{name}");
    }
    // No kernel is timed by events: each zone would be a stamped one.
    let functions = [
        "embed_f16",
        "gemv_f16",
        "gemv_stream_f16",
        "attention_f16",
        "argmax_advance",
    ];
    for zone in &zones {
        if functions.contains(&zone.name.as_str()) {
            assert!(zone.stamped, "{zone:?}");
        }
    }
    // A step issued again before its collection loses its groups (one per kernel, counted as
    // superseded), not its stamps: every kernel of every step had a stamp slot.
    let superseded = sink.dropped(DropReason::Superseded);
    assert_eq!(superseded % kernels as u64, 0, "whole steps superseded");
    assert_eq!(
        sink.dropped(DropReason::StampEmpty),
        (steps * kernels) as u64 + superseded,
        "every kernel of every step had a stamp slot"
    );
    assert_eq!(sink.dropped(DropReason::StampsExhausted), 0);
}
