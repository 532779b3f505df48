//! No heap allocation per decode step once warm: the step is one recorded graph, and a step's
//! submission (a wait on the previous step, a signal, one command buffer) goes through
//! `Queue::execute`'s allocation-free path. A counting global allocator sees every thread of
//! the process (submitter, worker and completion threads); its own test binary, so nothing
//! else allocates while it counts.

mod common;

use common::{ScratchDir, tiny_config};
use cuhal::{DeviceOptions, Driver};
use cuhal_decoder::gpu::{Decoder, DecoderOptions, KernelImage};
use cuhal_decoder::{ModelFiles, write_random_model};
use cuhal_fake_driver::harness::FakeDriver;

/// The device tests' counting allocator: the `*_alloc` tests there count the same way.
#[path = "../../device/tests/fake_support/counting.rs"]
mod counting;

#[global_allocator]
static GLOBAL: counting::CountingAlloc = counting::CountingAlloc::new();

/// Steps counted.
const COUNTED: usize = 2_000;
/// The host waits for the chain every this many steps (as `generate` keeps a few in flight).
const BATCH: usize = 50;

#[test]
fn a_decode_step_allocates_nothing_once_warm() {
    let dir = ScratchDir::new("fake-alloc");
    let config = cuhal_decoder::LlamaConfig {
        max_position_embeddings: 8192,
        ..tiny_config()
    };
    write_random_model(dir.path(), &config, 7).unwrap();
    let files = ModelFiles::open(dir.path()).unwrap();
    let weights = files.weights().unwrap();
    let fake = FakeDriver::private("decoder-alloc").unwrap();
    // SAFETY: this test binary has one test, and nothing reads the environment through libc.
    unsafe { std::env::set_var("CUHAL_CUDA_LIBRARY", fake.path()) };
    let driver = Driver::load().unwrap();
    let device = driver.open(0, DeviceOptions::default()).unwrap();
    let options = DecoderOptions {
        batch: 4,
        capacity: 2 * (COUNTED + 2 * BATCH) + 4,
        image: KernelImage::Ptx,
        ..DecoderOptions::default()
    };
    let mut decoder = Decoder::new(&device, &config, &weights, &options).unwrap();
    decoder
        .start(&[&[1, 2], &[3, 4], &[5, 6], &[7, 8]])
        .unwrap();
    decoder.prefill().unwrap();
    // Warm-up: as many steps as the counted phase, so pools and lists reach their sizes.
    for i in 0..COUNTED + BATCH {
        decoder.submit_step().unwrap();
        if (i + 1) % BATCH == 0 {
            decoder.wait().unwrap();
        }
    }
    decoder.wait().unwrap();

    GLOBAL.start();
    for i in 0..COUNTED {
        decoder.submit_step().unwrap();
        if (i + 1) % BATCH == 0 {
            decoder.wait().unwrap();
        }
    }
    decoder.wait().unwrap();
    let allocations = GLOBAL.stop();
    assert_eq!(
        allocations, 0,
        "{allocations} allocations over {COUNTED} decode steps"
    );
}
