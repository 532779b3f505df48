//! Pooled CUDA events: the device-side half of every semaphore timepoint.
//!
//! A [`CudaEvent`] is a reference-counted handle to a `CUevent` created with
//! `CU_EVENT_DISABLE_TIMING` (7x cheaper to record than a timing event) and nothing else: a
//! blocking-sync event would make every device-side wait on it slower (the completion thread
//! sleeps on an event of its own instead, see `backend.rs`). An event goes back to its pool's
//! free list only when its last handle is dropped: the semaphore drops its handle once its value passes the
//! timepoint, a queue drops its handle once the wait is enqueued (`cuStreamWaitEvent` captures
//! the event's state at the call), and the completion thread drops its handle after signalling.
//!
//! Handles are counted by hand rather than with `Arc` so that taking an event from the pool and
//! cloning it never allocates: slots are boxed once when the pool grows, and live as long as the
//! pool. A handed-out slot holds one strong count of the pool, taken when it leaves the free
//! list and given back when its last handle drops; clones and drops in between touch only the
//! slot's own counter, not a counter every event of the device shares.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crossbeam_utils::CachePadded;
use cuhal_recycle::Recycled;
use cuhal_scheduler::CompletionNudge;
use cuhal_semaphore::slot_pool::{FreeList, HandleCount};
use cuhal_semaphore::{DeviceEvent, Failure};
use cuhal_sys::{CU_EVENT_DISABLE_TIMING, CUevent, Event, PrimaryContext};

use crate::error::Error;
use crate::lost::Lost;
use crate::submissions::Submissions;

/// The fewest events a pool creates when it runs out: the events made double from there.
const MIN_GROWTH: usize = 16;

/// A list of slots of a pool, which grows (the slots made with it) as [`Recycled`] does.
type SlotList = Recycled<Vec<NonNull<Slot>>, MIN_GROWTH>;

/// One event of the pool, at a fixed address for the pool's lifetime, on a cache line of its own:
/// the issuing side takes and counts one slot while the completion side gives back another, and
/// two slots on one line would pass it between their cores on every such pair.
#[repr(align(64))]
struct Slot {
    event: Event,
    handles: HandleCount,
    /// The pool (`Arc::as_ptr`); the slot owns one strong count of it while it is handed out.
    pool: *const PoolShared,
}

struct PoolShared {
    context: Arc<PrimaryContext>,
    /// The device's lost state: an event query that sees a sticky error loses the device.
    lost: Arc<Lost>,
    /// The device's submission counts, which a host wait on one of these events watches.
    submissions: Arc<Submissions>,
    flags: u32,
    /// Slots whose handle count is zero, given back by the last drop of their handles.
    free: FreeList<NonNull<Slot>>,
    /// The issuing side's counts, on a line of their own: `free`'s lock beside them is taken by
    /// the completion side for every event it gives back.
    counts: CachePadded<Counts>,
    /// Every slot ever created; freed with the pool.
    all: Mutex<SlotList>,
    /// Hurries the completion side of the queue that records these events, for a host thread
    /// about to park on one of them (set once the queue exists).
    nudge: OnceLock<CompletionNudge>,
}

/// What the issuing side reads and writes on every take, apart from the lists.
struct Counts {
    /// How many free slots the queue's [`EventStash`] holds (written by the issuing side only,
    /// for [`TimepointEventPool::in_use`]).
    stashed: AtomicUsize,
    /// `all`'s length, readable without its lock.
    created: AtomicUsize,
}

// SAFETY: the slot pointers are only dereferenced for their atomic counter and immutable handle;
// the lists are behind mutexes; CUevent handles may be used from any thread.
unsafe impl Send for PoolShared {}
// SAFETY: as above.
unsafe impl Sync for PoolShared {}

/// Free events that a queue's issuing side took from its pool's free list in one go
/// ([`TimepointEventPool::acquire_via`]), kept with the queue's issue state: the issuing side
/// takes from here without a lock, and refills it once it runs dry.
pub(crate) struct EventStash(SlotList);

// SAFETY: the pointers name free slots of a pool (Sync, see PoolShared); the stash only moves
// them between free lists, under the issue lock of the one queue that holds it.
unsafe impl Send for EventStash {}

impl EventStash {
    /// An empty stash with room for `capacity` events.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        EventStash(SlotList::with_capacity(capacity))
    }
}

/// A pool of completion/timepoint events: each queue has its own, so that taking and giving back
/// events touches nothing another queue's submissions touch, and so that an event tells which
/// queue's stream it was recorded on ([`TimepointEventPool::owns`]).
#[derive(Clone)]
pub(crate) struct TimepointEventPool {
    shared: Arc<PoolShared>,
}

impl TimepointEventPool {
    /// A pool of `CU_EVENT_DISABLE_TIMING` events (timing ones when `timed`: a traced queue's
    /// completion events also time its submissions), with `reserve` created up front; queries
    /// that see a sticky error lose the device through `lost`; its events report the device's
    /// `submissions` to host waits.
    pub(crate) fn new(
        context: Arc<PrimaryContext>,
        reserve: usize,
        lost: Arc<Lost>,
        submissions: Arc<Submissions>,
        timed: bool,
    ) -> Result<Self, Error> {
        let pool = Self {
            shared: Arc::new(PoolShared {
                context,
                lost,
                submissions,
                flags: if timed { 0 } else { CU_EVENT_DISABLE_TIMING },
                free: FreeList::with_capacity(reserve.max(MIN_GROWTH)),
                counts: CachePadded::new(Counts {
                    stashed: AtomicUsize::new(0),
                    created: AtomicUsize::new(0),
                }),
                all: Mutex::new(SlotList::with_capacity(reserve.max(MIN_GROWTH))),
                nudge: OnceLock::new(),
            }),
        };
        let events: Vec<CudaEvent> = (0..reserve)
            .map(|_| pool.acquire())
            .collect::<Result<_, _>>()?;
        drop(events);
        Ok(pool)
    }

    /// Tells the pool which queue's completion side to hurry when a host thread is about to
    /// park on one of its events ([`DeviceEvent::awaited`]). The first call wins.
    pub(crate) fn set_nudge(&self, nudge: CompletionNudge) {
        let _ = self.shared.nudge.set(nudge);
    }

    /// Takes a free event, creating one if none is free.
    pub(crate) fn acquire(&self) -> Result<CudaEvent, Error> {
        // SAFETY: every slot on the free list belongs to this pool, which outlives it (we hold
        // the Arc).
        let taken = self
            .shared
            .free
            .take(|slot| &unsafe { slot.as_ref() }.handles);
        self.handed_out(taken)
    }

    /// [`acquire`](Self::acquire) for the queue's issuing side, through its `stash` of free
    /// events: it takes the whole free list at once when the stash runs dry, so it seldom meets
    /// the completion side giving events back, and takes no lock otherwise.
    pub(crate) fn acquire_via(&self, stash: &mut EventStash) -> Result<CudaEvent, Error> {
        let shared = &self.shared;
        // The stash and the free list swap their storage: the stash must hold every slot, as
        // the free list can (grown here if other takers grew the pool meanwhile).
        stash.0.reserve_total(self.created());
        // SAFETY: every slot on the free list and in the stash belongs to this pool, which
        // outlives it (we hold the Arc).
        let taken = shared
            .free
            .take_via(&mut stash.0, |slot| &unsafe { slot.as_ref() }.handles);
        shared
            .counts
            .stashed
            .store(stash.0.len(), Ordering::Relaxed);
        // The next submission's event: the completion thread gave it back last.
        stash.0.prefetch_last(|next| next.as_ptr());
        self.handed_out(taken)
    }

    /// The handle to a slot just taken from a free list (`None`: none was free, so the pool
    /// grows).
    fn handed_out(&self, taken: Option<NonNull<Slot>>) -> Result<CudaEvent, Error> {
        let slot = match taken {
            Some(slot) => slot,
            None => self.grow()?,
        };
        // SAFETY: the pointer is `Arc::as_ptr` of the live pool we hold; the count taken here is
        // given back by the drop of the slot's last handle.
        unsafe { Arc::increment_strong_count(Arc::as_ptr(&self.shared)) };
        Ok(CudaEvent { slot })
    }

    /// Creates events when none is free: as many as the pool holds already (at least
    /// [`MIN_GROWTH`], see [`Recycled::grown`]), one handed out at once and the rest put on the
    /// free list. Growing by doubling makes growth rare (a handful of times over a pool's life,
    /// however the number in flight creeps up), so a steady state that reaches a new high-water
    /// mark now and then does not allocate (and create an event) at each new mark.
    #[cold]
    fn grow(&self) -> Result<NonNull<Slot>, Error> {
        let shared = &self.shared;
        let created = self.created();
        let count = SlotList::grown(created) - created;
        let first = self.create_slot()?;
        let mut spare = Vec::with_capacity(count - 1);
        for _ in 1..count {
            match self.create_slot() {
                Ok(slot) => spare.push(slot),
                // The one handed out is enough for now; the next miss tries again.
                Err(_) => break,
            }
        }
        let mut all = shared.all.lock().unwrap_or_else(PoisonError::into_inner);
        all.push(first);
        all.extend(spare.iter().copied());
        // Keep the free list able to hold every slot, so releasing never allocates (the stash
        // catches up at its next take, as the two swap their storage).
        let capacity = all.len();
        shared.counts.created.store(capacity, Ordering::Relaxed);
        drop(all);
        shared.free.reserve_total(capacity);
        for slot in spare {
            shared.free.add_new(slot);
        }
        // SAFETY: the slot was just created and nothing else refers to it yet.
        unsafe { first.as_ref() }.handles.clone_handle();
        Ok(first)
    }

    /// Creates one event in a slot of its own, at a fixed address until the pool drops.
    fn create_slot(&self) -> Result<NonNull<Slot>, Error> {
        let shared = &self.shared;
        let event = Event::new(&shared.context, shared.flags)?;
        Ok(NonNull::from(Box::leak(Box::new(Slot {
            event,
            handles: HandleCount::new(),
            pool: Arc::as_ptr(shared),
        }))))
    }

    /// Whether `event` is one of this pool's: for a queue's pool, an event recorded on the
    /// queue's own stream, which stream order already waits for.
    pub fn owns(&self, event: &CudaEvent) -> bool {
        std::ptr::eq(event.slot().pool, Arc::as_ptr(&self.shared))
    }

    /// Events created so far.
    pub(crate) fn created(&self) -> usize {
        self.shared.counts.created.load(Ordering::Relaxed)
    }

    /// Events currently handed out (created minus free, on the free list or in the stash).
    pub(crate) fn in_use(&self) -> usize {
        // Three reads, three moments: the pool may grow or hand out between them.
        let stashed = self.shared.counts.stashed.load(Ordering::Relaxed);
        self.created()
            .saturating_sub(self.shared.free.len() + stashed)
    }
}

impl Drop for PoolShared {
    fn drop(&mut self) {
        // Every handle holds the pool, so when it goes every slot is free.
        for slot in self
            .all
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            // SAFETY: the slot was leaked from a Box in `grow` and nothing references it now;
            // dropping it destroys its event.
            drop(unsafe { Box::from_raw(slot.as_ptr()) });
        }
    }
}

/// A handle to a pooled CUDA event; clones share the event.
pub struct CudaEvent {
    slot: NonNull<Slot>,
}

// SAFETY: see PoolShared; the handle only touches the slot's atomic, its immutable CUevent and
// pool pointer, and the pool (Sync) through it.
unsafe impl Send for CudaEvent {}
// SAFETY: as above.
unsafe impl Sync for CudaEvent {}

impl CudaEvent {
    fn slot(&self) -> &Slot {
        // SAFETY: the slot lives until the pool drops, and the slot holds the pool while any
        // handle (this one) exists.
        unsafe { self.slot.as_ref() }
    }

    fn pool(&self) -> &PoolShared {
        // SAFETY: the handed-out slot owns a strong count of the pool until its last handle
        // drops, and this handle has not.
        unsafe { &*self.slot().pool }
    }

    /// The raw event handle (valid while this handle lives).
    pub fn raw(&self) -> CUevent {
        self.slot().event.raw()
    }

    /// The context the event belongs to.
    pub fn context(&self) -> &Arc<PrimaryContext> {
        &self.pool().context
    }

    /// `cuEventQuery` as a tri-state: complete, not ready, or the driver's error.
    pub fn query_raw(&self) -> Result<bool, cuhal_sys::Error> {
        self.slot().event.query()
    }
}

impl Clone for CudaEvent {
    fn clone(&self) -> Self {
        self.slot().handles.clone_handle();
        Self { slot: self.slot }
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        let pool = self.slot().pool;
        // The last handle puts the slot back on the free list (after synchronising with every
        // other handle's release, see `cuhal_semaphore::slot_pool`).
        if self
            .pool()
            .free
            .drop_handle(self.slot, &self.slot().handles)
        {
            // The slot is free now (another thread may already have taken it): only `pool`,
            // copied above, is used from here.
            // SAFETY: gives back the count `acquire` took for this handout; if it is the last,
            // the pool (and every slot) is freed now, and nothing here touches them afterwards.
            unsafe { Arc::decrement_strong_count(pool) };
        }
    }
}

impl DeviceEvent for CudaEvent {
    /// A host waiter querying this event may be the first to see the device fail: the error
    /// goes through the device's lost state, so the semaphore fails with the device's failure.
    fn query(&self) -> Result<bool, Failure> {
        self.query_raw()
            .map_err(|e| self.pool().lost.note(Error::from(e)))
    }

    /// The issues of every queue of the event's device.
    fn submissions(&self) -> u64 {
        self.pool().submissions.total()
    }

    /// Ends the gather of the completion thread of the queue that recorded the event: its
    /// advance is what wakes a parked host thread soonest.
    fn awaited(&self) {
        if let Some(nudge) = self.pool().nudge.get() {
            nudge.nudge();
        }
    }
}

impl cuhal_command::WorkDone for CudaEvent {
    fn is_done(&self) -> bool {
        matches!(self.query_raw(), Ok(true))
    }
}

impl std::fmt::Debug for CudaEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CudaEvent").field(&self.raw()).finish()
    }
}
