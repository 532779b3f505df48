//! Resident queues: queues the GPU drives itself (the host half is the `cuhal-resident` crate).
//! Opt-in through [`Device::open_resident_queue`]; the device's other queues are unaffected.
//!
//! A submission is one 256-byte descriptor written into a ring in host-mapped memory and
//! published by one store: no driver call on the submitting thread once a scheduler chain runs.
//! The scheduler kernel (`kernels/resident/scheduler.cu`) reads the ring, checks each
//! submission's waits against semaphore slots in mapped memory, launches ready graphs
//! fire-and-forget, and publishes their signals when its next execution (a tail launch, which
//! starts once the launched work is done) runs. A poller thread on the host mirrors completion
//! words into the semaphores. Idle for [`ResidentOptions::idle_exit`], the chain exits; the next
//! submission starts it again with one `cuGraphLaunch`.
//!
//! Lifetimes: the queue owns its mapped block, its scheduler graph and stream, and its poller;
//! each submission holds its [`ResidentGraph`] (and so the command buffer and its memory) and
//! its semaphores until its completion word is read. Dropping the queue shuts it down:
//! submissions whose waits are reached run, the others fail their signals.

mod graph;
mod memory;
mod scheduler;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use cuhal_command::CommandBuffer;
use cuhal_resident::{Launchable, ResidentOptions, ResidentStats};
use cuhal_sys::{CU_STREAM_NON_BLOCKING, Stream};

use crate::Semaphore;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::event_pool::CudaEvent;
use crate::queue::SemaphoreValues;
use crate::resident_missing::{RESIDENT_MIN_DRIVER, ResidentMissing};

pub use graph::ResidentGraph;
pub use scheduler::RESIDENT_SCHEDULER_DIR_ENV;

use memory::{Block, Layout, RingMemory};
use scheduler::Scheduler;

/// A queue the GPU drives itself (see the module's documentation).
pub struct ResidentQueue {
    queue: cuhal_resident::ResidentQueue<CudaEvent>,
    scheduler: Arc<Scheduler>,
    /// Where graphs are uploaded (not the scheduler's stream, where a chain may be polling).
    upload: Stream,
    /// This queue's number (never reused in the process): graphs prepared here carry it.
    id: u64,
}

/// The next resident queue's number.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Device {
    /// Opens a resident queue (opt-in; the device's other queues are unaffected). A driver or
    /// device without device graph launch, or one cuhal has no scheduler kernel for, is
    /// [`Error::ResidentUnavailable`] naming what is missing; bad options are
    /// [`Error::Resident`].
    pub fn open_resident_queue(&self, options: &ResidentOptions) -> Result<ResidentQueue> {
        options.check().map_err(Error::Resident)?;
        let context = self.context();
        let found = context.api().driver_version();
        let cc = (
            context.attribute(cuhal_sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            context.attribute(cuhal_sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let mut missing = Vec::new();
        if found < RESIDENT_MIN_DRIVER {
            missing.push(ResidentMissing::DriverVersion {
                found,
                needed: RESIDENT_MIN_DRIVER,
            });
        }
        let image = scheduler::image(cc);
        if image.is_none() {
            missing.push(ResidentMissing::SchedulerKernel {
                architecture: format!("sm_{}{}", cc.0, cc.1),
            });
        }
        if context.api().cuGraphNodeGetType.is_none() {
            missing.push(ResidentMissing::DriverFunction(cuhal_sys::cu_name!(
                cuGraphNodeGetType
            )));
        }
        let Some(image) = image.filter(|_| missing.is_empty()) else {
            return Err(Error::ResidentUnavailable { missing });
        };
        let block = Block::new(
            context,
            Layout {
                capacity: options.capacity,
                slots: options.slots,
            },
        )?;
        let scheduler = Scheduler::new(
            context,
            block.clone(),
            &image,
            options.idle_exit,
            options.launches_per_execution,
        )
        .map_err(|error| Error::ResidentUnavailable {
            missing: vec![ResidentMissing::SchedulerLoad(error.to_string())],
        })?;
        let scheduler = Arc::new(scheduler);
        let queue = cuhal_resident::ResidentQueue::with_device(
            options.clone(),
            Box::new(RingMemory(block)),
            scheduler.clone(),
        )
        .map_err(Error::Resident)?;
        Ok(ResidentQueue {
            queue,
            scheduler,
            upload: Stream::new(context, CU_STREAM_NON_BLOCKING)?,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }
}

impl ResidentQueue {
    /// The queue's label.
    pub fn label(&self) -> &str {
        self.queue.label()
    }

    /// Instantiates a graph command buffer for device launch, or says why it cannot run here:
    /// a deferred command buffer, binding slots, an indirect dispatch, tracing zones, or a node
    /// other than a kernel, copy or fill are [`Error::Resident`] refusals. Prepare once, submit
    /// many times.
    pub fn prepare(&self, command_buffer: &Arc<dyn CommandBuffer>) -> Result<Arc<ResidentGraph>> {
        ResidentGraph::new(
            self.scheduler.context(),
            &self.upload,
            command_buffer,
            self.id(),
        )
        .map(Arc::new)
    }

    /// What [`ResidentGraph`]s prepared here carry: the queue's number in this process.
    fn id(&self) -> u64 {
        self.id
    }

    /// A graph prepared by another queue: two queues could launch one executable at once,
    /// which the device refuses, and another context's handle means nothing here.
    fn check_owner(&self, graph: &ResidentGraph) -> Result<()> {
        if graph.owner() == self.id() {
            Ok(())
        } else {
            Err(Error::Resident(cuhal_resident::Refusal::OtherQueue.into()))
        }
    }

    /// Gives `semaphore` a slot in the queue's table (every semaphore a submission waits on or
    /// signals needs one); binding one twice returns its slot.
    pub fn bind(&self, semaphore: &Semaphore) -> Result<u32> {
        self.queue.bind(semaphore).map_err(Error::Resident)
    }

    /// Submits `graph` after `waits`, signalling `signals` once it is done: one descriptor
    /// written into the ring and one store, waiting for room when the ring is full. Returns the
    /// submission's sequence number. Refusals (an unbound semaphore, a signal already reached,
    /// too many waits or signals, a graph prepared for another queue) are [`Error::Resident`],
    /// with nothing published.
    pub fn submit(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        graph: &Arc<ResidentGraph>,
    ) -> Result<u64> {
        self.submit_with(waits, signals, graph, true)
    }

    /// [`submit`](Self::submit), or a `Full` error when the ring has no room.
    pub fn try_submit(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        graph: &Arc<ResidentGraph>,
    ) -> Result<u64> {
        self.submit_with(waits, signals, graph, false)
    }

    fn submit_with(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        graph: &Arc<ResidentGraph>,
        wait_for_room: bool,
    ) -> Result<u64> {
        self.check_owner(graph)?;
        let executable: Arc<dyn Launchable> = graph.clone();
        let submitted = if wait_for_room {
            self.queue.submit(waits, signals, &executable, 0)
        } else {
            self.queue.try_submit(waits, signals, &executable, 0)
        };
        submitted.map_err(Error::Resident)
    }

    /// What the queue has done so far. `starts` and `exits` count scheduler chains (host
    /// starts, device exits); `launched` counts submissions the device ran, as their completion
    /// words are read; `relaunches` is the CPU model's and stays 0 here (the device's
    /// executions are in [`device_counts`](Self::device_counts)).
    pub fn stats(&self) -> ResidentStats {
        let mut stats = self.queue.stats();
        stats.starts = self.scheduler.starts();
        stats.exits = self.scheduler.exits();
        stats
    }

    /// The scheduler's own counts, read from the device: executions, and whether two chains
    /// ever ran at once (never, if the design holds). Not ordered with a running chain: exact
    /// once the queue is shut down.
    pub fn device_counts(&self) -> Result<(u64, bool)> {
        let state = self.scheduler.state()?;
        Ok((state[1], state[3] != 0))
    }

    /// The device slot words (values the scheduler signalled, failures), for diagnostics.
    pub fn device_slot_values(&self) -> Vec<u64> {
        self.scheduler
            .block()
            .device_slots()
            .iter()
            .map(|w| w.load(Ordering::Acquire))
            .collect()
    }

    /// Shuts the queue down (also done on drop): nothing is accepted from here on; submissions
    /// whose waits are reached run, the others fail their signals; the scheduler and the
    /// poller end. Returns the stats at the end.
    pub fn shutdown(&self) -> ResidentStats {
        self.queue.shutdown();
        self.stats()
    }

    /// The failure that lost the queue, if it is lost.
    pub fn lost(&self) -> Option<cuhal_semaphore::Failure> {
        self.queue.lost()
    }
}
