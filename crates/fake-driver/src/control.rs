//! Exported functions that steer one loaded instance of the fake.
//!
//! A test opens its own copy of the library, calls these through `dlsym` (see
//! [`crate::harness`]), then loads the same path through `cuhal-sys` (the dynamic loader hands
//! back the same instance). Those taking a name return -1 for a null one.

use std::ffi::{CStr, c_char, c_int};

use crate::config::{Via, state};
use crate::faults::faults;
pub use crate::graph::GraphLaunch;
use crate::world::world;

/// What is alive in the instance (and how many kernels ran), for leak checks.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Device allocations (`cuMemAlloc` and stream-ordered) not yet freed.
    pub device_allocations: u64,
    /// Their bytes.
    pub device_bytes: u64,
    /// Pinned host allocations not yet freed.
    pub host_allocations: u64,
    /// Memory pools created and not destroyed (default pools are not counted).
    pub pools: u64,
    /// Streams.
    pub streams: u64,
    /// Events.
    pub events: u64,
    /// Graphs.
    pub graphs: u64,
    /// Executable graphs.
    pub graph_execs: u64,
    /// Loaded modules.
    pub modules: u64,
    /// Outstanding primary-context retains, over every device.
    pub context_retains: u64,
    /// Kernel launches so far (stream launches and kernel graph nodes), every function.
    pub launches: u64,
    /// Programmatic edges added to graphs so far.
    pub programmatic_edges: u64,
    /// Access grants of live pools to devices other than their own (`cuMemPoolSetAccess`).
    pub pool_peer_grants: u64,
}

/// Reads a caller's C string.
///
/// # Safety
/// `name` is null or NUL-terminated.
unsafe fn text(name: *const c_char) -> Option<String> {
    if name.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    Some(
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Makes `cuGetProcAddress` report `name` missing.
///
/// # Safety
/// `name` is null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuhal_fake_hide(name: *const c_char) -> c_int {
    // SAFETY: forwarded caller contract.
    match unsafe { text(name) } {
        Some(name) => {
            state().hidden.push(name);
            0
        }
        None => -1,
    }
}

/// Makes the implemented function `name` return `code` from its next call on (0: never again).
///
/// # Safety
/// `name` is null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuhal_fake_fail(name: *const c_char, code: c_int) -> c_int {
    // SAFETY: forwarded caller contract.
    unsafe { cuhal_fake_fail_calls(name, 1, 0, code) }
}

/// Makes the `nth` call of `name` from now (1: the next one) and the `count - 1` calls after it
/// return `code` without running; `count` 0 means every later call. Replaces any earlier fault
/// of `name`; `code` 0 removes it.
///
/// # Safety
/// `name` is null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuhal_fake_fail_calls(
    name: *const c_char,
    nth: u64,
    count: u64,
    code: c_int,
) -> c_int {
    // SAFETY: forwarded caller contract.
    match unsafe { text(name) } {
        Some(name) => {
            faults().inject(&name, nth, count, code);
            0
        }
        None => -1,
    }
}

/// Removes every injected fault, including those from the environment.
#[unsafe(no_mangle)]
pub extern "C" fn cuhal_fake_clear_faults() {
    faults().clear();
}

/// How many times the driver function `name` has been called (failed calls included).
///
/// # Safety
/// `name` is null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuhal_fake_calls(name: *const c_char) -> i64 {
    // SAFETY: forwarded caller contract.
    match unsafe { text(name) } {
        Some(name) => faults().calls(&name) as i64,
        None => -1,
    }
}

/// How many times kernels named `name` were launched (by `cuLaunchKernel` or a graph).
///
/// # Safety
/// `name` is null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuhal_fake_launches(name: *const c_char) -> i64 {
    // SAFETY: forwarded caller contract.
    match unsafe { text(name) } {
        Some(name) => world().launches.get(&name).copied().unwrap_or(0) as i64,
        None => -1,
    }
}

/// How many `cuEventElapsedTime` calls found one of their events not complete yet (and
/// answered `CUDA_ERROR_NOT_READY`, which compute-sanitizer reports as an API error).
#[unsafe(no_mangle)]
pub extern "C" fn cuhal_fake_elapsed_not_ready() -> u64 {
    world().elapsed_not_ready
}

/// Copies the first `capacity` graph launches recorded since the instance was loaded (or
/// since [`cuhal_fake_clear_graph_launches`]) into `out`, in call order; returns how many there
/// are in all (possibly more than `capacity`), or -1 if `out` is null while `capacity` is not 0.
///
/// # Safety
/// `out` is null or valid for `capacity` writes of [`GraphLaunch`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuhal_fake_graph_launches(out: *mut GraphLaunch, capacity: usize) -> i64 {
    if out.is_null() && capacity != 0 {
        return -1;
    }
    let world = world();
    for (i, launch) in world.graph_launches.iter().take(capacity).enumerate() {
        // SAFETY: `i < capacity`, and `out` is writable that far by the caller's contract.
        unsafe { out.add(i).write(*launch) };
    }
    world.graph_launches.len() as i64
}

/// Forgets the graph launches recorded so far.
#[unsafe(no_mangle)]
pub extern "C" fn cuhal_fake_clear_graph_launches() {
    world().graph_launches.clear();
}

/// Writes what is alive now into `out`; returns -1 if `out` is null.
///
/// # Safety
/// `out` is null or valid for one write of [`Counts`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuhal_fake_counts(out: *mut Counts) -> c_int {
    if out.is_null() {
        return -1;
    }
    let counts = world().counts();
    // SAFETY: non-null and writable by the caller's contract.
    unsafe { out.write(counts) };
    0
}

/// Sets what `cuDriverGetVersion` reports (e.g. 12040 for 12.4).
#[unsafe(no_mangle)]
pub extern "C" fn cuhal_fake_set_driver_version(version: c_int) {
    state().driver_version = version;
}

/// Sets how many devices there are.
#[unsafe(no_mangle)]
pub extern "C" fn cuhal_fake_set_device_count(count: c_int) {
    state().device_count = count.max(0);
}

/// Sets how long device work takes on the model clock (see [`crate::stream::Timing`]): each
/// kernel or graph launch keeps its stream busy `launch_ns`, and a stream that waits for an event
/// not yet complete goes on `cross_stream_ns` after it. Zero and zero: synchronous (the default).
#[unsafe(no_mangle)]
pub extern "C" fn cuhal_fake_set_timing(launch_ns: u64, cross_stream_ns: u64) {
    world().timing = crate::stream::Timing {
        launch: std::time::Duration::from_nanos(launch_ns),
        cross_stream: std::time::Duration::from_nanos(cross_stream_ns),
    };
}

/// Completes all work now: every recorded event is complete and every stream idle, whatever
/// the timing set by [`cuhal_fake_set_timing`] said.
#[unsafe(no_mangle)]
pub extern "C" fn cuhal_fake_finish_work() {
    world().finish_work();
}

/// How many times `name` was requested through either resolver. The last request's
/// resolver (1 or 2), CUDA version and flags are written through the non-null out-pointers.
///
/// # Safety
/// `name` is null or NUL-terminated; each out-pointer is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuhal_fake_requested(
    name: *const c_char,
    via: *mut c_int,
    cuda_version: *mut c_int,
    flags: *mut u64,
) -> c_int {
    // SAFETY: forwarded caller contract.
    let Some(name) = (unsafe { text(name) }) else {
        return -1;
    };
    let state = state();
    let mut matching = state.requests.iter().filter(|r| r.name == name);
    let count = matching.clone().count();
    if let Some(last) = matching.next_back() {
        // SAFETY: each pointer is null or writable by the caller's contract.
        unsafe {
            if !via.is_null() {
                via.write(last.via as c_int);
            }
            if !cuda_version.is_null() {
                cuda_version.write(last.cuda_version);
            }
            if !flags.is_null() {
                flags.write(last.flags);
            }
        }
    }
    count as c_int
}

/// How many requests came through resolver `via` (1: `cuGetProcAddress`, 2: `_v2`).
#[unsafe(no_mangle)]
pub extern "C" fn cuhal_fake_request_count(via: c_int) -> c_int {
    state()
        .requests
        .iter()
        .filter(|r| r.via as c_int == via && matches!(r.via, Via::V1 | Via::V2))
        .count() as c_int
}
