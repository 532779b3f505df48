//! `cuhal-decoder`: writes random Llama models and runs a model's greedy decoding, on the CPU
//! with `--cpu-reference` (the GPU path is not built yet).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use cuhal_decoder::reference::Model;
use cuhal_decoder::{LlamaConfig, ModelFiles, write_random_model};

const USAGE: &str = "\
usage: cuhal-decoder [--random-model DIR [--config small|1b] [--seed N]]
                     [--model DIR] [--prompt-tokens 1,2,3] [--tokens N] [--trace FILE]
                     [--cpu-reference]

  --random-model DIR   write config.json + model.safetensors of random weights to DIR
  --config NAME        the random model's shape: small (default) or 1b
  --seed N             the random model's seed (default 1)
  --model DIR          the model to run: a Hugging Face Llama directory (config.json and
                       model.safetensors, or model.safetensors.index.json and its shards)
  --prompt-tokens LIST comma-separated token ids (default: the model's bos_token_id)
  --tokens N           how many tokens to generate (default 16)
  --trace FILE         write a trace of the GPU's work to FILE (the GPU path)
  --cpu-reference      run the f32 reference on the CPU and print the greedy tokens

Without --cpu-reference the model runs on the GPU; with no GPU the command says so and exits
with status 2. Usage errors exit with 64, other errors with 1.";

/// The parsed command line.
#[derive(Debug, Default)]
struct Args {
    random_model: Option<PathBuf>,
    config: Option<String>,
    seed: u64,
    model: Option<PathBuf>,
    prompt_tokens: Option<Vec<u32>>,
    tokens: usize,
    trace: Option<PathBuf>,
    cpu_reference: bool,
    help: bool,
}

fn parse_args(mut raw: impl Iterator<Item = String>) -> anyhow::Result<Args> {
    let mut args = Args {
        seed: 1,
        tokens: 16,
        ..Args::default()
    };
    while let Some(flag) = raw.next() {
        let mut value = || raw.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--random-model" => args.random_model = Some(value()?.into()),
            "--config" => args.config = Some(value()?),
            "--seed" => args.seed = value()?.parse().context("--seed")?,
            "--model" => args.model = Some(value()?.into()),
            "--prompt-tokens" => {
                let list = value()?;
                let tokens = list
                    .split(',')
                    .map(|t| t.trim().parse::<u32>())
                    .collect::<Result<Vec<_>, _>>()
                    .with_context(|| {
                        format!("--prompt-tokens {list:?}: not a list of token ids")
                    })?;
                args.prompt_tokens = Some(tokens);
            }
            "--tokens" => args.tokens = value()?.parse().context("--tokens")?,
            "--trace" => args.trace = Some(value()?.into()),
            "--cpu-reference" => args.cpu_reference = true,
            "-h" | "--help" => args.help = true,
            other => bail!("unknown argument {other:?}\n\n{USAGE}"),
        }
    }
    if let Some(name) = &args.config {
        if args.random_model.is_none() {
            bail!("--config chooses the shape of --random-model; give --random-model DIR too");
        }
        if LlamaConfig::preset(name).is_none() {
            bail!("--config {name:?}: expected small or 1b");
        }
    }
    if args.random_model.is_none() && args.model.is_none() && !args.help {
        bail!("give --model DIR (or --random-model DIR to write one)\n\n{USAGE}");
    }
    Ok(args)
}

/// Exit status of a usage error (`EX_USAGE`), as the `cuhal` command: never 2, which says
/// "no GPU".
const EXIT_USAGE: u8 = 64;
/// Exit status when no GPU is available.
const EXIT_NO_GPU: u8 = 2;

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("cuhal-decoder: {error:#}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match run(&args) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("cuhal-decoder: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<ExitCode> {
    if args.help {
        println!("{USAGE}");
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(dir) = &args.random_model {
        let name = args.config.as_deref().unwrap_or("small");
        let config = LlamaConfig::preset(name)
            .with_context(|| format!("--config {name:?}: expected small or 1b"))?;
        let started = Instant::now();
        write_random_model(dir, &config, args.seed)?;
        eprintln!(
            "wrote a random {name} model (seed {}) to {} in {:.1} s",
            args.seed,
            dir.display(),
            started.elapsed().as_secs_f64()
        );
    }
    let Some(dir) = args.model.clone().or_else(|| {
        // `--random-model DIR --cpu-reference` runs the model just written.
        args.cpu_reference
            .then(|| args.random_model.clone())
            .flatten()
    }) else {
        if args.random_model.is_some() {
            return Ok(ExitCode::SUCCESS);
        }
        bail!("give --model DIR (or --random-model DIR to write one)\n\n{USAGE}");
    };

    let files = ModelFiles::open(&dir)?;
    let config = files.config().clone();
    let prompt = match &args.prompt_tokens {
        Some(tokens) => tokens.clone(),
        None => vec![
            config
                .bos_token_id
                .context("the model names no bos_token_id: give --prompt-tokens")?,
        ],
    };

    if args.cpu_reference {
        if args.trace.is_some() {
            eprintln!("note: --trace records GPU work; the CPU reference writes no trace");
        }
        let started = Instant::now();
        let model = Model::from_weights(&config, &files.weights()?);
        drop(files);
        let loaded = started.elapsed();
        let started = Instant::now();
        let tokens = model.generate(&prompt, args.tokens, &mut model.new_cache())?;
        let ran = started.elapsed();
        let list: Vec<String> = tokens.iter().map(u32::to_string).collect();
        println!("{}", list.join(","));
        eprintln!(
            "cpu reference: {} prompt tokens, {} generated; loaded in {:.2} s, ran in {:.2} s",
            prompt.len(),
            tokens.len(),
            loaded.as_secs_f64(),
            ran.as_secs_f64()
        );
        return Ok(ExitCode::SUCCESS);
    }

    match cuhal::Driver::load().and_then(|driver| driver.devices()) {
        Ok(devices) if !devices.is_empty() => {
            bail!("the GPU path is not built yet; --cpu-reference runs the model on the CPU")
        }
        Ok(_) => eprintln!("cuhal-decoder: no GPU available (the driver reports no device)"),
        Err(error) => eprintln!("cuhal-decoder: no GPU available: {error}"),
    }
    eprintln!("(--cpu-reference runs the f32 reference on the CPU)");
    Ok(ExitCode::from(EXIT_NO_GPU))
}
