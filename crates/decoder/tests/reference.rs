//! The f32 reference on tiny random models: incremental decoding equals a prefill, grouped
//! key/value heads equal their repetition, and bad inputs are refused.

mod common;

use common::{RawTensor, ScratchDir, read_tensors, tiny_config, write_tensors};
use cuhal_decoder::reference::{KvCache, Model};
use cuhal_decoder::{Error, LlamaConfig, write_random_model};

fn tiny_model(config: &LlamaConfig, seed: u64) -> Model {
    let dir = ScratchDir::new("reference");
    write_random_model(dir.path(), config, seed).unwrap();
    Model::load(dir.path()).unwrap()
}

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn decoding_step_by_step_equals_the_prefill() {
    let model = tiny_model(&tiny_config(), 21);
    let prompt = [1, 17, 42, 5, 96, 0, 33, 8];
    let mut prefill_cache = model.new_cache();
    let prefill = model.forward(&prompt, &mut prefill_cache).unwrap();
    assert_eq!(prefill.positions(), prompt.len());
    assert_eq!(prefill_cache.len(), prompt.len());

    let mut cache = model.new_cache();
    for (i, &token) in prompt.iter().enumerate() {
        let step = model.forward(&[token], &mut cache).unwrap();
        assert_eq!(step.positions(), 1);
        let d = max_difference(step.row(0).unwrap(), prefill.row(i).unwrap());
        assert!(d < 1e-4, "position {i}: logits differ by {d}");
    }
    // A prefill in two parts agrees as well, and so do the caches.
    let mut split = model.new_cache();
    model.forward(&prompt[..3], &mut split).unwrap();
    let rest = model.forward(&prompt[3..], &mut split).unwrap();
    let d = max_difference(rest.last().unwrap(), prefill.last().unwrap());
    assert!(d < 1e-4, "{d}");
    for layer in 0..2 {
        assert!(max_difference(cache.keys(layer), prefill_cache.keys(layer)) < 1e-5);
        assert!(max_difference(cache.values(layer), prefill_cache.values(layer)) < 1e-5);
    }
    // Logits depend on the context: the last position differs from the same token alone.
    let alone = model.forward(&[prompt[7]], &mut model.new_cache()).unwrap();
    assert!(max_difference(alone.last().unwrap(), prefill.last().unwrap()) > 1e-3);
}

#[test]
fn greedy_generation_is_the_argmax_fed_back() {
    let model = tiny_model(&tiny_config(), 22);
    let prompt = [3, 4, 5];
    let generated = model.generate(&prompt, 6, &mut model.new_cache()).unwrap();
    assert_eq!(generated.len(), 6);
    // Recomputed by prefilling the whole sequence each time.
    let mut sequence = prompt.to_vec();
    for &token in &generated {
        let logits = model.forward(&sequence, &mut model.new_cache()).unwrap();
        assert_eq!(logits.argmax_last(), Some(token));
        sequence.push(token);
    }
    assert_eq!(
        model.generate(&prompt, 0, &mut model.new_cache()).unwrap(),
        Vec::<u32>::new()
    );
    assert!(matches!(
        model.generate(&[], 1, &mut model.new_cache()),
        Err(Error::EmptyPrompt)
    ));
}

/// Grouped-query attention equals multi-head attention whose key/value heads repeat each
/// grouped head `heads / kv_heads` times (Hugging Face's `repeat_kv`): the same model written
/// both ways gives the same logits.
#[test]
fn grouped_query_attention_equals_repeated_heads() {
    let gqa_config = tiny_config();
    assert_eq!(
        (
            gqa_config.num_attention_heads,
            gqa_config.num_key_value_heads
        ),
        (4, 2)
    );
    let source = ScratchDir::new("gqa");
    write_random_model(source.path(), &gqa_config, 31).unwrap();
    let gqa = Model::load(source.path()).unwrap();

    let mha_config = LlamaConfig {
        num_key_value_heads: 4,
        ..gqa_config.clone()
    };
    let head = mha_config.head_dim * mha_config.hidden_size;
    let tensors: Vec<RawTensor> = read_tensors(source.path())
        .into_iter()
        .map(|mut t| {
            if t.name.ends_with("k_proj.weight") || t.name.ends_with("v_proj.weight") {
                // Rows of kv head j become rows of heads 2j and 2j + 1.
                t.values = t
                    .values
                    .chunks(head)
                    .flat_map(|h| [h, h].concat())
                    .collect();
                t.shape[0] *= 2;
            }
            t
        })
        .collect();
    let repeated = ScratchDir::new("mha");
    write_tensors(repeated.path(), &mha_config, &tensors);
    let mha = Model::load(repeated.path()).unwrap();

    let prompt = [9, 8, 7, 60, 61];
    let a = gqa.forward(&prompt, &mut gqa.new_cache()).unwrap();
    let b = mha.forward(&prompt, &mut mha.new_cache()).unwrap();
    let d = max_difference(a.as_slice(), b.as_slice());
    assert!(d < 1e-5, "{d}");
}

/// With as many key/value heads as query heads, the model's attention is plain multi-head
/// attention: checked against a direct computation of one layer's attention output.
#[test]
fn attention_with_equal_heads_is_plain_multi_head_attention() {
    use cuhal_decoder::reference::{AttentionShape, attention, ops};
    let (heads, head_dim, rows) = (3, 4, 5);
    let width = heads * head_dim;
    let mut rng = cuhal_decoder::SplitMix64::new(5);
    let mut random =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.next_normal_pair().0 as f32).collect() };
    let (q, k, v) = (
        random(rows * width),
        random(rows * width),
        random(rows * width),
    );
    let shape = AttentionShape {
        heads,
        kv_heads: heads,
        head_dim,
    };
    let out = attention(&q, rows, 0, &k, &v, shape);
    for r in 0..rows {
        for h in 0..heads {
            let slice = |m: &[f32], p: usize| m[p * width + h * head_dim..][..head_dim].to_vec();
            let mut scores: Vec<f32> = (0..=r)
                .map(|p| {
                    slice(&q, r)
                        .iter()
                        .zip(slice(&k, p))
                        .map(|(a, b)| a * b)
                        .sum::<f32>()
                        / (head_dim as f32).sqrt()
                })
                .collect();
            ops::softmax(&mut scores);
            for i in 0..head_dim {
                let expected: f32 = (0..=r).map(|p| scores[p] * slice(&v, p)[i]).sum();
                let got = out[r * width + h * head_dim + i];
                assert!((expected - got).abs() < 1e-5, "row {r} head {h} [{i}]");
            }
        }
    }
}

#[test]
fn bad_tokens_full_contexts_and_foreign_caches_are_refused() {
    let config = tiny_config();
    let model = tiny_model(&config, 23);
    let mut cache = model.new_cache();
    assert!(matches!(
        model.forward(&[1, 97], &mut cache),
        Err(Error::TokenOutOfRange {
            token: 97,
            vocab_size: 97
        })
    ));
    assert!(
        cache.is_empty(),
        "a refused call leaves the cache as it was"
    );
    let long: Vec<u32> = (0..64).map(|i| i % 97).collect();
    model.forward(&long, &mut cache).unwrap();
    assert!(matches!(
        model.forward(&[1], &mut cache),
        Err(Error::ContextFull {
            cached: 64,
            asked: 1,
            max: 64
        })
    ));
    cache.clear();
    assert!(model.forward(&[1], &mut cache).is_ok());

    let other = KvCache::new(&LlamaConfig {
        num_hidden_layers: 3,
        ..config
    });
    assert!(matches!(
        model.forward(&[1], &mut other.clone()),
        Err(Error::CacheMismatch { .. })
    ));
}

/// The tied output head is the embedding: a tied model's logits equal an untied copy whose
/// `lm_head` is the embedding.
#[test]
fn tied_embeddings_are_the_output_head() {
    let tied_config = LlamaConfig {
        tie_word_embeddings: true,
        ..tiny_config()
    };
    let source = ScratchDir::new("tied");
    write_random_model(source.path(), &tied_config, 41).unwrap();
    let tied = Model::load(source.path()).unwrap();
    let mut tensors = read_tensors(source.path());
    let embed = tensors
        .iter()
        .find(|t| t.name == "model.embed_tokens.weight")
        .unwrap();
    tensors.push(RawTensor {
        name: "lm_head.weight".into(),
        dtype: embed.dtype,
        shape: embed.shape.clone(),
        values: embed.values.clone(),
    });
    let untied_config = LlamaConfig {
        tie_word_embeddings: false,
        ..tied_config
    };
    let untied_dir = ScratchDir::new("untied");
    write_tensors(untied_dir.path(), &untied_config, &tensors);
    let untied = Model::load(untied_dir.path()).unwrap();
    let prompt = [10, 20, 30];
    let a = tied.forward(&prompt, &mut tied.new_cache()).unwrap();
    let b = untied.forward(&prompt, &mut untied.new_cache()).unwrap();
    assert_eq!(a, b);
}

/// The `small` preset (about 56 million parameters) writes, loads and computes a few tokens.
#[test]
#[ignore = "slow in debug builds: writes and converts a 110 MB model"]
fn the_small_preset_loads_and_generates() {
    let dir = ScratchDir::new("small");
    write_random_model(dir.path(), &LlamaConfig::small(), 1).unwrap();
    let model = Model::load(dir.path()).unwrap();
    let mut cache = model.new_cache();
    let tokens = model.generate(&[1, 2, 3], 4, &mut cache).unwrap();
    assert_eq!(tokens.len(), 4);
    assert_eq!(cache.len(), 3 + 3);
    assert!(tokens.iter().all(|&t| (t as usize) < 32000));
}
