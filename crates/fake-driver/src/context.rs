//! Primary contexts and each thread's current-context stack.
//!
//! A device's primary context has one handle for the life of the instance and a retain count;
//! it is active while retained. Objects are not destroyed when the count drops to zero (the
//! real driver would reset the context): a test then sees whatever cuhal forgot to free.
// Functions carry the driver's names so a reader can match them to cuda.h.
#![allow(non_snake_case)]

use std::cell::RefCell;
use std::ffi::{c_int, c_uint};

use cuhal_sys::{CUcontext, CUdevice};

use crate::driver::check_device;
use crate::entry::{entry, put};
use crate::status;
use crate::world::{World, handle, id, world};

/// One device's primary context.
#[derive(Clone, Debug, Default)]
pub(crate) struct PrimaryContext {
    /// Its handle id (0 until first retained).
    pub handle: usize,
    /// Outstanding `cuDevicePrimaryCtxRetain`s.
    pub retains: u32,
}

thread_local! {
    /// The calling thread's context stack; the top is current.
    static STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

fn current() -> Option<usize> {
    STACK.with(|s| s.borrow().last().copied())
}

impl World {
    /// The ordinal of the device whose primary context is `context`, if it is active.
    pub fn active_context(&self, context: usize) -> Option<i32> {
        self.contexts
            .iter()
            .position(|c| c.handle == context && c.retains > 0)
            .map(|ordinal| ordinal as i32)
    }

    /// The calling thread's current context and its device; `CUDA_ERROR_INVALID_CONTEXT` if
    /// there is none or it is no longer retained.
    pub fn current_context(&self) -> Result<(usize, i32), c_int> {
        let context = current().ok_or(status::INVALID_CONTEXT)?;
        let device = self
            .active_context(context)
            .ok_or(status::INVALID_CONTEXT)?;
        Ok((context, device))
    }
}

/// Checks that `context` is an active primary context.
fn check_context(world: &World, context: CUcontext) -> Result<usize, c_int> {
    let context = id(context).map_err(|_| status::INVALID_CONTEXT)?;
    world
        .active_context(context)
        .map(|_| context)
        .ok_or(status::INVALID_CONTEXT)
}

/// `CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)`.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(out: *mut CUcontext, device: CUdevice) -> c_int {
    entry("cuDevicePrimaryCtxRetain", || {
        check_device(device)?;
        let mut world = world();
        let ordinal = device as usize;
        if world.contexts.len() <= ordinal {
            world
                .contexts
                .resize(ordinal + 1, PrimaryContext::default());
        }
        if world.contexts[ordinal].handle == 0 {
            world.contexts[ordinal].handle = world.new_handle();
        }
        let context = &mut world.contexts[ordinal];
        // SAFETY: forwarded caller contract.
        unsafe { put(out, handle(context.handle)) }?;
        context.retains += 1;
        Ok(())
    })
}

/// `CUresult cuDevicePrimaryCtxRelease(CUdevice dev)`.
pub extern "C" fn cuDevicePrimaryCtxRelease(device: CUdevice) -> c_int {
    entry("cuDevicePrimaryCtxRelease", || {
        check_device(device)?;
        let mut world = world();
        match world.contexts.get_mut(device as usize) {
            Some(context) if context.retains > 0 => {
                context.retains -= 1;
                Ok(())
            }
            _ => Err(status::INVALID_CONTEXT),
        }
    })
}

/// `CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)`.
///
/// # Safety
/// Each out-pointer is null or valid for one write.
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    device: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> c_int {
    entry("cuDevicePrimaryCtxGetState", || {
        check_device(device)?;
        let retained = world()
            .contexts
            .get(device as usize)
            .is_some_and(|c| c.retains > 0);
        // SAFETY: forwarded caller contract.
        unsafe {
            put(flags, 0)?;
            put(active, c_int::from(retained))
        }
    })
}

/// `CUresult cuCtxSetCurrent(CUcontext ctx)`: replaces the top of the thread's stack; null pops.
pub extern "C" fn cuCtxSetCurrent(context: CUcontext) -> c_int {
    entry("cuCtxSetCurrent", || {
        if context.is_null() {
            STACK.with(|s| s.borrow_mut().pop());
            return Ok(());
        }
        let context = check_context(&world(), context)?;
        STACK.with(|s| {
            let mut stack = s.borrow_mut();
            stack.pop();
            stack.push(context);
        });
        Ok(())
    })
}

/// `CUresult cuCtxGetCurrent(CUcontext *pctx)`: null when the thread has none.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuCtxGetCurrent(out: *mut CUcontext) -> c_int {
    entry("cuCtxGetCurrent", || {
        let current = current().map_or(std::ptr::null_mut(), handle);
        // SAFETY: forwarded caller contract.
        unsafe { put(out, current) }
    })
}

/// `CUresult cuCtxPushCurrent(CUcontext ctx)`.
pub extern "C" fn cuCtxPushCurrent(context: CUcontext) -> c_int {
    entry("cuCtxPushCurrent", || {
        let context = check_context(&world(), context)?;
        STACK.with(|s| s.borrow_mut().push(context));
        Ok(())
    })
}

/// `CUresult cuCtxPopCurrent(CUcontext *pctx)`.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuCtxPopCurrent(out: *mut CUcontext) -> c_int {
    entry("cuCtxPopCurrent", || {
        let popped = STACK
            .with(|s| s.borrow_mut().pop())
            .ok_or(status::INVALID_CONTEXT)?;
        if !out.is_null() {
            // SAFETY: non-null, so valid for a write by the caller's contract.
            unsafe { put(out, handle(popped)) }?;
        }
        Ok(())
    })
}

/// `CUresult cuCtxGetDevice(CUdevice *device)`.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuCtxGetDevice(out: *mut CUdevice) -> c_int {
    entry("cuCtxGetDevice", || {
        let (_, device) = world().current_context()?;
        // SAFETY: forwarded caller contract.
        unsafe { put(out, device) }
    })
}

/// `CUresult cuCtxSynchronize(void)`: the fake's work is always done.
pub extern "C" fn cuCtxSynchronize() -> c_int {
    entry("cuCtxSynchronize", || {
        let mut world = world();
        world.current_context()?;
        world.forbid_on_capturing_thread()
    })
}

/// `CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)`: the current
/// context may then reach `peer`'s memory. Refused between a context and itself, where the
/// devices cannot peer, and twice (`CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`).
pub extern "C" fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) -> c_int {
    entry("cuCtxEnablePeerAccess", || {
        crate::entry::ensure(flags == 0, status::INVALID_VALUE)?;
        let mut world = world();
        let (context, device) = world.current_context()?;
        let peer = check_context(&world, peer)?;
        let peer_device = world.active_context(peer).ok_or(status::INVALID_CONTEXT)?;
        // CUDA_ERROR_PEER_ACCESS_UNSUPPORTED.
        crate::entry::ensure(
            peer_device != device && !crate::config::state().no_peer_access,
            217,
        )?;
        // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED.
        crate::entry::ensure(world.peer_access.insert((context, peer)), 704)
    })
}

/// `CUresult cuCtxDisablePeerAccess(CUcontext peerContext)`
/// (`CUDA_ERROR_PEER_ACCESS_NOT_ENABLED` if it was not enabled).
pub extern "C" fn cuCtxDisablePeerAccess(peer: CUcontext) -> c_int {
    entry("cuCtxDisablePeerAccess", || {
        let mut world = world();
        let (context, _) = world.current_context()?;
        let peer = check_context(&world, peer)?;
        crate::entry::ensure(world.peer_access.remove(&(context, peer)), 705)
    })
}

/// `CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)`: 0 to -5, as on Hopper.
///
/// # Safety
/// Each out-pointer is null or valid for one write.
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> c_int {
    entry("cuCtxGetStreamPriorityRange", || {
        world().current_context()?;
        // SAFETY: each pointer is null (skipped) or writable by the caller's contract.
        unsafe {
            if !least.is_null() {
                put(least, crate::stream::LEAST_PRIORITY)?;
            }
            if !greatest.is_null() {
                put(greatest, crate::stream::GREATEST_PRIORITY)?;
            }
        }
        Ok(())
    })
}
