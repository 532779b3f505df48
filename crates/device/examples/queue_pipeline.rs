//! A two-queue pipeline ordered only by semaphores: upload on queue 0, compute on queue 1, read
//! back on queue 0, then a host call, with nothing waited for on the host until the end.
//!
//! ```text
//! cargo run -p cuhal --example queue_pipeline
//! ```
//!
//! Without a CUDA driver (or device) it says so and exits successfully.

mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cuhal::{CommandBuffer, DeviceOptions, Dispatch, Driver, KernelArgs};

/// `scale_add(u32 *data, u32 a, u32 b, u32 n)`: `data[i] = data[i] * a + b` for `i < n`.
const PTX: &str = include_str!("queue_pipeline.ptx");

const N: u32 = 1 << 20;
const BLOCK: u32 = 256;

fn main() -> ExitCode {
    let Some(driver) = common::driver_with_a_device() else {
        return ExitCode::SUCCESS;
    };
    match run(&driver) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("queue_pipeline: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(driver: &Driver) -> Result<(), Box<dyn std::error::Error>> {
    let device = driver.open(
        0,
        DeviceOptions {
            queues: 2,
            ..DeviceOptions::default()
        },
    )?;
    println!("{} ({:?})", device.info().name, device);
    let (upload, compute) = (device.queue(0), device.queue(1));
    let module = device.load_ptx(PTX)?;
    let kernel = module.function("scale_add")?;

    let bytes = N as usize * 4;
    let data = device.create_buffer(bytes)?;
    let result = device.create_host_buffer(bytes)?;
    let input: Vec<u32> = (0..N).collect();
    let (a, b) = (3u32, 7u32);

    // Recorded once; the queue builds a graph (or a deferred buffer) and can run it many times.
    let mut cb = compute.create_command_buffer()?;
    let args = KernelArgs::new()
        .with_range(&data.whole())
        .with(a)
        .with(b)
        .with(N);
    cb.dispatch(&Dispatch::new(
        &kernel,
        [N.div_ceil(BLOCK), 1, 1],
        [BLOCK, 1, 1],
        &args,
    ))?;
    let cb: Arc<dyn CommandBuffer> = cb.end()?;

    // One timeline orders the whole pipeline, across both queues.
    let timeline = device.create_semaphore(0);
    let checked = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let host_data: Vec<u8> = input.iter().flat_map(|w| w.to_ne_bytes()).collect();
    upload.write(&[], &[(&timeline, 1)], &data.whole(), &host_data)?;
    compute.execute(&[(&timeline, 1)], &[(&timeline, 2)], &[&cb])?;
    upload.read(
        &[(&timeline, 2)],
        &[(&timeline, 3)],
        &data.whole(),
        &result,
        0,
    )?;
    {
        let (result, checked) = (result.clone(), checked.clone());
        let expected: Vec<u32> = input.iter().map(|x| x * a + b).collect();
        upload.host_call(&[(&timeline, 3)], &[(&timeline, 4)], move || {
            let mut bytes = vec![0u8; result.len()];
            result.read(0, &mut bytes).map_err(cuhal::Failure::new)?;
            let ok = bytes
                .chunks_exact(4)
                .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                .eq(expected.iter().copied());
            checked.store(ok, Ordering::SeqCst);
            Ok(())
        })?;
    }
    timeline.wait(4, Duration::from_secs(10))?;
    let elapsed = start.elapsed();
    if !checked.load(Ordering::SeqCst) {
        return Err("the pipeline's result is wrong".into());
    }
    println!(
        "upload -> scale_add -> read back -> host check: {N} words in {elapsed:?}; queue stats {:?} / {:?}",
        upload.stats(),
        compute.stats()
    );
    Ok(())
}
