//! Stream-ordered allocations: `queue_alloca` / `queue_dealloca` through a CUDA memory pool.
//!
//! The address of an allocation is needed when the user records commands that use it, which may
//! be before its waits are reached. So `queue_alloca` allocates at submission, with
//! `cuMemAllocFromPoolAsync` on the queue's own stream: the memory is valid, in stream order, for
//! everything issued on that stream afterwards and for everything on other queues that waits on
//! the alloca's signal (recorded after it on the same stream). The alloca's waits order only its
//! signal. `queue_dealloca` frees at issue, after its waits, with `cuMemFreeAsync`; memory freed
//! that way is reused by later allocations in stream order without a round trip to the OS
//! (the pool keeps what it has: its release threshold is the maximum).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use smallvec::SmallVec;

use cuhal_command::Buffer;
use cuhal_sys::cu;
use cuhal_sys::{
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE,
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, CU_STREAM_NON_BLOCKING, CUdevice, CUdeviceptr,
    CUmemAccessDesc, CUmemLocation, CUmemPoolProps, CUmemoryPool, CUresult, CUstream,
    PrimaryContext, Stream,
};

use crate::error::Error;

/// The device's pool for stream-ordered allocations.
pub(crate) struct MemoryPool {
    context: Arc<PrimaryContext>,
    raw: CUmemoryPool,
    /// Whether cuhal created the pool (and destroys it) or borrowed the device's default pool.
    owned: bool,
}

// SAFETY: a CUmemoryPool may be used from any thread.
unsafe impl Send for MemoryPool {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for MemoryPool {}

impl MemoryPool {
    /// A pool of this device's memory that keeps what it allocates until the device closes.
    pub(crate) fn new(context: Arc<PrimaryContext>) -> Result<Self, Error> {
        let _bound = context.enter()?;
        let api = context.api();
        let props = CUmemPoolProps {
            allocType: CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: 0,
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: context.device(),
            },
            win32SecurityAttributes: std::ptr::null_mut(),
            reserved: [0; 64],
        };
        let mut raw: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `props` is fully initialized.
        let created = unsafe { cu!(api, cuMemPoolCreate(&mut raw, &props)) };
        // Without a pool of its own (the driver may refuse one), the device's default pool.
        let owned = if created.is_ok() {
            true
        } else {
            // SAFETY: `raw` is a valid out-pointer; the device handle is live.
            unsafe { cu!(api, cuDeviceGetDefaultMemPool(&mut raw, context.device())) }?;
            false
        };
        // From here the pool's Drop destroys a pool created here, also when setting it up fails.
        let pool = Self {
            context: context.clone(),
            raw,
            owned,
        };
        if owned {
            let mut threshold = u64::MAX;
            // SAFETY: the attribute takes a pointer to a u64.
            unsafe {
                cu!(
                    api,
                    cuMemPoolSetAttribute(
                        raw,
                        CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                        (&mut threshold as *mut u64).cast()
                    )
                )
            }?;
        }
        Ok(pool)
    }

    /// Lets `device`'s kernels and copies reach this pool's memory (`cuMemPoolSetAccess`):
    /// peer access between contexts (`cuCtxEnablePeerAccess`) does not cover pool memory.
    pub(crate) fn grant_access(&self, device: CUdevice) -> Result<(), Error> {
        let _bound = self.context.enter()?;
        let desc = CUmemAccessDesc {
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the pool is live; one fully initialized descriptor.
        Ok(unsafe { cu!(self.context.api(), cuMemPoolSetAccess(self.raw, &desc, 1)) }?)
    }

    /// `cuMemAllocFromPoolAsync` of `len` bytes in the order of `stream` (a live stream of the
    /// pool's device), with the context current.
    fn allocate_raw(&self, len: usize, stream: CUstream) -> Result<CUdeviceptr, cuhal_sys::Error> {
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the pool is live and the caller's stream too.
        unsafe {
            cu!(
                self.context.api(),
                cuMemAllocFromPoolAsync(&mut ptr, len, self.raw, stream)
            )
        }?;
        Ok(ptr)
    }

    /// Allocates `len` bytes, in the order of `stream`.
    pub(crate) fn allocate(&self, len: usize, stream: CUstream) -> Result<Arc<Allocation>, Error> {
        let _bound = self.context.enter()?;
        let ptr = self.allocate_raw(len, stream)?;
        Ok(Arc::new(Allocation {
            context: self.context.clone(),
            ptr,
            len,
            freed: AtomicBool::new(false),
            released: AtomicBool::new(false),
            uses: Mutex::new(Uses::default()),
        }))
    }
}

impl Drop for MemoryPool {
    fn drop(&mut self) {
        if self.owned {
            let _bound = self.context.enter();
            let api = self.context.api();
            // SAFETY: the pool was created here and is destroyed once. Allocations still live
            // (held by buffers that outlive the device) stay valid: the driver releases the
            // pool's memory only when they are freed.
            let _ = unsafe { cu!(api, cuMemPoolDestroy(self.raw)) };
        }
    }
}

/// Where [`crate::Device::create_buffer`] takes memory from: the device's pool, allocated and
/// freed in the order of a stream of its own.
///
/// `cuMemFree` waits for the whole device to go idle, and holds the driver's lock while it
/// waits, so a buffer whose last reference went while any queue's work ran (on the completion
/// thread, after the work that used it) stalled every other thread's submissions until that
/// work ended: two queues' independent work ran one after the other. A pooled buffer is freed
/// with `cuMemFreeAsync` on this stream instead, which waits for nothing: every queued use of a
/// buffer holds it, so when the last reference goes, all work that used it has completed.
/// Allocation synchronizes this stream (which holds only frees), so the memory is ready for
/// every stream at once, as `cuMemAlloc`'s is.
pub(crate) struct BufferMemory {
    pool: Arc<MemoryPool>,
    stream: Stream,
}

impl BufferMemory {
    pub(crate) fn new(pool: Arc<MemoryPool>) -> Result<Arc<Self>, Error> {
        let stream = Stream::new(&pool.context, CU_STREAM_NON_BLOCKING)?;
        Ok(Arc::new(Self { pool, stream }))
    }

    /// A buffer of `len` bytes (256-byte aligned, like every driver allocation). When the pool
    /// has no room, memory it keeps but nobody uses goes back to the driver and the allocation
    /// is tried once more.
    pub(crate) fn allocate(self: &Arc<Self>, len: usize) -> Result<Arc<Buffer>, Error> {
        if len == 0 {
            return Err(Error::Command(cuhal_command::Error::ZeroSize {
                what: "buffer",
            }));
        }
        let context = &self.pool.context;
        let _bound = context.enter()?;
        let api = context.api();
        let attempt = || self.pool.allocate_raw(len, self.stream.raw());
        let ptr = match attempt() {
            Err(e) if e.result() == Some(CUresult::ERROR_OUT_OF_MEMORY) => {
                // Frees still queued on the stream return their memory to the pool first.
                self.stream.synchronize()?;
                // SAFETY: the pool is live; trimming releases only memory no allocation holds.
                unsafe { cu!(api, cuMemPoolTrimTo(self.pool.raw, 0)) }?;
                attempt()?
            }
            other => other?,
        };
        let block = Arc::new(PooledBlock {
            memory: self.clone(),
            ptr,
        });
        // The allocation is made in the order of the stream; once it is, any stream may use it.
        self.stream.synchronize()?;
        // SAFETY: `[ptr, ptr + len)` is device memory of `context`, allocated above; `block`
        // frees it only when dropped, which the buffer (its keeper) lets happen only when the
        // buffer itself goes, after every use of it.
        Ok(unsafe { Buffer::from_raw(context, ptr, len, block) })
    }
}

/// The memory of one pooled buffer: freed, in the order of [`BufferMemory`]'s stream, when the
/// buffer (its only holder) goes.
struct PooledBlock {
    memory: Arc<BufferMemory>,
    ptr: CUdeviceptr,
}

impl Drop for PooledBlock {
    fn drop(&mut self) {
        let context = &self.memory.pool.context;
        let _bound = context.enter();
        // SAFETY: allocated from the pool by `BufferMemory::allocate` and freed once, here. The
        // buffer that held this block is gone, and every queued use of a buffer (an action, a
        // command buffer) holds it until the work completed, so no work uses the memory any
        // more; the stream (kept alive by `memory`) orders the free after nothing else.
        let _ = unsafe {
            cu!(
                context.api(),
                cuMemFreeAsync(self.ptr, self.memory.stream.raw())
            )
        };
    }
}

/// One stream-ordered allocation, freed by `queue_dealloca` or, failing that, when dropped.
///
/// Its memory outlives every queued use: each queue operation or command buffer submission that
/// uses it holds an `AllocationUse` until the work completed or failed (a host copy through its
/// buffer, for the copy; a loan, while lent), `Queue::dealloca` marks it released (new uses are
/// refused from then on), and the free happens, at the dealloca's issue, in stream order if every
/// use left was issued on its stream before it, else when the last use ends.
pub struct Allocation {
    context: Arc<PrimaryContext>,
    ptr: CUdeviceptr,
    len: usize,
    freed: AtomicBool,
    /// Set when `Queue::dealloca` is submitted: no new work may use the memory.
    released: AtomicBool,
    /// Uses left, and whether the dealloca has issued and left the free to the last use.
    uses: Mutex<Uses>,
}

/// The uses of one allocation that have not ended.
#[derive(Default)]
struct Uses {
    /// Every use left.
    count: usize,
    /// `(stream as an address, uses)`: the uses whose operations were issued on that stream. A
    /// dealloca issued on the same stream later is ordered after them, so they do not hold its
    /// free back. Every other use does, one on the dealloca's own stream too: a use is taken
    /// when its operation is checked, before it is submitted, so a dealloca submitted meanwhile
    /// from another thread may issue ahead of it there.
    issued: SmallVec<[(usize, usize); 2]>,
    /// The dealloca issued while uses that hold it back were left.
    deferred: bool,
}

impl Uses {
    /// The uses issued on `stream`.
    fn issued_on(&self, stream: usize) -> usize {
        self.issued
            .iter()
            .find(|(s, _)| *s == stream)
            .map_or(0, |(_, n)| *n)
    }
}

/// One use of an [`Allocation`] (queued work, or a host copy through its buffer): keeps its
/// memory allocated until dropped.
pub(crate) struct AllocationUse {
    allocation: Arc<Allocation>,
    /// The stream its operation was issued on (as an address; 0: not issued), set under the
    /// allocation's lock.
    issued_on: AtomicUsize,
}

impl AllocationUse {
    /// Its operation was just issued on `stream` (under that queue's issue lock, so before any
    /// dealloca issued on `stream` after it).
    pub(crate) fn issued(&self, stream: CUstream) {
        let stream = stream as usize;
        if stream == 0 {
            return;
        }
        let mut uses = self
            .allocation
            .uses
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.issued_on.load(Ordering::Relaxed) != 0 {
            return;
        }
        self.issued_on.store(stream, Ordering::Relaxed);
        match uses.issued.iter_mut().find(|(s, _)| *s == stream) {
            Some((_, n)) => *n += 1,
            None => uses.issued.push((stream, 1)),
        }
    }
}

impl Drop for AllocationUse {
    fn drop(&mut self) {
        let allocation = &self.allocation;
        let mut uses = allocation
            .uses
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        uses.count -= 1;
        let stream = *self.issued_on.get_mut();
        if let Some(i) = uses.issued.iter().position(|(s, _)| *s == stream) {
            uses.issued[i].1 -= 1;
            if uses.issued[i].1 == 0 {
                uses.issued.swap_remove(i);
            }
        }
        if uses.deferred && uses.count == 0 {
            uses.deferred = false;
            drop(uses);
            // Every use completed (this one just did): the memory may go now. The legacy stream
            // orders it after nothing of cuhal's, which is all it needs.
            let _bound = allocation.context.enter();
            let _ = allocation.free_async(std::ptr::null_mut());
        }
    }
}

impl Allocation {
    /// The device address.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the allocation is empty (never: allocations are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `queue_dealloca` has freed it.
    pub fn is_freed(&self) -> bool {
        self.freed.load(Ordering::Acquire)
    }

    /// Whether `Queue::dealloca` released it (new work may not use it).
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Marks it released; `false` if it already was.
    pub(crate) fn release(&self) -> bool {
        !self.released.swap(true, Ordering::AcqRel)
    }

    /// A use by work about to be queued (or a host copy, or a loan), or `None` once released.
    pub(crate) fn begin_use(self: Arc<Self>) -> Option<AllocationUse> {
        let mut uses = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
        // Checked under the lock that the dealloca's issue takes: a release that this check
        // misses is made before its dealloca is submitted, so that issue sees this use.
        if self.is_released() {
            return None;
        }
        uses.count += 1;
        drop(uses);
        Some(AllocationUse {
            allocation: self,
            issued_on: AtomicUsize::new(0),
        })
    }

    /// The dealloca's issue on `stream`: frees in the order of `stream` if every use left was
    /// issued on `stream` before it, else leaves the free to the last use. A use not issued yet
    /// holds it back even when it is for `stream`: its operation may have been checked before
    /// the dealloca was submitted and submitted after it (two threads), and then issues after it.
    pub(crate) fn free_after_uses(&self, stream: CUstream) -> Result<(), Error> {
        let mut uses = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
        if uses.count == uses.issued_on(stream as usize) {
            drop(uses);
            return self.free_async(stream);
        }
        uses.deferred = true;
        Ok(())
    }

    /// Frees the memory in the order of `stream` (once; later calls do nothing).
    fn free_async(&self, stream: CUstream) -> Result<(), Error> {
        if self.freed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let api = self.context.api();
        // SAFETY: the memory came from cuMemAllocFromPoolAsync and is freed exactly once.
        let freed = unsafe { cu!(api, cuMemFreeAsync(self.ptr, stream)) };
        if freed.is_err() {
            // Still allocated: let the drop free it.
            self.freed.store(false, Ordering::Release);
        }
        Ok(freed?)
    }
}

/// The stream-ordered allocation behind a buffer that
/// [`Queue::alloca`](crate::Queue::alloca) made.
pub(crate) fn allocation_of(buffer: &Buffer) -> Option<Arc<Allocation>> {
    // Most buffers with a keeper are not stream-ordered allocations: tell by type before
    // touching the keeper's count.
    buffer
        .keeper()
        .filter(|keeper| (***keeper).is::<Allocation>())
        .and_then(|keeper| Arc::clone(keeper).downcast::<Allocation>().ok())
}

/// A use of the stream-ordered allocation behind `buffer`, if it is one (`None` if not):
/// [`Error::Deallocated`] (naming `what`) once `Queue::dealloca` released it.
pub(crate) fn use_of(buffer: &Buffer, what: &'static str) -> Result<Option<AllocationUse>, Error> {
    allocation_of(buffer)
        .map(|allocation| allocation.begin_use().ok_or(Error::Deallocated { what }))
        .transpose()
}

/// Adds to `resources` a use of the stream-ordered allocation behind `buffer`, if it is one, for
/// work about to be queued (see [`use_of`]).
pub(crate) fn use_allocation(
    buffer: &Buffer,
    what: &'static str,
    resources: &mut cuhal_scheduler::Resources,
) -> Result<(), Error> {
    if let Some(used) = use_of(buffer, what)? {
        resources.push(Arc::new(used));
    }
    Ok(())
}

/// What an allocation's buffer asks before a host copy: the copy holds a use, like queued work,
/// so a dealloca issued meanwhile leaves the free to it, and one released before refuses it.
pub(crate) struct HostCopies(pub(crate) Arc<Allocation>);

impl cuhal_command::HostAccess for HostCopies {
    fn begin_host_access(&self) -> Option<Box<dyn Send>> {
        Arc::clone(&self.0)
            .begin_use()
            .map(|used| Box::new(used) as Box<dyn Send>)
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if !*self.freed.get_mut() {
            let _bound = self.context.enter();
            let api = self.context.api();
            // SAFETY: never freed, and no handle to it remains: every action and command buffer
            // that used it retained it, so all work using it has completed.
            let _ = unsafe { cu!(api, cuMemFree(self.ptr)) };
        }
    }
}
