//! Memory: device allocations (plain and stream-ordered from pools), pinned host memory,
//! memory pools, and the range checks every copy and fill goes through.
//!
//! "Device" memory is host memory from `std::alloc`, 256-byte aligned like the real driver's,
//! and a device pointer is its address. Every allocation is registered, so a free of an
//! unknown or already freed pointer is `CUDA_ERROR_INVALID_VALUE`, a copy or fill that leaves
//! its allocation is refused, and a test can count what is still allocated. Fresh device
//! memory holds [`FRESH_BYTE`], not zeros, so nothing can rely on memory it never wrote.
// Functions carry the driver's names so a reader can match them to cuda.h.
#![allow(non_snake_case)]

use std::alloc::Layout;
use std::ffi::{c_int, c_uint, c_void};

use cuhal_sys::{
    CU_MEM_ACCESS_FLAGS_PROT_NONE, CU_MEM_ACCESS_FLAGS_PROT_READ,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE,
    CUdevice, CUdeviceptr, CUmemPool_attribute, CUmemPoolProps, CUmemoryPool, CUstream,
};

use crate::driver::{check_device, total_memory};
use crate::entry::{Status, ensure, entry, put};
use crate::status;
use crate::world::{World, handle, id, lookup, lookup_mut, world};

/// The alignment of every allocation, as the real driver guarantees.
pub const ALIGNMENT: usize = 256;
/// What fresh device memory holds.
pub const FRESH_BYTE: u8 = 0xa5;

/// `CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES` .. `CU_MEMPOOL_ATTR_USED_MEM_HIGH`: the
/// attributes a pool has.
const POOL_ATTRIBUTES: std::ops::RangeInclusive<CUmemPool_attribute> = 1..=8;

/// Where an allocation came from, which decides how it may be freed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `cuMemAlloc`.
    Device,
    /// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync`, from the pool with this handle id.
    Pool(usize),
    /// `cuMemAllocHost` / `cuMemHostAlloc`.
    Host,
}

/// One live allocation.
#[derive(Debug)]
pub(crate) struct Allocation {
    pub len: usize,
    pub kind: Kind,
    /// The device whose context allocated it.
    pub device: i32,
}

/// A memory pool.
#[derive(Debug)]
pub(crate) struct Pool {
    pub device: i32,
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`.
    pub release_threshold: u64,
    /// A device's default pool: never destroyed, not counted as live.
    pub default: bool,
    /// Other devices granted access by `cuMemPoolSetAccess`.
    pub access: Vec<i32>,
}

fn layout(len: usize) -> Result<Layout, c_int> {
    Layout::from_size_align(len, ALIGNMENT).map_err(|_| status::OUT_OF_MEMORY)
}

impl World {
    /// Allocates `len` bytes and registers them; returns the address.
    fn allocate(&mut self, len: usize, kind: Kind, device: i32) -> Result<u64, c_int> {
        ensure(len > 0, status::INVALID_VALUE)?;
        if kind != Kind::Host {
            let used = self.counts().device_bytes as usize;
            ensure(
                len <= total_memory(device).saturating_sub(used),
                status::OUT_OF_MEMORY,
            )?;
        }
        let layout = layout(len)?;
        // SAFETY: `layout` has a non-zero size.
        let memory = unsafe { std::alloc::alloc(layout) };
        ensure(!memory.is_null(), status::OUT_OF_MEMORY)?;
        let fill = if kind == Kind::Host { 0 } else { FRESH_BYTE };
        // SAFETY: `memory` is a fresh allocation of `len` bytes.
        unsafe { memory.write_bytes(fill, len) };
        let address = memory.expose_provenance() as u64;
        self.allocations
            .insert(address, Allocation { len, kind, device });
        Ok(address)
    }

    /// Frees the allocation at exactly `address` if `may_free` accepts its kind.
    fn free(&mut self, address: u64, may_free: impl Fn(Kind) -> bool) -> Status {
        match self.allocations.get(&address) {
            Some(a) if may_free(a.kind) => {}
            _ => return Err(status::INVALID_VALUE),
        }
        let Some(allocation) = self.allocations.remove(&address) else {
            return Err(status::INVALID_VALUE);
        };
        let memory = std::ptr::with_exposed_provenance_mut::<u8>(address as usize);
        // SAFETY: `memory` was allocated in `allocate` with this layout (its length is
        // remembered) and was just unregistered, so it is freed exactly once.
        unsafe { std::alloc::dealloc(memory, layout(allocation.len)?) };
        Ok(())
    }

    /// The bytes `[address, address + len)` of one live device allocation, or
    /// `CUDA_ERROR_INVALID_VALUE` if the range is not inside one.
    pub fn device_span(&self, address: u64, len: usize) -> Result<*mut u8, c_int> {
        let kind = self.span_kind(address, len)?;
        ensure(kind != Kind::Host, status::INVALID_VALUE)?;
        Ok(std::ptr::with_exposed_provenance_mut(address as usize))
    }

    /// The bytes `[address, address + len)` of one live allocation of any kind: device memory,
    /// or pinned host memory as the device sees it when mapped (at its host address).
    pub fn mapped_span(&self, address: u64, len: usize) -> Result<*mut u8, c_int> {
        self.span_kind(address, len)?;
        Ok(std::ptr::with_exposed_provenance_mut(address as usize))
    }

    /// The kind of the one live allocation holding all of `[address, address + len)`, or
    /// `CUDA_ERROR_INVALID_VALUE` if none does.
    fn span_kind(&self, address: u64, len: usize) -> Result<Kind, c_int> {
        let (&base, allocation) = self
            .allocations
            .range(..=address)
            .next_back()
            .ok_or(status::INVALID_VALUE)?;
        let end = address
            .checked_add(len as u64)
            .ok_or(status::INVALID_VALUE)?;
        ensure(end <= base + allocation.len as u64, status::INVALID_VALUE)?;
        Ok(allocation.kind)
    }

    /// The device whose memory `address` is (a device or pool allocation holding it).
    pub fn allocation_device(&self, address: u64) -> Option<i32> {
        let (&base, allocation) = self.allocations.range(..=address).next_back()?;
        (allocation.kind != Kind::Host && address < base + allocation.len.max(1) as u64)
            .then_some(allocation.device)
    }

    /// Whether `address` lies in stream-ordered pool memory (`Some(true)`) or another live
    /// allocation (`Some(false)`): the two are mapped differently, which the driver's memcpy
    /// node updates check.
    pub fn in_pool_memory(&self, address: u64) -> Option<bool> {
        let (&base, allocation) = self.allocations.range(..=address).next_back()?;
        (address < base + allocation.len.max(1) as u64)
            .then_some(matches!(allocation.kind, Kind::Pool(_)))
    }

    /// The pool behind a handle (a default pool or a live created one).
    fn pool(&self, pool: CUmemoryPool) -> Result<usize, c_int> {
        let pool = id(pool)?;
        lookup(&self.pools, pool).map(|_| pool)
    }

    /// The default pool of `device`, created on first use.
    fn default_pool(&mut self, device: i32) -> usize {
        if let Some(&pool) = self.default_pools.get(&device) {
            return pool;
        }
        let pool = self.new_handle();
        self.pools.insert(
            pool,
            Pool {
                device,
                release_threshold: 0,
                default: true,
                access: Vec::new(),
            },
        );
        self.default_pools.insert(device, pool);
        pool
    }
}

/// `CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)`.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuMemAlloc(out: *mut CUdeviceptr, bytes: usize) -> c_int {
    entry("cuMemAlloc", || {
        let mut world = world();
        let (_, device) = world.current_context()?;
        // Allocation may synchronize: forbidden on a capturing thread.
        world.forbid_on_capturing_thread()?;
        ensure(!out.is_null(), status::INVALID_VALUE)?;
        let address = world.allocate(bytes, Kind::Device, device)?;
        // SAFETY: forwarded caller contract (checked non-null above).
        unsafe { put(out, address) }
    })
}

/// `CUresult cuMemFree_v2(CUdeviceptr dptr)`: frees plain and stream-ordered allocations.
pub extern "C" fn cuMemFree(address: CUdeviceptr) -> c_int {
    entry("cuMemFree", || {
        let mut world = world();
        world.current_context()?;
        world.free(address, |kind| kind != Kind::Host)
    })
}

/// `CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)`.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuMemAllocHost(out: *mut *mut c_void, bytes: usize) -> c_int {
    entry("cuMemAllocHost", || {
        // SAFETY: forwarded caller contract.
        unsafe { host_alloc(out, bytes) }
    })
}

/// `CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)`.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuMemHostAlloc(
    out: *mut *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> c_int {
    entry("cuMemHostAlloc", || {
        // PORTABLE | DEVICEMAP | WRITECOMBINED.
        ensure(flags & !0x7 == 0, status::INVALID_VALUE)?;
        // SAFETY: forwarded caller contract.
        unsafe { host_alloc(out, bytes) }
    })
}

/// # Safety
/// `out` is null or valid for one write.
unsafe fn host_alloc(out: *mut *mut c_void, bytes: usize) -> Status {
    let mut world = world();
    let (_, device) = world.current_context()?;
    ensure(!out.is_null(), status::INVALID_VALUE)?;
    let address = world.allocate(bytes, Kind::Host, device)?;
    // SAFETY: forwarded caller contract (checked non-null above).
    unsafe { put(out, std::ptr::with_exposed_provenance_mut(address as usize)) }
}

/// `CUresult cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int flags)`: the
/// fake's device sees host memory at its host address.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuMemHostGetDevicePointer(
    out: *mut CUdeviceptr,
    pointer: *mut c_void,
    flags: c_uint,
) -> c_int {
    entry("cuMemHostGetDevicePointer", || {
        ensure(flags == 0, status::INVALID_VALUE)?;
        let world = world();
        let address = pointer.addr() as u64;
        let (_, allocation) = world
            .allocations
            .range(..=address)
            .next_back()
            .ok_or(status::INVALID_VALUE)?;
        ensure(matches!(allocation.kind, Kind::Host), status::INVALID_VALUE)?;
        world.mapped_span(address, 1)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(out, address) }
    })
}

/// `CUresult cuMemFreeHost(void *p)`.
pub extern "C" fn cuMemFreeHost(pointer: *mut c_void) -> c_int {
    entry("cuMemFreeHost", || {
        let mut world = world();
        world.current_context()?;
        world.free(pointer.addr() as u64, |kind| kind == Kind::Host)
    })
}

/// `CUresult cuMemGetInfo_v2(size_t *free, size_t *total)` of the current context's device.
///
/// # Safety
/// Each out-pointer is null or valid for one write.
pub unsafe extern "C" fn cuMemGetInfo(free: *mut usize, total: *mut usize) -> c_int {
    entry("cuMemGetInfo", || {
        let world = world();
        let (_, device) = world.current_context()?;
        let total_bytes = total_memory(device);
        let used = world.counts().device_bytes as usize;
        // SAFETY: forwarded caller contract.
        unsafe {
            put(free, total_bytes.saturating_sub(used))?;
            put(total, total_bytes)
        }
    })
}

/// `CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)`.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    out: *mut CUmemoryPool,
    device: CUdevice,
) -> c_int {
    entry("cuDeviceGetDefaultMemPool", || {
        check_device(device)?;
        let pool = world().default_pool(device);
        // SAFETY: forwarded caller contract.
        unsafe { put(out, handle(pool)) }
    })
}

/// `CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)`: pinned
/// device memory of a valid device only.
///
/// # Safety
/// `out` is null or valid for one write; `props` is null or points to a `CUmemPoolProps`.
pub unsafe extern "C" fn cuMemPoolCreate(
    out: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> c_int {
    entry("cuMemPoolCreate", || {
        ensure(!out.is_null() && !props.is_null(), status::INVALID_VALUE)?;
        // SAFETY: non-null and pointing to a CUmemPoolProps by the caller's contract.
        let props = unsafe { props.read() };
        ensure(
            props.allocType == CU_MEM_ALLOCATION_TYPE_PINNED
                && props.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE,
            status::INVALID_VALUE,
        )?;
        check_device(props.location.id).map_err(|_| status::INVALID_VALUE)?;
        let mut world = world();
        let pool = world.new_handle();
        world.pools.insert(
            pool,
            Pool {
                device: props.location.id,
                release_threshold: 0,
                default: false,
                access: Vec::new(),
            },
        );
        // SAFETY: forwarded caller contract (checked non-null above).
        unsafe { put(out, handle(pool)) }
    })
}

/// `CUresult cuMemPoolDestroy(CUmemoryPool pool)`.
///
/// As in the real driver, allocations still outstanding stay valid (and counted) until freed.
pub extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> c_int {
    entry("cuMemPoolDestroy", || {
        let mut world = world();
        let pool = world.pool(pool)?;
        ensure(!world.pools[&pool].default, status::INVALID_VALUE)?;
        world.pools.remove(&pool);
        Ok(())
    })
}

/// `CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)`.
///
/// # Safety
/// `value` is null or points to the attribute's type (a `u64` for the release threshold).
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attribute: CUmemPool_attribute,
    value: *mut c_void,
) -> c_int {
    entry("cuMemPoolSetAttribute", || {
        let mut world = world();
        let pool = world.pool(pool)?;
        ensure(
            !value.is_null() && POOL_ATTRIBUTES.contains(&attribute),
            status::INVALID_VALUE,
        )?;
        if attribute == cuhal_sys::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD {
            // SAFETY: non-null and pointing to a u64 for this attribute (caller's contract).
            let threshold = unsafe { value.cast::<u64>().read_unaligned() };
            lookup_mut(&mut world.pools, pool)?.release_threshold = threshold;
        }
        Ok(())
    })
}

/// `CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)`.
///
/// Checks what the real driver checks: a live pool, at least one entry, device locations of
/// devices that exist, known flags, and no entry that takes access away from the pool's own
/// device. Records the access of every other device.
///
/// # Safety
/// `descs` is null or valid for `count` reads.
pub unsafe extern "C" fn cuMemPoolSetAccess(
    pool: CUmemoryPool,
    descs: *const cuhal_sys::CUmemAccessDesc,
    count: usize,
) -> c_int {
    entry("cuMemPoolSetAccess", || {
        let mut world = world();
        let pool = world.pool(pool)?;
        ensure(!descs.is_null() && count > 0, status::INVALID_VALUE)?;
        // SAFETY: non-null and valid for `count` reads (caller's contract).
        let descs = unsafe { std::slice::from_raw_parts(descs, count) };
        let own = world.pools[&pool].device;
        for desc in descs {
            ensure(
                desc.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE
                    && matches!(
                        desc.flags,
                        CU_MEM_ACCESS_FLAGS_PROT_NONE
                            | CU_MEM_ACCESS_FLAGS_PROT_READ
                            | CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                    ),
                status::INVALID_VALUE,
            )?;
            check_device(desc.location.id).map_err(|_| status::INVALID_DEVICE)?;
            ensure(
                desc.location.id != own || desc.flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                status::INVALID_VALUE,
            )?;
        }
        let access = &mut lookup_mut(&mut world.pools, pool)?.access;
        for desc in descs.iter().filter(|d| d.location.id != own) {
            access.retain(|device| *device != desc.location.id);
            if desc.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE {
                access.push(desc.location.id);
            }
        }
        Ok(())
    })
}

/// `CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)`: nothing is cached.
pub extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, _keep: usize) -> c_int {
    entry("cuMemPoolTrimTo", || world().pool(pool).map(drop))
}

/// `CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)`: from the
/// stream's device's default pool.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuMemAllocAsync(
    out: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> c_int {
    entry("cuMemAllocAsync", || {
        let mut world = world();
        let device = world.stream_device(stream)?;
        let pool = world.default_pool(device);
        ensure(!out.is_null(), status::INVALID_VALUE)?;
        let address = world.allocate(bytes, Kind::Pool(pool), device)?;
        // SAFETY: forwarded caller contract (checked non-null above).
        unsafe { put(out, address) }
    })
}

/// `CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
/// CUstream hStream)`.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    out: *mut CUdeviceptr,
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> c_int {
    entry("cuMemAllocFromPoolAsync", || {
        let mut world = world();
        world.stream_device(stream)?;
        let pool = world.pool(pool)?;
        let device = world.pools[&pool].device;
        ensure(!out.is_null(), status::INVALID_VALUE)?;
        let address = world.allocate(bytes, Kind::Pool(pool), device)?;
        // SAFETY: forwarded caller contract (checked non-null above).
        unsafe { put(out, address) }
    })
}

/// `CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)`: the stream has already run
/// everything enqueued before, so the memory is freed now.
pub extern "C" fn cuMemFreeAsync(address: CUdeviceptr, stream: CUstream) -> c_int {
    entry("cuMemFreeAsync", || {
        let mut world = world();
        world.stream_device(stream)?;
        world.free(address, |kind| kind != Kind::Host)
    })
}

/// `CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)`.
///
/// Knows every address inside a live allocation: its context (the primary context of the
/// device that allocated it; pinned host memory too, as the real driver reports for
/// `cuMemAllocHost`), its memory type, device ordinal, and the allocation's start and size. An
/// address the fake never allocated is `CUDA_ERROR_INVALID_VALUE`, as a plain host pointer is for
/// the real driver. Other attributes are `CUDA_ERROR_NOT_SUPPORTED`.
///
/// # Safety
/// `data` is null or valid for one write of the attribute's type.
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: cuhal_sys::CUpointer_attribute,
    pointer: CUdeviceptr,
) -> c_int {
    use cuhal_sys::*;
    entry("cuPointerGetAttribute", || {
        let world = world();
        ensure(!data.is_null(), status::INVALID_VALUE)?;
        let (&base, allocation) = world
            .allocations
            .range(..=pointer)
            .next_back()
            .filter(|(base, a)| pointer < **base + a.len as u64)
            .ok_or(status::INVALID_VALUE)?;
        let device = allocation.device;
        // SAFETY: (every arm) `data` is non-null and valid for the attribute's type (caller's
        // contract).
        unsafe {
            match attribute {
                CU_POINTER_ATTRIBUTE_CONTEXT => {
                    let context = world.contexts.get(device as usize).map_or(0, |c| c.handle);
                    put(data.cast::<CUcontext>(), handle(context))
                }
                CU_POINTER_ATTRIBUTE_MEMORY_TYPE => {
                    let kind = if allocation.kind == Kind::Host {
                        CU_MEMORYTYPE_HOST
                    } else {
                        CU_MEMORYTYPE_DEVICE
                    };
                    put(data.cast::<c_uint>(), kind)
                }
                CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => put(data.cast::<c_int>(), device),
                CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => put(data.cast::<CUdeviceptr>(), base),
                CU_POINTER_ATTRIBUTE_RANGE_SIZE => put(data.cast::<usize>(), allocation.len),
                _ => Err(status::NOT_SUPPORTED),
            }
        }
    })
}

/// Copies `len` bytes between two host addresses (device memory is host memory here).
///
/// # Safety
/// Both ranges are valid for `len` bytes (they may overlap).
pub(crate) unsafe fn move_bytes(target: *mut u8, source: *const u8, len: usize) {
    // SAFETY: guaranteed by the caller; `copy` tolerates overlap.
    unsafe { std::ptr::copy(source, target, len) };
}

/// Fills `count` elements of `size` bytes (1, 2 or 4) at `target` with the low bytes of
/// `value`, in native byte order as the GPU stores them.
///
/// # Safety
/// `target` is valid for `count * size` bytes.
pub(crate) unsafe fn fill(target: *mut u8, value: u32, size: usize, count: usize) {
    let word = value.to_ne_bytes();
    let half = (value as u16).to_ne_bytes();
    let element: &[u8] = match size {
        1 => {
            // SAFETY: `target` is valid for `count` bytes.
            unsafe { target.write_bytes(value as u8, count) };
            return;
        }
        2 => &half,
        _ => &word,
    };
    for i in 0..count {
        // SAFETY: element `i` lies inside the `count * size` bytes the caller vouches for.
        unsafe {
            std::ptr::copy_nonoverlapping(element.as_ptr(), target.add(i * size), size);
        }
    }
}
