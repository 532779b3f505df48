//! The resident queue's scheduler kernel (`cuhal_resident_schedule`, cuhal's
//! `kernels/resident/scheduler.cu`), emulated: a launch of a graph holding it runs one chain of
//! the scheduler on the launching thread, as the fake runs every launch, by the kernel's rules.
//! Each ready descriptor's executable is launched at once and, this GPU being synchronous,
//! completes at once, so it is published before the next is looked at; the chain exits once it
//! finds nothing to do, by the kernel's exit protocol (`chain_try_exit`), rather than after an
//! idle time. The words it reads and writes are host-mapped memory, at their host addresses.
//!
//! What it checks, as the device would refuse: a descriptor's executable must be a live
//! executable instantiated for device launch and uploaded (else the launch fails with
//! `cudaErrorInvalidValue`, recorded in the cell's launch error word).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use cuhal_resident::{Completion, Descriptor, FAILED, chain_try_exit};

use crate::entry::ensure;
use crate::status;
use crate::world::World;

/// The scheduler kernel's name in its cubins.
pub const RESIDENT_SCHEDULER: &str = "cuhal_resident_schedule";

/// The name under which a test injects a failure of the emulated kernel's device graph launches
/// (`FakeDriver::fail`): the injected code is the launch's `cudaError_t`.
pub const DEVICE_GRAPH_LAUNCH: &str = "cudaGraphLaunch(device)";

/// `cudaErrorInvalidValue`, what a device launch of something not launchable returns.
const CUDA_ERROR_INVALID_VALUE: u64 = 1;

/// The kernel's parameter block, `SchedulerParams` in `scheduler.cu` (128 bytes): word indices.
mod at {
    pub const PRODUCED: usize = 0;
    pub const CONSUMED: usize = 1;
    pub const RINGS: usize = 2;
    pub const EXITS: usize = 3;
    pub const CONTROL: usize = 4;
    pub const DESCRIPTORS: usize = 6;
    pub const COMPLETIONS: usize = 7;
    pub const LAUNCH_ERRORS: usize = 8;
    pub const HOST_SLOTS: usize = 9;
    pub const DEVICE_SLOTS: usize = 10;
    pub const STATE: usize = 11;
    pub const CAPACITY: usize = 12;
    pub const SLOTS_AND_LIMIT: usize = 15;
}

/// A scheduler kernel node: its function and parameter block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ResidentSchedule {
    pub(crate) function: usize,
    words: [u64; 16],
}

impl ResidentSchedule {
    /// Reads the kernel's one argument, its 128-byte parameter block.
    ///
    /// # Safety
    /// `params` holds one pointer, to 128 readable bytes.
    pub(crate) unsafe fn read(function: usize, params: *mut *mut c_void) -> Result<Self, c_int> {
        ensure(!params.is_null(), status::INVALID_VALUE)?;
        // SAFETY: the caller's contract: `params` holds one pointer.
        let block = unsafe { *params };
        ensure(!block.is_null(), status::INVALID_VALUE)?;
        // SAFETY: the caller's contract: it points at the 128-byte block.
        let words = unsafe { block.cast::<[u64; 16]>().read_unaligned() };
        Ok(Self { function, words })
    }

    /// The word of mapped memory at `address` (the fake maps host memory at its host address).
    /// Every address used is checked first ([`World::check_resident`]).
    fn word(address: u64) -> &'static AtomicU64 {
        // SAFETY: `check_resident` found every word the chain reads or writes inside a live
        // allocation of mapped host or device memory, 8-byte aligned; the allocations live
        // while a chain can run (the queue stops its chains before it frees them); an
        // AtomicU64 is a u64 in memory.
        unsafe { &*std::ptr::with_exposed_provenance::<AtomicU64>(address as usize) }
    }

    fn line(&self, index: usize) -> &'static AtomicU64 {
        Self::word(self.words[index])
    }

    fn array(&self, index: usize, i: u64) -> &'static AtomicU64 {
        Self::word(self.words[index] + 8 * i)
    }
}

impl World {
    /// Checks that every region the chain reaches is inside live mapped or device memory and
    /// 8-byte aligned, as the device would fault (`CUDA_ERROR_ILLEGAL_ADDRESS`) otherwise.
    fn check_resident(&self, s: &ResidentSchedule) -> Result<(), c_int> {
        let capacity = s.words[at::CAPACITY];
        let slots = s.words[at::SLOTS_AND_LIMIT] & 0xffff_ffff;
        ensure(capacity > 0, status::ILLEGAL_ADDRESS)?;
        let regions = [
            (at::PRODUCED, 8),
            (at::CONSUMED, 8),
            (at::RINGS, 8),
            (at::EXITS, 8),
            (at::CONTROL, 8),
            (at::DESCRIPTORS, 256 * capacity),
            (at::COMPLETIONS, 8 * capacity),
            (at::LAUNCH_ERRORS, 8 * capacity),
            (at::HOST_SLOTS, 8 * slots.max(1)),
            (at::DEVICE_SLOTS, 8 * slots.max(1)),
            (at::STATE, 32),
        ];
        for (index, len) in regions {
            let address = s.words[index];
            ensure(address.is_multiple_of(8), status::ILLEGAL_ADDRESS)?;
            let len = usize::try_from(len).map_err(|_| status::ILLEGAL_ADDRESS)?;
            self.mapped_span(address, len)
                .map_err(|_| status::ILLEGAL_ADDRESS)?;
        }
        Ok(())
    }

    /// Runs one scheduler chain (see the module's documentation).
    pub(crate) fn run_resident(&mut self, s: &ResidentSchedule) -> Result<(), c_int> {
        self.check_resident(s)?;
        let capacity = s.words[at::CAPACITY];
        let slots = s.words[at::SLOTS_AND_LIMIT] & 0xffff_ffff;
        // Executions, as the kernel counts them (state[1]).
        s.array(at::STATE, 1).fetch_add(1, Ordering::SeqCst);
        loop {
            let seen = s.line(at::RINGS).load(Ordering::SeqCst);
            let control = s.line(at::CONTROL).load(Ordering::SeqCst);
            let head = s.line(at::CONSUMED).load(Ordering::SeqCst);
            if head < s.line(at::PRODUCED).load(Ordering::Acquire) {
                let cell = s.words[at::DESCRIPTORS] + 256 * (head % capacity);
                // SAFETY: the descriptor cell is in the mapped block, published (acquire above).
                let d = unsafe {
                    std::ptr::with_exposed_provenance::<Descriptor>(cell as usize).read_volatile()
                };
                ensure(d.sequence == head, status::ILLEGAL_ADDRESS)?;
                let slot = |i: u32| {
                    if u64::from(i) >= slots {
                        return FAILED;
                    }
                    let host = s.array(at::HOST_SLOTS, u64::from(i)).load(Ordering::SeqCst);
                    let device = s
                        .array(at::DEVICE_SLOTS, u64::from(i))
                        .load(Ordering::SeqCst);
                    if (host | device) & FAILED != 0 {
                        FAILED
                    } else {
                        host.max(device)
                    }
                };
                let failed = d.waits().iter().any(|w| slot(w.slot) & FAILED != 0);
                let pending = d.waits().iter().any(|w| slot(w.slot) < w.value);
                let completion = if control == 2 {
                    Some(Completion::Lost)
                } else if failed {
                    Some(Completion::WaitFailed)
                } else if pending && control == 1 {
                    Some(Completion::Shutdown)
                } else if pending {
                    None
                } else if let Err(code) = self.launch_device_graph(d.executable) {
                    let error = (head << 16) | (code & 0xffff);
                    s.array(at::LAUNCH_ERRORS, head % capacity)
                        .store(error, Ordering::SeqCst);
                    Some(Completion::LaunchFailed)
                } else {
                    Some(Completion::Done)
                };
                if let Some(completion) = completion {
                    s.line(at::CONSUMED).store(head + 1, Ordering::SeqCst);
                    for signal in d.signals() {
                        if u64::from(signal.slot) >= slots {
                            continue;
                        }
                        let word = s.array(at::DEVICE_SLOTS, u64::from(signal.slot));
                        let next = if completion == Completion::Done {
                            signal.value
                        } else {
                            FAILED
                        };
                        let old = word.load(Ordering::SeqCst);
                        if old & FAILED == 0 && next > old {
                            word.store(next, Ordering::SeqCst);
                        }
                    }
                    s.array(at::COMPLETIONS, head % capacity)
                        .store(completion.encode(head), Ordering::SeqCst);
                    continue;
                }
            }
            if chain_try_exit(s.line(at::RINGS), s.line(at::EXITS), seen) {
                return Ok(());
            }
        }
    }

    /// Launches the executable `handle` from the device, or the `cudaError_t` the device
    /// returns: `cudaErrorInvalidValue` when it is not a live executable instantiated for
    /// device launch and uploaded, or whatever a test injected for the pseudo-function
    /// [`DEVICE_GRAPH_LAUNCH`]. A launch either runs whole or fails before it runs.
    fn launch_device_graph(&mut self, handle: u64) -> Result<(), u64> {
        if let Some(code) = crate::faults::on_call(DEVICE_GRAPH_LAUNCH) {
            return Err(u64::from(code.unsigned_abs()));
        }
        let Some(exec) = self.execs.get(&(handle as usize)) else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        if !exec.device_launch || !exec.uploaded || exec.order.is_empty() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ops: Vec<_> = exec.order.iter().map(|(_, op)| op.clone()).collect();
        ops.iter()
            .try_for_each(|op| self.check(op))
            .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        for op in &ops {
            // Checked above: a failure here is the fake's own, reported as the device would.
            self.run(op).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        }
        Ok(())
    }
}
