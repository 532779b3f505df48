//! Owned driver objects: streams, events and modules, each created and destroyed in one place.
//!
//! Each handle keeps its [`PrimaryContext`] alive and makes it current (without disturbing
//! another runtime's context, see [`PrimaryContext::enter`]) to create and to destroy its
//! object, so a handle may be dropped on any thread and in any order. Destruction errors are
//! ignored: they only happen on a lost or deinitialized context, where the object is gone
//! anyway, and `Drop` must not fail.
//!
//! Hot-path operations (record, query, wait) make no context current: the driver finds the
//! context through the object itself.

use std::ffi::{CString, c_uint, c_void};
use std::fmt;
use std::sync::Arc;

use crate::types::*;
use crate::{Error, PrimaryContext, cu};

/// A stream (`cuStreamCreate` / `cuStreamCreateWithPriority`), destroyed on drop.
pub struct Stream {
    context: Arc<PrimaryContext>,
    raw: CUstream,
}

// SAFETY: a CUstream may be used from any thread (the driver synchronizes); the handle is only
// read after creation and destroyed once, in Drop.
unsafe impl Send for Stream {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a stream with `flags` (`CU_STREAM_NON_BLOCKING` for cuhal's queues).
    pub fn new(context: &Arc<PrimaryContext>, flags: c_uint) -> Result<Self, Error> {
        let _bound = context.enter()?;
        let mut raw: CUstream = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current.
        unsafe { cu!(context.api(), cuStreamCreate(&mut raw, flags)) }?;
        Ok(Self {
            context: Arc::clone(context),
            raw,
        })
    }

    /// Creates a stream with `flags` and `priority` (lower is higher; the driver clamps it to
    /// the range `cuCtxGetStreamPriorityRange` reports).
    pub fn with_priority(
        context: &Arc<PrimaryContext>,
        flags: c_uint,
        priority: i32,
    ) -> Result<Self, Error> {
        let _bound = context.enter()?;
        let mut raw: CUstream = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current.
        unsafe {
            cu!(
                context.api(),
                cuStreamCreateWithPriority(&mut raw, flags, priority)
            )
        }?;
        Ok(Self {
            context: Arc::clone(context),
            raw,
        })
    }

    /// The raw handle, valid while `self` lives.
    pub fn raw(&self) -> CUstream {
        self.raw
    }

    /// The context the stream belongs to.
    pub fn context(&self) -> &Arc<PrimaryContext> {
        &self.context
    }

    /// Waits until everything enqueued on the stream has completed (`cuStreamSynchronize`).
    pub fn synchronize(&self) -> Result<(), Error> {
        // SAFETY: a live stream.
        unsafe { cu!(self.context.api(), cuStreamSynchronize(self.raw)) }
    }

    /// Whether everything enqueued on the stream has completed (`cuStreamQuery`).
    pub fn query(&self) -> Result<bool, Error> {
        // SAFETY: a live stream.
        unsafe { cu!(ready: self.context.api(), cuStreamQuery(self.raw)) }
    }

    /// Makes later work on this stream wait for `event`'s latest record
    /// (`cuStreamWaitEvent`; the record is captured now, so the event may be re-recorded).
    pub fn wait_event(&self, event: &Event) -> Result<(), Error> {
        // SAFETY: both objects are live for the call, which is all the driver requires.
        unsafe { self.wait_raw_event(event.raw()) }
    }

    /// [`Stream::wait_event`] for a raw event handle (a pooled event).
    ///
    /// # Safety
    /// `event` must be a live event.
    #[inline]
    pub unsafe fn wait_raw_event(&self, event: CUevent) -> Result<(), Error> {
        // SAFETY: a live stream; the caller vouches for the event.
        unsafe {
            cu!(
                self.context.api(),
                cuStreamWaitEvent(self.raw, event, CU_EVENT_WAIT_DEFAULT)
            )
        }
    }
}

impl Stream {
    /// Records `event` on this stream (`cuEventRecord`): [`Event::record`] for a raw event
    /// handle (a pooled event).
    ///
    /// # Safety
    /// `event` must be a live event.
    #[inline]
    pub unsafe fn record_raw_event(&self, event: CUevent) -> Result<(), Error> {
        // SAFETY: a live stream; the caller vouches for the event.
        unsafe { cu!(self.context.api(), cuEventRecord(event, self.raw)) }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(_bound) = self.context.enter() {
            // SAFETY: a live stream, destroyed once; cuStreamDestroy returns at once and the
            // driver releases the stream when its pending work is done.
            let _ = unsafe { cu!(self.context.api(), cuStreamDestroy(self.raw)) };
        }
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Stream").field(&self.raw).finish()
    }
}

/// An event (`cuEventCreate`), destroyed on drop.
pub struct Event {
    context: Arc<PrimaryContext>,
    raw: CUevent,
}

// SAFETY: a CUevent may be used from any thread (the driver synchronizes); the handle is only
// read after creation and destroyed once, in Drop.
unsafe impl Send for Event {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event with `flags`: `CU_EVENT_DISABLE_TIMING` for synchronization (7x cheaper
    /// to record), 0 (`CU_EVENT_DEFAULT`) for timing, `| CU_EVENT_BLOCKING_SYNC` for an event
    /// whose host waits sleep in the driver.
    pub fn new(context: &Arc<PrimaryContext>, flags: c_uint) -> Result<Self, Error> {
        let _bound = context.enter()?;
        let mut raw: CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current.
        unsafe { cu!(context.api(), cuEventCreate(&mut raw, flags)) }?;
        Ok(Self {
            context: Arc::clone(context),
            raw,
        })
    }

    /// The raw handle, valid while `self` lives.
    pub fn raw(&self) -> CUevent {
        self.raw
    }

    /// The context the event belongs to.
    pub fn context(&self) -> &Arc<PrimaryContext> {
        &self.context
    }

    /// Records the event on `stream` (`cuEventRecord`).
    pub fn record(&self, stream: &Stream) -> Result<(), Error> {
        // SAFETY: the stream is live for the call.
        unsafe { self.record_raw(stream.raw()) }
    }

    /// [`Event::record`] on a raw stream handle (one a caller passes down, such as a queue's).
    ///
    /// # Safety
    /// `stream` must be a live stream (or null, the legacy default stream).
    pub unsafe fn record_raw(&self, stream: CUstream) -> Result<(), Error> {
        // SAFETY: a live event; the caller vouches for the stream.
        unsafe { cu!(self.context.api(), cuEventRecord(self.raw, stream)) }
    }

    /// Whether the event's latest record has completed (`cuEventQuery`): `Ok(false)` while it
    /// has not, the driver's error when the work before it failed.
    pub fn query(&self) -> Result<bool, Error> {
        // SAFETY: a live event.
        unsafe { cu!(ready: self.context.api(), cuEventQuery(self.raw)) }
    }

    /// Waits until the event's latest record has completed (`cuEventSynchronize`).
    pub fn synchronize(&self) -> Result<(), Error> {
        // SAFETY: a live event.
        unsafe { cu!(self.context.api(), cuEventSynchronize(self.raw)) }
    }

    /// Records the event on `stream` and waits for it: the driver's way to wait for everything
    /// enqueued on `stream` so far.
    pub fn record_and_synchronize(&self, stream: &Stream) -> Result<(), Error> {
        self.record(stream)?;
        self.synchronize()
    }

    /// Milliseconds from this event's record to `end`'s (`cuEventElapsedTime`; negative when
    /// `end` came first), or `None` while either has not completed. Both need timing.
    pub fn elapsed_ms(&self, end: &Event) -> Result<Option<f32>, Error> {
        // SAFETY: both events are live for the call.
        unsafe { elapsed_ms(self.context.api(), self.raw, end.raw) }
    }
}

/// `cuEventElapsedTime` from `start` to `end` in milliseconds, or `None` while either has not
/// completed (`CUDA_ERROR_NOT_READY`).
///
/// # Safety
/// Both events must be live timing events.
pub unsafe fn elapsed_ms(
    api: &crate::DriverApi,
    start: CUevent,
    end: CUevent,
) -> Result<Option<f32>, Error> {
    let mut ms = 0f32;
    // SAFETY: `ms` is a valid out-pointer; the caller vouches for the events.
    let done = unsafe { cu!(ready: api, cuEventElapsedTime(&mut ms, start, end)) }?;
    Ok(done.then_some(ms))
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(_bound) = self.context.enter() {
            // SAFETY: a live event, destroyed once; the driver defers the release while a
            // record is pending.
            let _ = unsafe { cu!(self.context.api(), cuEventDestroy(self.raw)) };
        }
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Event").field(&self.raw).finish()
    }
}

/// Bytes reserved for each of the JIT's logs.
const JIT_LOG_BYTES: usize = 16 * 1024;

/// The cubin of `images` (architecture as `major * 10 + minor`, image) for compute capability
/// `cc`: an exact match, else the newest of the same major version and a lower minor (a cubin
/// runs on later minors of its major, never on another major).
pub fn cubin_for(cc: (i32, i32), images: &[(u32, &'static [u8])]) -> Option<&'static [u8]> {
    (cc.0 * 10..=cc.0 * 10 + cc.1).rev().find_map(|a| {
        images
            .iter()
            .find(|(b, _)| i64::from(*b) == i64::from(a))
            .map(|(_, image)| *image)
    })
}

/// The cubin for compute capability `cc`: a file `{stem}_sm_XY.cubin` in the directory the
/// environment variable `dir_env` names, when it is set (cubins for other architectures, or
/// stand-ins for tests), by the rule of [`cubin_for`]; else the built-in one of `images`.
pub fn cubin_from_dir_or(
    cc: (i32, i32),
    dir_env: &str,
    stem: &str,
    images: &[(u32, &'static [u8])],
) -> Option<std::borrow::Cow<'static, [u8]>> {
    if let Some(dir) = std::env::var_os(dir_env).filter(|d| !d.is_empty()) {
        for a in (cc.0 * 10..=cc.0 * 10 + cc.1).rev() {
            let path = std::path::Path::new(&dir).join(format!("{stem}_sm_{a}.cubin"));
            if let Ok(bytes) = std::fs::read(&path) {
                return Some(std::borrow::Cow::Owned(bytes));
            }
        }
    }
    cubin_for(cc, images).map(std::borrow::Cow::Borrowed)
}

/// A loaded module (`cuModuleLoadDataEx`), unloaded on drop, with the JIT's informational log;
/// or a view of a module the context keeps loaded ([`PrimaryContext::resident_module`]), which
/// drop leaves loaded.
pub struct Module {
    context: Arc<PrimaryContext>,
    raw: CUmodule,
    info_log: String,
    /// Unloaded on drop (false for a view of a resident module).
    owned: bool,
}

// SAFETY: a CUmodule may be used from any thread of its context; it is only read after load
// and unloaded once, in Drop.
unsafe impl Send for Module {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for Module {}

impl Module {
    /// Compiles PTX text with the driver's JIT and loads it. A compile error is an
    /// [`Error::ModuleLoad`] carrying the JIT's error log.
    pub fn load_ptx(context: &Arc<PrimaryContext>, ptx: &str) -> Result<Self, Error> {
        let text = CString::new(ptx).map_err(|_| Error::BadImage {
            reason: "PTX text contains a NUL byte",
        })?;
        // SAFETY: a NUL-terminated PTX string that outlives the call.
        unsafe { Self::load_image(context, text.as_ptr().cast()) }
    }

    /// Loads a cubin or fatbin image (what `nvcc -cubin`, `-fatbin` or Triton produce).
    pub fn load_cubin(context: &Arc<PrimaryContext>, image: &[u8]) -> Result<Self, Error> {
        if image.len() < 4 {
            return Err(Error::BadImage {
                reason: "image shorter than an ELF or fatbin header",
            });
        }
        // The driver reads the image's headers in place: give it 8-byte-aligned storage.
        let mut aligned = vec![0u64; image.len().div_ceil(8)];
        // SAFETY: `aligned` holds at least `image.len()` bytes; the two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                image.as_ptr(),
                aligned.as_mut_ptr().cast::<u8>(),
                image.len(),
            );
        }
        // SAFETY: an aligned copy of the image that outlives the call.
        unsafe { Self::load_image(context, aligned.as_ptr().cast()) }
    }

    /// Loads `image` with both JIT logs captured.
    ///
    /// # Safety
    /// `image` must be a NUL-terminated PTX string or an 8-byte-aligned cubin or fatbin that
    /// lives across the call.
    unsafe fn load_image(
        context: &Arc<PrimaryContext>,
        image: *const c_void,
    ) -> Result<Self, Error> {
        let _bound = context.enter()?;
        let api = context.api();
        let mut info = vec![0u8; JIT_LOG_BYTES];
        let mut error = vec![0u8; JIT_LOG_BYTES];
        let mut options: [CUjit_option; 5] = [
            CU_JIT_INFO_LOG_BUFFER,
            CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            CU_JIT_ERROR_LOG_BUFFER,
            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            CU_JIT_LOG_VERBOSE,
        ];
        // Sizes and flags travel as integers in pointer-sized slots (cuda.h's convention);
        // the driver overwrites the size slots with the bytes it wrote.
        let mut values: [*mut c_void; 5] = [
            info.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut::<c_void>(JIT_LOG_BYTES),
            error.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut::<c_void>(JIT_LOG_BYTES),
            std::ptr::without_provenance_mut::<c_void>(1),
        ];
        let mut raw: CUmodule = std::ptr::null_mut();
        // SAFETY: the caller vouches for `image`; the option and value arrays have 5 entries
        // each; the log buffers are writable for the sizes given and outlive the call.
        let loaded = unsafe {
            cu!(
                api,
                cuModuleLoadDataEx(
                    &mut raw,
                    image,
                    options.len() as c_uint,
                    options.as_mut_ptr(),
                    values.as_mut_ptr(),
                )
            )
        };
        let info_log = log_text(&info, values[1].addr());
        if let Err(source) = loaded {
            let mut log = log_text(&error, values[3].addr());
            if log.is_empty() {
                log = info_log;
            }
            return Err(Error::ModuleLoad {
                source: Box::new(source),
                log,
            });
        }
        Ok(Self {
            context: Arc::clone(context),
            raw,
            info_log,
            owned: true,
        })
    }

    /// A view of `raw`, a module `context` keeps loaded.
    pub(crate) fn resident_view(
        context: &Arc<PrimaryContext>,
        raw: CUmodule,
        info_log: String,
    ) -> Self {
        Self {
            context: Arc::clone(context),
            raw,
            info_log,
            owned: false,
        }
    }

    /// Hands the module over to its context: the handle and log, no longer unloaded on drop.
    pub(crate) fn into_resident(mut self) -> (CUmodule, String) {
        self.owned = false;
        (self.raw, std::mem::take(&mut self.info_log))
    }

    /// The JIT's informational log from loading (register use and the like; may be empty).
    pub fn info_log(&self) -> &str {
        &self.info_log
    }

    /// The raw handle, valid while `self` lives.
    pub fn raw(&self) -> CUmodule {
        self.raw
    }

    /// The context the module is loaded in.
    pub fn context(&self) -> &Arc<PrimaryContext> {
        &self.context
    }

    /// Looks up the kernel `name` (`cuModuleGetFunction`). The handle is valid while the module
    /// is loaded.
    pub fn function(&self, name: &str) -> Result<CUfunction, Error> {
        let c_name = CString::new(name).map_err(|_| Error::BadImage {
            reason: "function name contains a NUL byte",
        })?;
        let _bound = self.context.enter()?;
        let mut raw: CUfunction = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer, the module is loaded, `c_name` is
        // NUL-terminated.
        unsafe {
            cu!(
                self.context.api(),
                cuModuleGetFunction(&mut raw, self.raw, c_name.as_ptr())
            )
        }?;
        Ok(raw)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        if let Ok(_bound) = self.context.enter() {
            // SAFETY: a live module, unloaded once; its owners keep it loaded until every
            // launch of its kernels was enqueued and whatever records them is gone.
            let _ = unsafe { cu!(self.context.api(), cuModuleUnload(self.raw)) };
        }
    }
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Module").field(&self.raw).finish()
    }
}

/// The text of a JIT log buffer: up to the bytes written, up to the first NUL, trimmed.
fn log_text(buffer: &[u8], written: usize) -> String {
    let bytes = &buffer[..written.min(buffer.len())];
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jit_logs_stop_at_the_nul_and_the_written_size() {
        let mut buffer = b"ptxas error: bad\0garbage".to_vec();
        assert_eq!(log_text(&buffer, buffer.len()), "ptxas error: bad");
        assert_eq!(log_text(&buffer, 5), "ptxas");
        buffer.truncate(3);
        assert_eq!(log_text(&buffer, 1000), "ptx");
        assert_eq!(log_text(&[0; 8], 8), "");
    }
}
