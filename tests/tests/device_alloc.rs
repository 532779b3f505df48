//! GPU suite: a warm queue allocates nothing per submission.
//!
//! A counting `#[global_allocator]` (this file is its own test binary, so nothing else runs in the
//! process) counts every heap allocation of every thread while 10,000 chained
//! `queue.execute(&[(&a, n)], &[(&a, n + 1)], &[&cb])` run, each with a one-dispatch command
//! buffer. Counting across all threads, rather than on the submitting thread only, also covers the
//! queue's worker and completion threads, which retire every one of those submissions inside the
//! counted window (the window closes only once the queue reports all of them retired). The CUDA
//! driver's own threads allocate with `malloc`, not through Rust's allocator, so they do not count.
//!
//! Steady state is made reachable on purpose: submissions are throttled to a window of
//! `WINDOW` in flight (by polling the queue's counters, which allocates nothing), and the warm-up
//! first holds twice that many in flight behind a slow kernel, so every pool and inline list has
//! already grown to what the measured loop can need. An allocation in the loop is therefore a
//! per-submission allocation, not growth. When one happens, the first few are described (size,
//! thread) to say where to look.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use cuhal::{CommandBuffer, CommandBufferMode, Device, Queue, Semaphore};
use cuhal_gpu_tests::device_support::*;

/// Counts allocations; while armed, describes the first few.
struct Counting;

static ALL: AtomicU64 = AtomicU64::new(0);
static ARMED: AtomicBool = AtomicBool::new(false);
/// Up to `SEEN` allocations made while armed: (bytes, made on the submitting thread, thread name).
static SEEN_LIST: Mutex<[(usize, bool, [u8; 24]); SEEN]> = Mutex::new([(0, false, [0; 24]); SEEN]);
static SEEN_COUNT: AtomicU64 = AtomicU64::new(0);
const SEEN: usize = 8;

thread_local! {
    static MINE: Cell<u64> = const { Cell::new(0) };
    static SUBMITTER: Cell<bool> = const { Cell::new(false) };
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

fn note(layout: Layout) {
    ALL.fetch_add(1, Ordering::Relaxed);
    let _ = MINE.try_with(|c| c.set(c.get() + 1));
    if !ARMED.load(Ordering::Relaxed) {
        return;
    }
    // Describing an allocation may allocate (the thread's name): never recurse into it.
    if INSIDE.try_with(|c| c.replace(true)).unwrap_or(true) {
        return;
    }
    let index = SEEN_COUNT.fetch_add(1, Ordering::Relaxed) as usize;
    if index < SEEN {
        let submitter = SUBMITTER.try_with(Cell::get).unwrap_or(false);
        let mut name = [0u8; 24];
        if let Some(text) = std::thread::current().name() {
            let n = text.len().min(name.len());
            name[..n].copy_from_slice(&text.as_bytes()[..n]);
        }
        if let Ok(mut list) = SEEN_LIST.try_lock() {
            list[index] = (layout.size(), submitter, name);
        }
    }
    let _ = INSIDE.try_with(|c| c.set(false));
}

// SAFETY: forwards to the system allocator unchanged; the bookkeeping uses atomics, const
// thread-locals without destructors and a lock taken with try_lock (never blocking inside the
// allocator), and a re-entrancy flag keeps it from recursing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout);
        // SAFETY: the caller's layout contract is passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout);
        // SAFETY: as for alloc.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(layout);
        // SAFETY: as for alloc and dealloc.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Submissions counted.
const COUNT: u64 = 10_000;
/// Submissions in flight at most during the counted loop.
const WINDOW: u64 = 64;

/// Blocks (without allocating) until at most `window` submissions of `queue` are unretired.
fn throttle(queue: &Queue, window: u64) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let stats = queue.stats();
        if stats.submitted - stats.retired() <= window {
            return;
        }
        if Instant::now() > deadline {
            ARMED.store(false, Ordering::Relaxed);
            panic!("{} stopped retiring: {stats:?}", queue.label());
        }
        std::thread::yield_now();
    }
}

struct Fixture {
    device: Device,
    a: Semaphore,
    n: u64,
    counter: Arc<cuhal::Buffer>,
    spin: Arc<dyn CommandBuffer>,
    increments: u64,
}

impl Fixture {
    fn new(mode: CommandBufferMode) -> Fixture {
        let device = open(mode, 1);
        let kernels = Kernels::load(&device);
        let counter = device.create_buffer(4).unwrap();
        poison(&counter, 0);
        let scratch = device.create_buffer(4).unwrap();
        let spin = command_buffer(device.queue(0), |cb| {
            record_spin_fill(cb, &kernels, 3_000_000, &scratch.whole(), 1)
        });
        let a = device.create_semaphore(0);
        Fixture {
            device,
            a,
            n: 0,
            counter,
            spin,
            increments: 0,
        }
    }

    fn cb(&self, dispatches: usize) -> Arc<dyn CommandBuffer> {
        let kernels = Kernels::load(&self.device);
        command_buffer(self.device.queue(0), |cb| {
            for _ in 0..dispatches {
                record_increment(cb, &kernels, &self.counter.whole());
            }
        })
    }

    /// `execute(&[(&a, n)], &[(&a, n + 1)], cbs)`.
    fn submit(&mut self, cbs: &[&Arc<dyn CommandBuffer>], increments: u64) {
        let n = self.n;
        if let Err(e) = self
            .device
            .queue(0)
            .execute(&[(&self.a, n)], &[(&self.a, n + 1)], cbs)
        {
            ARMED.store(false, Ordering::Relaxed);
            panic!("execute {n}: {e}");
        }
        self.n += 1;
        self.increments += increments;
    }

    /// Waits, without allocating, until everything submitted has retired.
    fn drain(&self) {
        throttle(self.device.queue(0), 0);
    }

    /// Brings every pool and list to steady-state size: twice `WINDOW` in flight behind a slow
    /// kernel, twice, then a throttled run like the measured one.
    fn warm_up(&mut self, cbs: &[&Arc<dyn CommandBuffer>], per_submission: u64) {
        for _ in 0..2 {
            let spin = self.spin.clone();
            self.submit(&[&spin], 0);
            for _ in 0..2 * WINDOW {
                self.submit(cbs, per_submission);
            }
            self.drain();
        }
        for _ in 0..1_000 {
            throttle(self.device.queue(0), WINDOW);
            self.submit(cbs, per_submission);
        }
        self.drain();
    }

    /// Runs `COUNT` throttled submissions and returns the allocations of all threads and of
    /// this one.
    fn measure(&mut self, cbs: &[&Arc<dyn CommandBuffer>], per_submission: u64) -> (u64, u64) {
        SUBMITTER.with(|c| c.set(true));
        SEEN_COUNT.store(0, Ordering::Relaxed);
        let all_before = ALL.load(Ordering::SeqCst);
        let mine_before = MINE.with(Cell::get);
        ARMED.store(true, Ordering::SeqCst);
        for _ in 0..COUNT {
            throttle(self.device.queue(0), WINDOW);
            self.submit(cbs, per_submission);
        }
        self.drain();
        ARMED.store(false, Ordering::SeqCst);
        let all = ALL.load(Ordering::SeqCst) - all_before;
        let mine = MINE.with(Cell::get) - mine_before;
        SUBMITTER.with(|c| c.set(false));
        (all, mine)
    }

    fn check(&self, what: &str, all: u64, mine: u64) {
        let stats = self.device.queue(0).stats();
        assert_eq!(self.a.query().unwrap(), self.n, "{what}: the chain's value");
        assert_eq!(stats.completed, stats.submitted, "{what}: {stats:?}");
        assert_eq!(stats.failed, 0);
        assert_eq!(
            read_u32(&self.counter),
            vec![self.increments as u32],
            "{what}: every dispatch ran once"
        );
        let (created, in_use) = self.device.event_counts();
        println!(
            "{what}: {COUNT} submissions, {all} allocations ({mine} on the submitting thread); events created {created}, in use {in_use}; {stats:?}"
        );
        if all != 0 {
            let seen = SEEN_LIST.lock().unwrap();
            let count = (SEEN_COUNT.load(Ordering::Relaxed) as usize).min(SEEN);
            for (size, submitter, name) in &seen[..count] {
                let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
                println!(
                    "  allocation of {size} bytes on {} ({})",
                    if *submitter {
                        "the submitting thread"
                    } else {
                        "another thread"
                    },
                    String::from_utf8_lossy(&name[..end])
                );
            }
        }
        assert_eq!(
            all, 0,
            "{what}: {all} heap allocations in {COUNT} warm submissions ({mine} on the submitting thread)"
        );
    }
}

fn one_dispatch(mode: CommandBufferMode, what: &str) {
    let mut f = Fixture::new(mode);
    let cb = f.cb(1);
    f.warm_up(&[&cb], 1);
    let (all, mine) = f.measure(&[&cb], 1);
    f.check(what, all, mine);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn graph_execute_allocates_nothing_when_warm() {
    one_dispatch(CommandBufferMode::Graph, "graph, 1 dispatch");
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn deferred_execute_allocates_nothing_when_warm() {
    one_dispatch(CommandBufferMode::Deferred, "deferred, 1 dispatch");
}

/// `Queue::execute` promises no allocation for up to four command buffers.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn four_command_buffers_allocate_nothing_when_warm() {
    let mut f = Fixture::new(CommandBufferMode::Graph);
    let cbs: Vec<_> = (0..4).map(|_| f.cb(1)).collect();
    let list: Vec<&Arc<dyn CommandBuffer>> = cbs.iter().collect();
    f.warm_up(&list, 4);
    let (all, mine) = f.measure(&list, 4);
    f.check("graph, 4 command buffers", all, mine);
}

/// Binding tables: every submission binds the one slot of a one-dispatch command buffer to the
/// other of two counters, so graph executables are patched at every launch; nothing allocates.
fn bound(mode: CommandBufferMode, what: &str) {
    let mut f = Fixture::new(mode);
    let kernels = Kernels::load(&f.device);
    let counters = [
        f.device.create_buffer(4).unwrap(),
        f.device.create_buffer(4).unwrap(),
    ];
    for c in &counters {
        poison(c, 0);
    }
    let mut cb = f
        .device
        .queue(0)
        .create_command_buffer_with_bindings(1)
        .unwrap();
    let args = cuhal::KernelArgs::new().with_binding(0, 0);
    cb.dispatch(&cuhal::Dispatch::new(
        &kernels.increment,
        [1, 1, 1],
        [1, 1, 1],
        &args,
    ))
    .unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    let tables = [[counters[0].whole()], [counters[1].whole()]];
    let mut submitted = 0u64;
    let mut submit = |f: &mut Fixture| {
        let n = f.n;
        let table = &tables[(submitted % 2) as usize];
        if let Err(e) =
            f.device
                .queue(0)
                .execute_with_bindings(&[(&f.a, n)], &[(&f.a, n + 1)], &[(&cb, table)])
        {
            ARMED.store(false, Ordering::Relaxed);
            panic!("execute {n}: {e}");
        }
        f.n += 1;
        submitted += 1;
    };
    // Warm-up as `Fixture::warm_up` does: twice a window's worth behind a slow kernel, then a
    // throttled run.
    for _ in 0..2 {
        let spin = f.spin.clone();
        f.submit(&[&spin], 0);
        for _ in 0..2 * WINDOW {
            submit(&mut f);
        }
        f.drain();
    }
    for _ in 0..1_000 {
        throttle(f.device.queue(0), WINDOW);
        submit(&mut f);
    }
    f.drain();
    SUBMITTER.with(|c| c.set(true));
    SEEN_COUNT.store(0, Ordering::Relaxed);
    let all_before = ALL.load(Ordering::SeqCst);
    let mine_before = MINE.with(Cell::get);
    ARMED.store(true, Ordering::SeqCst);
    for _ in 0..COUNT {
        throttle(f.device.queue(0), WINDOW);
        submit(&mut f);
    }
    f.drain();
    ARMED.store(false, Ordering::SeqCst);
    let all = ALL.load(Ordering::SeqCst) - all_before;
    let mine = MINE.with(Cell::get) - mine_before;
    SUBMITTER.with(|c| c.set(false));
    let (a, b) = (read_u32(&counters[0])[0], read_u32(&counters[1])[0]);
    assert_eq!(
        (u64::from(a), u64::from(b)),
        (submitted.div_ceil(2), submitted / 2),
        "{what}: every submission incremented the counter its table named"
    );
    f.check(what, all, mine);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn bound_graph_execute_allocates_nothing_when_warm() {
    bound(
        CommandBufferMode::Graph,
        "graph, 1 bound dispatch, table changed every time",
    );
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn bound_deferred_execute_allocates_nothing_when_warm() {
    bound(
        CommandBufferMode::Deferred,
        "deferred, 1 bound dispatch, table changed every time",
    );
}

/// The counter works: an allocation on this thread is counted (so a zero above means zero).
#[test]
fn the_counter_sees_allocations() {
    let before = ALL.load(Ordering::SeqCst);
    let mine = MINE.with(Cell::get);
    let boxed = std::hint::black_box(Box::new([7u8; 100]));
    assert!(ALL.load(Ordering::SeqCst) > before);
    assert_eq!(MINE.with(Cell::get), mine + 1);
    drop(boxed);
}
