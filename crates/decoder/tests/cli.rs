//! The `cuhal-decoder` binary as a user runs it.

mod common;

use std::process::{Command, Output};

use common::{ScratchDir, tiny_config};
use cuhal_decoder::reference::Model;
use cuhal_decoder::write_random_model;

/// Runs `cuhal-decoder <args>` with the driver library `library`.
fn decoder(args: &[&str], library: &str) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cuhal-decoder"));
    cmd.args(args).env("CUHAL_CUDA_LIBRARY", library);
    for var in ["CUHAL_FAKE_HIDE", "CUHAL_FAKE_FAIL", "CUHAL_FAKE_DEVICES"] {
        cmd.env_remove(var);
    }
    cmd.output().expect("run cuhal-decoder")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn cpu_reference_prints_the_greedy_tokens() {
    let dir = ScratchDir::new("cli-reference");
    write_random_model(dir.path(), &tiny_config(), 5).unwrap();
    let model = Model::load(dir.path()).unwrap();
    let expected = model
        .generate(&[4, 5, 6], 7, &mut model.new_cache())
        .unwrap();
    let expected: Vec<String> = expected.iter().map(u32::to_string).collect();

    let path = dir.path().to_str().unwrap();
    let args = [
        "--model",
        path,
        "--prompt-tokens",
        "4,5,6",
        "--tokens",
        "7",
        "--cpu-reference",
    ];
    let out = decoder(&args, "/nonexistent/libcuda.so.1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), expected.join(","));

    // Without a prompt, the model's bos_token_id (1) starts it.
    let out = decoder(
        &["--model", path, "--tokens", "2", "--cpu-reference"],
        "/nonexistent/libcuda.so.1",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bos = model.generate(&[1], 2, &mut model.new_cache()).unwrap();
    assert_eq!(text(&out.stdout).trim(), format!("{},{}", bos[0], bos[1]));
}

#[test]
fn without_a_gpu_it_says_so_and_exits_2() {
    let dir = ScratchDir::new("cli-nogpu");
    write_random_model(dir.path(), &tiny_config(), 5).unwrap();
    let path = dir.path().to_str().unwrap();
    let out = decoder(
        &["--model", path, "--prompt-tokens", "1"],
        "/nonexistent/libcuda.so.1",
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no GPU available"), "{stderr}");
    assert!(stderr.contains("--cpu-reference"), "{stderr}");
    assert!(out.stdout.is_empty());

    // With a device (the fake driver's, which reads only PTX) the GPU path runs: the fatbin is
    // not what it reads (it finds no kernel in it): an error naming the kernel, not "no GPU".
    let fake = cuhal_fake_driver::harness::FakeDriver::built_library().unwrap();
    let out = decoder(&["--model", path], fake.to_str().unwrap());
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("embed_f16"), "{stderr}");
}

#[test]
fn on_the_fake_driver_the_gpu_path_generates_traces_and_dumps_logits() {
    let dir = ScratchDir::new("cli-fake");
    let config = tiny_config();
    write_random_model(dir.path(), &config, 5).unwrap();
    let path = dir.path().to_str().unwrap();
    let fake = cuhal_fake_driver::harness::FakeDriver::built_library().unwrap();
    let fake = fake.to_str().unwrap();
    let trace = dir.path().join("trace.json");
    let args = [
        "--model",
        path,
        "--prompt-tokens",
        "4,5,6",
        "--tokens",
        "5",
        "--batch",
        "2",
        "--read-every",
        "2",
        "--kernel-image",
        "ptx",
        "--trace",
        trace.to_str().unwrap(),
    ];
    let out = decoder(&args, fake);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // One line of 5 tokens per sequence (the fake runs no kernel: their values are whatever
    // the fake's memory held).
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for line in lines {
        assert_eq!(line.split(',').count(), 5, "{line}");
    }
    assert!(stderr.contains("tokens/s"), "{stderr}");
    assert!(stderr.contains("p99"), "{stderr}");
    // A zone per kernel: every layer's kernels are named in the trace.
    let json = std::fs::read_to_string(&trace).unwrap();
    for zone in [
        "embed",
        "layer0.qkv",
        "layer1.attention",
        "lm_head",
        "argmax",
    ] {
        assert!(json.contains(zone), "{zone} missing from the trace");
    }

    // Teacher forcing writes [position][vocab] f32 logits.
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, "3, 9 27\n81").unwrap();
    let logits = dir.path().join("logits.f32");
    let teacher_force = |extra: &[&str], library: &str| {
        let mut args = vec![
            "--model",
            path,
            "--teacher-force",
            tokens.to_str().unwrap(),
            "--dump-logits",
            logits.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = decoder(&args, library);
        assert!(out.status.success(), "{}", text(&out.stderr));
        std::fs::read(&logits).unwrap()
    };
    let bytes = teacher_force(&["--kernel-image", "ptx"], fake);
    assert_eq!(bytes.len(), 4 * config.vocab_size * 4);

    // The CPU reference dumps the same shape, with its own values.
    let bytes = teacher_force(&["--cpu-reference"], "/nonexistent/libcuda.so.1");
    assert_eq!(bytes.len(), 4 * config.vocab_size * 4);
    let model = Model::load(dir.path()).unwrap();
    let expected = model
        .forward(&[3, 9, 27, 81], &mut model.new_cache())
        .unwrap();
    let first = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    assert_eq!(first, expected.as_slice()[0]);
}

#[test]
fn bad_arguments_and_models_fail_with_a_message() {
    let dir = ScratchDir::new("cli-bad");
    let path = dir.path().to_str().unwrap();
    // Usage errors exit 64 (never 2, which says "no GPU"); a bad model directory exits 1.
    let cases: [(&[&str], &str, i32); 7] = [
        (
            &["--random-model", path, "--config", "7b"],
            "expected small or 1b",
            64,
        ),
        (&["--config", "small"], "give --random-model DIR too", 64),
        (
            &["--model", path, "--prompt-tokens", "1,x"],
            "not a list of token ids",
            64,
        ),
        (&["--frobnicate"], "unknown argument", 64),
        (&["--tokens"], "needs a value", 64),
        (&[], "give --model DIR", 64),
        (&["--model", path, "--cpu-reference"], "config.json", 1),
    ];
    for (args, message, code) in cases {
        let out = decoder(args, "/nonexistent/libcuda.so.1");
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // A token outside the vocabulary is the library's typed error.
    write_random_model(dir.path(), &tiny_config(), 5).unwrap();
    let out = decoder(
        &["--model", path, "--prompt-tokens", "500", "--cpu-reference"],
        "/nonexistent/libcuda.so.1",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("token 500 is out of range"));
}
