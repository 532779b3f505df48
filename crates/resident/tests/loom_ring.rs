//! loom models of the resident ring's hand-over: a descriptor the producer publishes is read
//! whole by the consumer (loom's cell reports a read racing a write), a full ring is never
//! overwritten, and the doorbell never strands work (a consumer that exits idle either saw the
//! ring or the ringer starts a successor).
//!
//! Built and run only with `RUSTFLAGS="--cfg loom"` (`cargo xtask ci` does it).
#![cfg(loom)]

use cuhal_resident::{Descriptor, Doorbell, HostMemory, split};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;

/// Two descriptors through a ring of one: the second push waits for the consumer's release.
#[test]
fn descriptors_cross_whole() {
    loom::model(|| {
        let (mut producer, mut consumer) = split(HostMemory::new(1, 0).unwrap()).unwrap();
        let writer = thread::spawn(move || {
            for handle in [10u64, 20] {
                let d = Descriptor {
                    executable: handle,
                    bindings: handle + 1,
                    ..Descriptor::default()
                };
                while producer.try_push(d).is_err() {
                    thread::yield_now();
                }
            }
        });
        let mut seen = Vec::new();
        while seen.len() < 2 {
            match consumer.peek().unwrap() {
                Some(d) => {
                    assert_eq!(d.bindings, d.executable + 1);
                    seen.push(d.executable);
                    assert!(consumer.advance());
                }
                None => thread::yield_now(),
            }
        }
        assert_eq!(seen, [10, 20]);
        writer.join().unwrap();
    });
}

/// A publish and ring against an idle consumer's exit: the work is seen, or a successor starts,
/// never both.
#[test]
fn the_doorbell_strands_nothing() {
    loom::model(|| {
        let doorbell = Arc::new(Doorbell::new());
        assert!(doorbell.ring(), "the first ring starts the consumer");
        let work = Arc::new(AtomicBool::new(false));
        let consumer = {
            let (doorbell, work) = (doorbell.clone(), work.clone());
            thread::spawn(move || {
                loop {
                    let seen = doorbell.seen();
                    if work.load(Ordering::SeqCst) {
                        return true;
                    }
                    if doorbell.try_exit(seen) {
                        return false;
                    }
                }
            })
        };
        work.store(true, Ordering::SeqCst);
        let started = doorbell.ring();
        let saw = consumer.join().unwrap();
        // Exactly one consumer handles the work: the running one saw it, or the ringer starts
        // a successor (never none, never two).
        assert_ne!(saw, started);
    });
}
