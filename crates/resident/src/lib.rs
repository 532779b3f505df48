//! The host half of a resident queue: a queue the GPU drives itself.
//!
//! A submission is one [`Descriptor`] written into a ring in memory the device reads, published
//! by one release store of the producer's sequence number: no driver call on the submitting
//! thread. A scheduler on the device reads the ring, checks each submission's waits against
//! semaphore values in device-visible memory (the [`SlotTable`]), launches ready work
//! fire-and-forget, publishes the signals, relaunches itself before the driver's limit of
//! [`FIRE_AND_FORGET_LIMIT`] launches per execution, and exits when idle; the next submission
//! starts it again ([`Doorbell`]). The host mirrors the values both ways: signals into the cuhal
//! [`Semaphore`](cuhal_semaphore::Semaphore)s (so the host and normal queues see them), and
//! host-reached waits into the slots.
//!
//! What this crate holds, with no CUDA dependency (like the scheduler crate):
//!
//! - the ring ([`split`], [`Producer`], [`Consumer`]) over a [`SharedMemory`] (the CPU version
//!   is [`HostMemory`]; the host-mapped one is `cuhal`'s), with its documented
//!   [`Descriptor`] layout;
//! - the slot table and completion words ([`SlotTable`], [`Completion`]);
//! - typed refusals at submission ([`Refusal`]): stream and deferred command buffers, graphs
//!   with nodes device launch refuses, semaphores without a slot;
//! - [`ResidentQueue`], whose scheduler is a CPU model (a thread calling a [`Launcher`]), enough
//!   to test the ring, back-pressure, failure, device loss and shutdown without a GPU, or a
//!   [`DeviceScheduler`] ([`ResidentQueue::with_device`]): a scheduler on a device that the host
//!   wakes, stops and watches, while a poller thread here reads its completion words. `cuhal`'s
//!   `Device::open_resident_queue` is that, with the scheduler kernel on the GPU.
//!
//! See `docs/decisions/resident.md`.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use cuhal_resident::{ExecutableKind, Launch, LaunchError, Launchable, NodeKind};
//! use cuhal_resident::{ResidentOptions, ResidentQueue};
//! use cuhal_semaphore::{NoEvent, Semaphore};
//!
//! struct Graph;
//! impl Launchable for Graph {
//!     fn kind(&self) -> ExecutableKind { ExecutableKind::Graph }
//!     fn nodes(&self) -> &[NodeKind] { &[NodeKind::Kernel] }
//!     fn handle(&self) -> u64 { 7 }
//! }
//!
//! let queue = ResidentQueue::<NoEvent>::new(
//!     ResidentOptions::new("doc"),
//!     |launch: Launch| -> Result<(), LaunchError> { assert_eq!(launch.executable, 7); Ok(()) },
//! )?;
//! let done = Semaphore::new(0);
//! queue.bind(&done)?;
//! let graph: Arc<dyn Launchable> = Arc::new(Graph);
//! queue.submit(&[], &[(&done, 1)], &graph, 0)?;
//! done.wait(1, Duration::from_secs(5)).unwrap();
//! # Ok::<(), cuhal_resident::Error>(())
//! ```

mod chain;
mod descriptor;
mod doorbell;
mod error;
mod handoff;
mod memory;
mod refusal;
mod ring;
mod slots;
mod sync;

#[cfg(not(loom))]
mod engine;
#[cfg(all(test, not(loom)))]
mod engine_tests;
#[cfg(not(loom))]
mod mirror;
#[cfg(not(loom))]
mod model;
#[cfg(not(loom))]
mod options;
#[cfg(not(loom))]
mod queue;
#[cfg(not(loom))]
mod room;
#[cfg(not(loom))]
mod shared;

pub use chain::{ChainStarter, chain_try_exit};
pub use descriptor::{Descriptor, MAX_SIGNALS, MAX_WAITS, SlotValue};
pub use doorbell::Doorbell;
pub use error::Error;
pub use handoff::{RetireQueue, SlotGate};
pub use memory::{DescriptorCell, HostMemory, Line, RingHeader, SharedMemory};
pub use refusal::{ExecutableKind, Launchable, NodeKind, Refusal};
pub use ring::{Consumer, Full, Producer, split};
pub use slots::{Completion, FAILED, SlotState, SlotTable};

#[cfg(not(loom))]
pub use engine::DeviceScheduler;
#[cfg(not(loom))]
pub use model::{Launch, LaunchError, Launcher};
#[cfg(not(loom))]
pub use options::{FIRE_AND_FORGET_LIMIT, MAX_CAPACITY, MAX_SLOTS, ResidentOptions};
#[cfg(not(loom))]
pub use queue::{ResidentQueue, ResidentStats};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
