//! Helpers shared by the integration tests.
#![allow(dead_code)]

#[cfg(loom)]
pub mod loom;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use cuhal_semaphore::Failure;

/// Runs `f` on its own thread and fails the test (instead of hanging) if it takes longer than
/// `limit`.
pub fn bounded<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(value) => {
            let _ = handle.join();
            value
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("did not finish within {limit:?}: hang"),
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the thread sends before it ends"),
        },
    }
}

/// A failure with a recognisable message.
pub fn failure(text: &str) -> Failure {
    Failure::msg(text)
}
