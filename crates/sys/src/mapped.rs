//! Pinned host memory mapped into the device's address space, allocated and freed in one place.

use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use crate::types::*;
use crate::{Error, PrimaryContext, cu};

/// Pinned, portable host memory mapped into the device's address space
/// (`cuMemHostAlloc` with `CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE`, then
/// `cuMemHostGetDevicePointer`), zeroed when made and freed on drop (`cuMemFreeHost`).
///
/// The host and the device reach the same bytes: the host through [`host_ptr`](Self::host_ptr),
/// kernels through [`device_ptr`](Self::device_ptr). Words both sides use are read and written
/// through [`word`](Self::word) on the host. Like the other owned objects, it keeps its
/// [`PrimaryContext`] alive and makes it current to allocate and to free, so it may be dropped on
/// any thread. Freeing waits for the device work that uses the memory (`cuMemFreeHost`
/// synchronizes), so the owner drops it only once no work that writes it can still be queued.
pub struct MappedHostMemory {
    context: Arc<PrimaryContext>,
    host: *mut u8,
    device: CUdeviceptr,
    len: usize,
}

// SAFETY: the memory is plain pinned host memory that stays mapped until drop; the pointers are
// only read after construction, and the bytes are reached through raw pointers (the owner's
// contract) or atomics ([`MappedHostMemory::word`]), which any thread may use.
unsafe impl Send for MappedHostMemory {}
// SAFETY: as above; `&self` hands out nothing but the pointers and atomic views.
unsafe impl Sync for MappedHostMemory {}

impl MappedHostMemory {
    /// Allocates `len` zeroed bytes (at least one: the driver refuses an empty allocation) of
    /// mapped, portable pinned memory in `context`. The host pointer is page-aligned.
    pub fn new(context: &Arc<PrimaryContext>, len: usize) -> Result<Self, Error> {
        let len = len.max(1);
        let api = context.api();
        let _bound = context.enter()?;
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: `host` is a valid out-pointer; the context is current; the flags are cuda.h's.
        unsafe {
            cu!(
                api,
                cuMemHostAlloc(
                    &mut host,
                    len,
                    CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE
                )
            )
        }?;
        // Owned from here: an error below frees the allocation in `Drop`.
        let mut this = Self {
            context: Arc::clone(context),
            host: host.cast(),
            device: 0,
            len,
        };
        // SAFETY: `len` writable bytes were just allocated; no device work knows them yet.
        unsafe { std::ptr::write_bytes(this.host, 0, len) };
        let mut device: CUdeviceptr = 0;
        // SAFETY: `host` is mapped pinned memory of the current context; flags must be 0.
        unsafe { cu!(api, cuMemHostGetDevicePointer(&mut device, host, 0)) }?;
        this.device = device;
        Ok(this)
    }

    /// The host address of the first byte, valid for [`len`](Self::len) bytes while `self`
    /// lives. Writes through it must not race the device's accesses to the same bytes.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// The device address of the first byte, for kernels of any context (the memory is portable).
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.device
    }

    /// The number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: an allocation holds at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The context the memory was allocated in.
    pub fn context(&self) -> &Arc<PrimaryContext> {
        &self.context
    }

    /// The `index`th 32-bit word as the host sees it, for words the device also reads or writes
    /// (flags, counters, failure records).
    ///
    /// # Panics
    /// If the word does not lie wholly inside the allocation (an index the owner computed
    /// wrongly, never data from outside).
    pub fn word(&self, index: usize) -> &AtomicU32 {
        assert!(
            index
                .checked_add(1)
                .and_then(|n| n.checked_mul(4))
                .is_some_and(|end| end <= self.len),
            "word {index} of a mapped allocation of {} bytes",
            self.len
        );
        // SAFETY: the word lies inside the allocation (checked above), which is page-aligned, so
        // it is 4-byte aligned; it stays mapped while `self` lives; the device accesses it only
        // with plain aligned stores and loads or atomics, which an AtomicU32 view tolerates.
        unsafe { AtomicU32::from_ptr(self.host.cast::<u32>().add(index)) }
    }
}

impl Drop for MappedHostMemory {
    fn drop(&mut self) {
        if let Ok(_bound) = self.context.enter() {
            // SAFETY: allocated in `new` with cuMemHostAlloc and freed once, here; the owner
            // drops it only after the device work that uses it (see the type's documentation).
            let _ = unsafe { cu!(self.context.api(), cuMemFreeHost(self.host.cast())) };
        }
    }
}

impl fmt::Debug for MappedHostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappedHostMemory")
            .field("host", &self.host)
            .field("device", &format_args!("{:#x}", self.device))
            .field("len", &self.len)
            .finish()
    }
}
