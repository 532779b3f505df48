//! The scheduler used alone, on the CPU host backend: two queues and semaphores between them
//! running a small pipeline. An "upload" queue produces a block of numbers, a "compute" queue
//! squares it once the upload is done (a device wait on the upload's completion event, no host
//! round trip), and the upload of the next block overlaps the compute of this one. A third step
//! shows a failure travelling down the pipeline to exactly the work that depends on it.
//!
//! Run with `cargo run -p cuhal-scheduler --example host_pipeline`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuhal_scheduler::host::{self, HostPayload, HostSemaphore};
use cuhal_scheduler::{Cleanup, Cleanups, Failure, QueueOptions, Resources};
use smallvec::smallvec;

const BLOCKS: u64 = 4;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let upload = host::queue(QueueOptions::new("upload"))?;
    let compute = host::queue(QueueOptions::new("compute"))?;
    let uploaded = HostSemaphore::new(0);
    let computed = HostSemaphore::new(0);
    let blocks: Vec<Arc<Mutex<Vec<u64>>>> = (0..BLOCKS).map(|_| Arc::default()).collect();
    let results = Arc::new(Mutex::new(Vec::new()));

    for (b, block) in (1..=BLOCKS).zip(&blocks) {
        // Upload block b into its own buffer; the buffer is retained until the action retires.
        let data = block.clone();
        upload.submit(
            &[],
            &[(&uploaded, b)],
            HostPayload::once(move || {
                std::thread::sleep(Duration::from_millis(5));
                *data.lock().unwrap() = (b * 10..b * 10 + 4).collect();
                Ok(())
            }),
            smallvec![block.clone() as _],
            Cleanups::new(),
        )?;
        // Compute block b once it is uploaded.
        let (data, out) = (block.clone(), results.clone());
        compute.submit(
            &[(&uploaded, b)],
            &[(&computed, b)],
            HostPayload::once(move || {
                let squares: Vec<u64> = data.lock().unwrap().iter().map(|x| x * x).collect();
                out.lock().unwrap().push((b, squares));
                Ok(())
            }),
            smallvec![block.clone() as _],
            smallvec![Cleanup::once(move |outcome| {
                println!("cleanup: block {b} computed: {outcome:?}");
            })],
        )?;
    }
    computed.wait(BLOCKS, Duration::from_secs(5))?;
    for (b, squares) in results.lock().unwrap().iter() {
        println!("block {b}: {squares:?}");
    }
    println!(
        "upload: {:?}\ncompute: {:?}",
        upload.stats(),
        compute.stats()
    );

    // A failure: an input semaphore fails; the compute waiting on it fails with the same error,
    // and so does whatever waits on the compute. Unrelated work is untouched.
    let input = HostSemaphore::new(0);
    let (stage, unrelated) = (HostSemaphore::new(0), HostSemaphore::new(0));
    compute.submit(
        &[(&input, 1)],
        &[(&stage, 1)],
        HostPayload::Nop,
        Resources::new(),
        Cleanups::new(),
    )?;
    upload.submit(
        &[],
        &[(&unrelated, 1)],
        HostPayload::Nop,
        Resources::new(),
        Cleanups::new(),
    )?;
    input.fail(Failure::msg("the input file could not be read"));
    match stage.wait(1, Duration::from_secs(5)) {
        Err(error) => println!("dependent stage: {error}"),
        Ok(()) => println!("dependent stage unexpectedly succeeded"),
    }
    unrelated.wait(1, Duration::from_secs(5))?;
    println!("unrelated work: done");
    Ok(())
}
