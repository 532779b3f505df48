//! The binary's GPU path: generation with timings, teacher forcing with a logits dump, and the
//! trace.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use cuhal::{CuptiChoice, DeviceOptions, Driver, JsonSink, Sink, Verbosity};
use cuhal_decoder::ModelFiles;
use cuhal_decoder::gpu::{Decoder, DecoderOptions, GenerateOptions, KernelImage};

/// What the command line asked of the GPU path.
pub struct RunOptions {
    pub prompt: Vec<u32>,
    pub tokens: usize,
    pub batch: usize,
    pub ahead: usize,
    pub read_every: usize,
    pub trace: Option<PathBuf>,
    pub teacher_force: Option<PathBuf>,
    pub dump_logits: Option<PathBuf>,
    pub ptx: bool,
    pub programmatic: bool,
}

/// Token ids separated by commas or white space.
pub fn read_tokens(path: &Path) -> anyhow::Result<Vec<u32>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let tokens = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .map(str::parse::<u32>)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: not a list of token ids", path.display()))?;
    if tokens.is_empty() {
        bail!("{}: no token ids", path.display());
    }
    Ok(tokens)
}

/// Writes `logits` as little-endian f32.
pub fn write_logits(path: &Path, logits: &[f32]) -> anyhow::Result<()> {
    let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// The `q`-quantile (0..=1) of `sorted`.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[at]
}

/// Runs the model in `files` on device 0 as `options` ask.
pub fn run(driver: &Driver, files: &ModelFiles, options: &RunOptions) -> anyhow::Result<()> {
    let config = files.config().clone();
    let sink = match &options.trace {
        Some(path) => Some(Arc::new(
            JsonSink::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => None,
    };
    let device = driver.open(
        0,
        DeviceOptions {
            // FINE: each kernel's zone comes from its own `%globaltimer` stamps
            // (`cuhal_zone_stamp.cuh`), inside its debug group's zone.
            tracing: if sink.is_some() {
                Verbosity::Fine
            } else {
                Verbosity::Off
            },
            trace_sink: sink.clone().map(|s| s as Arc<dyn Sink>),
            // Every kernel stamps itself: CUPTI's activity kinds would only tax each launch.
            cupti: CuptiChoice::Off,
            ..DeviceOptions::default()
        },
    )?;
    let teacher = match &options.teacher_force {
        Some(path) => Some(read_tokens(path)?),
        None => None,
    };
    let capacity = match &teacher {
        Some(tokens) => tokens.len() + 1,
        None => options.prompt.len() + options.tokens.max(1),
    };
    let decoder_options = DecoderOptions {
        batch: options.batch,
        capacity,
        image: if options.ptx {
            KernelImage::Ptx
        } else {
            KernelImage::Fatbin
        },
        programmatic: options.programmatic,
    };
    let weights = files.weights()?;
    let started = std::time::Instant::now();
    let mut decoder = Decoder::new(&device, &config, &weights, &decoder_options)?;
    drop(weights);
    eprintln!(
        "{} on {}: weights uploaded and the step recorded ({} kernels{}) in {:.2} s",
        files.dir().display(),
        device.info().name,
        decoder.kernel_names().len(),
        if decoder.programmatic() {
            ", programmatic launches"
        } else {
            ""
        },
        started.elapsed().as_secs_f64()
    );
    let memory = decoder.memory();
    eprintln!(
        "device memory: {:.1} MB = weights {:.1} MB + key/value cache {:.1} MB + workspace {:.2} MB",
        memory.total() as f64 / 1e6,
        memory.weights as f64 / 1e6,
        memory.cache as f64 / 1e6,
        memory.workspace as f64 / 1e6
    );

    if let (Some(tokens), Some(output)) = (&teacher, &options.dump_logits) {
        let logits = decoder.teacher_force(tokens)?;
        write_logits(output, &logits)?;
        eprintln!(
            "teacher forcing: logits of {} positions written to {}",
            tokens.len(),
            output.display()
        );
    } else {
        let prompts = vec![options.prompt.as_slice(); options.batch];
        let generation = decoder.generate(
            &prompts,
            options.tokens,
            &GenerateOptions {
                ahead: options.ahead,
                read_every: options.read_every,
            },
        )?;
        for sequence in &generation.tokens {
            let list: Vec<String> = sequence.iter().map(u32::to_string).collect();
            println!("{}", list.join(","));
        }
        let mut times = generation.step_times.clone();
        times.sort();
        let decoded = generation.step_times.len();
        let per_second = if generation.decode.is_zero() {
            0.0
        } else {
            (decoded * options.batch) as f64 / generation.decode.as_secs_f64()
        };
        eprintln!(
            "prefill of {} tokens: {:.3} ms; {} decode steps of batch {}: {:.1} tokens/s; \
             per-token latency median {:.1} us, p99 {:.1} us; weights read per step {:.1} MB",
            options.prompt.len(),
            generation.prefill.as_secs_f64() * 1e3,
            decoded,
            options.batch,
            per_second,
            quantile(&times, 0.5).as_secs_f64() * 1e6,
            quantile(&times, 0.99).as_secs_f64() * 1e6,
            decoder.weight_bytes_per_step() as f64 / 1e6
        );
        let mut submits = generation.submit_times.clone();
        submits.sort();
        eprintln!(
            "host time per step submission: median {:.1} us, p99 {:.1} us",
            quantile(&submits, 0.5).as_secs_f64() * 1e6,
            quantile(&submits, 0.99).as_secs_f64() * 1e6
        );
    }
    drop(decoder);
    // Dropping the device joins the completion threads, so every zone is collected.
    drop(device);
    if let (Some(sink), Some(path)) = (sink, &options.trace) {
        sink.finish().context("writing the trace")?;
        eprintln!("trace written to {}", path.display());
    }
    Ok(())
}
