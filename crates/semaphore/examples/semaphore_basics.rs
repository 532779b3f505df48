//! A tour of cuhal-semaphore: signal and wait across threads, a multi-wait, a device-signal
//! timepoint that a host waiter completes by itself, a listener, and failure propagation.
//!
//! Run with `cargo run -p cuhal-semaphore --example semaphore_basics`.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use cuhal_semaphore::testing::FlagEvent;
use cuhal_semaphore::{
    Error, Failure, Listener, Semaphore, SemaphoreId, Timeout, wait_all, wait_any,
};

struct Print;

impl<E> Listener<E> for Print {
    fn notify(&self, semaphore: SemaphoreId, key: u64) {
        println!(
            "listener: semaphore {} is ready for action {key}",
            semaphore.get()
        );
    }
}

fn main() -> Result<(), Error> {
    // Two queues' timelines; the "device" event type here is a flag.
    let upload = Semaphore::<FlagEvent>::new(0);
    let compute = Semaphore::<FlagEvent>::new(0);

    // A scheduler would listen instead of blocking: fired once, outside the semaphore's lock.
    let listener: Arc<dyn Listener<FlagEvent>> = Arc::new(Print);
    upload.listen(2, &listener, 42);

    // Another thread plays the completion thread of the upload queue.
    let producer = {
        let upload = upload.clone();
        thread::spawn(move || -> Result<(), Error> {
            for value in 1..=2 {
                thread::sleep(Duration::from_millis(5));
                upload.advance_to(value)?;
            }
            Ok(())
        })
    };
    upload.wait(2, Duration::from_secs(5))?;
    println!("upload reached {}", upload.query()?);
    producer.join().expect("producer thread")?;

    // Device-signal timepoint: the compute queue records an event for value 1 at submission.
    // Another queue could wait for it on the device; a host waiter that sees the event complete
    // brings the semaphore up to date itself.
    let done = FlagEvent::new();
    compute.record_device_signal(1, done.clone())?;
    assert!(
        compute
            .device_wait_event(1)
            .is_some_and(|e| e.ptr_eq(&done))
    );
    done.complete(); // the "GPU" finished
    wait_all(&[(&upload, 2), (&compute, 1)], Timeout::Immediate)?;
    println!(
        "compute reached {} through its event, with no signal call",
        compute.query()?
    );

    // Timeline values only increase.
    match compute.signal(1) {
        Err(Error::NotMonotonic { current, requested }) => {
            println!("signal({requested}) refused: already at {current}")
        }
        other => println!("unexpected: {other:?}"),
    }

    // Failure: the first one wins, and every waiter sees that very failure.
    let waiter = {
        let compute = compute.clone();
        thread::spawn(move || wait_any(&[(&compute, 10)], Timeout::Infinite))
    };
    thread::sleep(Duration::from_millis(5));
    let lost = Failure::msg("device lost");
    compute.fail(lost.clone());
    match waiter.join().expect("waiter thread") {
        Err(Error::Failed(f)) => println!(
            "waiter woke with the original failure: {f} (same: {})",
            f.ptr_eq(&lost)
        ),
        other => println!("unexpected: {other:?}"),
    }
    Ok(())
}
