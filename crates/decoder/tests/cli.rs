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

    // With a device (the fake driver's), the GPU path is named as not built yet: an error,
    // not "no GPU".
    let fake = cuhal_fake_driver::harness::FakeDriver::built_library().unwrap();
    let out = decoder(&["--model", path], fake.to_str().unwrap());
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("GPU path is not built yet"), "{stderr}");
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
