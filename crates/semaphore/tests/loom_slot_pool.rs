//! loom model of the slot pool's bookkeeping (`cuhal_semaphore::slot_pool`, which the device
//! crate's event pool runs): handles of one slot cloned and dropped on two threads while a third
//! takes slots. Built and run only with `RUSTFLAGS="--cfg loom"` (`cargo xtask ci` does it).
#![cfg(loom)]

mod common;

use cuhal_semaphore::slot_pool::{FreeList, HandleCount};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

use common::loom::model;

/// Two slots, named by index, each with its handle count and a count of how often it went back
/// on the free list.
struct Pool {
    counts: [HandleCount; 2],
    returned: [AtomicUsize; 2],
    free: FreeList<usize>,
}

/// A handle as the device crate's event handle keeps it: clone counts, drop gives back.
struct Handle {
    pool: Arc<Pool>,
    slot: usize,
}

/// Takes a free slot as a handle.
fn take(pool: &Arc<Pool>) -> Option<Handle> {
    let slot = pool.free.take(|&slot| &pool.counts[slot])?;
    Some(Handle {
        pool: pool.clone(),
        slot,
    })
}

impl Clone for Handle {
    fn clone(&self) -> Self {
        self.pool.counts[self.slot].clone_handle();
        Handle {
            pool: self.pool.clone(),
            slot: self.slot,
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let pool = &self.pool;
        if pool.free.drop_handle(self.slot, &pool.counts[self.slot]) {
            pool.returned[self.slot].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Both slots free (created with one handle each, as the device pool's `grow` hands a new slot
/// out, whose drop puts them on the free list), then slot 0 handed out once.
fn pool_with_slot_0_out() -> (Arc<Pool>, Handle) {
    let pool = Arc::new(Pool {
        counts: [HandleCount::new(), HandleCount::new()],
        returned: [AtomicUsize::new(0), AtomicUsize::new(0)],
        free: FreeList::with_capacity(2),
    });
    for slot in [1, 0] {
        pool.counts[slot].clone_handle();
        assert!(pool.free.drop_handle(slot, &pool.counts[slot]));
    }
    let first = take(&pool).expect("slot 0 is free");
    assert_eq!(first.slot, 0);
    (pool, first)
}

/// Every slot has no handle left, and went back once per handout: once for slot 0's first, and
/// once for each of the `taken` ones.
fn check_returns(pool: &Pool, taken: usize) {
    for slot in 0..2 {
        assert_eq!(
            pool.counts[slot].handles(),
            0,
            "slot {slot} still has handles"
        );
    }
    let returned: usize = pool
        .returned
        .iter()
        .map(|r| r.load(Ordering::Relaxed))
        .sum();
    assert_eq!(returned, 1 + taken, "each handout returned exactly once");
}

/// Slot 0 is handed out and its handle cloned; one thread clones and drops its handle, another
/// drops its own, while a third takes slots (slot 1 is free from the start, slot 0 once both
/// handles are gone). `take` asserts that a slot it hands out has no handles; at the end each
/// slot is free, on the free list exactly once, and went back once per handout.
#[test]
fn handles_dropped_while_another_thread_takes() {
    model(
        "slot_pool::handles_dropped_while_another_thread_takes",
        || {
            let (pool, first) = pool_with_slot_0_out();
            let second = first.clone();

            let a = thread::spawn(move || {
                let third = first.clone();
                drop(first);
                drop(third);
            });
            let b = thread::spawn(move || drop(second));
            let taker = {
                let pool = pool.clone();
                thread::spawn(move || {
                    // Takes up to two slots; each must be free when taken (checked in `take`) and
                    // distinct from the other one held.
                    let one = take(&pool);
                    let two = take(&pool);
                    if let (Some(one), Some(two)) = (&one, &two) {
                        assert_ne!(one.slot, two.slot, "one slot handed out twice");
                    }
                    [one, two].iter().flatten().count()
                })
            };
            a.join().unwrap();
            b.join().unwrap();
            let taken = taker.join().unwrap();

            let free = pool.free.len();
            assert_eq!(free, 2, "every slot is back on the free list exactly once");
            check_returns(&pool, taken);
        },
    );
}

/// The same handles dropped on two threads while a third takes slots through a list of its own
/// (`FreeList::take_via`, as the device crate's event pool takes them): no slot is handed out
/// twice or while it has handles, and at the end every slot is free, on exactly one of the two
/// lists.
#[test]
fn handles_dropped_while_another_thread_takes_via_its_own_list() {
    model(
        "slot_pool::handles_dropped_while_another_thread_takes_via_its_own_list",
        || {
            let (pool, first) = pool_with_slot_0_out();
            let second = first.clone();
            let a = thread::spawn(move || drop(first));
            let b = thread::spawn(move || drop(second));
            let taker = {
                let pool = pool.clone();
                thread::spawn(move || {
                    let mut local = cuhal_recycle::Recycled::<Vec<usize>, 2>::with_capacity(2);
                    let mut take_local = || {
                        let slot = pool.free.take_via(&mut local, |&slot| &pool.counts[slot])?;
                        Some(Handle {
                            pool: pool.clone(),
                            slot,
                        })
                    };
                    let one = take_local();
                    let two = take_local();
                    if let (Some(one), Some(two)) = (&one, &two) {
                        assert_ne!(one.slot, two.slot, "one slot handed out twice");
                    }
                    let taken = [&one, &two].iter().filter(|h| h.is_some()).count();
                    drop((one, two));
                    (taken, local.len())
                })
            };
            a.join().unwrap();
            b.join().unwrap();
            let (taken, kept) = taker.join().unwrap();
            assert_eq!(
                pool.free.len() + kept,
                2,
                "every slot is free, on one list exactly once"
            );
            check_returns(&pool, taken);
        },
    );
}
