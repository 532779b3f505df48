//! Device and pinned host allocations, freed in `Drop` with their context bound.

use cuhal_sys::cu;
use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::{Mutex, OnceLock, PoisonError};

use cuhal_sys::{CUdeviceptr, PrimaryContext};

use crate::Error;
use crate::bounds::check_range;

/// Device memory: an allocation of its own (`cuMemAlloc`, freed when the last `Arc` goes), or
/// memory owned by something else that the buffer keeps alive (see [`Buffer::from_raw`]).
///
/// Command buffers hold an `Arc<Buffer>` for every buffer they record, so a buffer lives at
/// least as long as the work that uses it. Dropping binds the buffer's context first, so the
/// last reference may go on any thread.
pub struct Buffer {
    context: Arc<PrimaryContext>,
    ptr: CUdeviceptr,
    len: usize,
    /// `None`: the buffer owns its `cuMemAlloc`. `Some`: the owner of the memory.
    keeper: Option<Arc<dyn Any + Send + Sync>>,
    /// For memory its owner may free while the buffer lives: what a host copy asks first.
    host_access: Option<Arc<dyn HostAccess>>,
}

/// The owner of memory that it may free while buffers over it still exist (a stream-ordered
/// allocation that `dealloca` released): [`Buffer::write`] and [`Buffer::read`] ask it before
/// they touch the memory, and hold what it returns until the copy is done.
pub trait HostAccess: Send + Sync {
    /// Something that keeps the memory allocated until it drops, or `None` once the owner
    /// released the memory (the copy is then refused with [`Error::MemoryReleased`]).
    fn begin_host_access(&self) -> Option<Box<dyn Send>>;
}

impl Buffer {
    /// Allocates `len` bytes of device memory (uninitialized; 256-byte aligned).
    pub fn new(context: &Arc<PrimaryContext>, len: usize) -> Result<Arc<Self>, Error> {
        if len == 0 {
            return Err(Error::ZeroSize { what: "buffer" });
        }
        let _bound = context.enter()?;
        let api = context.api();
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer and the context is current.
        unsafe { cu!(api, cuMemAlloc(&mut ptr, len)) }?;
        Ok(Arc::new(Self {
            context: Arc::clone(context),
            ptr,
            len,
            keeper: None,
            host_access: None,
        }))
    }

    /// A buffer over `len` bytes at `ptr` that some other object owns (a stream-ordered
    /// allocation, another runtime's tensor). The buffer holds `keeper` and never frees the
    /// memory itself.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be device memory of `context` that stays allocated for as long
    /// as `keeper` lives (or, if freed earlier by its owner, is no longer used by any work).
    pub unsafe fn from_raw(
        context: &Arc<PrimaryContext>,
        ptr: CUdeviceptr,
        len: usize,
        keeper: Arc<dyn Any + Send + Sync>,
    ) -> Arc<Self> {
        Self::owned_by(context, ptr, len, keeper, None)
    }

    /// [`Buffer::from_raw`] over memory that its owner may free while the buffer lives (a
    /// stream-ordered allocation): every host copy through the buffer first asks `access`,
    /// and is refused once the owner released the memory.
    ///
    /// # Safety
    /// As for [`Buffer::from_raw`], except that the memory may be freed while `keeper` lives,
    /// provided it is not while a guard from `access` lives, and that `access` returns none
    /// once it may be.
    pub unsafe fn from_raw_releasable(
        context: &Arc<PrimaryContext>,
        ptr: CUdeviceptr,
        len: usize,
        keeper: Arc<dyn Any + Send + Sync>,
        access: Arc<dyn HostAccess>,
    ) -> Arc<Self> {
        Self::owned_by(context, ptr, len, keeper, Some(access))
    }

    /// A buffer over memory that `keeper` owns (the constructors' contracts hold).
    fn owned_by(
        context: &Arc<PrimaryContext>,
        ptr: CUdeviceptr,
        len: usize,
        keeper: Arc<dyn Any + Send + Sync>,
        host_access: Option<Arc<dyn HostAccess>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            context: Arc::clone(context),
            ptr,
            len,
            keeper: Some(keeper),
            host_access,
        })
    }

    /// What keeps the memory allocated for a host copy: nothing for memory that lives as long
    /// as the buffer, a guard from the owner otherwise (`MemoryReleased` once it released it).
    fn host_access(&self) -> Result<Option<Box<dyn Send>>, Error> {
        match &self.host_access {
            None => Ok(None),
            Some(access) => access
                .begin_host_access()
                .map(Some)
                .ok_or(Error::MemoryReleased),
        }
    }

    /// The owner of the memory, for buffers made by [`Buffer::from_raw`].
    pub fn keeper(&self) -> Option<&Arc<dyn Any + Send + Sync>> {
        self.keeper.as_ref()
    }

    /// The device address of the first byte.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes (only possible through [`Buffer::from_raw`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The context the memory belongs to.
    pub fn context(&self) -> &Arc<PrimaryContext> {
        &self.context
    }

    /// Copies `data` into the buffer at `offset` and returns when the bytes are on the device
    /// (`cuMemcpyHtoD`, then a wait on the legacy stream, since a copy from pageable memory may
    /// return while its DMA is still under way).
    ///
    /// Not ordered with work on non-blocking streams: synchronize them first. Refused with
    /// [`Error::MemoryReleased`] once the memory's owner released it (a `dealloca`).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), Error> {
        check_range(offset, data.len(), self.len)?;
        if data.is_empty() {
            return Ok(());
        }
        let _access = self.host_access()?;
        let _bound = self.context.enter()?;
        let api = self.context.api();
        // SAFETY: the destination range was checked against the allocation; `data` is a live
        // host slice of exactly that many bytes.
        unsafe {
            cu!(
                api,
                cuMemcpyHtoD(self.ptr + offset as u64, data.as_ptr().cast(), data.len())
            )
        }?;
        // SAFETY: the null stream is the context's legacy default stream.
        unsafe { cu!(api, cuStreamSynchronize(std::ptr::null_mut())) }?;
        Ok(())
    }

    /// Copies bytes at `offset` into `out` (`cuMemcpyDtoH`, synchronous for the host).
    ///
    /// Not ordered with work on non-blocking streams: synchronize them first. Refused with
    /// [`Error::MemoryReleased`] once the memory's owner released it (a `dealloca`).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), Error> {
        check_range(offset, out.len(), self.len)?;
        if out.is_empty() {
            return Ok(());
        }
        let _access = self.host_access()?;
        let _bound = self.context.enter()?;
        let api = self.context.api();
        // SAFETY: the source range was checked against the allocation; `out` is a live,
        // exclusively borrowed host slice of exactly that many bytes.
        unsafe {
            cu!(
                api,
                cuMemcpyDtoH(out.as_mut_ptr().cast(), self.ptr + offset as u64, out.len())
            )
        }?;
        Ok(())
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.keeper.is_some() {
            return; // the keeper frees the memory, if anything does
        }
        // A failure here means the context is already lost or the driver is shutting down;
        // there is nothing better to do than to leak the address range.
        if let Ok(_bound) = self.context.enter() {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed exactly once.
            let _ = unsafe { cu!(self.context.api(), cuMemFree(self.ptr)) };
        }
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("owned", &self.keeper.is_none())
            .finish()
    }
}

/// Page-locked host memory (`cuMemAllocHost`): the source or destination of fast,
/// truly asynchronous copies.
///
/// The device may read or write it at any time while work that uses it runs, so its bytes are
/// reached through copies ([`HostBuffer::read`], [`HostBuffer::write`]) or raw pointers rather
/// than slices.
pub struct HostBuffer {
    context: Arc<PrimaryContext>,
    ptr: *mut u8,
    len: usize,
    /// Queued device work that uses the bytes (see [`HostBuffer::device_use`]). Host reads
    /// hold this lock while they copy, so no device use starts meanwhile, and are refused while a
    /// use lasts whose work has not been seen complete.
    uses: Mutex<Vec<Arc<UseState>>>,
}

/// Tells whether the device work of a [`HostBufferUse`] has completed (for example a query of
/// the work's completion event).
pub trait WorkDone: Send + Sync {
    /// Whether the work completed: the device reads and writes no more of the buffer. An error
    /// answers `false`.
    fn is_done(&self) -> bool;
}

/// One device use: how to tell its work completed, once the work is issued.
#[derive(Default)]
struct UseState {
    done: OnceLock<Box<dyn WorkDone>>,
}

impl UseState {
    fn is_done(&self) -> bool {
        self.done.get().is_some_and(|done| done.is_done())
    }
}

/// Marks a host buffer as used by queued device work until dropped (when that work completed or
/// failed): meanwhile [`HostBuffer::read`] is refused, unless the work has been seen complete
/// (see [`HostBufferUse::complete_when`]), and [`HostBuffer::write`] is impossible (the use holds
/// an `Arc` of the buffer).
pub struct HostBufferUse {
    buffer: Arc<HostBuffer>,
    state: Arc<UseState>,
}

impl HostBufferUse {
    /// The buffer in use.
    pub fn buffer(&self) -> &Arc<HostBuffer> {
        &self.buffer
    }

    /// Once the work is issued: `done` tells when it completed, so host reads after that (for
    /// example right after a wait on the work's signal) succeed even before the use is dropped.
    /// Only the first call counts.
    pub fn complete_when(&self, done: Box<dyn WorkDone>) {
        let _ = self.state.done.set(done);
    }
}

impl Drop for HostBufferUse {
    fn drop(&mut self) {
        let mut uses = self
            .buffer
            .uses
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        uses.retain(|u| !Arc::ptr_eq(u, &self.state));
    }
}

impl fmt::Debug for HostBufferUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HostBufferUse").field(&self.buffer).finish()
    }
}

// SAFETY: the pointer is an allocation owned by this value; it is only dereferenced through
// bounds-checked copies, and the driver's pinned memory may be used from any thread.
unsafe impl Send for HostBuffer {}
// SAFETY: as above; `&self` methods only copy out of or into the allocation.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Allocates `len` bytes of pinned host memory, zeroed.
    pub fn new(context: &Arc<PrimaryContext>, len: usize) -> Result<Self, Error> {
        if len == 0 {
            return Err(Error::ZeroSize {
                what: "host buffer",
            });
        }
        let _bound = context.enter()?;
        let api = context.api();
        let mut ptr: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer and the context is current.
        unsafe { cu!(api, cuMemAllocHost(&mut ptr, len)) }?;
        // SAFETY: the driver returned `len` writable bytes at `ptr`.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, len) };
        Ok(Self {
            context: Arc::clone(context),
            ptr: ptr.cast(),
            len,
            uses: Mutex::new(Vec::new()),
        })
    }

    /// Marks the buffer as used by device work about to be queued (a copy into or out of it),
    /// until the returned use is dropped, which the queue does once the work completed or failed.
    /// Waits for a host read in progress to finish (one bounded copy).
    pub fn device_use(self: &Arc<Self>) -> HostBufferUse {
        let state = Arc::new(UseState::default());
        self.uses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(&state));
        HostBufferUse {
            buffer: Arc::clone(self),
            state,
        }
    }

    /// Whether queued device work that has not been seen complete uses the buffer now.
    pub fn in_device_use(&self) -> bool {
        self.uses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|u| !u.is_done())
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: host buffers are never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The context the memory was allocated in.
    pub fn context(&self) -> &Arc<PrimaryContext> {
        &self.context
    }

    /// The host address of the first byte (also valid on the device under unified addressing).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Copies `data` into the buffer at `offset`. Takes `&mut self`, so no other thread can read
    /// or write the buffer meanwhile; a buffer shared with queued device work (an `Arc` held by a
    /// read) cannot be written at all until that work releases it.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), Error> {
        check_range(offset, data.len(), self.len)?;
        // SAFETY: the range was checked against the allocation; `data` cannot alias it (it is
        // a shared Rust slice and the allocation is only reached through raw copies); `&mut
        // self` excludes every other access from Rust.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset), data.len());
        }
        Ok(())
    }

    /// Copies bytes at `offset` into `out`. Writes through `&mut self` need the buffer to
    /// themselves; while queued device work uses the buffer (see [`HostBuffer::device_use`]) this
    /// is refused with [`Error::HostBufferBusy`]: wait for that work's signal first.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), Error> {
        check_range(offset, out.len(), self.len)?;
        // Held through the copy: no device use can start meanwhile.
        let uses = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
        if !uses.iter().all(|u| u.is_done()) {
            return Err(Error::HostBufferBusy);
        }
        // SAFETY: the range was checked against the allocation; `out` is exclusively borrowed;
        // every device use of the buffer has completed and none can start until `uses` is
        // unlocked, so the device does not write these bytes during the copy.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.add(offset), out.as_mut_ptr(), out.len());
        }
        drop(uses);
        Ok(())
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let Ok(_bound) = self.context.enter() {
            // SAFETY: `ptr` came from cuMemAllocHost and is freed exactly once.
            let _ = unsafe { cu!(self.context.api(), cuMemFreeHost(self.ptr.cast())) };
        }
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("in_device_use", &self.in_device_use())
            .finish()
    }
}
