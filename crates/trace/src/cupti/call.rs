//! Calling CUPTI: each call is written once, with its name, and checked, as the driver's are
//! (`cuhal_sys::cu!`).

use std::ffi::{CStr, c_char};

use super::error::CuptiError;
use super::ffi::{self, CUptiResult, CuptiApi};

impl CuptiApi {
    /// `Ok(())` for `CUPTI_SUCCESS`, else the [`CuptiError`] for a failed `call`: with CUPTI's
    /// description of `result` (`cuptiGetResultString`), or
    /// [`CuptiError::SubscriberTaken`] when another profiler holds CUPTI. What
    /// [`cupti!`](crate::cupti!) checks with.
    pub fn check(&self, call: &'static str, result: CUptiResult) -> Result<(), CuptiError> {
        if result == ffi::CUPTI_SUCCESS {
            return Ok(());
        }
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: `text` is a valid out-pointer; CUPTI returns a static string or leaves it null.
        let description = unsafe {
            if (self.cuptiGetResultString)(result, &mut text) == ffi::CUPTI_SUCCESS
                && !text.is_null()
            {
                CStr::from_ptr(text).to_string_lossy().into_owned()
            } else {
                String::new()
            }
        };
        Err(CuptiError::call(call, result, description))
    }
}

/// Calls a function of a [`CuptiApi`](crate::cupti::CuptiApi) table and checks its result,
/// naming the function once: CUPTI's counterpart of `cuhal_sys::cu!`.
///
/// `cupti!(api, cuptiX(args...))` calls the table's entry `cuptiX` with `args` and returns
/// `Result<(), CuptiError>`, whose error's `call` is `"cuptiX"`
/// ([`CuptiApi::check`](crate::cupti::CuptiApi::check)). A name the table lacks does not compile.
/// `api` is any expression that dereferences to a `CuptiApi`, evaluated once. The call is
/// `unsafe`, so the macro is used inside an `unsafe` block with a `// SAFETY:` comment:
///
/// ```no_run
/// # fn f(api: &cuhal_trace::cupti::CuptiApi) -> Result<(), cuhal_trace::cupti::CuptiError> {
/// // SAFETY: a plain call.
/// unsafe { cuhal_trace::cupti!(api, cuptiActivityFlushAll(0)) }
/// # }
/// ```
#[macro_export]
macro_rules! cupti {
    ($api:expr, $name:ident ( $($arg:expr),* $(,)? )) => {{
        let api: &$crate::cupti::CuptiApi = &$api;
        api.check(::core::stringify!($name), (api.$name)($($arg),*))
    }};
}

/// The name of a function of the [`CuptiApi`](crate::cupti::CuptiApi) table, as a
/// `&'static str`, checked at compile time: `cupti_name!(cuptiGetTimestamp)` is
/// `"cuptiGetTimestamp"`. For code that speaks of a call without making it (tests, messages).
///
/// ```
/// assert_eq!(cuhal_trace::cupti_name!(cuptiGetTimestamp), "cuptiGetTimestamp");
/// ```
///
/// ```compile_fail
/// let _ = cuhal_trace::cupti_name!(cuptiFinalize);
/// ```
#[macro_export]
macro_rules! cupti_name {
    ($name:ident) => {{
        // Never called: it only makes the compiler check that the table has the entry.
        let _ = |api: &$crate::cupti::CuptiApi| {
            let _ = &api.$name;
        };
        ::core::stringify!($name)
    }};
}
