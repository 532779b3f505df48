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
        // SAFETY: the caller's contract.
        let words = unsafe { (*params).cast::<[u64; 16]>().read_unaligned() };
        Ok(Self { function, words })
    }

    /// The word of mapped memory at `address` (the fake maps host memory at its host address).
    fn word(address: u64) -> &'static AtomicU64 {
        // SAFETY: cuhal's scheduler parameters point at live, 8-byte aligned words of its
        // mapped block (or device allocation), alive while a chain can run; an AtomicU64 is a
        // u64 in memory.
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
    /// Runs one scheduler chain (see the module's documentation).
    pub(crate) fn run_resident(&mut self, s: &ResidentSchedule) -> Result<(), c_int> {
        let capacity = s.words[at::CAPACITY].max(1);
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
                } else if self.launch_device_graph(d.executable) {
                    Some(Completion::Done)
                } else {
                    let error = (head << 16) | CUDA_ERROR_INVALID_VALUE;
                    s.array(at::LAUNCH_ERRORS, head % capacity)
                        .store(error, Ordering::SeqCst);
                    Some(Completion::LaunchFailed)
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

    /// Launches the executable `handle` from the device: false when it is not a live
    /// executable instantiated for device launch and uploaded.
    fn launch_device_graph(&mut self, handle: u64) -> bool {
        let Some(exec) = self.execs.get(&(handle as usize)) else {
            return false;
        };
        if !exec.device_launch || !exec.uploaded {
            return false;
        }
        let ops: Vec<_> = exec.order.iter().map(|(_, op)| op.clone()).collect();
        ops.iter().all(|op| self.run(op).is_ok())
    }
}
