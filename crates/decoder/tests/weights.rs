//! Loading models: the layout, the sharded form, and a typed error for each way a model
//! directory can be wrong, never a panic.

mod common;

use common::{RawTensor, ScratchDir, read_tensors, tiny_config, write_tensors};
use cuhal_decoder::{
    DType, Error, LlamaConfig, ModelFiles, SplitMix64, write_random_model,
    write_random_model_sharded,
};

#[test]
fn a_random_model_loads_with_every_tensor_borrowed_from_the_map() {
    let dir = ScratchDir::new("load");
    let config = tiny_config();
    write_random_model(dir.path(), &config, 7).unwrap();
    let files = ModelFiles::open(dir.path()).unwrap();
    assert_eq!(files.config(), &config);
    let weights = files.weights().unwrap();
    assert_eq!(weights.dtype, DType::F16);
    assert_eq!(weights.layers.len(), 2);
    assert_eq!(weights.layers[1].k_proj.shape, [32, 64]);
    assert_eq!(weights.layers[1].o_proj.shape, [64, 64]);
    assert_eq!(weights.layers[0].down_proj.shape, [64, 128]);
    assert_eq!(weights.lm_head.as_ref().unwrap().shape, [97, 64]);

    // Each tensor's bytes lie inside the mapped file, and together they fill its data section.
    let file = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let mut total = 0;
    for t in weights.tensors() {
        assert_eq!(t.data.len(), t.element_count() * 2, "{}", t.name);
        total += t.data.len();
        // The same bytes sit in the file (found by content; random data does not repeat).
        let at = file
            .windows(t.data.len().min(64))
            .position(|w| w == &t.data[..t.data.len().min(64)]);
        assert!(at.is_some(), "{}", t.name);
    }
    let header = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    assert_eq!(total, file.len() - 8 - header);
    assert_eq!(files.mapped_bytes(), file.len());

    // Projections are small around 0, norm scales near 1.
    let q = weights.layers[0].q_proj.to_f32();
    let std = (q.iter().map(|v| v * v).sum::<f32>() / q.len() as f32).sqrt();
    assert!((std - 0.02).abs() < 0.002, "projection deviation {std}");
    let norm = weights.norm.to_f32();
    assert!(norm.iter().all(|v| (v - 1.0).abs() < 0.15), "{norm:?}");
}

#[test]
fn the_same_seed_writes_the_same_bytes() {
    let (a, b, c) = (
        ScratchDir::new("seed-a"),
        ScratchDir::new("seed-b"),
        ScratchDir::new("seed-c"),
    );
    write_random_model(a.path(), &tiny_config(), 3).unwrap();
    write_random_model(b.path(), &tiny_config(), 3).unwrap();
    write_random_model(c.path(), &tiny_config(), 4).unwrap();
    let read = |d: &ScratchDir| std::fs::read(d.path().join("model.safetensors")).unwrap();
    assert_eq!(read(&a), read(&b));
    assert_ne!(read(&a), read(&c));
}

#[test]
fn bf16_and_tied_models_load() {
    let dir = ScratchDir::new("bf16");
    let config = LlamaConfig {
        torch_dtype: DType::BF16,
        tie_word_embeddings: true,
        ..tiny_config()
    };
    write_random_model(dir.path(), &config, 1).unwrap();
    let files = ModelFiles::open(dir.path()).unwrap();
    let weights = files.weights().unwrap();
    assert_eq!(weights.dtype, DType::BF16);
    assert!(weights.lm_head.is_none());
    assert_eq!(weights.output().name, "model.embed_tokens.weight");
    assert!(weights.tensors().all(|t| t.dtype == DType::BF16));
}

#[test]
fn the_sharded_form_loads_the_same_tensors() {
    let (single, sharded) = (ScratchDir::new("single"), ScratchDir::new("sharded"));
    write_random_model(single.path(), &tiny_config(), 11).unwrap();
    write_random_model_sharded(sharded.path(), &tiny_config(), 11, 3).unwrap();
    assert!(!sharded.path().join("model.safetensors").exists());
    assert!(
        sharded
            .path()
            .join("model-00003-of-00003.safetensors")
            .exists()
    );
    let a = ModelFiles::open(single.path()).unwrap();
    let b = ModelFiles::open(sharded.path()).unwrap();
    let (wa, wb) = (a.weights().unwrap(), b.weights().unwrap());
    let names: Vec<_> = wa.tensors().map(|t| t.name.clone()).collect();
    assert_eq!(
        names,
        wb.tensors().map(|t| t.name.clone()).collect::<Vec<_>>()
    );
    for (ta, tb) in wa.tensors().zip(wb.tensors()) {
        assert_eq!(ta.data, tb.data, "{}", ta.name);
    }
}

#[test]
fn a_shard_name_outside_the_directory_is_refused() {
    let dir = ScratchDir::new("bad-shard");
    write_random_model_sharded(dir.path(), &tiny_config(), 1, 2).unwrap();
    let index_path = dir.path().join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index_path).unwrap();
    let evil = text.replace("model-00002-of-00002", "../model-00002-of-00002");
    std::fs::write(&index_path, evil).unwrap();
    match ModelFiles::open(dir.path()) {
        Err(Error::BadShardName { name }) => assert!(name.starts_with("../"), "{name}"),
        other => panic!("{other:?}"),
    }
    // A shard the index names but the directory lacks: an I/O error naming it.
    std::fs::write(&index_path, text).unwrap();
    std::fs::remove_file(dir.path().join("model-00001-of-00002.safetensors")).unwrap();
    match ModelFiles::open(dir.path()) {
        Err(e @ Error::Io { .. }) => assert!(e.to_string().contains("model-00001-of-00002")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_missing_tensor_is_named() {
    let dir = ScratchDir::new("missing");
    let config = tiny_config();
    write_random_model(dir.path(), &config, 1).unwrap();
    let tensors: Vec<RawTensor> = read_tensors(dir.path())
        .into_iter()
        .filter(|t| t.name != "model.layers.1.mlp.up_proj.weight")
        .collect();
    write_tensors(dir.path(), &config, &tensors);
    match ModelFiles::open(dir.path()) {
        Err(e @ Error::MissingTensor { .. }) => {
            assert!(
                e.to_string().contains("model.layers.1.mlp.up_proj.weight"),
                "{e}"
            )
        }
        other => panic!("{other:?}"),
    }
    // Untied without lm_head: missing too.
    let no_head: Vec<RawTensor> = read_tensors_of(&config, 2)
        .into_iter()
        .filter(|t| t.name != "lm_head.weight")
        .collect();
    write_tensors(dir.path(), &config, &no_head);
    assert!(matches!(
        ModelFiles::open(dir.path()),
        Err(Error::MissingTensor { name }) if name == "lm_head.weight"
    ));
}

/// The tensors of a random model of `config`, written and read back.
fn read_tensors_of(config: &LlamaConfig, seed: u64) -> Vec<RawTensor> {
    let dir = ScratchDir::new("source");
    write_random_model(dir.path(), config, seed).unwrap();
    read_tensors(dir.path())
}

#[test]
fn a_wrong_shape_says_expected_and_found() {
    let dir = ScratchDir::new("shape");
    write_random_model(dir.path(), &tiny_config(), 1).unwrap();
    // The configuration now claims a wider MLP than the files hold.
    let wider = LlamaConfig {
        intermediate_size: 256,
        ..tiny_config()
    };
    std::fs::write(dir.path().join("config.json"), wider.to_json()).unwrap();
    match ModelFiles::open(dir.path()) {
        Err(Error::WrongShape {
            name,
            expected,
            found,
        }) => {
            assert_eq!(name, "model.layers.0.mlp.gate_proj.weight");
            assert_eq!((expected, found), (vec![256, 64], vec![128, 64]));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_tensor_of_another_dtype_is_named() {
    let dir = ScratchDir::new("dtype");
    let config = tiny_config();
    let mut tensors = read_tensors_of(&config, 5);
    tensors[3].dtype = DType::BF16;
    let odd = tensors[3].name.clone();
    write_tensors(dir.path(), &config, &tensors);
    match ModelFiles::open(dir.path()) {
        Err(e @ Error::WrongDtype { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains(&odd) && text.contains("F16") && text.contains("BF16"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    // An f32 model under a float32 configuration: refused, naming the two accepted types.
    for t in &mut tensors {
        t.dtype = DType::F32;
    }
    let f32_config = LlamaConfig {
        torch_dtype: DType::F32,
        ..config.clone()
    };
    write_tensors(dir.path(), &f32_config, &tensors);
    match ModelFiles::open(dir.path()) {
        Err(Error::WrongDtype { name, expected, .. }) => {
            assert_eq!(name, "model.embed_tokens.weight");
            assert_eq!(expected, "F16 or BF16");
        }
        other => panic!("{other:?}"),
    }
    // The writer refuses float32 models.
    assert!(matches!(
        write_random_model(dir.path(), &f32_config, 1),
        Err(Error::InvalidConfig {
            field: "torch_dtype",
            ..
        })
    ));
}

#[test]
fn directories_without_weights_or_with_another_architecture_are_refused() {
    let dir = ScratchDir::new("empty");
    assert!(matches!(
        ModelFiles::open(dir.path()),
        Err(Error::Io { path, .. }) if path.ends_with("config.json")
    ));
    std::fs::write(dir.path().join("config.json"), tiny_config().to_json()).unwrap();
    assert!(matches!(
        ModelFiles::open(dir.path()),
        Err(Error::NoWeights { .. })
    ));

    write_random_model(dir.path(), &tiny_config(), 1).unwrap();
    let text = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    let gpt2 = text.replace("LlamaForCausalLM", "GPT2LMHeadModel");
    std::fs::write(dir.path().join("config.json"), gpt2).unwrap();
    match ModelFiles::open(dir.path()) {
        Err(e @ Error::UnsupportedArchitecture { .. }) => {
            assert!(e.to_string().contains("GPT2LMHeadModel"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn truncated_and_corrupted_files_are_typed_errors_never_panics() {
    let source = ScratchDir::new("fuzz-source");
    write_random_model(source.path(), &tiny_config(), 9).unwrap();
    let original = std::fs::read(source.path().join("model.safetensors")).unwrap();
    let header_end = 8 + u64::from_le_bytes(original[..8].try_into().unwrap()) as usize;

    let dir = ScratchDir::new("fuzz");
    std::fs::copy(
        source.path().join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let file = dir.path().join("model.safetensors");

    // Every truncation is refused: inside the length prefix, inside the header, inside data.
    let len = original.len();
    for cut in [
        0,
        3,
        8,
        9,
        header_end / 2,
        header_end,
        header_end + 1,
        len / 2,
        len - 1,
    ] {
        std::fs::write(&file, &original[..cut]).unwrap();
        match ModelFiles::open(dir.path()) {
            Err(Error::Truncated { len: found, .. }) => assert_eq!(found, cut),
            Err(Error::MalformedHeader { .. }) => {}
            other => panic!("cut at {cut}: {other:?}"),
        }
    }
    // A malformed header: the length prefix pointing past the end, and JSON broken.
    let mut bad = original.clone();
    bad[..8].copy_from_slice(&(len as u64).to_le_bytes());
    std::fs::write(&file, &bad).unwrap();
    assert!(matches!(
        ModelFiles::open(dir.path()),
        Err(Error::Truncated { .. })
    ));
    let mut bad = original.clone();
    bad[8] = b'[';
    std::fs::write(&file, &bad).unwrap();
    assert!(matches!(
        ModelFiles::open(dir.path()),
        Err(Error::MalformedHeader { .. })
    ));

    // Random byte flips: in the header they fail (or, rarely, still describe a valid model);
    // in the data they only change values. Nothing panics.
    let mut rng = SplitMix64::new(1234);
    let (mut refused, mut header_flips) = (0, 0);
    for round in 0..300 {
        let mut bytes = original.clone();
        // Two thirds of the flips land in the header, where the parser is exercised.
        let at = if round % 3 == 0 {
            (rng.next_u64() as usize) % len
        } else {
            header_flips += 1;
            (rng.next_u64() as usize) % header_end
        };
        bytes[at] ^= 1 << (rng.next_u64() % 8);
        std::fs::write(&file, &bytes).unwrap();
        match ModelFiles::open(dir.path()) {
            Ok(files) => {
                // A model that still loads is well formed all the way through.
                let weights = files.weights().unwrap();
                assert_eq!(weights.layers.len(), 2);
            }
            Err(
                Error::Truncated { .. }
                | Error::MalformedHeader { .. }
                | Error::MissingTensor { .. }
                | Error::WrongShape { .. }
                | Error::WrongDtype { .. },
            ) => refused += 1,
            Err(other) => panic!("flip at {at}: unexpected {other:?}"),
        }
    }
    // Most header flips break the header.
    assert!(
        refused > header_flips / 2,
        "{refused} of {header_flips} header flips refused"
    );
}

#[test]
fn the_weights_file_has_the_permissions_of_the_config() {
    let dir = ScratchDir::new("permissions");
    write_random_model_sharded(dir.path(), &tiny_config(), 1, 2).unwrap();
    let config = std::fs::metadata(dir.path().join("config.json"))
        .unwrap()
        .permissions();
    for shard in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ] {
        let shard = std::fs::metadata(dir.path().join(shard))
            .unwrap()
            .permissions();
        assert_eq!(shard, config);
    }
}
