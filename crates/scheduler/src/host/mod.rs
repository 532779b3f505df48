//! The CPU host backend: a [`Backend`] whose "device" is one executor thread per queue.
//!
//! It is what cuhal runs without a GPU (`cuhal demo`), and the backend this crate's tests and
//! benchmarks drive. Each [`HostBackend`] owns an executor thread that runs issued payloads in
//! order, after their device waits, and completes a pooled [`HostEvent`] for each. Like a CUDA
//! stream after a fault, an executor whose payload failed fails every later payload with the same
//! error (the queue is lost anyway); an action whose device wait failed upstream fails with that
//! upstream failure without touching its own queue.
//!
//! ```
//! use std::time::Duration;
//! use cuhal_scheduler::{Cleanups, QueueOptions, Resources};
//! use cuhal_scheduler::host::{self, HostPayload, HostSemaphore};
//!
//! let queue = host::queue(QueueOptions::new("doc")).unwrap();
//! let done = HostSemaphore::new(0);
//! queue
//!     .submit(&[], &[(&done, 1)], HostPayload::once(|| Ok(())), Resources::new(), Cleanups::new())
//!     .unwrap();
//! done.wait(1, Duration::from_secs(5)).unwrap();
//! ```

mod event;
mod payload;

use std::collections::VecDeque;
use std::mem;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crossbeam_utils::sync::{Parker, Unparker};
use cuhal_semaphore::{DeviceEvent, Failure, Semaphore};
use smallvec::SmallVec;

pub use event::HostEvent;
pub use payload::HostPayload;

use crate::action::INLINE_SEMAPHORES;
use crate::backend::{Backend, ThreadRole};
use crate::error::Error;
use crate::options::QueueOptions;
use crate::queue::Queue;
use crate::spin::spin_until;
use event::HostEventPool;

/// A semaphore whose device events are host events.
pub type HostSemaphore = Semaphore<HostEvent>;

/// A queue on the host backend.
pub type HostQueue = Queue<HostBackend>;

/// Starts a host backend and a queue on it, both named by `options`' label.
pub fn queue(options: QueueOptions) -> Result<HostQueue, Error> {
    let backend = HostBackend::new(options.label(), crate::policy::IDLE_SPIN).map_err(|error| {
        Error::Spawn {
            queue: Arc::from(options.label()),
            role: ThreadRole::Device,
            error: Arc::new(error),
        }
    })?;
    Queue::new(backend, options)
}

struct Job {
    waits: SmallVec<[HostEvent; INLINE_SEMAPHORES]>,
    payload: HostPayload,
    event: HostEvent,
}

struct Executor {
    jobs: Mutex<VecDeque<Job>>,
    len: AtomicUsize,
    unparker: Unparker,
    shutdown: AtomicBool,
    idle_spin: Duration,
}

/// The host backend of one queue: an executor thread that runs payloads in issue order.
pub struct HostBackend {
    executor: Arc<Executor>,
    pool: Mutex<HostEventPool>,
    thread: Option<JoinHandle<()>>,
}

impl HostBackend {
    /// Starts the executor thread (named `{label}-exec`). It looks for work for `idle_spin` before
    /// it parks, and polls a device-wait event for as long before it blocks on it.
    pub fn new(label: &str, idle_spin: Duration) -> std::io::Result<Self> {
        let parker = Parker::new();
        let executor = Arc::new(Executor {
            jobs: Mutex::new(VecDeque::with_capacity(QueueOptions::DEFAULT_CAPACITY)),
            len: AtomicUsize::new(0),
            unparker: parker.unparker().clone(),
            shutdown: AtomicBool::new(false),
            idle_spin,
        });
        let thread = {
            let executor = executor.clone();
            thread::Builder::new()
                .name(format!("{label}-exec"))
                .spawn(move || run(&executor, &parker))?
        };
        Ok(HostBackend {
            executor,
            pool: Mutex::new(HostEventPool::with_capacity(QueueOptions::DEFAULT_CAPACITY)),
            thread: Some(thread),
        })
    }

    /// Events in this backend's pool, free or in use (it grows only when all are in use).
    pub fn pooled_events(&self) -> usize {
        self.pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Backend for HostBackend {
    type Event = HostEvent;
    type Payload = HostPayload;
    type IssueLocal = ();

    fn issue(
        &self,
        _local: &mut (),
        device_waits: &[HostEvent],
        payload: &mut HostPayload,
    ) -> Result<HostEvent, Failure> {
        let event = self
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .acquire();
        let job = Job {
            waits: device_waits.iter().cloned().collect(),
            payload: mem::replace(payload, HostPayload::Nop),
            event: event.clone(),
        };
        {
            let mut jobs = self
                .executor
                .jobs
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            jobs.push_back(job);
            self.executor.len.store(jobs.len(), Ordering::Release);
        }
        self.executor.unparker.unpark();
        Ok(event)
    }

    fn issue_local(&self) {}

    fn query_event(&self, event: &HostEvent) -> Result<bool, Failure> {
        event.query()
    }

    fn block_on_event(&self, event: &HostEvent) -> Result<(), Failure> {
        event.wait(Duration::ZERO)
    }
}

impl Drop for HostBackend {
    fn drop(&mut self) {
        self.executor.shutdown.store(true, Ordering::Release);
        self.executor.unparker.unpark();
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

fn pop(executor: &Executor) -> Option<Job> {
    let mut jobs = executor.jobs.lock().unwrap_or_else(PoisonError::into_inner);
    let job = jobs.pop_front();
    executor.len.store(jobs.len(), Ordering::Release);
    job
}

/// The executor: runs every issued job, in order, until shut down with nothing left.
fn run(executor: &Executor, parker: &Parker) {
    // The first payload error: every later payload fails with it, as on a faulted CUDA stream.
    let mut sticky: Option<Failure> = None;
    loop {
        if let Some(job) = pop(executor) {
            let result = execute(job.waits, job.payload, executor.idle_spin, &mut sticky);
            job.event.complete(result);
            continue;
        }
        if executor.shutdown.load(Ordering::Acquire) && executor.len.load(Ordering::Acquire) == 0 {
            break;
        }
        if !spin_until(executor.idle_spin, || {
            executor.len.load(Ordering::Acquire) > 0 || executor.shutdown.load(Ordering::Acquire)
        }) {
            parker.park();
        }
    }
}

fn execute(
    waits: SmallVec<[HostEvent; INLINE_SEMAPHORES]>,
    payload: HostPayload,
    spin: Duration,
    sticky: &mut Option<Failure>,
) -> Result<(), Failure> {
    for event in &waits {
        // An upstream failure fails this job, but does not fault this executor.
        event.wait(spin)?;
    }
    drop(waits);
    if let Some(failure) = sticky {
        return Err(failure.clone());
    }
    let result = catch_unwind(AssertUnwindSafe(|| payload.run()))
        .unwrap_or_else(|_| Err(Failure::msg("host payload panicked")));
    if let Err(failure) = &result {
        *sticky = Some(failure.clone());
    }
    result
}
