//! loom models of the completion policy's hurry against its sleeps: a nap (the completion
//! thread waiting on a completion nobody needed yet) and a hurry (a waiter registering, a
//! submitter wanting room, urgent work) race. No interleaving loses the wake: the nap either
//! sees the hurry before it sleeps or is unparked by it, and then reports itself hurried (so
//! the wait polls from then on). loom has no time, so a nap's sleep here lasts until an
//! unpark: a lost wake leaves the napping thread parked for ever, which loom reports as a
//! deadlock.
//!
//! Built and run only with `RUSTFLAGS="--cfg loom"` (`cargo xtask ci` does it).
#![cfg(loom)]

use std::time::Duration;

use cuhal_scheduler::Hurry;
use cuhal_semaphore::loom_sync::Parker;
use loom::sync::Arc;
use loom::thread;

/// A hurry and the completion thread's two parkers (its own, its nap's).
fn hurry() -> (Arc<Hurry>, Parker, Parker) {
    let completion = Parker::new();
    let nap = Parker::new();
    let hurry = Arc::new(Hurry::new(
        completion.unparker().clone(),
        nap.unparker().clone(),
    ));
    (hurry, completion, nap)
}

/// A hurry from another thread during (or before, or after the start of) a nap ends it, and
/// the nap reports it.
#[test]
fn a_hurry_ends_a_nap() {
    loom::model(|| {
        let (hurry, _completion, nap) = hurry();
        let hurrier = {
            let hurry = hurry.clone();
            thread::spawn(move || hurry.hurry())
        };
        assert!(
            hurry.nap(&nap, Duration::from_micros(20)),
            "a nap ended unhurried"
        );
        hurrier.join().unwrap();
    });
}

/// Two hurries (a waiter and a submitter wanting room) and a nap: the nap ends hurried, and
/// every later nap of the same round does not sleep at all.
#[test]
fn two_hurries_and_two_naps() {
    loom::model(|| {
        let (hurry, _completion, nap) = hurry();
        let hurriers: Vec<_> = (0..2)
            .map(|_| {
                let hurry = hurry.clone();
                thread::spawn(move || hurry.hurry())
            })
            .collect();
        assert!(hurry.nap(&nap, Duration::from_micros(20)));
        // Hurried until the round's take: a second nap sees it before it sleeps (an unpark
        // token the second hurry may have left is harmless either way).
        assert!(hurry.nap(&nap, Duration::from_micros(20)));
        for hurrier in hurriers {
            hurrier.join().unwrap();
        }
    });
}

/// A wake (a held burst's, new work for a parked thread) unparks the completion thread's own
/// parker, not the nap's: it does not hurry.
#[test]
fn a_wake_reaches_the_completion_parker() {
    loom::model(|| {
        let (hurry, completion, _nap) = hurry();
        let waker = {
            let hurry = hurry.clone();
            thread::spawn(move || hurry.wake())
        };
        completion.park();
        waker.join().unwrap();
    });
}
