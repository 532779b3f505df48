//! The door every driver function goes through: count the call, apply an injected fault, run
//! the body, and never let a panic cross the C ABI.

use std::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::{faults, status};

/// What a driver function's body returns: `Ok` is `CUDA_SUCCESS`, `Err` the `CUresult`.
pub(crate) type Status = Result<(), c_int>;

/// Runs the body of the driver function `name`.
///
/// The call is counted first; a fault injected for this call number returns its code without
/// running the body, as a failing driver call changes nothing. A panic (a bug in the fake) is
/// `CUDA_ERROR_UNKNOWN` rather than an abort of the host process.
///
/// A driver call first waits for the graph launches still running on their own threads
/// (`graph::settle`), except NCCL's, `cuGraphLaunch` (which settles its own stream), the
/// context calls other than `cuCtxSynchronize` (making a context current touches no GPU work),
/// and calls nested in another.
pub(crate) fn entry(name: &'static str, body: impl FnOnce() -> Status) -> c_int {
    thread_local! {
        static DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    let outer = DEPTH.get() == 0;
    let settles = !name.starts_with("nccl")
        && name != "cuGraphLaunch"
        && (!name.starts_with("cuCtx") || name == "cuCtxSynchronize");
    if outer && settles {
        crate::graph::settle(None);
    }
    DEPTH.set(DEPTH.get() + 1);
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            DEPTH.set(DEPTH.get().saturating_sub(1));
        }
    }
    let _leave = Leave;
    let run = AssertUnwindSafe(|| {
        if let Some(code) = faults::on_call(name) {
            return code;
        }
        match body() {
            Ok(()) => status::SUCCESS,
            Err(code) => code,
        }
    });
    catch_unwind(run).unwrap_or(status::UNKNOWN)
}

/// Writes `value` through the caller's out-pointer.
///
/// # Safety
/// `out` is null or valid for one write of `T`.
pub(crate) unsafe fn put<T>(out: *mut T, value: T) -> Status {
    if out.is_null() {
        return Err(status::INVALID_VALUE);
    }
    // SAFETY: non-null and valid for a write by the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// `Err(code)` unless `condition` holds.
pub(crate) fn ensure(condition: bool, code: c_int) -> Status {
    if condition { Ok(()) } else { Err(code) }
}
