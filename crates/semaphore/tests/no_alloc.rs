//! Steady-state operations allocate nothing: signal, advance, waits (reached, timed out, parked),
//! multi-waits, listener registration and firing, device-signal recording and lookup.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use cuhal_semaphore::testing::FlagEvent;
use cuhal_semaphore::{Listener, Semaphore, SemaphoreId, Timeout, wait_all, wait_any};

/// Counts allocations made by the current thread.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards every call unchanged to the system allocator; only counts on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller upholds `alloc`'s contract, which we pass on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller upholds `realloc`'s contract, which we pass on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

struct Nop;

impl<E> Listener<E> for Nop {
    fn notify(&self, _: SemaphoreId, _: u64) {}
}

/// One round of everything, on semaphores at `base`. Events are made outside (a pool's job).
fn round(
    a: &Semaphore<FlagEvent>,
    b: &Semaphore<FlagEvent>,
    base: u64,
    listener: &Arc<dyn Listener<FlagEvent>>,
    events: &[FlagEvent; 2],
) {
    let token = a.listen(base + 2, listener, 1);
    a.cancel_listen(token);
    a.listen(base + 1, listener, 2);
    a.listen(base + 3, listener, 3);
    a.record_device_signal(base + 3, events[0].clone()).unwrap();
    b.record_device_signal(base + 2, events[1].clone()).unwrap();
    assert!(a.device_wait_event(base + 2).is_some());
    a.signal(base + 1).unwrap();
    a.wait(base + 1, Timeout::Immediate).unwrap();
    assert!(a.wait(base + 2, Timeout::Immediate).is_err());
    assert!(wait_all(&[(a, base + 1), (b, base + 1)], Timeout::Immediate).is_err());
    b.advance_to(base + 2).unwrap();
    assert_eq!(
        wait_any(&[(a, base + 9), (b, base + 2)], Timeout::Infinite).unwrap(),
        1
    );
    wait_all(&[(a, base + 1), (b, base + 2)], Duration::from_secs(1)).unwrap();
    a.advance_to(base + 10).unwrap();
    b.advance_to(base + 10).unwrap();
}

#[test]
fn steady_state_operations_do_not_allocate() {
    let a = Semaphore::<FlagEvent>::new(0);
    let b = Semaphore::<FlagEvent>::new(0);
    let listener: Arc<dyn Listener<FlagEvent>> = Arc::new(Nop);
    let events = [FlagEvent::new(), FlagEvent::new()];
    // Warm up: slabs grow, the thread's parker is created.
    round(&a, &b, 0, &listener, &events);
    let before = allocations();
    for i in 1..100 {
        round(&a, &b, i * 10, &listener, &events);
    }
    assert_eq!(
        allocations() - before,
        0,
        "allocations in 99 steady-state rounds"
    );

    // A wait that parks: the signalling thread is elsewhere; the waiting thread allocates nothing.
    let c = Semaphore::<FlagEvent>::new(0);
    let c2 = c.clone();
    let signaller = thread::spawn(move || {
        for v in 1..=50 {
            while c2.waiter_count() == 0 {
                thread::yield_now();
            }
            c2.signal(v).unwrap();
        }
    });
    c.wait(1, Timeout::Infinite).unwrap();
    let before = allocations();
    for v in 2..=50 {
        c.wait(v, Timeout::Infinite).unwrap();
    }
    assert_eq!(allocations() - before, 0, "allocations in 49 parked waits");
    signaller.join().unwrap();
}

/// A wait that parks with events to query looks at them again now and then: those looks
/// allocate nothing either (four semaphores, one event each, all awaited at once).
#[test]
fn a_parked_wait_that_looks_at_its_events_again_does_not_allocate() {
    let sems: Vec<Semaphore<FlagEvent>> = (0..4).map(|_| Semaphore::new(0)).collect();
    let wait_round = |round: u64| {
        let events: Vec<FlagEvent> = (0..4).map(|_| FlagEvent::new()).collect();
        for (sem, event) in sems.iter().zip(&events) {
            sem.record_device_signal(round, event.clone()).unwrap();
        }
        let completer = {
            let events = events.clone();
            thread::spawn(move || {
                // Long enough for the waiter to spin, park and look again several times.
                thread::sleep(Duration::from_millis(5));
                for event in &events {
                    event.complete();
                }
            })
        };
        let list: Vec<(&Semaphore<FlagEvent>, u64)> = sems.iter().map(|s| (s, round)).collect();
        let before = allocations();
        wait_all(&list, Timeout::Infinite).unwrap();
        let made = allocations() - before;
        completer.join().unwrap();
        made
    };
    // Warm up: the thread's parker, the semaphores' rings and slabs.
    wait_round(1);
    for round in 2..6 {
        assert_eq!(
            wait_round(round),
            0,
            "allocations in parked wait round {round}"
        );
    }
}
