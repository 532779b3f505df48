//! A cudarc buffer through a cuhal command buffer and back: cudarc uploads it, a cuhal command
//! buffer fills it (after the upload, on the device), cudarc reads it back (after the fill, on
//! the device).
//!
//! Run with `cargo run -p cuhal-cudarc --example cudarc_roundtrip`. Without a driver it says so
//! and exits: cuhal is loaded first, and cudarc (which panics without a driver) only after.

use std::time::Duration;

use anyhow::{Context, ensure};
use cudarc::driver::CudaContext;
use cuhal::{DeviceOptions, Driver, FillPattern};
use cuhal_cudarc::SliceLoan;

fn main() -> anyhow::Result<()> {
    let driver = match Driver::load() {
        Ok(driver) => driver,
        Err(e) => {
            println!("no CUDA driver ({e}): nothing to run");
            return Ok(());
        }
    };
    let device = driver.open(0, DeviceOptions::default())?;
    let stream = CudaContext::new(0)?.new_stream()?;
    let mut slice = stream.clone_htod(&[1u32; 4096])?;

    let queue = device.queue(0);
    let done = device.create_semaphore(0);
    let mut cb = queue.create_command_buffer()?;
    // SAFETY: the loan is given back below and the command buffer dropped before the slice is.
    let mut loan =
        unsafe { SliceLoan::lend_mut(&device, queue, &mut slice, &stream, &[(&done, 1)]) }?;
    cb.fill(&loan.range(), FillPattern::U32(42))?;
    let cb = cb.end()?;
    queue.execute(&[(&done, 1)], &[(&done, 2)], &[&cb])?;
    loan.give_back(&done, 2, Duration::from_secs(5))?;
    drop(loan);

    let host = stream
        .clone_dtoh(&slice)
        .context("reading the slice back")?;
    ensure!(
        host.iter().all(|&x| x == 42),
        "cudarc read before cuhal's fill"
    );
    drop(cb);
    println!("{} words through cuhal and back to cudarc", host.len());
    Ok(())
}
