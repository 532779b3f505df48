//! The process's one CUPTI subscription: activity buffers, the callbacks that capture
//! correlation ids and graph-node clones, and the clock conversion.
//!
//! CUPTI is process-wide (one subscriber, buffer callbacks without user data), so the state the
//! callbacks touch is static. A [`CuptiSession`] owns the subscription; every tracing context
//! that wants CUPTI shares the live one ([`CuptiSession::acquire`]) and the last one to go
//! unsubscribes.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use cuhal_sys::{CUcontext, CUgraphNode};

use super::error::CuptiError;
use super::ffi::{self, CuptiApi};
use super::load::CuptiLibrary;
use super::records::{self, Activity};
use crate::clock;
use crate::lock::lock;

/// Bytes per activity buffer (about 4,800 kernel records). CUPTI fills one while the previous
/// ones are processed.
pub const BUFFER_BYTES: usize = 1 << 20;
/// Buffers allocated at most; past it CUPTI drops records (counted by CUPTI and reported).
pub const MAX_BUFFERS: usize = 64;
/// Buffers allocated when the session starts, so steady tracing allocates none.
const PREALLOCATED_BUFFERS: usize = 4;

const BUFFER_WORDS: usize = BUFFER_BYTES / 8;

/// Activity buffers: allocations of [`BUFFER_BYTES`] (8-byte aligned, as CUPTI requires) handed
/// to CUPTI, returned full, parsed, and recycled.
struct Buffers {
    /// Addresses of free buffers.
    free: Mutex<Vec<usize>>,
    /// Buffers CUPTI completed: address and valid bytes, oldest first.
    filled: Mutex<VecDeque<(usize, usize)>>,
    allocated: AtomicUsize,
    /// Requests answered with no buffer (the cap was reached).
    refused: AtomicU64,
}

static BUFFERS: Buffers = Buffers {
    free: Mutex::new(Vec::new()),
    filled: Mutex::new(VecDeque::new()),
    allocated: AtomicUsize::new(0),
    refused: AtomicU64::new(0),
};

fn allocate_buffer() -> usize {
    let buffer: Box<[u64]> = vec![0u64; BUFFER_WORDS].into_boxed_slice();
    Box::into_raw(buffer).cast::<u64>() as usize
}

/// # Safety
/// `address` must come from [`allocate_buffer`] and be freed once.
unsafe fn free_buffer(address: usize) {
    let slice = std::ptr::slice_from_raw_parts_mut(address as *mut u64, BUFFER_WORDS);
    // SAFETY: `address` is a `Box<[u64]>` of BUFFER_WORDS leaked by `allocate_buffer` (the
    // caller's contract), so rebuilding the box with that length frees it correctly.
    drop(unsafe { Box::from_raw(slice) });
}

/// CUPTI asks for a buffer (on any thread, possibly inside a driver call).
unsafe extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max: *mut usize) {
    let address = lock(&BUFFERS.free).pop().or_else(|| {
        let n = BUFFERS.allocated.fetch_add(1, Ordering::Relaxed);
        if n < MAX_BUFFERS {
            Some(allocate_buffer())
        } else {
            BUFFERS.allocated.fetch_sub(1, Ordering::Relaxed);
            None
        }
    });
    let (ptr, bytes) = match address {
        Some(a) => (a as *mut u8, BUFFER_BYTES),
        None => {
            BUFFERS.refused.fetch_add(1, Ordering::Relaxed);
            (std::ptr::null_mut(), 0)
        }
    };
    // SAFETY: CUPTI passes valid out-pointers.
    unsafe {
        *buffer = ptr;
        *size = bytes;
        *max = 0;
    }
}

/// CUPTI hands back a buffer with `valid` bytes of records (on its worker thread, or inside
/// `cuptiActivityFlushAll`).
unsafe extern "C" fn buffer_completed(
    _context: CUcontext,
    _stream: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    lock(&BUFFERS.filled).push_back((buffer as usize, valid.min(BUFFER_BYTES)));
}

/// Correlation ids captured on this thread while a capture is open.
struct Capture {
    open: bool,
    ids: Vec<u32>,
}

thread_local! {
    static CAPTURE: RefCell<Capture> = const { RefCell::new(Capture { open: false, ids: Vec::new() }) };
}

/// Graph nodes CUPTI saw cloned (on instantiation): the clone's id to the original's.
static CLONES: Mutex<Option<HashMap<u64, u64>>> = Mutex::new(None);

/// The entry points the callbacks use (set while a session lives).
static CALLBACK_API: Mutex<Option<CuptiApi>> = Mutex::new(None);

/// Driver-API and resource callbacks.
unsafe extern "C" fn on_callback(
    _userdata: *mut c_void,
    domain: ffi::CUpti_CallbackDomain,
    cbid: ffi::CUpti_CallbackId,
    cbdata: *const c_void,
) {
    if cbdata.is_null() {
        return;
    }
    match domain {
        ffi::CUPTI_CB_DOMAIN_DRIVER_API => {
            // SAFETY: driver-API callbacks receive a CUpti_CallbackData.
            let data = unsafe { &*cbdata.cast::<ffi::CUpti_CallbackData>() };
            if data.callbackSite != ffi::CUPTI_API_EXIT {
                return;
            }
            // A failed call produces no activity: its id would never be matched.
            if !data.functionReturnValue.is_null() {
                // SAFETY: at exit, functionReturnValue points to the call's CUresult (an i32).
                let result = unsafe { *data.functionReturnValue.cast::<i32>() };
                if result != 0 {
                    return;
                }
            }
            let id = data.correlationId;
            // `try_with`: the thread may be tearing down its locals.
            let _ = CAPTURE.try_with(|c| {
                if let Ok(mut c) = c.try_borrow_mut()
                    && c.open
                {
                    c.ids.push(id);
                }
            });
        }
        ffi::CUPTI_CB_DOMAIN_RESOURCE if cbid == ffi::CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED => {
            // SAFETY: resource callbacks receive a CUpti_ResourceData whose descriptor, for
            // graph callbacks, is a CUpti_GraphData.
            let graph = unsafe {
                let resource = &*cbdata.cast::<ffi::CUpti_ResourceData>();
                if resource.resourceDescriptor.is_null() {
                    return;
                }
                *resource.resourceDescriptor.cast::<ffi::CUpti_GraphData>()
            };
            let Some(api) = *lock(&CALLBACK_API) else {
                return;
            };
            let (mut clone, mut original) = (0u64, 0u64);
            // SAFETY: both nodes are live for the duration of the callback; CUPTI calls (not
            // driver calls) are allowed inside CUPTI callbacks.
            let ok = unsafe {
                (api.cuptiGetGraphNodeId)(graph.node, &mut clone) == ffi::CUPTI_SUCCESS
                    && (api.cuptiGetGraphNodeId)(graph.originalNode, &mut original)
                        == ffi::CUPTI_SUCCESS
            };
            if ok {
                lock(&CLONES)
                    .get_or_insert_with(HashMap::new)
                    .insert(clone, original);
            }
        }
        _ => {}
    }
}

/// Collects the correlation ids of the launches (kernels, copies, fills, graph launches) this
/// thread makes until [`CaptureGuard::finish`]. Open one around the issue of a submission: the
/// ids, in issue order, are how its activity records are found.
pub struct CaptureGuard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl CaptureGuard {
    /// Opens a capture on this thread (an open one is restarted).
    pub fn start() -> Self {
        CAPTURE.with(|c| {
            let mut c = c.borrow_mut();
            c.open = true;
            c.ids.clear();
        });
        Self {
            _not_send: std::marker::PhantomData,
        }
    }

    /// Closes the capture and hands the ids, in issue order, to `f`.
    pub fn finish<R>(self, f: impl FnOnce(&[u32]) -> R) -> R {
        CAPTURE.with(|c| {
            let mut c = c.borrow_mut();
            c.open = false;
            f(&c.ids)
        })
    }
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        let _ = CAPTURE.try_with(|c| {
            if let Ok(mut c) = c.try_borrow_mut() {
                c.open = false;
            }
        });
    }
}

/// A mapping from CUPTI's clock to the trace clock, taken by reading both.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ClockMap {
    /// Trace-clock nanoseconds minus CUPTI nanoseconds.
    pub offset_ns: i128,
    /// Half the host-time bracket around the CUPTI reading.
    pub uncertainty_ns: u64,
    /// When it was taken, on the trace clock.
    pub taken_at_ns: u64,
}

impl ClockMap {
    /// The mapping from a CUPTI reading `cupti_ns` bracketed by trace-clock readings `before`
    /// and `after`.
    pub fn from_bracket(before: u64, cupti_ns: u64, after: u64) -> Self {
        let (lo, hi) = (before.min(after), before.max(after));
        let mid = lo + (hi - lo) / 2;
        Self {
            offset_ns: i128::from(mid) - i128::from(cupti_ns),
            uncertainty_ns: (hi - lo).div_ceil(2),
            taken_at_ns: after,
        }
    }

    /// `cupti_ns` on the trace clock (0 for times before the trace clock's epoch).
    pub fn to_trace_ns(&self, cupti_ns: u64) -> u64 {
        let t = i128::from(cupti_ns) + self.offset_ns;
        u64::try_from(t.max(0)).unwrap_or(u64::MAX)
    }
}

/// Clock mappings older than this are taken again: the two clocks drift apart by parts
/// per million at most, well under a nanosecond a millisecond.
pub const REBASE_AFTER_NS: u64 = 1_000_000_000;
/// Clock readings per calibration; the tightest bracket is kept.
const CALIBRATION_TRIES: usize = 5;

/// A function shown every record as it is parsed, before any tracing context claims it
/// (diagnostics: see [`CuptiSession::set_record_tap`]).
static TAP: Mutex<Option<fn(&Activity)>> = Mutex::new(None);
/// Whether [`TAP`] is set: parsing checks this flag, not the lock.
static TAPPED: AtomicBool = AtomicBool::new(false);

/// Past this many arrived records, the stale ones are dropped ([`UNCLAIMED_AGE_NS`]).
pub const MAX_UNCLAIMED: usize = 1 << 16;
/// Records older than this (on CUPTI's clock, behind the newest record) that no context
/// claimed are dropped once [`MAX_UNCLAIMED`] is reached: a submission's records are claimed
/// within a few collections of its completion, far sooner.
pub const UNCLAIMED_AGE_NS: u64 = 2_000_000_000;

/// Records that arrived and were not claimed yet.
struct Arrived {
    activities: Vec<Activity>,
}

/// The live subscription, if any (shared by every context that uses CUPTI).
static CURRENT: Mutex<Weak<CuptiSession>> = Mutex::new(Weak::new());

/// The process's CUPTI subscription: activity kinds enabled, buffers registered, correlation
/// callbacks on. See the module documentation.
pub struct CuptiSession {
    api: CuptiApi,
    library: Option<CuptiLibrary>,
    subscriber: usize,
    /// When the activity kinds are enabled (see [`CuptiSession::acquire_sampled_with`]).
    gate: Mutex<Gate>,
    clock: Mutex<ClockMap>,
    arrived: Mutex<Arrived>,
    records: AtomicU64,
    discarded: AtomicU64,
}

impl std::fmt::Debug for CuptiSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CuptiSession")
            .field("library", &self.library.as_ref().map(CuptiLibrary::path))
            .finish_non_exhaustive()
    }
}

/// When a session's activity kinds are enabled: for its whole life once any user asked for
/// every launch ([`CuptiSession::acquire`]), otherwise only while an [`ActivityWindow`] is open.
#[derive(Default)]
struct Gate {
    /// A user wants every launch traced: the kinds stay enabled until the session ends.
    always: bool,
    /// Windows open now.
    windows: usize,
    /// Whether the kinds are enabled now.
    enabled: bool,
    /// Times the kinds were enabled or disabled after the session started.
    toggles: u64,
}

/// The activity kinds stay enabled while this lives (and the session's kinds are gated: see
/// [`CuptiSession::acquire_sampled_with`]): open one around the issue of work whose records
/// are wanted. The last window to close disables them again, unless a user of the session
/// asked for every launch. Not sendable: it belongs to the issue it brackets.
pub struct ActivityWindow {
    session: Arc<CuptiSession>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl std::fmt::Debug for ActivityWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActivityWindow").finish_non_exhaustive()
    }
}

impl Drop for ActivityWindow {
    fn drop(&mut self) {
        self.session.close_window();
    }
}

/// The activity kinds enabled.
const KINDS: [ffi::CUpti_ActivityKind; 3] = [
    ffi::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    ffi::CUPTI_ACTIVITY_KIND_MEMCPY,
    ffi::CUPTI_ACTIVITY_KIND_MEMSET,
];

impl CuptiSession {
    /// The live session, or a new one on the library at `library` (else the environment
    /// variable, else the loader's path). A live session is shared whatever path was asked for.
    /// Its activity kinds are enabled for as long as it lives: every launch is traced.
    pub fn acquire(library: Option<&Path>) -> Result<Arc<Self>, CuptiError> {
        Self::acquire_as(true, || {
            let lib = CuptiLibrary::load(library)?;
            Ok((*lib.api(), Some(lib)))
        })
    }

    /// The live session, or a new one over `api` (a fake CUPTI in tests), as
    /// [`CuptiSession::acquire`].
    pub fn acquire_with(api: CuptiApi) -> Result<Arc<Self>, CuptiError> {
        Self::acquire_as(true, || Ok((api, None)))
    }

    /// As [`CuptiSession::acquire`], for a user that wants the records of some launches only:
    /// a session it starts subscribes and registers its buffers but leaves the activity kinds
    /// disabled, and enables them only while an [`ActivityWindow`] is open
    /// ([`CuptiSession::open_window`]), so work issued outside every window costs CUPTI no
    /// record. A live session is shared as it is: if a user of it asked for every launch, its
    /// kinds stay enabled.
    pub fn acquire_sampled(library: Option<&Path>) -> Result<Arc<Self>, CuptiError> {
        Self::acquire_as(false, || {
            let lib = CuptiLibrary::load(library)?;
            Ok((*lib.api(), Some(lib)))
        })
    }

    /// As [`CuptiSession::acquire_sampled`], over `api` (a fake CUPTI in tests).
    pub fn acquire_sampled_with(api: CuptiApi) -> Result<Arc<Self>, CuptiError> {
        Self::acquire_as(false, || Ok((api, None)))
    }

    fn acquire_as(
        always: bool,
        load: impl FnOnce() -> Result<(CuptiApi, Option<CuptiLibrary>), CuptiError>,
    ) -> Result<Arc<Self>, CuptiError> {
        let mut current = lock(&CURRENT);
        if let Some(live) = current.upgrade() {
            if always {
                live.hold_enabled()?;
            }
            return Ok(live);
        }
        let (api, library) = load()?;
        let session = Arc::new(Self::start(api, library, always)?);
        *current = Arc::downgrade(&session);
        Ok(session)
    }

    fn start(
        api: CuptiApi,
        library: Option<CuptiLibrary>,
        always: bool,
    ) -> Result<Self, CuptiError> {
        let mut subscriber: ffi::CUpti_SubscriberHandle = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the callback is a plain function that lives forever.
        unsafe {
            crate::cupti!(
                api,
                cuptiSubscribe(&mut subscriber, on_callback, std::ptr::null_mut())
            )
        }?;
        *lock(&CALLBACK_API) = Some(api);
        *lock(&CLONES) = Some(HashMap::new());
        let session = Self {
            api,
            library,
            subscriber: subscriber as usize,
            gate: Mutex::new(Gate::default()),
            clock: Mutex::new(ClockMap::from_bracket(0, 0, 0)),
            arrived: Mutex::new(Arrived {
                activities: Vec::with_capacity(4096),
            }),
            records: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
        };
        // From here `session`'s Drop undoes whatever was set up, on any failure.
        session.enable()?;
        if always {
            // Failing half-way, the session's Drop disables every kind.
            for kind in KINDS {
                // SAFETY: a plain activity kind.
                unsafe { crate::cupti!(session.api, cuptiActivityEnable(kind)) }?;
            }
            let mut gate = lock(&session.gate);
            gate.always = true;
            gate.enabled = true;
        }
        session.recalibrate()?;
        Ok(session)
    }

    /// A user of the live session wants every launch traced: the kinds are enabled (if they
    /// were not) and stay so until the session ends.
    fn hold_enabled(&self) -> Result<(), CuptiError> {
        let mut gate = lock(&self.gate);
        if !gate.enabled {
            self.set_kinds(true)?;
            gate.enabled = true;
            gate.toggles += 1;
        }
        gate.always = true;
        Ok(())
    }

    /// Enables the activity kinds until the returned window closes (no CUPTI call when they
    /// are enabled already). On an error nothing stays enabled by this call.
    pub fn open_window(self: &Arc<Self>) -> Result<ActivityWindow, CuptiError> {
        let mut gate = lock(&self.gate);
        if !gate.enabled {
            self.set_kinds(true)?;
            gate.enabled = true;
            gate.toggles += 1;
        }
        gate.windows += 1;
        Ok(ActivityWindow {
            session: self.clone(),
            _not_send: std::marker::PhantomData,
        })
    }

    fn close_window(&self) {
        let mut gate = lock(&self.gate);
        gate.windows = gate.windows.saturating_sub(1);
        if gate.windows == 0 && !gate.always && gate.enabled {
            // A failure leaves them enabled: later windows find them so, and the session's end
            // disables them.
            if self.set_kinds(false).is_ok() {
                gate.enabled = false;
                gate.toggles += 1;
            }
        }
    }

    /// Whether the activity kinds are enabled now.
    pub fn kinds_enabled(&self) -> bool {
        lock(&self.gate).enabled
    }

    /// Times the activity kinds were enabled or disabled since the session started (each time
    /// is one CUPTI call per kind).
    pub fn kind_toggles(&self) -> u64 {
        lock(&self.gate).toggles
    }

    /// Enables (or disables) every kind of [`KINDS`]. Enabling undoes itself on a failure.
    fn set_kinds(&self, on: bool) -> Result<(), CuptiError> {
        let api = &self.api;
        if !on {
            let mut result = Ok(());
            for kind in KINDS {
                // SAFETY: a plain activity kind.
                let r = unsafe { crate::cupti!(api, cuptiActivityDisable(kind)) };
                if result.is_ok() {
                    result = r;
                }
            }
            return result;
        }
        for (i, kind) in KINDS.into_iter().enumerate() {
            // SAFETY: a plain activity kind.
            if let Err(e) = unsafe { crate::cupti!(api, cuptiActivityEnable(kind)) } {
                for done in &KINDS[..i] {
                    // SAFETY: as above; the failure of an undo leaves nothing more to do.
                    let _ = unsafe { (api.cuptiActivityDisable)(*done) };
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Subscribes to launches and graph-node clones, and registers the activity buffers. The
    /// activity kinds are enabled apart ([`CuptiSession::start`], windows).
    fn enable(&self) -> Result<(), CuptiError> {
        let api = &self.api;
        let subscriber = self.subscriber as ffi::CUpti_SubscriberHandle;
        for id in ffi::cbid::LAUNCHES {
            // SAFETY: a live subscriber and a driver-API callback id.
            unsafe {
                crate::cupti!(
                    api,
                    cuptiEnableCallback(1, subscriber, ffi::CUPTI_CB_DOMAIN_DRIVER_API, id)
                )
            }?;
        }
        // SAFETY: as above, for the resource domain.
        unsafe {
            crate::cupti!(
                api,
                cuptiEnableCallback(
                    1,
                    subscriber,
                    ffi::CUPTI_CB_DOMAIN_RESOURCE,
                    ffi::CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED,
                )
            )
        }?;
        {
            let mut free = lock(&BUFFERS.free);
            while BUFFERS.allocated.load(Ordering::Relaxed) < PREALLOCATED_BUFFERS {
                BUFFERS.allocated.fetch_add(1, Ordering::Relaxed);
                free.push(allocate_buffer());
            }
        }
        // SAFETY: both callbacks are plain functions that live forever.
        unsafe {
            crate::cupti!(
                api,
                cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed)
            )
        }
    }

    /// CUPTI's clock now (`cuptiGetTimestamp`).
    pub fn timestamp(&self) -> Result<u64, CuptiError> {
        let mut t = 0u64;
        // SAFETY: valid out-pointer.
        unsafe { crate::cupti!(self.api, cuptiGetTimestamp(&mut t)) }?;
        Ok(t)
    }

    /// A mapping from CUPTI's clock onto the clock `host` reads (the tightest of a few
    /// brackets).
    pub fn calibrate_against(&self, host: impl Fn() -> u64) -> Result<ClockMap, CuptiError> {
        let mut best: Option<ClockMap> = None;
        for _ in 0..CALIBRATION_TRIES {
            let before = host();
            let cupti = self.timestamp()?;
            let after = host();
            let m = ClockMap::from_bracket(before, cupti, after);
            if best.is_none_or(|b| m.uncertainty_ns < b.uncertainty_ns) {
                best = Some(m);
            }
        }
        Ok(best.unwrap_or(ClockMap::from_bracket(0, 0, 0)))
    }

    /// Reads CUPTI's clock and the trace clock again.
    pub fn recalibrate(&self) -> Result<ClockMap, CuptiError> {
        let best = self.calibrate_against(clock::now_ns)?;
        *lock(&self.clock) = best;
        Ok(best)
    }

    /// The current clock mapping, re-read when older than a second.
    pub fn clock(&self) -> ClockMap {
        let current = *lock(&self.clock);
        if clock::now_ns().saturating_sub(current.taken_at_ns) > REBASE_AFTER_NS {
            return self.recalibrate().unwrap_or(current);
        }
        current
    }

    /// CUPTI's id for a graph node cuhal added (`cuptiGetGraphNodeId`), to find the records of
    /// that node's clones later.
    ///
    /// # Safety
    /// `node` must be a live graph node.
    pub unsafe fn graph_node_id(&self, node: CUgraphNode) -> Result<u64, CuptiError> {
        let mut id = 0u64;
        // SAFETY: valid out-pointer; the caller vouches for the node.
        unsafe { crate::cupti!(self.api, cuptiGetGraphNodeId(node, &mut id)) }?;
        Ok(id)
    }

    /// The id of the node cuhal added that the executable graph's node `recorded` (a record's
    /// `graph_node_id`) was cloned from; `recorded` itself when no clone is known.
    pub fn original_node_id(&self, recorded: u64) -> u64 {
        lock(&CLONES)
            .as_ref()
            .and_then(|m| m.get(&recorded).copied())
            .unwrap_or(recorded)
    }

    /// Has CUPTI hand over every buffer with completed records (`cuptiActivityFlushAll(0)`), then
    /// parses them into the arrived records. Returns the number of new records.
    pub fn flush(&self) -> Result<usize, CuptiError> {
        // SAFETY: a plain call; completed buffers come back through `buffer_completed` on this
        // thread before it returns.
        unsafe { crate::cupti!(self.api, cuptiActivityFlushAll(0)) }?;
        Ok(self.parse_filled())
    }

    /// Shows every record parsed from now on to `tap` (on the parsing thread, before tracing
    /// claims it), or stops showing them (`None`). For diagnostics that compare CUPTI's raw
    /// records with the zones made of them; it costs one flag read per buffer when unset.
    pub fn set_record_tap(tap: Option<fn(&Activity)>) {
        let mut current = lock(&TAP);
        *current = tap;
        TAPPED.store(tap.is_some(), Ordering::Release);
    }

    fn parse_filled(&self) -> usize {
        let mut new = 0;
        let tap = if TAPPED.load(Ordering::Acquire) {
            *lock(&TAP)
        } else {
            None
        };
        loop {
            let Some((address, valid)) = lock(&BUFFERS.filled).pop_front() else {
                break;
            };
            let buffer = address as *mut u8;
            let mut record: *mut ffi::CUpti_Activity = std::ptr::null_mut();
            let mut arrived = lock(&self.arrived);
            // Once per buffer, not per record: graph records name the executable graph's
            // clones, and collection wants the nodes cuhal added.
            let clones = lock(&CLONES);
            loop {
                // SAFETY: `buffer` is a completed activity buffer with `valid` bytes; `record`
                // is the iterator CUPTI advances (null to start).
                let r =
                    unsafe { (self.api.cuptiActivityGetNextRecord)(buffer, valid, &mut record) };
                if r != ffi::CUPTI_SUCCESS || record.is_null() {
                    break;
                }
                // SAFETY: CUPTI handed out a whole record inside the buffer.
                if let Some(mut activity) = unsafe { records::parse(record) } {
                    if let Some(tap) = tap {
                        tap(&activity);
                    }
                    if activity.graph_node_id != 0
                        && let Some(&original) =
                            clones.as_ref().and_then(|m| m.get(&activity.graph_node_id))
                    {
                        activity.node_id = original;
                    }
                    arrived.activities.push(activity);
                    new += 1;
                }
            }
            drop(clones);
            if arrived.activities.len() > MAX_UNCLAIMED {
                self.discard_stale(&mut arrived.activities);
            }
            drop(arrived);
            lock(&BUFFERS.free).push(address);
        }
        self.records.fetch_add(new as u64, Ordering::Relaxed);
        new
    }

    /// Drops records that no tracing context claimed for [`UNCLAIMED_AGE_NS`] (GPU work cuhal
    /// did not issue as a command: a queue's own copies and fills, another library's kernels),
    /// so the arrived records stay bounded.
    fn discard_stale(&self, activities: &mut Vec<Activity>) {
        let newest = activities.iter().map(|a| a.end).max().unwrap_or(0);
        let before = activities.len();
        activities.retain(|a| newest.saturating_sub(a.end) <= UNCLAIMED_AGE_NS);
        self.discarded
            .fetch_add((before - activities.len()) as u64, Ordering::Relaxed);
    }

    /// Records dropped unclaimed (see [`UNCLAIMED_AGE_NS`]).
    pub fn discarded(&self) -> u64 {
        self.discarded.load(Ordering::Relaxed)
    }

    /// Activity buffers allocated now (process-wide; recycled, so steady tracing keeps this at
    /// the few the session started with).
    pub fn buffers_allocated() -> usize {
        BUFFERS.allocated.load(Ordering::Relaxed)
    }

    /// Takes the arrived records whose correlation id is `id`, in start order, handing each to
    /// `f`. Returns how many there were.
    pub fn take(&self, id: u32, mut f: impl FnMut(&Activity)) -> usize {
        let mut arrived = lock(&self.arrived);
        let mut n = 0;
        arrived.activities.retain(|a| {
            if a.correlation_id == id {
                f(a);
                n += 1;
                false
            } else {
                true
            }
        });
        n
    }

    /// Applies `f` to every arrived record; records for which it answers `true` are removed.
    pub fn claim(&self, mut f: impl FnMut(&Activity) -> bool) -> usize {
        let mut arrived = lock(&self.arrived);
        let before = arrived.activities.len();
        arrived.activities.retain(|a| !f(a));
        before - arrived.activities.len()
    }

    /// Runs `f` on the arrived records (locked); it may take the ones it claims.
    pub fn with_arrived<R>(&self, f: impl FnOnce(&mut Vec<Activity>) -> R) -> R {
        f(&mut lock(&self.arrived).activities)
    }

    /// Records arrived and not claimed yet.
    pub fn unclaimed(&self) -> usize {
        lock(&self.arrived).activities.len()
    }

    /// Records parsed since the session started.
    pub fn records_parsed(&self) -> u64 {
        self.records.load(Ordering::Relaxed)
    }

    /// Records CUPTI dropped for want of a buffer (`cuptiActivityGetNumDroppedRecords`), plus
    /// buffer requests refused at the cap.
    pub fn dropped(&self) -> u64 {
        let mut dropped = 0usize;
        // SAFETY: valid out-pointer; a null context and stream 0 ask about the global buffers.
        let r = unsafe {
            (self.api.cuptiActivityGetNumDroppedRecords)(std::ptr::null_mut(), 0, &mut dropped)
        };
        let from_cupti = if r == ffi::CUPTI_SUCCESS {
            dropped as u64
        } else {
            0
        };
        from_cupti + BUFFERS.refused.load(Ordering::Relaxed)
    }

    /// The library's path, or `None` for a supplied table (a fake).
    pub fn library_path(&self) -> Option<&str> {
        self.library.as_ref().map(CuptiLibrary::path)
    }
}

impl Drop for CuptiSession {
    fn drop(&mut self) {
        let api = self.api;
        for kind in KINDS {
            // SAFETY: plain calls; failures leave nothing to undo.
            let _ = unsafe { (api.cuptiActivityDisable)(kind) };
        }
        // Forced: hand back even buffers with records still in flight, so none stays with CUPTI.
        // SAFETY: a plain call.
        let _ = unsafe { (api.cuptiActivityFlushAll)(1) };
        self.parse_filled();
        // SAFETY: the subscriber from `start`, released once.
        let _ = unsafe { (api.cuptiUnsubscribe)(self.subscriber as ffi::CUpti_SubscriberHandle) };
        *lock(&CALLBACK_API) = None;
        *lock(&CLONES) = None;
        let mut free = lock(&BUFFERS.free);
        for address in free.drain(..) {
            // SAFETY: every free buffer came from `allocate_buffer` and is freed once, here.
            unsafe { free_buffer(address) };
            BUFFERS.allocated.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bracket_maps_cupti_times_onto_its_midpoint() {
        let m = ClockMap::from_bracket(1_000, 5_000_000, 1_200);
        assert_eq!(m.uncertainty_ns, 100);
        assert_eq!(m.to_trace_ns(5_000_000), 1_100);
        assert_eq!(m.to_trace_ns(5_000_250), 1_350);
        // Before the trace clock's epoch: clamped, not wrapped.
        assert_eq!(m.to_trace_ns(0), 0);
    }
}
