//! The CPU model of the device scheduler kernel: a thread that reads the ring, checks each
//! submission's waits against the slot table, "launches" ready work through a [`Launcher`],
//! publishes signals, writes the completion word, and relaunches itself (a modelled tail launch)
//! before it would pass the fire-and-forget limit. Idle for
//! [`idle_exit`](crate::ResidentOptions::idle_exit), it exits; the next ring of the doorbell
//! starts it again.
//!
//! On the device, a launch is fire-and-forget and its signals are published by the launched
//! work's last node; here the launcher runs to completion before the signals are written. The
//! model calls the host's mirror after each submission, standing in for the host completion
//! side that polls the completion words.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use cuhal_semaphore::{DeviceEvent, Failure};

use crate::descriptor::Descriptor;
use crate::engine::Engine;
use crate::error::Error;
use crate::ring::Consumer;
use crate::shared::{Memory, Shared, lock};
use crate::slots::{Completion, SlotState, SlotTable};

/// One launch the scheduler makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The submission's sequence number.
    pub sequence: u64,
    /// The executable's handle.
    pub executable: u64,
    /// The binding table's address, or 0.
    pub bindings: u64,
    /// Which execution of the scheduler launched it (counts from 0 for the queue's life: every
    /// start and every relaunch is a new execution).
    pub execution: u64,
}

/// Why a launch failed.
#[derive(Clone, Debug)]
pub enum LaunchError {
    /// This launch failed: its signals fail, and what waits on them.
    Failed(Failure),
    /// A sticky error: the queue (and on the device, the context) is lost.
    Lost(Failure),
}

/// What the model scheduler calls for each ready submission (a device graph launch on the GPU).
pub trait Launcher: Send + Sync + 'static {
    /// Runs `launch`'s executable.
    fn launch(&self, launch: Launch) -> Result<(), LaunchError>;
}

impl<F> Launcher for F
where
    F: Fn(Launch) -> Result<(), LaunchError> + Send + Sync + 'static,
{
    fn launch(&self, launch: Launch) -> Result<(), LaunchError> {
        self(launch)
    }
}

/// What the scheduler did with the ring's head.
enum Step {
    /// Finished a submission.
    Progress,
    /// Nothing to do (empty ring, or the head's waits are pending).
    Idle,
}

impl<E: DeviceEvent> Shared<E> {
    /// Starts a consumer thread (the caller won the doorbell). On failure the doorbell is given
    /// back, so the next ring tries again.
    pub(crate) fn start_consumer(self: &Arc<Self>) -> Result<(), Error> {
        let shared = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("{}-scheduler", self.options.label))
            .spawn(move || shared.run_consumer());
        match spawned {
            Ok(handle) => {
                let previous = lock(&self.thread).replace(handle);
                if let Some(previous) = previous {
                    // It exited (or is exiting) before this one could start: joining it is short.
                    if previous.thread().id() != std::thread::current().id() {
                        let _ = previous.join();
                    }
                }
                Ok(())
            }
            Err(error) => {
                self.doorbell.give_back();
                Err(Error::Spawn(error.to_string()))
            }
        }
    }

    /// One execution chain of the scheduler, from a start to its exit (relaunches included).
    pub(crate) fn run_consumer(self: Arc<Self>) {
        let mut consumer = lock(&self.consumer);
        let starts = self.counters.starts.fetch_add(1, Ordering::Relaxed);
        let mut execution = starts + self.counters.relaunches.load(Ordering::Relaxed);
        let mut budget = self.options.launches_per_execution;
        let mut idle_since: Option<Instant> = None;
        loop {
            let seen = self.doorbell.seen();
            match self.step(&mut consumer, &mut budget, &mut execution) {
                Step::Progress => idle_since = None,
                Step::Idle => {
                    let now = Instant::now();
                    let since = *idle_since.get_or_insert(now);
                    let quit = self.is_shutdown() && !consumer.has_work()
                        || self.lost.get().is_some() && !consumer.has_work()
                        || now.duration_since(since) >= self.options.idle_exit;
                    if quit {
                        if self.doorbell.try_exit(seen) {
                            break;
                        }
                        idle_since = None;
                    } else {
                        std::thread::yield_now();
                    }
                }
            }
        }
        self.counters.exits.fetch_add(1, Ordering::Relaxed);
        drop(consumer);
        self.retire();
    }

    /// Looks at the ring's head once.
    fn step(&self, consumer: &mut Consumer<Memory>, budget: &mut u32, execution: &mut u64) -> Step {
        let descriptor = match consumer.peek() {
            Ok(Some(descriptor)) => descriptor,
            Ok(None) => return Step::Idle,
            Err(error) => {
                self.lose(Failure::new(error));
                return Step::Idle;
            }
        };
        let completion = if self.lost.get().is_some() {
            Completion::Lost
        } else {
            match self.waits_state(&descriptor) {
                SlotState::Failed => Completion::WaitFailed,
                SlotState::Pending if self.is_shutdown() => Completion::Shutdown,
                SlotState::Pending => return Step::Idle,
                SlotState::Reached => self.launch(&descriptor, budget, execution),
            }
        };
        if completion == Completion::Done {
            for signal in descriptor.signals() {
                SlotTable::publish(self.slot(signal.slot), signal.value);
            }
        } else {
            for signal in descriptor.signals() {
                SlotTable::fail(self.slot(signal.slot));
            }
        }
        // Advance first: a retire on another thread (an exiting consumer's last one) may read the
        // word at once, and the host counts room by retired submissions, so `retired` must not
        // pass `consumed` (the producer would find the ring full where the host saw room).
        consumer.advance();
        consumer.complete(descriptor.sequence, completion.encode(descriptor.sequence));
        self.retire();
        Step::Progress
    }

    /// Failed if any wait failed, else pending if any is pending.
    fn waits_state(&self, descriptor: &Descriptor) -> SlotState {
        let mut state = SlotState::Reached;
        for wait in descriptor.waits() {
            match SlotTable::state(self.slot(wait.slot), wait.value) {
                SlotState::Failed => return SlotState::Failed,
                SlotState::Pending => state = SlotState::Pending,
                SlotState::Reached => {}
            }
        }
        state
    }

    /// Launches a ready submission, relaunching the scheduler first when this execution's
    /// budget of fire-and-forget launches is spent.
    fn launch(&self, descriptor: &Descriptor, budget: &mut u32, execution: &mut u64) -> Completion {
        if *budget == 0 {
            self.counters.relaunches.fetch_add(1, Ordering::Relaxed);
            *execution += 1;
            *budget = self.options.launches_per_execution;
        }
        *budget -= 1;
        self.counters.launched.fetch_add(1, Ordering::Relaxed);
        let launch = Launch {
            sequence: descriptor.sequence,
            executable: descriptor.executable,
            bindings: descriptor.bindings,
            execution: *execution,
        };
        let Engine::Model(launcher) = &self.engine else {
            // Only a model queue runs a model consumer.
            return Completion::LaunchFailed;
        };
        let result = catch_unwind(AssertUnwindSafe(|| launcher.launch(launch)))
            .unwrap_or_else(|_| Err(LaunchError::Failed(Failure::msg("the launcher panicked"))));
        match result {
            Ok(()) => Completion::Done,
            Err(LaunchError::Failed(failure)) => {
                lock(&self.launch_failures).push((descriptor.sequence, failure));
                Completion::LaunchFailed
            }
            Err(LaunchError::Lost(failure)) => {
                lock(&self.launch_failures).push((descriptor.sequence, failure.clone()));
                self.lose(failure);
                Completion::LaunchFailed
            }
        }
    }
}
