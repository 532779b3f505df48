//! A last resort against a run that never ends: the bench runs once, unattended, on a lent GPU
//! machine, and a wait that never returns (a driver hang, a bug in cuhal's shutdown) must not
//! eat the machine's time. Every host wait of the cases is already bounded; this bounds what
//! they cannot, such as a `Drop` that blocks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What the watchdog knows of the run.
struct State {
    stage: Mutex<String>,
    done: AtomicBool,
}

/// Ends the process with exit status 1 and a message naming the stage, if the run is not done
/// within its limit. Dropping it disarms it.
pub struct Watchdog {
    state: Arc<State>,
}

impl Watchdog {
    /// Arms a watchdog; `on_fire` returns the text to print (where partial results are).
    pub fn start(limit: Duration, on_fire: String) -> Self {
        let state = Arc::new(State {
            stage: Mutex::new("start-up".to_owned()),
            done: AtomicBool::new(false),
        });
        let watched = state.clone();
        let started = Instant::now();
        // A thread that cannot be spawned leaves the run unguarded, which is no worse than
        // before: ignore it.
        let _ = std::thread::Builder::new()
            .name("bench-watchdog".into())
            .spawn(move || {
                while started.elapsed() < limit {
                    if watched.done.load(Ordering::Acquire) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                if watched.done.load(Ordering::Acquire) {
                    return;
                }
                let stage = watched
                    .stage
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                eprintln!(
                    "cuhal bench: gave up after {} s in {stage}: something never returned. {on_fire}",
                    limit.as_secs()
                );
                // 1: the `cuhal` binary's exit status for a failed run.
                std::process::exit(1);
            });
        Self { state }
    }

    /// Names what the run is doing now, for the message.
    pub fn stage(&self, stage: impl Into<String>) {
        *self
            .state
            .stage
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = stage.into();
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.state.done.store(true, Ordering::Release);
    }
}
