//! `cuhal-decoder`: writes random Llama models and runs a model's greedy decoding on the GPU
//! (one recorded decode step replayed per token), or on the CPU with `--cpu-reference`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use cuhal_decoder::reference::Model;
use cuhal_decoder::{LlamaConfig, ModelFiles, write_random_model};

mod gpu_run;

const USAGE: &str = "\
usage: cuhal-decoder [--random-model DIR [--config small|1b] [--seed N]]
                     [--model DIR] [--prompt-tokens 1,2,3] [--tokens N] [--batch B]
                     [--trace FILE] [--cpu-reference]
                     [--teacher-force FILE --dump-logits FILE]

  --random-model DIR   write config.json + model.safetensors of random weights to DIR
  --config NAME        the random model's shape: small (default) or 1b
  --seed N             the random model's seed (default 1)
  --model DIR          the model to run: a Hugging Face Llama directory (config.json and
                       model.safetensors, or model.safetensors.index.json and its shards)
  --prompt-tokens LIST comma-separated token ids (default: the model's bos_token_id)
  --tokens N           how many tokens to generate (default 16)
  --batch B            decode B sequences at once, each with the prompt (1 to 64; default 1)
  --ahead N            decode steps submitted ahead of the last seen complete (default 8)
  --read-every K       read the generated tokens back every K steps (default 32)
  --kernel-image NAME  fatbin (default: cubins for sm_80/sm_90, PTX for later GPUs) or ptx
                       (the compute_80 PTX, compiled by the driver)
  --trace FILE         write a Perfetto trace of the GPU's work to FILE, a zone per kernel
                       timed by the kernel's own %globaltimer stamps (the kernels then
                       launch without programmatic dependencies)
  --no-programmatic    launch each kernel only once the one before has ended (default on
                       compute capability 9.0+: programmatic dependent launches)
  --cpu-reference      run the f32 reference on the CPU and print the greedy tokens
  --teacher-force FILE run the comma- or space-separated token ids in FILE one position at a
                       time and write every position's logits to --dump-logits FILE
                       (little-endian f32, [position][vocab]); with --cpu-reference the CPU
                       reference computes them

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
    batch: usize,
    ahead: usize,
    read_every: usize,
    teacher_force: Option<PathBuf>,
    dump_logits: Option<PathBuf>,
    ptx: bool,
    no_programmatic: bool,
    help: bool,
}

fn parse_args(mut raw: impl Iterator<Item = String>) -> anyhow::Result<Args> {
    let mut args = Args {
        seed: 1,
        tokens: 16,
        batch: 1,
        ahead: 8,
        read_every: 32,
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
            "--batch" => args.batch = value()?.parse().context("--batch")?,
            "--ahead" => args.ahead = value()?.parse().context("--ahead")?,
            "--read-every" => args.read_every = value()?.parse().context("--read-every")?,
            "--teacher-force" => args.teacher_force = Some(value()?.into()),
            "--dump-logits" => args.dump_logits = Some(value()?.into()),
            "--kernel-image" => match value()?.as_str() {
                "fatbin" => args.ptx = false,
                "ptx" => args.ptx = true,
                other => bail!("--kernel-image {other:?}: expected fatbin or ptx"),
            },
            "--no-programmatic" => args.no_programmatic = true,
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
    if args.teacher_force.is_some() != args.dump_logits.is_some() {
        bail!("--teacher-force FILE and --dump-logits FILE go together");
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
        if let (Some(input), Some(output)) = (&args.teacher_force, &args.dump_logits) {
            let tokens = gpu_run::read_tokens(input)?;
            let logits = model.forward(&tokens, &mut model.new_cache())?;
            gpu_run::write_logits(output, logits.as_slice())?;
            eprintln!(
                "cpu reference: logits of {} positions written to {}",
                tokens.len(),
                output.display()
            );
            return Ok(ExitCode::SUCCESS);
        }
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

    let driver = match cuhal::Driver::load() {
        Ok(driver) => driver,
        Err(error) => return Ok(no_gpu(&format!(": {error}"))),
    };
    match driver.devices() {
        Ok(devices) if !devices.is_empty() => {}
        Ok(_) => return Ok(no_gpu(" (the driver reports no device)")),
        Err(error) => return Ok(no_gpu(&format!(": {error}"))),
    }
    let options = gpu_run::RunOptions {
        prompt,
        tokens: args.tokens,
        batch: args.batch,
        ahead: args.ahead,
        read_every: args.read_every,
        trace: args.trace.clone(),
        teacher_force: args.teacher_force.clone(),
        dump_logits: args.dump_logits.clone(),
        ptx: args.ptx,
        programmatic: !args.no_programmatic,
    };
    gpu_run::run(&driver, &files, &options)?;
    Ok(ExitCode::SUCCESS)
}

/// Says that no GPU is available and returns the status that says so.
fn no_gpu(why: &str) -> ExitCode {
    eprintln!("cuhal-decoder: no GPU available{why}");
    eprintln!("(--cpu-reference runs the f32 reference on the CPU)");
    ExitCode::from(EXIT_NO_GPU)
}
