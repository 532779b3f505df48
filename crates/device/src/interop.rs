//! Interoperation with other CUDA code in the same process (PyTorch, cuBLAS, NCCL, kernels
//! launched by another runtime), in both directions:
//!
//! - memory in: [`Device::import_buffer`] wraps a device pointer cuhal did not allocate as a
//!   non-owning [`Buffer`], after asking the driver (`cuPointerGetAttribute`) that it is device
//!   memory of this device and that the whole range lies in one allocation; an optional release
//!   callback runs once, after the last queued use completes;
//! - memory out: [`ExportedBuffer`] hands another library a buffer's pointer and length, and
//!   keeps the memory alive until that library drops it;
//! - ordering in: [`Queue::wait_event`](crate::Queue::wait_event) makes a queue operation wait,
//!   on the device, for a [`ForeignEvent`] the other runtime recorded on its stream;
//! - ordering out: [`Device::export_timepoint`] turns a semaphore value into a `CUevent` a
//!   foreign stream can wait on with `cuStreamWaitEvent` ([`ExportedEvent`]), valid until the
//!   foreign side drops it;
//! - streams, both ways, one driver call each: [`Queue::wait_stream`](crate::Queue::wait_stream)
//!   makes a queue operation wait for everything enqueued so far on a foreign stream (one
//!   `cuEventRecord` on it), and [`Device::stream_wait_value`] makes a foreign stream wait for
//!   a semaphore value (one `cuStreamWaitEvent`).
//!
//! Neither direction needs a host round trip: the only host wait is
//! [`Device::export_timepoint`]'s, which waits for the signalling work to be *issued* (its event
//! recorded), never for it to run.

use std::any::Any;
use std::ffi::{c_int, c_uint, c_void};
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Instant;

use cuhal_command::Buffer;
use cuhal_semaphore::{Listener, SemaphoreId, Timeout, WaitPoint};
use cuhal_sys::{
    CU_MEMORYTYPE_DEVICE, CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CUcontext, CUdeviceptr, CUevent, CUpointer_attribute,
    CUresult, CUstream, PrimaryContext, cu,
};

use crate::error::{Error, Result};
use crate::event_pool::{CudaEvent, TimepointEventPool};
use crate::memory::{AllocationUse, use_of};
use crate::{Device, Semaphore};

/// A callback run once when cuhal no longer uses something it was lent.
pub type Release = Box<dyn FnOnce() + Send + 'static>;

/// Runs a release callback once, when the last holder drops it.
struct ReleaseOnDrop(Mutex<Option<Release>>);

impl ReleaseOnDrop {
    fn new(release: Option<Release>) -> Self {
        Self(Mutex::new(release))
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        let release = self
            .0
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(release) = release {
            // A panicking callback must not unwind through whichever cuhal thread dropped the
            // last reference (a completion thread, say): it is caught and the drop carries on.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(release));
        }
    }
}

/// Memory another allocator owns, kept "borrowed" by the buffers over it; its release callback
/// runs when the last of them goes.
struct ForeignMemory {
    _release: ReleaseOnDrop,
}

/// What the driver says about a foreign address (`cuPointerGetAttribute`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PointerInfo {
    /// The `CUmemorytype` (`CU_MEMORYTYPE_DEVICE` for device memory).
    pub memory_type: c_uint,
    /// The device the memory lives on.
    pub device_ordinal: i32,
    /// The context that allocated it (null for memory of no single context, such as some
    /// memory-pool and virtual-memory allocations).
    pub context: CUcontext,
    /// The first address of the allocation holding the pointer.
    pub allocation_start: CUdeviceptr,
    /// The size of that allocation in bytes.
    pub allocation_size: usize,
}

/// Reads one attribute of `ptr`; `Ok(None)` when the driver does not know the address at all
/// (`CUDA_ERROR_INVALID_VALUE`: plain host memory, or nothing).
fn attribute<T: Default>(
    context: &PrimaryContext,
    attribute: CUpointer_attribute,
    ptr: CUdeviceptr,
) -> Result<Option<T>> {
    let api = context.api();
    let mut value = T::default();
    // SAFETY: `value` is a live local of the type the attribute writes (the callers pair each
    // attribute with its type from cuda.h); the driver only reads `ptr` as a number.
    let read = unsafe {
        cu!(
            api,
            cuPointerGetAttribute((&mut value as *mut T).cast::<c_void>(), attribute, ptr)
        )
    };
    match read {
        Ok(()) => Ok(Some(value)),
        Err(e) if e.result() == Some(CUresult::ERROR_INVALID_VALUE) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Asks the driver what `ptr` is. `Error::NotDeviceMemory` when it does not know the address.
pub(crate) fn pointer_info(context: &PrimaryContext, ptr: CUdeviceptr) -> Result<PointerInfo> {
    let _bound = context.enter()?;
    let unknown = || Error::NotDeviceMemory {
        ptr,
        memory_type: None,
    };
    let memory_type: c_uint =
        attribute(context, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)?.ok_or_else(unknown)?;
    let device_ordinal: c_int =
        attribute(context, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)?.ok_or_else(unknown)?;
    let context_raw: usize =
        attribute(context, CU_POINTER_ATTRIBUTE_CONTEXT, ptr)?.ok_or_else(unknown)?;
    let allocation_start: CUdeviceptr =
        attribute(context, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr)?.ok_or_else(unknown)?;
    let allocation_size: usize =
        attribute(context, CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr)?.ok_or_else(unknown)?;
    Ok(PointerInfo {
        memory_type,
        device_ordinal,
        context: std::ptr::without_provenance_mut(context_raw),
        allocation_start,
        allocation_size,
    })
}

/// Checks that `[ptr, ptr + len)` is device memory of `context`'s device, inside one allocation.
pub(crate) fn check_foreign_range(
    context: &PrimaryContext,
    ptr: CUdeviceptr,
    len: usize,
) -> Result<PointerInfo> {
    if len == 0 {
        return Err(Error::Command(cuhal_command::Error::ZeroSize {
            what: "imported buffer",
        }));
    }
    // The memory type first: for a pinned host pointer the other attributes describe the host
    // allocation, and the error should say "host memory", not "another device".
    let info = pointer_info(context, ptr)?;
    if info.memory_type != CU_MEMORYTYPE_DEVICE {
        return Err(Error::NotDeviceMemory {
            ptr,
            memory_type: Some(info.memory_type),
        });
    }
    if info.device_ordinal != context.ordinal() {
        return Err(Error::OtherDevice {
            ptr,
            owner: info.device_ordinal,
            device: context.ordinal(),
        });
    }
    if !info.context.is_null() && info.context != context.raw() {
        return Err(Error::OtherContext { ptr });
    }
    let end = info.allocation_start as u128 + info.allocation_size as u128;
    if ptr < info.allocation_start || ptr as u128 + len as u128 > end {
        return Err(Error::PastAllocation {
            ptr,
            len,
            allocation_start: info.allocation_start,
            allocation_size: info.allocation_size,
        });
    }
    Ok(info)
}

impl Device {
    /// Wraps `len` bytes of device memory at `ptr`, allocated by other code (another runtime's
    /// tensor, a library's workspace), as a [`Buffer`] of this device that cuhal never frees.
    ///
    /// Checked with `cuPointerGetAttribute` before anything else: a host pointer (pinned or
    /// not) is [`Error::NotDeviceMemory`], memory of another device [`Error::OtherDevice`] (of
    /// another context of this device [`Error::OtherContext`]), and a range that runs past the
    /// end of its allocation [`Error::PastAllocation`]. On error nothing is kept and `release`
    /// is dropped without being run.
    ///
    /// `release`, if given, runs exactly once, when the last handle to the buffer goes: queue
    /// operations and command buffers hold a handle until their work has completed, so by then
    /// no queued use remains. It runs on whichever thread drops that handle (possibly a queue's
    /// completion thread, never inside a driver callback), so it may call CUDA, but should be
    /// quick and must not wait for cuhal work.
    ///
    /// # Safety
    /// The memory must stay allocated (and not be reused by its owner) until `release` runs, or,
    /// without a callback, for as long as any handle to the buffer and any work using it lives.
    /// The driver can check where the memory is, not for how long its owner will keep it.
    pub unsafe fn import_buffer(
        &self,
        ptr: CUdeviceptr,
        len: usize,
        release: Option<Release>,
    ) -> Result<Arc<Buffer>> {
        self.shared.lost.check()?;
        check_foreign_range(self.context(), ptr, len).map_err(|e| self.shared.lost.filter(e))?;
        let keeper: Arc<dyn Any + Send + Sync> = Arc::new(ForeignMemory {
            _release: ReleaseOnDrop::new(release),
        });
        // SAFETY: the range was checked to be this context's device memory inside one live
        // allocation; the caller guarantees it stays allocated while `keeper` (which the buffer
        // holds) lives.
        Ok(unsafe { Buffer::from_raw(self.context(), ptr, len, keeper) })
    }

    /// Exports `semaphore`'s value `value` as a `CUevent` another runtime's stream can wait on
    /// (`cuStreamWaitEvent(stream, exported.raw(), 0)`), with no host round trip.
    ///
    /// - value already reached: an event that waits for nothing (a pooled event whose last
    ///   record has completed);
    /// - a signal of a value `>= value` already issued on a queue: that submission's completion
    ///   event;
    /// - not issued yet (its waits are pending): this waits, on the host, until it is issued or
    ///   `timeout` passes ([`Error::Semaphore`] with `Timeout`). It waits for the issue, never
    ///   for the GPU to run the work.
    ///
    /// A failed semaphore is its failure. The event stays valid, and is neither reused nor
    /// re-recorded by cuhal, until the returned value is dropped: keep it until every foreign
    /// `cuStreamWaitEvent` on it has been *enqueued* (CUDA captures the event's state then).
    pub fn export_timepoint(
        &self,
        semaphore: &Semaphore,
        value: u64,
        timeout: impl Into<Timeout>,
    ) -> Result<ExportedEvent> {
        let deadline = deadline(timeout.into());
        let mut notify: Option<Arc<Notify>> = None;
        loop {
            match semaphore.wait_point(value)? {
                WaitPoint::Reached => {
                    return Ok(ExportedEvent {
                        event: self
                            .shared
                            .events
                            .acquire()
                            .map_err(|e| self.shared.lost.filter(e))?,
                        value: None,
                    });
                }
                WaitPoint::Device { value, event } => {
                    return Ok(ExportedEvent {
                        event,
                        value: Some(value),
                    });
                }
                WaitPoint::Pending => {}
            }
            // Not issued yet: sleep until the semaphore records a device signal (or advances, or
            // fails), then look again.
            let notify = notify.get_or_insert_with(|| Arc::new(Notify::default()));
            notify.reset();
            let listener: Arc<dyn Listener<CudaEvent>> = notify.clone();
            let token = semaphore.listen(value, &listener, 0);
            let woken = notify.wait(deadline);
            semaphore.cancel_listen(token);
            if !woken {
                // One last look: the signal may have been issued as the deadline passed.
                if let WaitPoint::Pending = semaphore.wait_point(value)? {
                    return Err(Error::Semaphore(cuhal_semaphore::Error::Timeout));
                }
            }
        }
    }
}

impl Device {
    /// Makes `stream`, another runtime's stream, wait on the device until `semaphore` reaches
    /// `value`, with no host round trip: the stream half of [`Device::export_timepoint`].
    ///
    /// - value already reached: nothing to wait for, and no driver call;
    /// - a signal of a value `>= value` already issued on a queue: one driver call,
    ///   `cuStreamWaitEvent(stream, completion event, 0)`;
    /// - not issued yet: waits on the host until it is issued, up to `timeout`, as
    ///   [`Device::export_timepoint`] does ([`Error::Semaphore`] with `Timeout`), then as above.
    ///
    /// A failed semaphore is its failure. CUDA captures the event's state at the call, so
    /// nothing needs to be kept afterwards.
    ///
    /// # Safety
    /// `stream` must be a live stream (of any context: CUDA lets a stream wait on an event of
    /// another device) for the duration of the call, or null (the legacy default stream of the
    /// context current on this thread).
    pub unsafe fn stream_wait_value(
        &self,
        stream: CUstream,
        semaphore: &Semaphore,
        value: u64,
        timeout: impl Into<Timeout>,
    ) -> Result<()> {
        let wait_on = |event: CUevent| {
            let api = self.context().api();
            // SAFETY: the event is live (its handle is held by the caller of this closure), and
            // the caller guarantees `stream` is.
            unsafe { cu!(api, cuStreamWaitEvent(stream, event, 0)) }
                .map_err(|e| self.shared.lost.filter(e.into()))
        };
        match semaphore.wait_point(value)? {
            WaitPoint::Reached => Ok(()),
            WaitPoint::Device { event, .. } => wait_on(event.raw()),
            WaitPoint::Pending => {
                let exported = self.export_timepoint(semaphore, value, timeout)?;
                match exported.signal_value() {
                    // Reached while waiting for the issue.
                    None => Ok(()),
                    Some(_) => wait_on(exported.raw()),
                }
            }
        }
    }
}

/// Records an event of `pool` on `stream`, another runtime's stream (one driver call,
/// `cuEventRecord`), and hands it over as a [`ForeignEvent`] that gives the event back to the
/// pool when its last holder drops it.
///
/// # Safety
/// `stream` must be a live stream of the pool's context (or null) for the duration of the call.
pub(crate) unsafe fn record_on_stream(
    pool: &TimepointEventPool,
    stream: CUstream,
) -> Result<Arc<ForeignEvent>> {
    let event = pool.acquire()?;
    let raw = event.raw();
    let api = event.context().api();
    // SAFETY: `event` holds `raw` live; the caller guarantees `stream` is live and of the
    // event's context (the driver refuses another context's stream).
    unsafe { cu!(api, cuEventRecord(raw, stream)) }?;
    // SAFETY: the release callback owns the pooled handle, so `raw` stays a live event until it
    // runs.
    Ok(unsafe { ForeignEvent::from_raw(raw, Some(Box::new(move || drop(event)))) })
}

fn deadline(timeout: Timeout) -> Option<Instant> {
    match timeout {
        Timeout::Immediate => Some(Instant::now()),
        Timeout::After(d) => Instant::now().checked_add(d),
        Timeout::At(at) => Some(at),
        Timeout::Infinite => None,
    }
}

/// Wakes a thread parked in [`Device::export_timepoint`].
#[derive(Default)]
struct Notify {
    fired: Mutex<bool>,
    wake: Condvar,
}

impl Notify {
    fn reset(&self) {
        *self.fired.lock().unwrap_or_else(PoisonError::into_inner) = false;
    }

    /// Parks until notified (`true`) or `deadline` passes (`false`).
    fn wait(&self, deadline: Option<Instant>) -> bool {
        let mut fired = self.fired.lock().unwrap_or_else(PoisonError::into_inner);
        while !*fired {
            match deadline {
                None => {
                    fired = self
                        .wake
                        .wait(fired)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return false;
                    }
                    fired = self
                        .wake
                        .wait_timeout(fired, deadline - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
        true
    }
}

impl<E> Listener<E> for Notify {
    fn notify(&self, _semaphore: SemaphoreId, _key: u64) {
        *self.fired.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.wake.notify_all();
    }
}

/// A semaphore timepoint as a `CUevent` for another runtime ([`Device::export_timepoint`]).
///
/// While it lives, cuhal neither re-records nor reuses the event. Drop it once the foreign
/// side has enqueued its waits on it.
pub struct ExportedEvent {
    event: CudaEvent,
    /// The timepoint's value; `None` when the value was already reached at export.
    value: Option<u64>,
}

impl ExportedEvent {
    /// The event, for `cuStreamWaitEvent` (or `cudaStreamWaitEvent`) on a foreign stream.
    pub fn raw(&self) -> CUevent {
        self.event.raw()
    }

    /// The value of the semaphore signal the event completes with (at least the one asked
    /// for), or `None` if the value was already reached and the event waits for nothing.
    pub fn signal_value(&self) -> Option<u64> {
        self.value
    }

    /// Hands the event to code that frees things by callback (a C API): the raw event, and a
    /// callback that gives it back to cuhal. Until the callback runs the event stays valid.
    pub fn into_raw(self) -> (CUevent, Release) {
        let raw = self.raw();
        (raw, Box::new(move || drop(self)))
    }
}

impl fmt::Debug for ExportedEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportedEvent")
            .field("event", &self.raw())
            .field("signal_value", &self.value)
            .finish()
    }
}

/// A `CUevent` recorded by other code, for [`Queue::wait_event`](crate::Queue::wait_event).
///
/// cuhal never records, queries or destroys it: it only enqueues `cuStreamWaitEvent` on it.
/// The optional release callback runs once, when the last operation waiting on it has
/// completed and the caller's handle is gone.
pub struct ForeignEvent {
    raw: CUevent,
    _release: ReleaseOnDrop,
}

// SAFETY: a CUevent may be used from any thread; cuhal only passes it to cuStreamWaitEvent, and
// the release callback is Send and run once under a mutex.
unsafe impl Send for ForeignEvent {}
// SAFETY: as above; `&self` only reads the handle.
unsafe impl Sync for ForeignEvent {}

impl ForeignEvent {
    /// Wraps an event another runtime created (of any context: CUDA lets a stream wait on an
    /// event of another device).
    ///
    /// # Safety
    /// `event` must be a live `CUevent` until `release` runs (without a callback: until this
    /// value and every operation waiting on it are gone).
    pub unsafe fn from_raw(event: CUevent, release: Option<Release>) -> Arc<Self> {
        Arc::new(Self {
            raw: event,
            _release: ReleaseOnDrop::new(release),
        })
    }

    /// The raw event.
    pub fn raw(&self) -> CUevent {
        self.raw
    }
}

impl fmt::Debug for ForeignEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ForeignEvent").field(&self.raw).finish()
    }
}

/// A buffer's device memory lent to other code: its address and length, and a handle that keeps
/// the memory allocated until the borrower drops it (every clone of it).
#[derive(Clone)]
pub struct ExportedBuffer {
    buffer: Arc<Buffer>,
    /// For a stream-ordered allocation (`Queue::alloca`): a use, so that a `dealloca` leaves the
    /// free to the borrower's drop.
    _lent: Option<Arc<AllocationUse>>,
}

impl ExportedBuffer {
    /// Lends `buffer`'s memory. A stream-ordered allocation that `Queue::dealloca` released is
    /// [`Error::Deallocated`].
    pub fn new(buffer: &Arc<Buffer>) -> Result<Self> {
        Ok(Self {
            buffer: Arc::clone(buffer),
            _lent: use_of(buffer, "exported buffer")?.map(Arc::new),
        })
    }

    /// The device address of the first byte.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.buffer.device_ptr()
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    /// The context the memory belongs to (its raw handle is what `cuCtxSetCurrent` takes).
    pub fn context(&self) -> &Arc<PrimaryContext> {
        self.buffer.context()
    }

    /// Hands the memory to code that frees things by callback: address, length, and a
    /// callback that gives the memory back to cuhal.
    pub fn into_raw(self) -> (CUdeviceptr, usize, Release) {
        let (ptr, len) = (self.device_ptr(), self.len());
        (ptr, len, Box::new(move || drop(self)))
    }
}

impl fmt::Debug for ExportedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportedBuffer")
            .field("ptr", &format_args!("{:#x}", self.device_ptr()))
            .field("len", &self.len())
            .finish()
    }
}
