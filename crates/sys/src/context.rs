//! The primary context of a device, retained for as long as anything of cuhal's uses it.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use crate::types::*;
use crate::{DriverApi, Error, Module};

/// A retained primary context (`cuDevicePrimaryCtxRetain`) and the driver table that owns it.
///
/// cuhal uses primary contexts so it shares them with the runtime API (PyTorch, CuPy) in the same
/// process. Every RAII handle of the higher crates (buffers, streams, events, graphs) keeps an
/// `Arc<PrimaryContext>` and calls [`PrimaryContext::bind`] before destroying its object, so a
/// handle may be dropped on any thread. The context is released when the last handle goes.
pub struct PrimaryContext {
    api: Arc<DriverApi>,
    device: CUdevice,
    ordinal: i32,
    context: CUcontext,
    /// Modules loaded once for the context's whole life ([`PrimaryContext::resident_module`]),
    /// by key, with their JIT info logs; unloaded when the context is released.
    resident: Mutex<Vec<Resident>>,
}

/// One module of [`PrimaryContext::resident_module`].
struct Resident {
    key: &'static str,
    raw: CUmodule,
    info_log: String,
}

// SAFETY: a CUcontext handle may be used from any thread (the driver synchronizes); the handle
// is only read after construction.
unsafe impl Send for PrimaryContext {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    /// Retains the primary context of device `ordinal` and makes it current on this thread if no
    /// context is (see [`PrimaryContext::enter`]).
    pub fn retain(api: Arc<DriverApi>, ordinal: i32) -> Result<Arc<Self>, Error> {
        let mut device: CUdevice = 0;
        // SAFETY: `device` is a valid out-pointer.
        unsafe { crate::cu!(api, cuDeviceGet(&mut device, ordinal)) }?;
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: `context` is a valid out-pointer; `device` came from cuDeviceGet.
        unsafe { crate::cu!(api, cuDevicePrimaryCtxRetain(&mut context, device)) }?;
        let this = Arc::new(Self {
            api,
            device,
            ordinal,
            context,
            resident: Mutex::new(Vec::new()),
        });
        drop(this.enter()?);
        Ok(this)
    }

    /// Makes the context current on the calling thread (`cuCtxSetCurrent`; cheap when it
    /// already is).
    pub fn bind(&self) -> Result<(), Error> {
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: `current` is a valid out-pointer.
        let r = unsafe { (self.api.cuCtxGetCurrent)(&mut current) };
        if r.is_success() && current == self.context {
            return Ok(());
        }
        // SAFETY: `self.context` is a live retained primary context.
        unsafe { crate::cu!(self.api, cuCtxSetCurrent(self.context)) }
    }

    /// Makes the context current on the calling thread for as long as the returned guard lives,
    /// without disturbing another runtime: if another context is current (PyTorch or CuPy on
    /// another device, say), it is pushed over it and popped when the guard drops
    /// (`cuCtxPushCurrent` / `cuCtxPopCurrent`); if none is, it is simply made current and stays
    /// so, which makes the next call on this thread free; if it already is, nothing happens. cuhal
    /// uses this wherever it may run on a thread it does not own (submissions, drops);
    /// [`PrimaryContext::bind`] is for cuhal's own threads.
    #[inline]
    pub fn enter(&self) -> Result<ContextGuard, Error> {
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: `current` is a valid out-pointer.
        let r = unsafe { (self.api.cuCtxGetCurrent)(&mut current) };
        if r.is_success() && current == self.context {
            return Ok(ContextGuard {
                pushed: None,
                _not_send: std::marker::PhantomData,
            });
        }
        self.enter_other(r.is_success() && current.is_null())
    }

    /// [`PrimaryContext::enter`] when the context is not current already: made current on a
    /// thread without one (`unbound`), pushed otherwise. Out of line: submissions find their
    /// context current.
    #[cold]
    fn enter_other(&self, unbound: bool) -> Result<ContextGuard, Error> {
        if unbound {
            // SAFETY: `self.context` is a live retained primary context.
            unsafe { crate::cu!(self.api, cuCtxSetCurrent(self.context)) }?;
            return Ok(ContextGuard {
                pushed: None,
                _not_send: std::marker::PhantomData,
            });
        }
        // SAFETY: `self.context` is a live retained primary context.
        unsafe { crate::cu!(self.api, cuCtxPushCurrent(self.context)) }?;
        Ok(ContextGuard {
            pushed: Some(self.api.clone()),
            _not_send: std::marker::PhantomData,
        })
    }

    /// The module stored under `key`, loaded by `load` at the first call for this context and
    /// kept loaded until the context itself is released (the last `Arc` drops).
    ///
    /// For modules cuhal itself needs on every context that uses a feature (helper kernels):
    /// loading and unloading a module waits for all work running in the context, so loading one
    /// per command buffer would make recording and dropping wait for the device. The returned
    /// [`Module`] is a view that does not unload on drop; it keeps the context (and so the
    /// module) alive. Concurrent first calls load once: `load` runs under the cache's lock.
    pub fn resident_module(
        self: &Arc<Self>,
        key: &'static str,
        load: impl FnOnce(&Arc<Self>) -> Result<Module, Error>,
    ) -> Result<Module, Error> {
        let mut resident = self.resident.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = resident.iter().find(|r| r.key == key) {
            return Ok(Module::resident_view(self, r.raw, r.info_log.clone()));
        }
        let module = load(self)?;
        let (raw, info_log) = module.into_resident();
        resident.push(Resident {
            key,
            raw,
            info_log: info_log.clone(),
        });
        Ok(Module::resident_view(self, raw, info_log))
    }

    /// The driver table.
    pub fn api(&self) -> &Arc<DriverApi> {
        &self.api
    }

    /// The raw context handle.
    pub fn raw(&self) -> CUcontext {
        self.context
    }

    /// The device handle.
    pub fn device(&self) -> CUdevice {
        self.device
    }

    /// The device ordinal the context was retained for.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Reads a device attribute.
    pub fn attribute(&self, attribute: CUdevice_attribute) -> Result<i32, Error> {
        let mut value = 0;
        // SAFETY: `value` is a valid out-pointer.
        unsafe {
            crate::cu!(
                self.api,
                cuDeviceGetAttribute(&mut value, attribute, self.device)
            )
        }?;
        Ok(value)
    }
}

/// Keeps a context current; see [`PrimaryContext::enter`].
#[must_use = "the context is current only while the guard lives"]
pub struct ContextGuard {
    /// The driver, when `enter` pushed the context and the drop must pop it.
    pushed: Option<Arc<DriverApi>>,
    /// The context stack is per thread: the guard must drop on the thread that entered.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ContextGuard {
    #[inline]
    fn drop(&mut self) {
        if let Some(api) = &self.pushed {
            let mut popped: CUcontext = std::ptr::null_mut();
            // SAFETY: balances the push in `enter`; the calls between them leave the stack as
            // they found it (cuhal pushes and pops in pairs).
            let _ = unsafe { (api.cuCtxPopCurrent)(&mut popped) };
        }
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        let resident = std::mem::take(
            self.resident
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        if !resident.is_empty()
            && let Ok(_bound) = self.enter()
        {
            for r in resident {
                // SAFETY: loaded by `resident_module`, unloaded once, here; every view of it
                // held an `Arc` of this context, so none is left.
                let _ = unsafe { crate::cu!(self.api, cuModuleUnload(r.raw)) };
            }
        }
        // The release can only fail on a deinitialized driver (process exit); nothing to do then.
        // SAFETY: balances the retain in `retain`.
        let _ = unsafe { (self.api.cuDevicePrimaryCtxRelease)(self.device) };
    }
}

impl fmt::Debug for PrimaryContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrimaryContext")
            .field("ordinal", &self.ordinal)
            .field("context", &self.context)
            .finish()
    }
}
