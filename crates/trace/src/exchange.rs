//! The clock exchange on CUDA: how [`CudaEvents`](crate::CudaEvents) ties `%globaltimer` to the
//! host clock, and its base events to `%globaltimer` (the arithmetic is
//! [`clock_sync`](crate::clock_sync)'s).
//!
//! Both kernels live in `clock_sync.ptx` and run on the backend's private stream. Their words
//! live in one allocation of mapped host memory: the exchange's mailbox (the host's request on
//! one cache line, the kernel's answer on the next) and the stamps of the kernels around the
//! base events. The exchange never hangs: the host gives up after its timeout (and when the
//! kernel has exited without answering), then asks the kernel to stop; the kernel stops by
//! itself after a budget of `%globaltimer` or of polls; an exchange whose kernel of a previous
//! call has not finished yet is refused instead of sharing the mailbox with it.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cuhal_sys::{
    CU_EVENT_DISABLE_TIMING, CUevent, CUfunction, CUstream, Event, MappedHostMemory, Module,
    PrimaryContext, Stream, cu,
};

use crate::Error;
use crate::clock_sync::{ExchangeRound, GpuBracket};

/// The kernels (see the file).
const CLOCK_SYNC_PTX: &str = include_str!("clock_sync.ptx");
const EXCHANGE_NAME: &str = "cuhal_clock_exchange";
const STAMP_NAME: &str = "cuhal_clock_stamp";

/// The mailbox's words (32-bit word indices into the allocation): the host's request (a round
/// number, or [`STOP`]) on the first cache line, the kernel's `%globaltimer` answer (a `u64`,
/// two words, low first) and the round it answers on the second.
const REQUEST_WORD: usize = 0;
const ANSWER_LOW_WORD: usize = 16;
const ANSWER_HIGH_WORD: usize = 17;
const ANSWER_ROUND_WORD: usize = 18;
/// Asks the exchange kernel to stop.
const STOP: u32 = u32::MAX;
/// Byte offset of the stamping kernels' slots (two `u64` each: first and last stamp).
const STAMPS_OFFSET: usize = 128;
const STAMP_SLOT_BYTES: usize = 16;
/// Stamping kernels at most per call: base events at most, plus one.
pub(crate) const MAX_STAMPED_EVENTS: usize = 7;
const MAPPED_BYTES: usize = STAMPS_OFFSET + STAMP_SLOT_BYTES * (MAX_STAMPED_EVENTS + 1);

/// Host spins between two looks at the clock and at whether the kernel exited.
const SPINS_PER_LOOK: u32 = 1_024;

/// The exchange's kernels and memory, made on the first exchange and kept by the backend.
pub(crate) struct ClockExchange {
    context: Arc<PrimaryContext>,
    /// Recorded after each exchange kernel: complete once it exited.
    done: Event,
    /// Whether `done` was recorded at least once.
    launched: bool,
    /// The mailbox and stamp slots.
    mapped: MappedHostMemory,
    exchange: CUfunction,
    stamp: CUfunction,
    /// Keeps both functions loaded; unloaded after `Drop::drop` waited for the kernel.
    _module: Module,
}

// SAFETY: the function handles are plain driver handles of a module this value owns; the
// driver's calls on them are thread-safe, and the backend uses the value under a lock.
unsafe impl Send for ClockExchange {}

impl ClockExchange {
    /// Loads the kernels and allocates the mapped memory, in `context` (made current).
    pub(crate) fn new(context: &Arc<PrimaryContext>) -> Result<Self, Error> {
        let module = Module::load_ptx(context, CLOCK_SYNC_PTX)?;
        let exchange = module.function(EXCHANGE_NAME)?;
        let stamp = module.function(STAMP_NAME)?;
        let mapped = MappedHostMemory::new(context, MAPPED_BYTES)?;
        let done = Event::new(context, CU_EVENT_DISABLE_TIMING)?;
        Ok(Self {
            context: context.clone(),
            done,
            launched: false,
            mapped,
            exchange,
            stamp,
            _module: module,
        })
    }

    /// Whether the kernel of the previous exchange has exited.
    fn idle(&self) -> Result<bool, Error> {
        if !self.launched {
            return Ok(true);
        }
        Ok(self.done.query()?)
    }

    /// Runs up to `rounds` rounds on `stream` (see the module), appending the answered ones to
    /// `out`; `now` reads the host clock. Fails when the previous exchange's kernel still runs,
    /// when the kernel exits (or never starts) without answering, or after `timeout`.
    pub(crate) fn run(
        &mut self,
        stream: &Stream,
        rounds: usize,
        timeout: Duration,
        now: &dyn Fn() -> u64,
        out: &mut Vec<ExchangeRound>,
    ) -> Result<(), Error> {
        if !self.idle()? {
            return Err(Error::ClockSync {
                reason: "the previous exchange's kernel is still waiting to run",
            });
        }
        let request = self.mapped.word(REQUEST_WORD);
        let answer_round = self.mapped.word(ANSWER_ROUND_WORD);
        // Nothing runs on the mailbox now: the previous kernel exited.
        request.store(0, Ordering::SeqCst);
        answer_round.store(0, Ordering::SeqCst);
        self.mapped.word(ANSWER_LOW_WORD).store(0, Ordering::SeqCst);
        self.mapped
            .word(ANSWER_HIGH_WORD)
            .store(0, Ordering::SeqCst);
        // The kernel outlives the host's patience by at most as much again; a poll takes at
        // least a PCIe round trip (hundreds of nanoseconds), so the poll budget is looser still.
        let budget_ns = u64::try_from(timeout.as_nanos())
            .unwrap_or(u64::MAX / 2)
            .saturating_mul(2);
        let max_polls = budget_ns / 100;
        launch(
            &self.context,
            self.exchange,
            stream.raw(),
            &mut [self.mapped.device_ptr(), budget_ns, max_polls],
        )?;
        self.done.record(stream)?;
        self.launched = true;
        let result = self.rounds(rounds, timeout, now, out);
        // Whatever happened, the kernel stops at its next poll (or at once, if it starts late).
        request.store(STOP, Ordering::SeqCst);
        result
    }

    fn rounds(
        &self,
        rounds: usize,
        timeout: Duration,
        now: &dyn Fn() -> u64,
        out: &mut Vec<ExchangeRound>,
    ) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        let request = self.mapped.word(REQUEST_WORD);
        let answer_round = self.mapped.word(ANSWER_ROUND_WORD);
        let rounds = u32::try_from(rounds).unwrap_or(STOP - 1).min(STOP - 1);
        for round in 1..=rounds {
            let host_before_ns = now();
            request.store(round, Ordering::SeqCst);
            let mut spins = 0u32;
            // No pause hint: the loop is the measurement, and a pause delays noticing.
            while answer_round.load(Ordering::Acquire) != round {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(SPINS_PER_LOOK) {
                    if Instant::now() > deadline {
                        return Err(Error::ClockSync {
                            reason: "the exchange kernel did not answer in time",
                        });
                    }
                    if self.done.query()? && answer_round.load(Ordering::Acquire) != round {
                        return Err(Error::ClockSync {
                            reason: "the exchange kernel exited without answering",
                        });
                    }
                }
            }
            let host_after_ns = now();
            // Written before the round number, with a system-wide fence between.
            let low = self.mapped.word(ANSWER_LOW_WORD).load(Ordering::Acquire);
            let high = self.mapped.word(ANSWER_HIGH_WORD).load(Ordering::Acquire);
            out.push(ExchangeRound {
                host_before_ns,
                gpu_ns: u64::from(low) | (u64::from(high) << 32),
                host_after_ns,
            });
        }
        Ok(())
    }

    /// Records each of `events` on `stream` between two stamping kernels, waits, and appends
    /// each event's bracket to `out`.
    ///
    /// # Safety
    /// Every event must be a live event of the backend's context.
    pub(crate) unsafe fn stamp_events(
        &mut self,
        stream: &Stream,
        events: &[CUevent],
        out: &mut Vec<GpuBracket>,
    ) -> Result<(), Error> {
        if events.len() > MAX_STAMPED_EVENTS {
            return Err(Error::ClockSync {
                reason: "more base events than stamp slots",
            });
        }
        if !self.idle()? {
            return Err(Error::ClockSync {
                reason: "the previous exchange's kernel is still waiting to run",
            });
        }
        let slot_word = |slot: usize, i: usize| (STAMPS_OFFSET + STAMP_SLOT_BYTES * slot) / 4 + i;
        for slot in 0..=events.len() {
            for i in 0..4 {
                self.mapped
                    .word(slot_word(slot, i))
                    .store(0, Ordering::SeqCst);
            }
        }
        let slot_ptr = |slot: usize| {
            self.mapped.device_ptr() + (STAMPS_OFFSET + STAMP_SLOT_BYTES * slot) as u64
        };
        launch(&self.context, self.stamp, stream.raw(), &mut [slot_ptr(0)])?;
        for (i, &event) in events.iter().enumerate() {
            // SAFETY: the caller passes live events of this context; the stream is live.
            unsafe { stream.record_raw_event(event) }?;
            launch(
                &self.context,
                self.stamp,
                stream.raw(),
                &mut [slot_ptr(i + 1)],
            )?;
        }
        stream.synchronize()?;
        let stamp = |slot: usize, which: usize| {
            let low = self
                .mapped
                .word(slot_word(slot, 2 * which))
                .load(Ordering::Acquire);
            let high = self
                .mapped
                .word(slot_word(slot, 2 * which + 1))
                .load(Ordering::Acquire);
            u64::from(low) | (u64::from(high) << 32)
        };
        for i in 0..events.len() {
            let bracket = GpuBracket {
                after_ns: stamp(i, 1),
                before_ns: stamp(i + 1, 0),
            };
            if !bracket.is_valid() {
                return Err(Error::ClockSync {
                    reason: "the stamping kernels left no stamps",
                });
            }
            out.push(bracket);
        }
        Ok(())
    }
}

impl Drop for ClockExchange {
    fn drop(&mut self) {
        self.mapped.word(REQUEST_WORD).store(STOP, Ordering::SeqCst);
        if self.launched {
            // The kernel stops at its next poll, or at once when it starts: bounded either way
            // (and by its own budget). The module and memory go only after it.
            let _ = self.done.synchronize();
        }
    }
}

/// Launches one thread of `function`, whose parameters are all `u64`, on `stream`.
fn launch(
    context: &Arc<PrimaryContext>,
    function: CUfunction,
    stream: CUstream,
    args: &mut [u64],
) -> Result<(), Error> {
    let mut params: smallvec::SmallVec<[*mut c_void; 4]> = args
        .iter_mut()
        .map(|a| std::ptr::from_mut(a).cast::<c_void>())
        .collect();
    // SAFETY: both kernels take only `u64` parameters, as many as `args` holds (their callers
    // pass them so), and `params` points at each, read during the call; the function and
    // stream are live objects of the current context.
    unsafe {
        cu!(
            context.api(),
            cuLaunchKernel(
                function,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut()
            )
        )
    }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_fits_the_allocation_and_the_kernels_offsets() {
        // The PTX answers at mailbox + 64 (u64) and + 72 (u32).
        assert_eq!(ANSWER_LOW_WORD * 4, 64);
        assert_eq!(ANSWER_ROUND_WORD * 4, 72);
        assert!(CLOCK_SYNC_PTX.contains("[%rd4+64], %rd10"));
        assert!(CLOCK_SYNC_PTX.contains("[%rd4+72], %r2"));
        const {
            assert!(STAMPS_OFFSET >= ANSWER_ROUND_WORD * 4 + 4);
            assert!(MAPPED_BYTES >= STAMPS_OFFSET + STAMP_SLOT_BYTES * (MAX_STAMPED_EVENTS + 1));
            assert!(crate::context::CALIBRATION_TRIES <= MAX_STAMPED_EVENTS);
        }
        assert!(CLOCK_SYNC_PTX.contains(&format!(".entry {EXCHANGE_NAME}(")));
        assert!(CLOCK_SYNC_PTX.contains(&format!(".entry {STAMP_NAME}(")));
    }
}
