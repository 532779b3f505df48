//! The loom runner shared by the loom models (the scheduler's include this file too).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs `body` under loom and prints how many interleavings it explored.
pub fn model(name: &str, body: impl Fn() + Sync + Send + 'static) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    loom::model(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        body();
    });
    println!(
        "loom model {name}: {} interleavings",
        runs.load(Ordering::Relaxed)
    );
}
