//! The clock exchange on CUDA: how [`CudaEvents`](crate::CudaEvents) ties `%globaltimer` to the
//! host clock, and its base events to `%globaltimer` (the arithmetic is
//! [`clock_sync`](crate::clock_sync)'s).
//!
//! Both kernels live in `clock_sync.ptx` and run on a stream of their own, so one that cannot
//! start (a device full of other work) never holds up the backend's calibration stream, which
//! the host-bracket fallback uses. Their words live in one allocation of mapped host memory:
//! the exchange's mailbox (the host's request on one cache line, the kernel's answer on the
//! next) and the stamps of the kernels around the base events. Nothing waits without bound: the
//! host gives up the exchange after its timeout (or as soon as the kernel has exited without
//! answering), then asks the kernel to stop; the kernel stops by itself after a budget of
//! `%globaltimer` or of polls; the stamping kernels are waited for with a timeout; an exchange
//! while the stream's earlier work has not finished is refused instead of sharing the mailbox
//! with it; and dropping waits a bounded time, then leaks rather than frees memory a kernel
//! that never started could still touch.

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cuhal_sys::{
    CU_EVENT_DISABLE_TIMING, CU_STREAM_NON_BLOCKING, CUevent, CUfunction, CUstream, Event,
    MappedHostMemory, Module, PrimaryContext, Stream, cu,
};

use crate::Error;
use crate::clock_sync::{ExchangeRound, GpuBracket};

/// The kernels (see the file).
const CLOCK_SYNC_PTX: &str = include_str!("clock_sync.ptx");
const EXCHANGE_NAME: &str = "cuhal_clock_exchange";
const STAMP_NAME: &str = "cuhal_clock_stamp";

/// The mailbox: the host's request (a round number, or [`STOP`]; a 32-bit word index) on the
/// first cache line, the kernel's `%globaltimer` answer (a `u64`, byte offset) on the second.
const REQUEST_WORD: usize = 0;
const ANSWER_OFFSET: usize = 64;
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

/// How long dropping the exchange waits for its kernels to exit before it leaks their module,
/// memory and stream instead of freeing what a kernel that never started could still touch.
const DROP_PATIENCE: Duration = Duration::from_secs(1);

/// The exchange's kernels, stream and memory, made on the first exchange and kept by the
/// backend.
pub(crate) struct ClockExchange {
    context: Arc<PrimaryContext>,
    /// The exchange's own stream: a kernel of it that cannot start (a device full of other
    /// work) never holds up the backend's calibration stream, which the fallback uses.
    stream: ManuallyDrop<Stream>,
    /// Recorded after the last work enqueued on `stream`: complete once it all finished.
    done: ManuallyDrop<Event>,
    /// Whether `done` was recorded at least once.
    launched: bool,
    /// The mailbox and stamp slots.
    mapped: ManuallyDrop<MappedHostMemory>,
    exchange: CUfunction,
    stamp: CUfunction,
    /// Keeps both functions loaded.
    module: ManuallyDrop<Module>,
}

// SAFETY: the function handles are plain driver handles of a module this value owns; the
// driver's calls on them are thread-safe, and the backend uses the value under a lock.
unsafe impl Send for ClockExchange {}

impl ClockExchange {
    /// Loads the kernels, makes the stream and allocates the mapped memory, in `context`
    /// (made current).
    pub(crate) fn new(context: &Arc<PrimaryContext>) -> Result<Self, Error> {
        let module = Module::load_ptx(context, CLOCK_SYNC_PTX)?;
        let exchange = module.function(EXCHANGE_NAME)?;
        let stamp = module.function(STAMP_NAME)?;
        let mapped = MappedHostMemory::new(context, MAPPED_BYTES)?;
        let stream = Stream::new(context, CU_STREAM_NON_BLOCKING)?;
        let done = Event::new(context, CU_EVENT_DISABLE_TIMING)?;
        Ok(Self {
            context: context.clone(),
            stream: ManuallyDrop::new(stream),
            done: ManuallyDrop::new(done),
            launched: false,
            mapped: ManuallyDrop::new(mapped),
            exchange,
            stamp,
            module: ManuallyDrop::new(module),
        })
    }

    /// The kernel's answer, as the host sees it.
    fn answer(&self) -> &AtomicU64 {
        const { assert!(ANSWER_OFFSET.is_multiple_of(8) && ANSWER_OFFSET + 8 <= STAMPS_OFFSET) };
        // SAFETY: the allocation is page-aligned and MAPPED_BYTES long, so the word at
        // ANSWER_OFFSET (a multiple of 8, before the stamp slots) is aligned and inside it; it
        // stays mapped while `self` lives (the borrow); the kernel writes it only with one
        // aligned 8-byte store, which an atomic view tolerates.
        unsafe { AtomicU64::from_ptr(self.mapped.host_ptr().add(ANSWER_OFFSET).cast::<u64>()) }
    }

    /// Whether everything enqueued on the exchange's stream has finished.
    fn idle(&self) -> Result<bool, Error> {
        if !self.launched {
            return Ok(true);
        }
        Ok(self.done.query()?)
    }

    /// Records `done` after what was enqueued on the stream.
    fn mark_done(&mut self) -> Result<(), Error> {
        self.done.record(&self.stream)?;
        self.launched = true;
        Ok(())
    }

    /// Waits (polling) until `done` completes or `timeout` passes; whether it completed.
    fn wait_done(&self, timeout: Duration) -> Result<bool, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.idle()? {
                return Ok(true);
            }
            if Instant::now() > deadline {
                return Ok(false);
            }
            std::thread::yield_now();
        }
    }

    /// Runs up to `rounds` rounds (see the module), appending the answered ones to `out`;
    /// `now` reads the host clock. Fails when the stream's previous work has not finished,
    /// when the kernel exits (or never starts) without answering, or after `timeout`.
    pub(crate) fn run(
        &mut self,
        rounds: usize,
        timeout: Duration,
        now: &dyn Fn() -> u64,
        out: &mut Vec<ExchangeRound>,
    ) -> Result<(), Error> {
        if !self.idle()? {
            return Err(Error::ClockSync {
                reason: "the previous exchange's kernel has not run yet",
            });
        }
        // Nothing runs on the mailbox now: the stream's previous kernels exited.
        self.mapped.word(REQUEST_WORD).store(0, Ordering::SeqCst);
        self.answer().store(0, Ordering::SeqCst);
        // The kernel outlives the host's patience by at most as much again; a poll takes at
        // least a PCIe round trip (hundreds of nanoseconds), so the poll budget is looser still.
        let budget_ns = u64::try_from(timeout.as_nanos())
            .unwrap_or(u64::MAX / 2)
            .saturating_mul(2);
        let max_polls = budget_ns / 100;
        launch(
            &self.context,
            self.exchange,
            self.stream.raw(),
            &mut [self.mapped.device_ptr(), budget_ns, max_polls],
        )?;
        let result = self
            .mark_done()
            .and_then(|()| self.rounds(rounds, timeout, now, out));
        // Whatever happened, the kernel stops at its next poll (or at once, if it starts late).
        self.mapped.word(REQUEST_WORD).store(STOP, Ordering::SeqCst);
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
        let answer = self.answer();
        let rounds = u32::try_from(rounds).unwrap_or(STOP - 1).min(STOP - 1);
        for round in 1..=rounds {
            // The previous round's answer was seen, so the kernel writes nothing until it sees
            // this request: cleared here, a non-zero answer is this round's. Stores reach the
            // device in order, so the clear lands before the request does.
            answer.store(0, Ordering::SeqCst);
            let host_before_ns = now();
            request.store(round, Ordering::SeqCst);
            let mut spins = 0u32;
            // No pause hint: the loop is the measurement, and a pause delays noticing.
            let gpu_ns = loop {
                let gpu_ns = answer.load(Ordering::Acquire);
                if gpu_ns != 0 {
                    break gpu_ns;
                }
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(SPINS_PER_LOOK) {
                    if Instant::now() > deadline {
                        return Err(Error::ClockSync {
                            reason: "the exchange kernel did not answer in time",
                        });
                    }
                    if self.done.query()? && answer.load(Ordering::Acquire) == 0 {
                        return Err(Error::ClockSync {
                            reason: "the exchange kernel exited without answering",
                        });
                    }
                }
            };
            let host_after_ns = now();
            out.push(ExchangeRound {
                host_before_ns,
                gpu_ns,
                host_after_ns,
            });
        }
        Ok(())
    }

    /// Records each of `events` on the exchange's stream between two stamping kernels (after
    /// whatever the stream still runs, such as the exchange kernel seeing its stop word),
    /// waits at most `timeout`, and appends each event's bracket to `out`.
    ///
    /// # Safety
    /// Every event must be a live event of the backend's context.
    pub(crate) unsafe fn stamp_events(
        &mut self,
        events: &[CUevent],
        timeout: Duration,
        out: &mut Vec<GpuBracket>,
    ) -> Result<(), Error> {
        if events.len() > MAX_STAMPED_EVENTS {
            return Err(Error::ClockSync {
                reason: "more base events than stamp slots",
            });
        }
        let slot_word = |slot: usize, i: usize| (STAMPS_OFFSET + STAMP_SLOT_BYTES * slot) / 4 + i;
        // Stamping kernels of an earlier call that did not finish in time run before these
        // (one stream) and are overwritten by them.
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
        let stream = self.stream.raw();
        launch(&self.context, self.stamp, stream, &mut [slot_ptr(0)])?;
        for (i, &event) in events.iter().enumerate() {
            // SAFETY: the caller passes live events of this context; the stream is live.
            unsafe { self.stream.record_raw_event(event) }?;
            launch(&self.context, self.stamp, stream, &mut [slot_ptr(i + 1)])?;
        }
        self.mark_done()?;
        if !self.wait_done(timeout)? {
            return Err(Error::ClockSync {
                reason: "the stamping kernels did not run in time",
            });
        }
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
        let _bound = self.context.enter();
        // The kernel stops at its next poll, or at once when it starts: bounded unless the
        // device never gives it a chance to start. Then its module, memory and stream are
        // leaked rather than freed under it (or waited for without end). A failed query means
        // a context in error, which runs nothing more: freeing is safe then.
        if matches!(self.wait_done(DROP_PATIENCE), Ok(false)) {
            return;
        }
        // SAFETY: each field is dropped once, here, and never used again; the work that used
        // them finished (`done` completed after it) or never will run (the context failed).
        unsafe {
            ManuallyDrop::drop(&mut self.done);
            ManuallyDrop::drop(&mut self.stream);
            ManuallyDrop::drop(&mut self.module);
            ManuallyDrop::drop(&mut self.mapped);
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
        // The PTX answers at mailbox + 64, a u64, and nowhere else.
        assert_eq!(ANSWER_OFFSET, 64);
        assert!(CLOCK_SYNC_PTX.contains("st.volatile.global.u64  [%rd4+64], %rd10;"));
        assert_eq!(CLOCK_SYNC_PTX.matches("[%rd4+").count(), 1);
        const {
            assert!(STAMPS_OFFSET >= ANSWER_OFFSET + 8);
            assert!(MAPPED_BYTES >= STAMPS_OFFSET + STAMP_SLOT_BYTES * (MAX_STAMPED_EVENTS + 1));
            assert!(crate::context::CALIBRATION_TRIES <= MAX_STAMPED_EVENTS);
        }
        assert!(CLOCK_SYNC_PTX.contains(&format!(".entry {EXCHANGE_NAME}(")));
        assert!(CLOCK_SYNC_PTX.contains(&format!(".entry {STAMP_NAME}(")));
    }
}
