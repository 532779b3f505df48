//! cuhal: an asynchronous CUDA hardware abstraction layer.
//!
//! This crate is the thin composition users start from. It loads the driver ([`Driver`]),
//! opens a device ([`Device`]) with one or more [`Queue`]s, and hands out timeline
//! [`Semaphore`]s, buffers, executables and command buffers. Most of the logic lives in the
//! crates it composes:
//!
//! - `cuhal-sys`: the driver's symbol table, loaded at run time;
//! - `cuhal-semaphore`: timeline semaphores and timepoints (generic; here bound to
//!   [`CudaEvent`]s from the device's event pool);
//! - `cuhal-scheduler`: the pending-action queue; this crate provides its CUDA backend;
//! - `cuhal-command`: graph and deferred command buffers, buffers, executables;
//! - `cuhal-trace`: GPU timing zones collected after completion.
//!
//! Every queue operation ([`Queue::execute`], [`Queue::fill`], [`Queue::copy`],
//! [`Queue::write`], [`Queue::read`], [`Queue::alloca`], [`Queue::dealloca`],
//! [`Queue::barrier`], [`Queue::host_call`]) takes a list of `(semaphore, value)` waits and a
//! list of signals, and is ordered only by them. A wait whose value some issued work will signal
//! becomes a device-side wait (`cuStreamWaitEvent`), with no host round trip; work that is ready
//! when submitted is issued by the submitting thread; completions are seen by a completion thread
//! that polls briefly and then blocks, never inside a driver callback. A sticky CUDA error marks
//! the device lost: everything pending fails with it, and nothing waits forever.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use cuhal::{CommandBuffer, DeviceOptions, Driver, FillPattern};
//!
//! let driver = Driver::load()?;
//! let device = driver.open(0, DeviceOptions::default())?;
//! let queue = device.queue(0);
//! let data = device.create_buffer(1 << 20)?;
//! let mut cb = queue.create_command_buffer()?;
//! cb.fill(&data.whole(), FillPattern::U32(7))?;
//! let cb: Arc<dyn CommandBuffer> = cb.end()?;
//! let done = device.create_semaphore(0);
//! queue.execute(&[], &[(&done, 1)], &[&cb])?;
//! done.wait(1, Duration::from_secs(5))?;
//! # Ok::<(), cuhal::Error>(())
//! ```
//!
//! Async code awaits the same semaphores without blocking a thread: [`Semaphore::wait_async`]
//! (and [`wait_semaphores_async`] for several) returns a `Future` for any executor, woken by the
//! queue's completion side when the value is reached, or with the device's failure when it is
//! lost (`examples/tokio_service.rs` serves many tasks that way).
//!
//! Safe code cannot skip the checks a [`Queue`] makes: the scheduler backend that issues work
//! and its payload type are private (an unchecked payload could make the driver write any
//! memory), so this does not compile:
//!
//! ```compile_fail
//! use cuhal::{CudaBackend, Payload};
//! ```
//!
//! Nor can it submit what a queue does not accept: [`Queue::execute`] takes only
//! [`CommandBuffer`]s, which only `end()` makes. A command buffer still recording does not
//! compile there:
//!
//! ```compile_fail,E0308
//! # fn f(queue: &cuhal::Queue) -> cuhal::Result<()> {
//! let mut cb = queue.create_command_buffer()?;
//! cb.barrier()?;
//! queue.execute(&[], &[], &[&cb])?;
//! # Ok(()) }
//! ```
//!
//! and neither does a stream command buffer, whose work runs as it is recorded, ended or not:
//!
//! ```compile_fail,E0277
//! # use std::sync::Arc;
//! # use cuhal_command::StreamCommandBuffer;
//! # fn f(queue: &cuhal::Queue, mut cb: StreamCommandBuffer) {
//! cb.end().unwrap();
//! let cb: Arc<dyn cuhal::CommandBuffer> = Arc::new(cb);
//! queue.execute(&[], &[], &[&cb]).unwrap();
//! # }
//! ```
//!
//! Once ended it is submitted any number of times:
//!
//! ```
//! # fn f(queue: &cuhal::Queue) -> cuhal::Result<()> {
//! let mut cb = queue.create_command_buffer()?;
//! cb.barrier()?;
//! let cb = cb.end()?;
//! queue.execute(&[], &[], &[&cb])?;
//! queue.execute(&[], &[], &[&cb])?;
//! # Ok(()) }
//! ```

mod backend;
mod bindings;
mod collective;
mod device;
mod error;
mod event_pool;
mod interop;
mod lost;
mod memory;
mod peer;
mod queue;
mod resident;
mod resident_missing;
mod submissions;
mod wait;

pub use collective::{
    Collective, CollectiveCommandBuffers, CollectivePart, Communicator, CommunicatorOptions, Nccl,
    PartField, UniqueId,
};
pub use cuhal_resident::ResidentOptions;
pub use device::{Device, DeviceOptions, Driver, MAX_QUEUES, MAX_RESERVED_EVENTS};
pub use error::{Error, Result, cuda_of_failure};
pub use event_pool::CudaEvent;
pub use interop::{ExportedBuffer, ExportedEvent, ForeignEvent, PointerInfo, Release};
pub use lost::DeviceLost;
pub use memory::Allocation;
pub use queue::{BoundCommandBuffer, CommandBufferMode, Queue, SemaphoreValues};
pub use resident::{RESIDENT_SCHEDULER_DIR_ENV, ResidentGraph, ResidentQueue};
pub use resident_missing::{RESIDENT_MIN_DRIVER, ResidentMissing};
pub use wait::{WaitMode, WaitSemaphores, wait_semaphores, wait_semaphores_async};

pub use cuhal_command::{
    ArgSlot, BindingError, BindingLayout, Buffer, BufferRange, CommandBuffer, CommandBufferKind,
    CommandBufferState, CommandEncoder, CommandRecorder, DeferredCommandBuffer, DeferredExec,
    DevicePtr, Dispatch, Executable, FillPattern, Function, FunctionAttributes, GraphCommandBuffer,
    GraphExec, HostBuffer, KernelArg, KernelArgs, LaunchAttributes, MAX_BINDING_CAPACITY,
    PatchMethod, StreamWork, StreamWorkError, StreamWorkFn, WorkRange,
};
pub use cuhal_scheduler::{CompletionOptions, policy as completion_policy};
pub use cuhal_semaphore::{Failure, Timeout, Wait};
pub use cuhal_sys::{LinkKind, NcclDataType, NcclRedOp, PeerLink};
pub use cuhal_trace::{CuptiChoice, FineSampling, JsonSink, MemorySink, Sink, Verbosity};

/// A timeline semaphore whose device timepoints are pooled CUDA events.
pub type Semaphore = cuhal_semaphore::Semaphore<CudaEvent>;

/// The README's examples, compiled (and run where they need no GPU) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
