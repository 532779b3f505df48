//! No heap allocation per action in steady state: a counting global allocator sees zero
//! allocations over 10,000 submissions after warm-up, on the host backend, with every kind of
//! wait (reached, device wait across queues, pending then issued by the worker), resources and
//! cleanups; nor in a fresh thread's first burst; nor for actions whose lists spill far past
//! their inline room (the slots keep what they spilled to). Its own test binary (no harness), so nothing
//! else allocates while it counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use cuhal_scheduler::host::{self, HostPayload, HostQueue, HostSemaphore};
use cuhal_scheduler::{Cleanup, Cleanups, Failure, Outcome, QueueOptions, Resource, Resources};
use smallvec::smallvec;

mod support;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller upholds `alloc`'s contract, which we pass on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes through it).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as for `dealloc`; the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

static RAN: AtomicU64 = AtomicU64::new(0);
static CLEANED: AtomicU64 = AtomicU64::new(0);

fn work(_: u64) -> Result<(), Failure> {
    RAN.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

fn cleanup(outcome: Outcome<'_>, _: u64) {
    assert!(outcome.is_ok());
    CLEANED.fetch_add(1, Ordering::Relaxed);
}

struct Pipeline {
    a: HostQueue,
    b: HostQueue,
    sa: HostSemaphore,
    sb: HostSemaphore,
    gate: HostSemaphore,
    resource: Resource,
    round: u64,
}

impl Pipeline {
    /// One round: a (waits b's previous round: a device wait or reached) then b (waits a's round,
    /// a device wait); every 8th round a also waits a host gate signalled after submission, so it is
    /// pending and issued by the thread that signals the gate.
    fn round(&mut self) {
        self.round += 1;
        let i = self.round;
        let gated = i.is_multiple_of(8);
        let gate_value = i / 8;
        let a_waits: &[(&HostSemaphore, u64)] = if gated {
            &[(&self.sb, i - 1), (&self.gate, gate_value)]
        } else {
            &[(&self.sb, i - 1)]
        };
        let resources: Resources = smallvec![self.resource.clone()];
        let cleanups: Cleanups = smallvec![Cleanup::call(cleanup, i)];
        self.a
            .submit(
                a_waits,
                &[(&self.sa, i)],
                HostPayload::call(work, i),
                resources,
                cleanups,
            )
            .unwrap();
        let resources: Resources = smallvec![self.resource.clone()];
        let cleanups: Cleanups = smallvec![Cleanup::call(cleanup, i)];
        self.b
            .submit(
                &[(&self.sa, i)],
                &[(&self.sb, i)],
                HostPayload::call(work, i),
                resources,
                cleanups,
            )
            .unwrap();
        if gated {
            self.gate.signal(gate_value).unwrap();
        }
        // Bound what is in flight, as a steadily fed queue would be (both semaphores: each
        // holds a device-signal timepoint per round in flight).
        if i.is_multiple_of(32) {
            self.sync(i);
        }
    }

    fn sync(&self, value: u64) {
        self.sa.wait(value, Duration::from_secs(10)).unwrap();
        self.sb.wait(value, Duration::from_secs(10)).unwrap();
    }

    fn settle(&self) {
        self.sync(self.round);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while CLEANED.load(Ordering::SeqCst) < 2 * self.round {
            assert!(
                std::time::Instant::now() < deadline,
                "cleanups did not all run"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A chain across both queues, pending on a gate, released by a thread that never issued
/// before, while both completion threads are parked: its burst holds back their wakes (see the
/// scheduler's `burst` module) until it ends. Returns the allocations from the release to the
/// burst's end.
fn first_burst_of_a_fresh_thread(pipeline: &Pipeline) -> usize {
    let gate = HostSemaphore::new(0);
    let chain = HostSemaphore::new(0);
    const STEPS: u64 = 16;
    let pend = |round: u64| {
        for i in 0..STEPS {
            let step = round * STEPS + i;
            let wait = if i == 0 {
                (&gate, round + 1)
            } else {
                (&chain, step)
            };
            let queue = if i % 2 == 0 { &pipeline.a } else { &pipeline.b };
            queue
                .submit(
                    &[wait],
                    &[(&chain, step + 1)],
                    HostPayload::Nop,
                    Resources::new(),
                    Cleanups::new(),
                )
                .unwrap();
        }
        let parked =
            || pipeline.a.stats().completion_parked && pipeline.b.stats().completion_parked;
        assert!(
            support::within(Duration::from_secs(10), parked),
            "the completion threads did not park"
        );
    };
    // Warm-up, released by this thread: the chain semaphore's timepoint list grows to the
    // chain's length once.
    pend(0);
    gate.signal(1).unwrap();
    chain.wait(STEPS, Duration::from_secs(10)).unwrap();
    pend(1);
    let go = Arc::new(AtomicBool::new(false));
    let signaller = {
        let (go, gate) = (go.clone(), gate.clone());
        std::thread::spawn(move || {
            while !go.load(Ordering::SeqCst) {
                std::hint::spin_loop();
            }
            gate.signal(2).unwrap();
            // Off the count once the burst is over (the thread's end frees, and may allocate).
            COUNTING.store(false, Ordering::SeqCst);
        })
    };
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    go.store(true, Ordering::SeqCst);
    signaller.join().unwrap();
    let allocations = ALLOCATIONS.load(Ordering::SeqCst) - before;
    chain.wait(2 * STEPS, Duration::from_secs(10)).unwrap();
    allocations
}

fn main() {
    // A completion thread starved of a core falls behind its submitter; an in-flight limit under
    // the capacity made at start keeps the slots a queue needs within that capacity however far
    // behind it falls (without it, a backlog past the capacity grows the storage once, mid-count).
    let options = |label: &str| {
        let options = QueueOptions::new(label);
        let limit = options.capacity() / 2;
        options.with_max_in_flight(limit)
    };
    let mut pipeline = Pipeline {
        a: host::queue(options("alloc-a")).unwrap(),
        b: host::queue(options("alloc-b")).unwrap(),
        sa: HostSemaphore::new(0),
        sb: HostSemaphore::new(0),
        gate: HostSemaphore::new(0),
        resource: Arc::new(0u64),
        round: 0,
    };
    const ROUNDS: u64 = 5_000; // two submissions per round: 10,000 submissions
    // Warm-up: first a burst far deeper than the measured loop ever gets (storage grows to its
    // high-water mark once and keeps it), then the measured pattern itself.
    for _ in 0..256 {
        pipeline.round += 1;
        let i = pipeline.round;
        pipeline
            .a
            .submit(
                &[(&pipeline.sb, i - 1)],
                &[(&pipeline.sa, i)],
                HostPayload::Nop,
                Resources::new(),
                Cleanups::new(),
            )
            .unwrap();
        pipeline
            .b
            .submit(
                &[(&pipeline.sa, i)],
                &[(&pipeline.sb, i)],
                HostPayload::Nop,
                Resources::new(),
                Cleanups::new(),
            )
            .unwrap();
        CLEANED.fetch_add(2, Ordering::SeqCst); // these have no cleanup to count themselves
    }
    for _ in 0..ROUNDS {
        pipeline.round();
    }
    pipeline.settle();

    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..ROUNDS {
        pipeline.round();
    }
    pipeline.settle();
    COUNTING.store(false, Ordering::SeqCst);

    let allocations = ALLOCATIONS.load(Ordering::SeqCst);
    let stats = (pipeline.a.stats(), pipeline.b.stats());
    println!(
        "alloc: {} submissions measured, {allocations} allocations; a: {:?}; b: {:?}",
        2 * ROUNDS,
        stats.0,
        stats.1
    );
    assert_eq!(RAN.load(Ordering::SeqCst), 4 * ROUNDS, "every payload ran");
    assert!(
        stats.0.issued_on_signal + stats.0.issued_by_worker > 0,
        "the path of actions that become ready after submission was exercised"
    );
    assert!(stats.1.issued_on_submit > 0, "the fast path was exercised");
    assert_eq!(allocations, 0, "steady state must not allocate");
    let first_burst = first_burst_of_a_fresh_thread(&pipeline);
    println!("alloc: a fresh thread's first burst, {first_burst} allocations");
    assert_eq!(
        first_burst, 0,
        "a burst's held-back wakes must not allocate"
    );
    let spilled = spilled_lists(&pipeline);
    println!("alloc: actions with spilled lists, {spilled} allocations");
    assert_eq!(
        spilled, 0,
        "a slot must keep the storage its lists spilled to"
    );
    drop(pipeline);
    println!("alloc: ok");
}

/// Actions with 100 resources, cleanups and signals each, written in place (`submit_with`), one
/// queue: after a warm-up of every slot, the allocations of 1,000 more (every slot's lists
/// spilled once and kept that storage).
fn spilled_lists(pipeline: &Pipeline) -> usize {
    const ENTRIES: usize = 100;
    let semaphores: Vec<HostSemaphore> = (0..ENTRIES).map(|_| HostSemaphore::new(0)).collect();
    let mut signals: Vec<(&HostSemaphore, u64)> = semaphores.iter().map(|s| (s, 0)).collect();
    let mut value = 0;
    let mut submit = |count: u64| {
        for _ in 0..count {
            value += 1;
            for signal in &mut signals {
                signal.1 = value;
            }
            pipeline
                .a
                .submit_with(&[], &signals, |resources, cleanups| {
                    resources.extend((0..ENTRIES).map(|_| pipeline.resource.clone()));
                    cleanups.extend((0..ENTRIES).map(|_| Cleanup::call(cleanup, 0)));
                    HostPayload::Nop
                })
                .unwrap();
            // Polled, not waited for: what a parked wait costs is not this test's subject.
            while semaphores[0].query().unwrap() < value {
                std::thread::yield_now();
            }
        }
    };
    // Every slot in rotation (up to the queue's capacity, and the earlier phases' high-water
    // mark) spills once.
    submit(3000);
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    submit(1000);
    COUNTING.store(false, Ordering::SeqCst);
    ALLOCATIONS.load(Ordering::SeqCst) - before
}
