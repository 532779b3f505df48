//! CUPTI driven directly, with no cuhal tracing: case 6's raw CUPTI floor.
//!
//! The same activity kinds cuhal's FINE tracing enables (concurrent kernels, memcpy, memset),
//! with buffers CUPTI fills and hands back through its own callbacks, which only count the
//! records and recycle the buffers. What a replay costs with this on is what CUPTI itself costs;
//! cuhal's FINE figure above it is cuhal's share.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use anyhow::Result;
use cuhal_sys::CUcontext;
use cuhal_trace::cupti;
use cuhal_trace::cupti::ffi::{self, CuptiApi};
use cuhal_trace::cupti::{BUFFER_BYTES, CuptiLibrary};

/// The kinds cuhal's FINE tracing enables.
const KINDS: [ffi::CUpti_ActivityKind; 3] = [
    ffi::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    ffi::CUPTI_ACTIVITY_KIND_MEMCPY,
    ffi::CUPTI_ACTIVITY_KIND_MEMSET,
];
const WORDS: usize = BUFFER_BYTES / 8;
/// Buffers allocated at most (as cuhal's session).
const MAX_BUFFERS: usize = 64;

/// The entry points the buffer callbacks use.
static API: OnceLock<CuptiApi> = OnceLock::new();
/// Free buffers (addresses of leaked `Box<[u64]>` of `WORDS`); kept for the process's life.
static FREE: Mutex<Vec<usize>> = Mutex::new(Vec::new());
static ALLOCATED: AtomicU64 = AtomicU64::new(0);
static RECORDS: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn requested(buffer: *mut *mut u8, size: *mut usize, max: *mut usize) {
    let address = FREE.lock().ok().and_then(|mut f| f.pop()).or_else(|| {
        (ALLOCATED.fetch_add(1, Ordering::Relaxed) < MAX_BUFFERS as u64)
            .then(|| Box::into_raw(vec![0u64; WORDS].into_boxed_slice()).cast::<u64>() as usize)
    });
    let (ptr, bytes) = match address {
        Some(a) => (a as *mut u8, BUFFER_BYTES),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: CUPTI passes valid out-pointers.
    unsafe {
        *buffer = ptr;
        *size = bytes;
        *max = 0;
    }
}

unsafe extern "C" fn completed(
    _context: CUcontext,
    _stream: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    if let Some(api) = API.get() {
        let mut record: *mut ffi::CUpti_Activity = std::ptr::null_mut();
        let mut n = 0;
        // SAFETY: `buffer` is a completed buffer with `valid` bytes; `record` is CUPTI's
        // iterator (null to start).
        while unsafe { (api.cuptiActivityGetNextRecord)(buffer, valid, &mut record) }
            == ffi::CUPTI_SUCCESS
            && !record.is_null()
        {
            n += 1;
        }
        RECORDS.fetch_add(n, Ordering::Relaxed);
    }
    if let Ok(mut free) = FREE.lock() {
        free.push(buffer as usize);
    }
}

/// CUPTI's activity kinds on, through raw calls, until dropped.
pub struct RawCupti {
    api: CuptiApi,
}

impl RawCupti {
    /// Loads CUPTI (as cuhal does: `CUHAL_CUPTI_LIBRARY`, then the loader's path), registers the
    /// counting buffer callbacks and enables the kinds.
    pub fn enable() -> Result<Self> {
        let library = CuptiLibrary::load(None)?;
        let api = *library.api();
        // The library is never unloaded (see `CuptiLibrary`), so the entry points stay valid.
        let api = *API.get_or_init(|| api);
        // SAFETY: both callbacks are plain functions that live forever.
        unsafe { cupti!(api, cuptiActivityRegisterCallbacks(requested, completed)) }?;
        let raw = Self { api };
        for kind in KINDS {
            // SAFETY: a plain activity kind; `raw`'s drop disables it again.
            unsafe { cupti!(api, cuptiActivityEnable(kind)) }?;
        }
        Ok(raw)
    }

    /// `cuptiActivityFlushAll(0)`: hands back every buffer with completed records.
    pub fn flush(&self) -> Result<()> {
        // SAFETY: a plain call.
        unsafe { cupti!(self.api, cuptiActivityFlushAll(0)) }?;
        Ok(())
    }

    /// Records counted so far (all raw sessions of the process).
    pub fn records() -> u64 {
        RECORDS.load(Ordering::Relaxed)
    }
}

impl Drop for RawCupti {
    fn drop(&mut self) {
        for kind in KINDS {
            // SAFETY: plain calls; a failure leaves nothing to undo.
            let _ = unsafe { (self.api.cuptiActivityDisable)(kind) };
        }
        // Forced: every buffer comes back, so none is left with CUPTI.
        // SAFETY: a plain call.
        let _ = unsafe { (self.api.cuptiActivityFlushAll)(1) };
    }
}
